// TensorFlow ops over hccn: HccnAllreduce, HccnAllgather, HccnBroadcast.
//
// Built against tensorflow-cpu with tf.sysconfig's flags (bindings/tensorflow/build.sh) and
// loaded with tf.load_op_library by the hccn_tf Python package. The kernels are AsyncOpKernels,
// as Horovod's are: ComputeAsync only queues the tensor for one background thread, which runs
// the hccn collectives one at a time, in the order the kernels were started, and calls `done`.
// One thread owns the communicator, so it is never used by two threads at once (docs/c-api.md).
//
// The communicator is the hccnrun job's (hccn_init_from_env), created by hccn_tf_init(), which
// the Python package calls through ctypes before the first op.

#include <hccn.hpp>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace hccn_tf {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::DataType;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// ---------------------------------------------------------------------------------------------
// The communicator and the background thread

class Runtime {
 public:
  static Runtime& get() {
    // Never destroyed: a joinable std::thread destroyed at exit would terminate the process.
    // hccn_tf_shutdown() (registered with atexit by the Python package) drains and frees.
    static Runtime* r = new Runtime();
    return *r;
  }

  // Joins the hccnrun job once; later calls return at once.
  void init() {
    std::lock_guard<std::mutex> g(init_mu_);
    if (comm_) return;
    comm_.emplace(hccn::Comm::from_env());
    rank_ = int(comm_->rank());
    size_ = int(comm_->size());
  }
  bool ready() {
    std::lock_guard<std::mutex> g(init_mu_);
    return comm_.has_value();
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  hccn::Comm& comm() { return *comm_; }

  // Runs `job` on the background thread after every job queued before it.
  void enqueue(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // Waits for the queued jobs, stops the thread and frees the communicator.
  void shutdown() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = false;  // a later init() and op start a new thread
    }
    std::lock_guard<std::mutex> g(init_mu_);
    comm_.reset();
    rank_ = size_ = -1;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and everything queued has run
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex init_mu_;
  std::optional<hccn::Comm> comm_;
  int rank_ = -1, size_ = -1;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::thread thread_;
  bool stop_ = false;
};

// An hccn::Error as a TensorFlow status with the library's message.
Status to_status(const hccn::Error& e) {
  switch (e.code()) {
    case HCCN_ERROR_INVALID_ARGUMENT:
    case HCCN_ERROR_NULL_POINTER:
      return errors::InvalidArgument(e.what());
    case HCCN_ERROR_TIMEOUT:
      return errors::DeadlineExceeded(e.what());
    case HCCN_ERROR_RANK_FAILED:
    case HCCN_ERROR_REVOKED:
    case HCCN_ERROR_ABORTED:
    case HCCN_ERROR_CONNECT:
    case HCCN_ERROR_TRANSFER:
      return errors::Aborted(e.what());
    case HCCN_ERROR_NOT_SUPPORTED:
      return errors::Unimplemented(e.what());
    case HCCN_ERROR_OUT_OF_MEMORY:
      return errors::ResourceExhausted(e.what());
    default:
      return errors::Internal(e.what());
  }
}

std::optional<hccn_datatype> to_hccn(DataType dt) {
  switch (dt) {
    case ::tensorflow::DT_INT8: return HCCN_INT8;
    case ::tensorflow::DT_INT16: return HCCN_INT16;
    case ::tensorflow::DT_INT32: return HCCN_INT32;
    case ::tensorflow::DT_INT64: return HCCN_INT64;
    case ::tensorflow::DT_UINT8: return HCCN_UINT8;
    case ::tensorflow::DT_UINT16: return HCCN_UINT16;
    case ::tensorflow::DT_UINT32: return HCCN_UINT32;
    case ::tensorflow::DT_UINT64: return HCCN_UINT64;
    case ::tensorflow::DT_HALF: return HCCN_FP16;
    case ::tensorflow::DT_BFLOAT16: return HCCN_BF16;
    case ::tensorflow::DT_FLOAT: return HCCN_FP32;
    case ::tensorflow::DT_DOUBLE: return HCCN_FP64;
    default: return std::nullopt;
  }
}

Status same_shape(::tensorflow::shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(0));
  return ::absl::OkStatus();
}

#define HCCN_TF_TYPES "T: {int8, int16, int32, int64, uint8, uint16, uint32, uint64, half, bfloat16, float, double}"

