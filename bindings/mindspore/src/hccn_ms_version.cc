#include "hccn_ms_version.h"

#include <link.h>

#include <fstream>
#include <sstream>
#include <string>

#ifndef HCCN_MS_MINDSPORE_VERSION
#error "build.sh passes -DHCCN_MS_MINDSPORE_VERSION=... (the installed MindSpore's version)"
#endif
#ifndef HCCN_MS_MINDSPORE_COMMIT
#error "build.sh passes -DHCCN_MS_MINDSPORE_COMMIT=... (the installed MindSpore's commit)"
#endif

namespace hccn_ms {
namespace {

// Where the running MindSpore keeps its shared libraries: the directory of the loaded
// libmindspore_hardware_abstract.so (a dependency of this library, so always loaded with it).
std::string LoadedMindSporeLibDir() {
  std::string dir;
  dl_iterate_phdr(
    [](struct dl_phdr_info *info, size_t, void *out) {
      const std::string path = info->dlpi_name == nullptr ? "" : info->dlpi_name;
      const std::string name = "/libmindspore_hardware_abstract.so";
      if (path.size() > name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0) {
        *static_cast<std::string *>(out) = path.substr(0, path.size() - name.size());
        return 1;
      }
      return 0;
    },
    &dir);
  return dir;
}

// The quoted value of `key = '...'` in a MindSpore package file ("" when absent).
std::string QuotedValue(const std::string &file, const std::string &key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    size_t open = line.find_first_of("'\"");
    if (open == std::string::npos) continue;
    size_t close = line.find(line[open], open + 1);
    if (close == std::string::npos) continue;
    return line.substr(open + 1, close - open - 1);
  }
  return "";
}

std::string Check() {
  const std::string lib_dir = LoadedMindSporeLibDir();
  if (lib_dir.empty()) return "libmindspore_hardware_abstract.so is not loaded; is MindSpore installed?";
  // The package directory: lib/'s parent.
  const std::string package = lib_dir.substr(0, lib_dir.rfind('/'));
  const std::string version = QuotedValue(package + "/version.py", "__version__");
  // .commit_id holds e.g. "[sha1]:2d550373,[branch]:(HEAD,origin/r2.10,r2.10)".
  const std::string commit_line = QuotedValue(package + "/.commit_id", "__commit_id__");
  const std::string commit = commit_line.substr(0, commit_line.find(',')).substr(commit_line.find(':') + 1);
  if (version == BuiltForVersion() && commit == BuiltForCommit()) return "";
  std::ostringstream why;
  why << "hccn_ms was built for MindSpore " << BuiltForVersion() << " (commit " << BuiltForCommit()
      << ") but this process runs MindSpore " << (version.empty() ? "of unknown version" : version)
      << " (commit " << (commit.empty() ? "unknown" : commit) << ") from " << package
      << "; MindSpore's internal C++ interface changes between releases: rebuild with "
         "bindings/mindspore/build.sh against the MindSpore you run";
  return why.str();
}

}  // namespace

const char *BuiltForVersion() { return HCCN_MS_MINDSPORE_VERSION; }
const char *BuiltForCommit() { return HCCN_MS_MINDSPORE_COMMIT; }

const std::string &VersionProblem() {
  static const std::string problem = Check();
  return problem;
}

}  // namespace hccn_ms
