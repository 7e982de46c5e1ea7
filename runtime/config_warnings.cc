// Warnings about the names of the environment's variables (runtime/config.h: EnvironmentWarnings).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/config.h"

extern char** environ;

namespace braid {
namespace {

// Horovod's variables that have a braid equivalent (same unit), for users migrating.
struct HorovodEquivalent {
  const char* horovod;
  const char* braid;
  const char* same;  // what the two share, for the warning
};
const HorovodEquivalent kHorovodEquivalents[] = {
    {"HOROVOD_FUSION_THRESHOLD", "BRAID_FUSION_THRESHOLD", " (bytes, as Horovod's)"},
    {"HOROVOD_CYCLE_TIME", "BRAID_CYCLE_TIME_MS", " (milliseconds, as Horovod's)"},
    {"HOROVOD_CACHE_CAPACITY", "BRAID_CACHE_CAPACITY", " (entries, as Horovod's)"},
    {"HOROVOD_TIMELINE", "BRAID_TIMELINE", " (a file path, as Horovod's)"},
    {"HOROVOD_STALL_CHECK_TIME_SECONDS", "BRAID_STALL_CHECK_S", " (seconds, as Horovod's)"},
    {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "BRAID_STALL_SHUTDOWN_S",
     " (seconds, as Horovod's)"},
    {"HOROVOD_AUTOTUNE", "BRAID_AUTOTUNE", " (0 or 1, as Horovod's)"},
    {"HOROVOD_AUTOTUNE_LOG", "BRAID_AUTOTUNE_LOG", " (a file path, as Horovod's)"},
    {"HOROVOD_RANK", "BRAID_RANK", ""},
    {"HOROVOD_SIZE", "BRAID_SIZE", ""},
    {"HOROVOD_LOCAL_RANK", "BRAID_LOCAL_RANK", ""},
    {"HOROVOD_LOCAL_SIZE", "BRAID_LOCAL_SIZE", ""},
};

// Levenshtein distance (insertions, deletions, substitutions), hand-rolled: neither Abseil
// (whose Damerau-Levenshtein is internal, and absent from the version braid builds with) nor
// another dependency offers one; two rows of a few dozen entries for names this short.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::vector<std::string> EnvironmentWarnings(const std::vector<std::string>& names) {
  std::vector<std::string> warnings;
  for (const std::string& name : names) {
    if (absl::StartsWith(name, "BRAID_")) {
      const std::string* closest = nullptr;
      size_t best = 0;
      bool known = false;
      for (const std::string& k : KnownBraidVariables()) {
        if (name == k) known = true;
        const size_t d = EditDistance(name, k);
        if (closest == nullptr || d < best) closest = &k, best = d;
      }
      if (known) continue;
      // Near enough to be a slip: a few edits, more for longer names.
      const size_t near = std::max<size_t>(2, (name.size() - 6) / 3);
      warnings.push_back(
          best <= near
              ? absl::StrCat(name, " is not a braid variable and is ignored: did you mean ",
                             *closest, "?")
              : absl::StrCat(name, " is not a braid variable and is ignored ("
                                   "docs/configuration.md lists them)"));
    } else if (absl::StartsWith(name, "HOROVOD_")) {
      for (const HorovodEquivalent& e : kHorovodEquivalents) {
        if (name != e.horovod) continue;
        warnings.push_back(absl::StrCat(name, " is Horovod's and braid ignores it: set ",
                                        e.braid, e.same, " instead"));
      }
    }
  }
  return warnings;
}

std::vector<std::string> ProcessEnvironmentNames() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    names.emplace_back(*e, eq == nullptr ? std::strlen(*e) : eq - *e);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace braid
