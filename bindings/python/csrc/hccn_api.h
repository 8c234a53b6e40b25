// The C functions of libhccn that the torch backend calls, and hccn's errors as a C++ exception.
//
// The functions are looked up (dlsym) in the libhccn.so that the Python package has already
// loaded (hccn._raw: $HCCN_LIB, else the copy next to the package, else the system's), so that
// Python and C++ share one library, one set of handles and one thread-local last error. The
// extension is therefore not linked against libhccn and uses only its C ABI (include/hccn.h).
#pragma once

#include <hccn.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace hccn_torch {

#define HCCN_TORCH_FUNCTIONS(X) \
  X(hccn_get_error_string)      \
  X(hccn_get_last_error)        \
  X(hccn_get_version)           \
  X(hccn_comm_init_rank)        \
  X(hccn_comm_destroy)          \
  X(hccn_comm_abort)            \
  X(hccn_comm_rank)             \
  X(hccn_comm_size)             \
  X(hccn_new_group)             \
  X(hccn_comm_failed_ranks)     \
  X(hccn_comm_epoch)            \
  X(hccn_comm_shrink)           \
  X(hccn_comm_rebuild)          \
  X(hccn_allreduce)             \
  X(hccn_broadcast)             \
  X(hccn_reduce)                \
  X(hccn_allgather)             \
  X(hccn_reduce_scatter)        \
  X(hccn_gather)                \
  X(hccn_scatter)               \
  X(hccn_alltoall)              \
  X(hccn_alltoallv)             \
  X(hccn_send)                  \
  X(hccn_recv)                  \
  X(hccn_barrier)               \
  X(hccn_stream_create)         \
  X(hccn_stream_destroy)        \
  X(hccn_stream_synchronize)    \
  X(hccn_stream_add_callback)    \
  X(hccn_mem_alloc)             \
  X(hccn_mem_free)

struct Api {
#define HCCN_TORCH_POINTER(name) decltype(&::name) name = nullptr;
  HCCN_TORCH_FUNCTIONS(HCCN_TORCH_POINTER)
#undef HCCN_TORCH_POINTER
};

// Looks every function up in `dl_handle` (a dlopen handle of libhccn.so); throws
// std::runtime_error naming the first missing one (a library older than this extension).
void load_api(void* dl_handle);

// The loaded table; throws if load_api has not succeeded.
const Api& api();

// A failed hccn call: its result code, the library's message, and for RANK_FAILED the failed
// members in the communicator's numbering. Through pybind (collective calls, Work.wait,
// Future.wait) Python sees hccn.torch's error class for the code, which is also a
// torch.distributed.DistBackendError; where torch converts it itself (an error inside
// loss.backward() under DDP) it is a DistBackendError with the same text.
class Error : public c10::DistBackendError {
 public:
  Error(hccn_result code, std::string message, std::vector<uint32_t> failed_ranks = {});
  hccn_result code() const noexcept { return code_; }
  // The library's text (the full what() adds the code and the failed ranks).
  const std::string& message() const noexcept { return message_; }
  const std::vector<uint32_t>& failed_ranks() const noexcept { return failed_ranks_; }

 private:
  hccn_result code_;
  std::string message_;
  std::vector<uint32_t> failed_ranks_;
};

// The error of a call that returned `code` on this thread (hccn_get_last_error()), with the
// failed ranks of `comm` (may be null) when the code says a member failed.
Error error_of(hccn_result code, const hccn_comm* comm);

// Throws error_of(code, comm) unless code is HCCN_SUCCESS.
inline void check(hccn_result code, const hccn_comm* comm) {
  if (code != HCCN_SUCCESS) throw error_of(code, comm);
}

// An argument the backend refuses before calling hccn (HCCN_ERROR_INVALID_ARGUMENT).
[[noreturn]] void invalid(const std::string& message);

}  // namespace hccn_torch
