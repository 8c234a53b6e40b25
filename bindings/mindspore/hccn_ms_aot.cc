// hccn collectives as MindSpore AOT custom-op functions (ops.Custom(func_type="aot"), CPU).
//
// MindSpore has no public route to plug in a third-party collective library (its collective
// library names are fixed in its code; see bindings/mindspore/README.md), so hccn comes in
// the supported way: functions with the AOT signature
//   int f(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
//         void* stream, void* extra)
// that run an hccn collective on the host buffers MindSpore hands them (inputs first, then the
// output). A non-zero return makes MindSpore raise; the message is kept for hccn_ms_last_error().
//
// The communicator is the hccnrun job's (hccn_init_from_env), created by hccn_ms_init(), which
// the hccn_ms Python package calls through ctypes. A mutex keeps it to one thread at a time.
//
// Built by bindings/mindspore/build.sh: g++ -std=c++17 -shared -fPIC ... -lhccn.

#include <hccn.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {

std::mutex g_mu;  // guards everything below
std::optional<hccn::Comm> g_comm;
std::string g_last_error;

std::optional<hccn_datatype> to_hccn(const char* dtype) {
  if (dtype == nullptr) return std::nullopt;
  const std::string d(dtype);
  if (d == "float32" || d == "float") return HCCN_FP32;
  if (d == "float64" || d == "double") return HCCN_FP64;
  if (d == "float16") return HCCN_FP16;
  if (d == "bfloat16") return HCCN_BF16;
  if (d == "int8") return HCCN_INT8;
  if (d == "int16") return HCCN_INT16;
  if (d == "int32" || d == "int") return HCCN_INT32;
  if (d == "int64") return HCCN_INT64;
  if (d == "uint8") return HCCN_UINT8;
  if (d == "uint16") return HCCN_UINT16;
  if (d == "uint32" || d == "uint") return HCCN_UINT32;
  if (d == "uint64") return HCCN_UINT64;
  return std::nullopt;
}

size_t dtype_size(hccn_datatype dt) {
  switch (dt) {
    case HCCN_INT8:
    case HCCN_UINT8:
      return 1;
    case HCCN_INT16:
    case HCCN_UINT16:
    case HCCN_FP16:
    case HCCN_BF16:
      return 2;
    case HCCN_INT32:
    case HCCN_UINT32:
    case HCCN_FP32:
      return 4;
    default:
      return 8;
  }
}

uint64_t elements(int ndim, const int64_t* shape) {
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= uint64_t(shape[i] < 0 ? 0 : shape[i]);
  return n;
}

struct Failure {
  int code;
  std::string message;
};

// Runs `body` with the communicator under the lock; returns 0, or the error code after
// recording the message (also printed, since MindSpore reports only the number).
template <class F>
int guarded(const char* what, F body) {
  std::lock_guard<std::mutex> g(g_mu);
  try {
    if (!g_comm) throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT), "hccn is not initialised: call hccn_ms.init() first"};
    body(*g_comm);
    return 0;
  } catch (const Failure& f) {
    g_last_error = std::string(what) + ": " + f.message;
    std::fprintf(stderr, "hccn_ms: %s\n", g_last_error.c_str());
    return f.code;
  } catch (const hccn::Error& e) {
    g_last_error = std::string(what) + ": " + e.what();
    std::fprintf(stderr, "hccn_ms: %s\n", g_last_error.c_str());
    return int(e.code());
  } catch (const std::exception& e) {
    g_last_error = std::string(what) + ": " + e.what();
    std::fprintf(stderr, "hccn_ms: %s\n", g_last_error.c_str());
    return int(HCCN_ERROR_INTERNAL);
  }
}

hccn_datatype dtype_of(const char** dtypes, int i) {
  std::optional<hccn_datatype> dt = to_hccn(dtypes[i]);
  if (!dt) {
    throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT),
                  std::string("unsupported dtype ") + (dtypes[i] ? dtypes[i] : "(null)")};
  }
  return *dt;
}

void expect_params(int nparam, int want) {
  if (nparam != want) {
    throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT),
                  "expected " + std::to_string(want) + " inputs+outputs, got " + std::to_string(nparam)};
  }
}

