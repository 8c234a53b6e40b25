#include "hccn_api.h"

#include <dlfcn.h>

#include <mutex>

namespace hccn_torch {

namespace {
Api table;
bool loaded = false;
std::mutex load_lock;
}  // namespace

void load_api(void* dl_handle) {
  std::lock_guard<std::mutex> g(load_lock);
  if (loaded) return;
  if (dl_handle == nullptr) throw std::runtime_error("hccn.torch: no libhccn handle to look functions up in");
  Api found;
#define HCCN_TORCH_LOOKUP(name)                                                                   \
  found.name = reinterpret_cast<decltype(found.name)>(dlsym(dl_handle, #name));                   \
  if (found.name == nullptr)                                                                      \
    throw std::runtime_error(std::string("hccn.torch: the loaded libhccn.so has no ") + #name +   \
                             " (it is older than this extension; rebuild it with cargo build " \
                             "--release -p hccn-capi and reinstall the package)");
  HCCN_TORCH_FUNCTIONS(HCCN_TORCH_LOOKUP)
#undef HCCN_TORCH_LOOKUP
  table = found;
  loaded = true;
}

const Api& api() {
  if (!loaded) throw std::runtime_error("hccn.torch: libhccn functions are not loaded");
  return table;
}

namespace {
std::string describe(hccn_result code, const std::string& message, const std::vector<uint32_t>& failed) {
  std::string s = "hccn error " + std::to_string(int(code));
  if (loaded) s += std::string(" (") + table.hccn_get_error_string(code) + ")";
  s += ": " + message;
  if (!failed.empty()) {
    s += " [failed ranks:";
    for (uint32_t r : failed) s += " " + std::to_string(r);
    s += "]";
  }
  return s;
}
}  // namespace

Error::Error(hccn_result code, std::string message, std::vector<uint32_t> failed_ranks)
    : c10::DistBackendError(c10::SourceLocation{"hccn", "hccn.torch", 0}, describe(code, message, failed_ranks)),
      code_(code), message_(std::move(message)), failed_ranks_(std::move(failed_ranks)) {}

Error error_of(hccn_result code, const hccn_comm* comm) {
  const Api& a = api();
  std::string message = a.hccn_get_last_error();
  if (message.empty()) message = a.hccn_get_error_string(code);
  std::vector<uint32_t> failed;
  if (code == HCCN_ERROR_RANK_FAILED && comm != nullptr) {
    uint32_t count = 0;
    std::vector<uint32_t> ranks(64);
    // Asked twice at most: once with room for 64, then with room for all of them.
    for (int attempt = 0; attempt < 2; attempt++) {
      if (a.hccn_comm_failed_ranks(comm, ranks.data(), uint32_t(ranks.size()), &count) != HCCN_SUCCESS) break;
      if (count <= ranks.size()) {
        failed.assign(ranks.begin(), ranks.begin() + count);
        break;
      }
      ranks.resize(count);
    }
  }
  return Error(code, std::move(message), std::move(failed));
}

void invalid(const std::string& message) { throw Error(HCCN_ERROR_INVALID_ARGUMENT, "hccn.torch: " + message); }

}  // namespace hccn_torch
