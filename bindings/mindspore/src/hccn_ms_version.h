// The version guard: this library is compiled against one MindSpore release's private C++
// headers (class layouts, std::string ABI, enum numbers), which change between releases, so it
// serves only the release it was built for.

#ifndef HCCN_MS_VERSION_H_
#define HCCN_MS_VERSION_H_

#include <string>

namespace hccn_ms {

// The MindSpore version and commit build.sh compiled against ("2.10.0", "2d550373").
const char *BuiltForVersion();
const char *BuiltForCommit();

// "" when the MindSpore whose libraries this process loaded is the one built for; otherwise why
// not, in a sentence meant for the user.
const std::string &VersionProblem();

}  // namespace hccn_ms

#endif  // HCCN_MS_VERSION_H_