// params: [input, output], same shape and dtype.
int allreduce(hccn_reduce_op op, const char* name, int nparam, void** params, int* ndims, int64_t** shapes,
              const char** dtypes) {
  return guarded(name, [&](hccn::Comm& comm) {
    expect_params(nparam, 2);
    hccn_datatype dt = dtype_of(dtypes, 0);
    uint64_t count = elements(ndims[0], shapes[0]);
    hccn::check(hccn_allreduce(params[0], params[1], count, dt, op, comm.get(), nullptr), "hccn_allreduce");
  });
}

}  // namespace

extern "C" {

// ---- AOT kernels ----------------------------------------------------------------------------

int hccn_ms_allreduce_sum(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                          void*) {
  return allreduce(HCCN_SUM, "AllReduce(sum)", nparam, params, ndims, shapes, dtypes);
}
int hccn_ms_allreduce_prod(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                           void*) {
  return allreduce(HCCN_PROD, "AllReduce(prod)", nparam, params, ndims, shapes, dtypes);
}
int hccn_ms_allreduce_max(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                          void*) {
  return allreduce(HCCN_MAX, "AllReduce(max)", nparam, params, ndims, shapes, dtypes);
}
int hccn_ms_allreduce_min(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                          void*) {
  return allreduce(HCCN_MIN, "AllReduce(min)", nparam, params, ndims, shapes, dtypes);
}
int hccn_ms_allreduce_avg(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                          void*) {
  return allreduce(HCCN_AVG, "AllReduce(average)", nparam, params, ndims, shapes, dtypes);
}

// params: [input (d0, ...), output (size * d0, ...)]: rank order along the first dimension.
int hccn_ms_allgather(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {
  return guarded("AllGather", [&](hccn::Comm& comm) {
    expect_params(nparam, 2);
    hccn_datatype dt = dtype_of(dtypes, 0);
    uint64_t count = elements(ndims[0], shapes[0]);
    if (elements(ndims[1], shapes[1]) != count * comm.size()) {
      throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT), "the output does not hold size() inputs"};
    }
    hccn::check(hccn_allgather(params[0], params[1], count, dt, comm.get(), nullptr), "hccn_allgather");
  });
}

// params: [input, root (int64 scalar or [1]), output]: the root's input on every rank.
int hccn_ms_broadcast(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {
  return guarded("Broadcast", [&](hccn::Comm& comm) {
    expect_params(nparam, 3);
    hccn_datatype dt = dtype_of(dtypes, 0);
    if (dtypes[1] == nullptr || std::string(dtypes[1]) != "int64" || elements(ndims[1], shapes[1]) != 1) {
      throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT), "the root must be one int64"};
    }
    int64_t root = *static_cast<const int64_t*>(params[1]);
    if (root < 0 || root > int64_t(UINT32_MAX)) {
      throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT), "root " + std::to_string(root) + " is out of range"};
    }
    uint64_t count = elements(ndims[0], shapes[0]);
    // In place on the output: the input first, then overwritten from the root.
    if (count > 0) std::memcpy(params[2], params[0], size_t(count) * dtype_size(dt));
    hccn::check(hccn_broadcast(params[2], count, dt, uint32_t(root), comm.get(), nullptr), "hccn_broadcast");
  });
}

// ---- plain C helpers for the Python package (ctypes) ----------------------------------------

// Joins the hccnrun job once; 0 on success, else the hccn_result (message: hccn_ms_last_error).
int hccn_ms_init(void) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_comm) return 0;
  try {
    g_comm.emplace(hccn::Comm::from_env());
    return 0;
  } catch (const hccn::Error& e) {
    g_last_error = e.what();
    return int(e.code());
  }
}

int hccn_ms_rank(void) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_comm ? int(g_comm->rank()) : -1;
}

int hccn_ms_size(void) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_comm ? int(g_comm->size()) : -1;
}

// The message of the last failing kernel or init ("" when none).
const char* hccn_ms_last_error(void) {
  std::lock_guard<std::mutex> g(g_mu);
  static thread_local std::string copy;
  copy = g_last_error;
  return copy.c_str();
}

// Frees the communicator (after its blocking calls have returned); safe to call twice.
void hccn_ms_shutdown(void) {
  std::lock_guard<std::mutex> g(g_mu);
  g_comm.reset();
}

}  // extern "C"
