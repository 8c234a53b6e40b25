// The Python module hccn._torch_C: ProcessGroupHCCN for hccn/torch.py, and hccn's errors as the
// Python exceptions hccn/torch.py makes for them.
#include "backend.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using hccn_torch::ProcessGroupHCCN;

namespace {

// hccn.torch._exception(code, message, failed_ranks, text): a Python exception instance. A
// strong reference kept for the life of the process (never released: it may be needed while
// the interpreter shuts down).
PyObject* exception_factory = nullptr;

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const hccn_torch::Error& e) {
    if (exception_factory == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
      return;
    }
    try {
      py::object exc = py::reinterpret_borrow<py::object>(exception_factory)(
          int(e.code()), e.message(), e.failed_ranks(), std::string(e.what_without_backtrace()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (py::error_already_set& failed) {
      failed.restore();
    }
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hccn's torch.distributed backend (C++): see hccn/torch.py";

  m.def(
      "load_library", [](uintptr_t dl_handle) { hccn_torch::load_api(reinterpret_cast<void*>(dl_handle)); },
      "Looks libhccn's functions up in the dlopen handle that hccn._raw holds.");
  m.def("set_exception_factory", [](py::object factory) {
    Py_XDECREF(exception_factory);
    exception_factory = factory.release().ptr();
  });
  py::register_exception_translator(&translate);

  using Ptr = c10::intrusive_ptr<ProcessGroupHCCN>;
  py::class_<ProcessGroupHCCN, c10d::Backend, Ptr>(m, "ProcessGroupHCCN")
      .def_static(
          "init_rank",
          [](const std::string& unique_id, int rank, int size, std::chrono::milliseconds timeout) {
            return ProcessGroupHCCN::init_rank(unique_id, rank, size, timeout);
          },
          py::arg("unique_id"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          py::call_guard<py::gil_scoped_release>(),
          "A communicator from rank 0's hccn unique id (128 bytes), owned by the backend.")
      .def_static(
          "borrow",
          [](uintptr_t comm, std::chrono::milliseconds timeout) {
            return c10::make_intrusive<ProcessGroupHCCN>(reinterpret_cast<hccn_comm*>(comm), false, timeout);
          },
          py::arg("comm"), py::arg("timeout"),
          "A backend over a communicator that stays its owner's (the hccn.Group of the world).")
      .def("new_group", &ProcessGroupHCCN::new_group, py::arg("ranks"), py::call_guard<py::gil_scoped_release>())
      .def("shrink_comm", &ProcessGroupHCCN::shrink_comm, py::call_guard<py::gil_scoped_release>())
      .def("rebuild_comm", &ProcessGroupHCCN::rebuild_comm, py::arg("timeout_ms"),
           py::call_guard<py::gil_scoped_release>())
      .def("adopt_comm", &ProcessGroupHCCN::adopt_comm, py::arg("next"), py::call_guard<py::gil_scoped_release>())
      .def("failed_ranks", &ProcessGroupHCCN::failed_ranks)
      .def("epoch", &ProcessGroupHCCN::epoch)
      .def("origin_ranks", &ProcessGroupHCCN::origin_ranks)
      .def("broadcast_value", &ProcessGroupHCCN::broadcast_value, py::arg("value"),
           py::call_guard<py::gil_scoped_release>())
      .def("synchronize", &ProcessGroupHCCN::synchronize, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("comm_handle", &ProcessGroupHCCN::comm_handle);
}
