// hccn collectives as MindSpore AOT custom-op functions (ops.Custom(func_type="aot"), CPU), for
// what MindSpore's own CPU kernels cannot do over the native route (hccn_ms_lib.h): AllReduce
// with prod/max/min/average or on types other than float32/float16, and ReduceScatter, which has
// no CPU kernel. Each has the AOT signature
//   int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
//         void *stream, void *extra)
// and runs the hccn collective on the host buffers MindSpore hands it (inputs first, then the
// output), on the world communicator the library joined. A non-zero return makes MindSpore
// raise; the message is kept for hccn_ms_last_error().

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "hccn_ms_lib.h"

namespace {

std::optional<hccn_datatype> to_hccn(const char *dtype) {
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

uint64_t elements(int ndim, const int64_t *shape) {
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= uint64_t(shape[i] < 0 ? 0 : shape[i]);
  return n;
}

struct Failure {
  int code;
  std::string message;
};

// Runs `body(world)` on the library's world communicator; 0, or a non-zero code after Report.
template <class F>
int guarded(const char *what, F body) {
  int code = int(HCCN_ERROR_INTERNAL);
  bool ok = hccn_ms::HccnCollectiveLib::Instance().RunOnWorld(what, [&](hccn_comm *world) {
    try {
      body(world);
    } catch (const Failure& f) {
      code = f.code;
      throw hccn_ms::Refused(f.message);
    } catch (const hccn::Error& e) {
      code = int(e.code());
      throw;
    }
  });
  return ok ? 0 : code;
}

hccn_datatype dtype_of(const char **dtypes, int i) {
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
int allreduce(hccn_reduce_op op, const char *name, int nparam, void **params, int *ndims, int64_t **shapes,
              const char **dtypes) {
  return guarded(name, [&](hccn_comm *comm) {
    expect_params(nparam, 2);
    hccn_datatype dt = dtype_of(dtypes, 0);
    uint64_t count = elements(ndims[0], shapes[0]);
    hccn::check(hccn_allreduce(params[0], params[1], count, dt, op, comm, nullptr), "hccn_allreduce");
  });
}

// params: [input (size * d0, ...), output (d0, ...)]: rank r gets the reduction of rows r*d0...
int reduce_scatter(hccn_reduce_op op, const char *name, int nparam, void **params, int *ndims, int64_t **shapes,
                   const char **dtypes) {
  return guarded(name, [&](hccn_comm *comm) {
    expect_params(nparam, 2);
    hccn_datatype dt = dtype_of(dtypes, 0);
    uint64_t count = elements(ndims[1], shapes[1]);
    uint32_t size = 0;
    hccn::check(hccn_comm_size(comm, &size), "hccn_comm_size");
    if (elements(ndims[0], shapes[0]) != count * size) {
      throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT), "the input does not hold size() outputs"};
    }
    hccn::check(hccn_reduce_scatter(params[0], params[1], count, dt, op, comm, nullptr), "hccn_reduce_scatter");
  });
}

}  // namespace

extern "C" {

// ---- AOT kernels ----------------------------------------------------------------------------

// The AOT signature's parameters (the stream and the extra argument are unused on CPU).
#define HCCN_MS_AOT_PARAMS int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *

// hccn_ms_allreduce_<suffix> and hccn_ms_reduce_scatter_<suffix> for one reduce op.
#define HCCN_MS_REDUCING(suffix, op, label)                                                           \
  HCCN_MS_EXPORT int hccn_ms_allreduce_##suffix(HCCN_MS_AOT_PARAMS) {                                 \
    return allreduce(op, "AllReduce(" label ")", nparam, params, ndims, shapes, dtypes);              \
  }                                                                                                   \
  HCCN_MS_EXPORT int hccn_ms_reduce_scatter_##suffix(HCCN_MS_AOT_PARAMS) {                            \
    return reduce_scatter(op, "ReduceScatter(" label ")", nparam, params, ndims, shapes, dtypes);     \
  }
HCCN_MS_REDUCING(sum, HCCN_SUM, "sum")
HCCN_MS_REDUCING(prod, HCCN_PROD, "prod")
HCCN_MS_REDUCING(max, HCCN_MAX, "max")
HCCN_MS_REDUCING(min, HCCN_MIN, "min")
HCCN_MS_REDUCING(avg, HCCN_AVG, "average")
#undef HCCN_MS_REDUCING

// params: [input (d0, ...), output (size * d0, ...)]: rank order along the first dimension.
HCCN_MS_EXPORT int hccn_ms_allgather(HCCN_MS_AOT_PARAMS) {
  return guarded("AllGather", [&](hccn_comm *comm) {
    expect_params(nparam, 2);
    hccn_datatype dt = dtype_of(dtypes, 0);
    uint64_t count = elements(ndims[0], shapes[0]);
    uint32_t size = 0;
    hccn::check(hccn_comm_size(comm, &size), "hccn_comm_size");
    if (elements(ndims[1], shapes[1]) != count * size) {
      throw Failure{int(HCCN_ERROR_INVALID_ARGUMENT), "the output does not hold size() inputs"};
    }
    hccn::check(hccn_allgather(params[0], params[1], count, dt, comm, nullptr), "hccn_allgather");
  });
}

// params: [input, root (int64 scalar or [1]), output]: the root's input on every rank.
HCCN_MS_EXPORT int hccn_ms_broadcast(HCCN_MS_AOT_PARAMS) {
  return guarded("Broadcast", [&](hccn_comm *comm) {
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
    if (count > 0) std::memcpy(params[2], params[0], size_t(count) * hccn_ms::ElementSize(dt));
    hccn::check(hccn_broadcast(params[2], count, dt, uint32_t(root), comm, nullptr), "hccn_broadcast");
  });
}

#undef HCCN_MS_AOT_PARAMS

}  // extern "C"
