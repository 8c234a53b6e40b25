// A torch.distributed backend that does nothing, for measurement only (never shipped, never used
// by a test): its allreduce and barrier return at once without a Work, as hccn's synchronous path
// does. Timing dist.all_reduce on it gives what torch's own layers cost (the Python function,
// pybind11, the dispatcher, the c10d op and its hooks) for any out-of-tree backend, i.e. the
// floor under hccn's figure. Built and used by benches/small_allreduce_torch.py --backend null.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

namespace {

class NullBackend : public c10d::Backend {
 public:
  NullBackend(int rank, int size)
      : Backend(rank, size), options_(c10::make_intrusive<Options>("null", std::chrono::milliseconds(60000))) {}
  const std::string getBackendName() const override { return "null"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return {};
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return {}; }

 private:
  c10::intrusive_ptr<Options> options_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<NullBackend, c10d::Backend, c10::intrusive_ptr<NullBackend>>(m, "NullBackend")
      .def(pybind11::init<int, int>());
}