// Shared by the three kernels: checks, then runs `body` on the background thread, turning an
// hccn::Error into the op's status, and always calls `done`.
class HccnKernel : public AsyncOpKernel {
 public:
  explicit HccnKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {}

 protected:
  using Body = std::function<void(OpKernelContext*, hccn_datatype)>;

  void run(OpKernelContext* ctx, DoneCallback done, Body body) {
    Runtime& rt = Runtime::get();
    OP_REQUIRES_ASYNC(ctx, rt.ready(),
                      errors::FailedPrecondition("hccn is not initialised: call hccn_tf.init() under hccnrun first"),
                      done);
    std::optional<hccn_datatype> dt = to_hccn(ctx->input(0).dtype());
    OP_REQUIRES_ASYNC(ctx, dt.has_value(), errors::InvalidArgument("hccn: unsupported dtype"), done);
    hccn_datatype hdt = *dt;
    rt.enqueue([ctx, done, body, hdt] {
      try {
        body(ctx, hdt);
      } catch (const hccn::Error& e) {
        ctx->SetStatus(to_status(e));
      } catch (const std::exception& e) {
        ctx->SetStatus(errors::Internal("hccn: ", e.what()));
      }
      done();
    });
  }
};

// ---------------------------------------------------------------------------------------------
// HccnAllreduce

REGISTER_OP("HccnAllreduce")
    .Attr(HCCN_TF_TYPES)
    .Attr("reduce_op: {'sum', 'prod', 'max', 'min', 'average'} = 'sum'")
    .Input("tensor: T")
    .Output("reduced: T")
    .SetShapeFn(same_shape)
    .Doc(R"doc(
Elementwise reduction of `tensor` over every rank of the hccnrun job; every rank gets the result.
'average' divides the sum by the number of ranks (integers truncate toward zero).
)doc");

class HccnAllreduceOp : public HccnKernel {
 public:
  explicit HccnAllreduceOp(OpKernelConstruction* c) : HccnKernel(c) {
    std::string op;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    op_ = op == "sum"    ? HCCN_SUM
          : op == "prod" ? HCCN_PROD
          : op == "max"  ? HCCN_MAX
          : op == "min"  ? HCCN_MIN
                         : HCCN_AVG;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, in.shape(), &out), done);
    hccn_reduce_op op = op_;
    run(ctx, done, [in, out, op](OpKernelContext*, hccn_datatype dt) {
      hccn::check(hccn_allreduce(in.tensor_data().data(), const_cast<char*>(out->tensor_data().data()),
                                 uint64_t(in.NumElements()), dt, op, Runtime::get().comm().get(), nullptr),
                  "hccn_allreduce");
    });
  }

 private:
  hccn_reduce_op op_ = HCCN_SUM;
};

REGISTER_KERNEL_BUILDER(Name("HccnAllreduce").Device(::tensorflow::DEVICE_CPU), HccnAllreduceOp);

// ---------------------------------------------------------------------------------------------
// HccnAllgather: concatenation along the first dimension; the ranks' first dimensions may
// differ (their sizes are exchanged first), the other dimensions must agree.

REGISTER_OP("HccnAllgather")
    .Attr(HCCN_TF_TYPES)
    .Input("tensor: T")
    .Output("gathered: T")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return ::absl::OkStatus();
    })
    .Doc(R"doc(
Every rank's `tensor` concatenated along the first dimension, in rank order.
)doc");

