// MindSpore's TypeId and CollectiveOpReduceType in hccn's terms, and how failures are reported.

#ifndef HCCN_MS_TYPES_H_
#define HCCN_MS_TYPES_H_

#include <hccn.h>

#include <stdexcept>
#include <string>

#include "include/runtime/hardware_abstract/collective/collective_communication_lib.h"

namespace hccn_ms {

// A call MindSpore made that hccn cannot serve as asked (an unmapped type, an unknown group...).
class Refused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// hccn's datatype for a MindSpore TypeId; throws Refused for types hccn has no counterpart of.
// `reducing`: bool and the like can be moved as bytes but not reduced.
hccn_datatype ToHccn(mindspore::TypeId type, bool reducing);

// hccn's reduce op; throws Refused for MindSpore's Sum_Square, ASum and All.
hccn_reduce_op ToHccn(mindspore::device::CollectiveOpReduceType op);

// Bytes per element of `dt`.
size_t ElementSize(hccn_datatype dt);

// A failed call: writes "hccn_ms: <message>" to stderr (MindSpore's log is not reachable from
// here), keeps it for LastError() and returns false, which is how MindSpore's collective
// libraries answer a failure.
bool Report(const std::string &message);

// A failed collective: Report(message), then throws std::runtime_error(message). MindSpore's
// kernels turn a false return into "Launch kernel failed" without our reason, but let an
// exception through to Python with its text, as they do for the Open MPI library's (which
// throws on every MPI error).
[[noreturn]] void Raise(const std::string &message);

// Keeps `message` for LastError() without printing it (a failure the caller reports itself).
void Remember(const std::string &message);

// The message of the last Report in this process ("" when none).
std::string LastError();

}  // namespace hccn_ms

#endif  // HCCN_MS_TYPES_H_
