// The library's C entry points: the one MindSpore looks up, and the ones the hccn_ms Python
// package calls through ctypes.

#include <string>

#include "hccn_ms_lib.h"
#include "hccn_ms_version.h"

using hccn_ms::HccnCollectiveLib;

// What MindSpore's CPU device context dlsyms after dlopen("libmpi_collective.so"). A library
// built for another MindSpore release must not be used: the exception (MindSpore turns it into
// a RuntimeError of init()) says why.
extern "C" HCCN_MS_EXPORT mindspore::device::CollectiveCommunicationLib *
communication_lib_instance() {
  const std::string &problem = hccn_ms::VersionProblem();
  if (!problem.empty()) {
    (void)hccn_ms::Report(problem);
    throw std::runtime_error(problem);
  }
  return &HccnCollectiveLib::Instance();
}

extern "C" {

// Joins the job hccnrun started; 0, or the hccn_result (message: hccn_ms_last_error(); not
// printed, since outside hccnrun failing is the expected answer).
HCCN_MS_EXPORT int hccn_ms_join(void) {
  try {
    HccnCollectiveLib::Instance().Join();
    return 0;
  } catch (const hccn::Error &e) {
    hccn_ms::Remember(e.what());
    return int(e.code());
  } catch (const std::exception &e) {
    hccn_ms::Remember(e.what());
    return int(HCCN_ERROR_INTERNAL);
  }
}

// This rank and the world size, or -1 when not joined.
HCCN_MS_EXPORT int hccn_ms_rank(void) {
  try {
    return int(HccnCollectiveLib::Instance().WorldRank());
  } catch (const std::exception &) {
    return -1;
  }
}

HCCN_MS_EXPORT int hccn_ms_size(void) {
  try {
    return int(HccnCollectiveLib::Instance().WorldSize());
  } catch (const std::exception &) {
    return -1;
  }
}

// The last failure's message ("" when none); valid until the next call on this thread.
HCCN_MS_EXPORT const char *hccn_ms_last_error(void) {
  static thread_local std::string copy;
  copy = hccn_ms::LastError();
  return copy.c_str();
}

// NULL when the loaded MindSpore is the release this library was built for, else why not.
HCCN_MS_EXPORT const char *hccn_ms_version_problem(void) {
  const std::string &problem = hccn_ms::VersionProblem();
  return problem.empty() ? nullptr : problem.c_str();
}

HCCN_MS_EXPORT const char *hccn_ms_built_for(void) { return hccn_ms::BuiltForVersion(); }

// Destroys the groups and leaves the job (the package calls it at exit, before C++ teardown);
// MindSpore's own later Finalize then finds nothing left to do.
HCCN_MS_EXPORT void hccn_ms_shutdown(void) { (void)HccnCollectiveLib::Instance().Finalize(); }

}  // extern "C"