class HccnAllgatherOp : public HccnKernel {
 public:
  explicit HccnAllgatherOp(OpKernelConstruction* c) : HccnKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, in.dims() >= 1, errors::InvalidArgument("HccnAllgather needs a tensor of rank >= 1"),
                      done);
    run(ctx, done, [in](OpKernelContext* ctx, hccn_datatype dt) {
      hccn::Comm& comm = Runtime::get().comm();
      const uint32_t n = comm.size();
      // Exchange (first dimension, elements per row, rank of the tensor, a digest of the other
      // dimensions) so that every rank sees the same shapes and fails alike on a mismatch.
      const int64_t rows = in.dim_size(0);
      int64_t row_elems = 1, digest = 0;
      for (int d = 1; d < in.dims(); d++) {
        row_elems *= in.dim_size(d);
        digest = digest * 1000003 + in.dim_size(d);
      }
      std::vector<int64_t> mine{rows, row_elems, int64_t(in.dims()), digest};
      std::vector<int64_t> all = comm.allgather(mine);
      int64_t total_rows = 0;
      std::vector<uint64_t> counts(n), displs(n);
      for (uint32_t r = 0; r < n; r++) {
        const int64_t* s = &all[4 * r];
        if (s[1] != row_elems || s[2] != mine[2] || s[3] != mine[3]) {
          ctx->SetStatus(errors::InvalidArgument("HccnAllgather: rank ", r, " has a tensor of rank ", s[2],
                                                 " whose dimensions after the first differ from this rank's ",
                                                 in.shape().DebugString()));
          return;
        }
        counts[r] = uint64_t(s[0] * row_elems);
        displs[r] = uint64_t(total_rows * row_elems);
        total_rows += s[0];
      }
      TensorShape shape = in.shape();
      shape.set_dim(0, total_rows);
      Tensor* out = nullptr;
      auto st = ctx->allocate_output(0, shape, &out);
      // The other ranks go on to the allgatherv whatever happens here: without an output, take
      // part through a scratch buffer so that the job's order of collectives holds, then fail.
      std::vector<char> scratch;
      char* dst = nullptr;
      if (st.ok()) {
        dst = const_cast<char*>(out->tensor_data().data());
      } else {
        scratch.resize(size_t(total_rows * row_elems) * ::tensorflow::DataTypeSize(in.dtype()) + 1);
        dst = scratch.data();
      }
      hccn::check(hccn_allgatherv(in.tensor_data().data(), uint64_t(in.NumElements()), dst, counts.data(),
                                  displs.data(), dt, comm.get(), nullptr),
                  "hccn_allgatherv");
      if (!st.ok()) ctx->SetStatus(st);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("HccnAllgather").Device(::tensorflow::DEVICE_CPU), HccnAllgatherOp);

// ---------------------------------------------------------------------------------------------
// HccnBroadcast

REGISTER_OP("HccnBroadcast")
    .Attr(HCCN_TF_TYPES)
    .Attr("root_rank: int")
    .Input("tensor: T")
    .Output("broadcast: T")
    .SetShapeFn(same_shape)
    .Doc(R"doc(
`root_rank`'s tensor on every rank (every rank passes a tensor of the same shape).
)doc");

class HccnBroadcastOp : public HccnKernel {
 public:
  explicit HccnBroadcastOp(OpKernelConstruction* c) : HccnKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
    OP_REQUIRES(c, root_ >= 0, errors::InvalidArgument("root_rank must be >= 0, got ", root_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, in.shape(), &out), done);
    uint32_t root = uint32_t(root_);
    run(ctx, done, [in, out, root](OpKernelContext*, hccn_datatype dt) {
      // Broadcast is in place: copy the input into the output, then overwrite it from the root.
      char* dst = const_cast<char*>(out->tensor_data().data());
      std::memcpy(dst, in.tensor_data().data(), in.tensor_data().size());
      hccn::check(hccn_broadcast(dst, uint64_t(in.NumElements()), dt, root,
                                 Runtime::get().comm().get(), nullptr),
                  "hccn_broadcast");
    });
  }

 private:
  int root_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("HccnBroadcast").Device(::tensorflow::DEVICE_CPU), HccnBroadcastOp);

}  // namespace hccn_tf

// ---------------------------------------------------------------------------------------------
// Plain C helpers for the Python package (ctypes), as Horovod's are.

namespace {
void copy_message(const std::string& msg, char* buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  std::strncpy(buf, msg.c_str(), len - 1);
  buf[len - 1] = '\0';
}
}  // namespace

// Joins the hccnrun job; 0 on success, else the hccn_result with a message in `err`.
extern "C" int hccn_tf_init(char* err, size_t err_len) {
  try {
    hccn_tf::Runtime::get().init();
    return 0;
  } catch (const hccn::Error& e) {
    copy_message(e.what(), err, err_len);
    return int(e.code());
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
    return int(HCCN_ERROR_INTERNAL);
  }
}

extern "C" int hccn_tf_rank() { return hccn_tf::Runtime::get().rank(); }
extern "C" int hccn_tf_size() { return hccn_tf::Runtime::get().size(); }

// Waits for queued collectives, then frees the communicator. Safe to call twice.
extern "C" void hccn_tf_shutdown() { hccn_tf::Runtime::get().shutdown(); }
