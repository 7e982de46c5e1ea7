// Counters per group of tensors, bounded: the statistics braidctl status shows per method
// and plan pattern.
//
// Note [Compression groups]
//   All-reduces count per group of tensors: the method they ran with and the plan pattern
//   that gave it (Note [Compression plans] in compression/compression_plan.h; "" when no
//   plan did: a single spec, the job's or the call's). Under compression `auto` a rank books
//   the bytes under the method auto chose, in the group of its pattern with " (auto)" after
//   it, or "(auto)" alone (AutoCompressionPattern, runtime/statistics.h); the coordinator
//   counts the negotiated tensors under the spec `auto` and the plan's pattern as it is.
//   A plan of up to 64 KiB may hold thousands of patterns, and a job may use several plans,
//   so the groups are bounded wherever they are counted (a rank's ledger, its fast-path
//   counts, the coordinator's negotiation counts and its merge of the ranks' reports): the
//   first kMaxCompressionGroups groups of a pattern keep their own row, and every later
//   pattern of a method counts in that method's kOtherPatterns group; a method's group of no
//   pattern always keeps its row. A method's totals stay exact whatever is folded; the rows
//   are at most kMaxCompressionGroups plus two per method.
#ifndef BRAID_CONTROL_COMPRESSION_GROUPS_H_
#define BRAID_CONTROL_COMPRESSION_GROUPS_H_

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/string_view.h"

namespace braid::control {

inline constexpr size_t kMaxCompressionGroups = 64;
inline constexpr char kOtherPatterns[] = "(other patterns)";

// Counts (any default-constructible type) per (method, pattern), bounded as Note
// [Compression groups] says. Not thread-safe.
template <typename Counts>
class CompressionGroups {
 public:
  using Patterns = std::map<std::string, Counts, std::less<>>;
  using Group = typename Patterns::value_type;  // (the pattern counted under, its counts)

  // The group a tensor of `method` and `pattern` counts in, made when new: its own, or past
  // the bound its method's kOtherPatterns group ("", no pattern, is never folded).
  Group& At(absl::string_view method, absl::string_view pattern) {
    auto by_method = groups_.find(method);
    if (by_method == groups_.end()) {
      by_method = groups_.emplace(std::piecewise_construct, std::forward_as_tuple(method),
                                  std::forward_as_tuple()).first;
    }
    Patterns& patterns = by_method->second;
    auto it = patterns.find(pattern);
    if (it == patterns.end() && !pattern.empty() && patterned_ >= kMaxCompressionGroups) {
      it = patterns.find(absl::string_view(kOtherPatterns));
      if (it == patterns.end()) pattern = kOtherPatterns;
    }
    if (it == patterns.end()) {
      it = patterns.emplace(std::piecewise_construct, std::forward_as_tuple(pattern),
                            std::forward_as_tuple()).first;
      ++size_;
      if (!pattern.empty() && pattern != kOtherPatterns) ++patterned_;
    }
    return *it;
  }

  // Calls f(method, pattern, counts) for every group, by method, then pattern.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [method, patterns] : groups_) {
      for (const auto& [pattern, counts] : patterns) f(method, pattern, counts);
    }
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::map<std::string, Patterns, std::less<>> groups_;  // method -> pattern -> counts
  size_t size_ = 0;       // groups
  size_t patterned_ = 0;  // groups of a pattern of their own (the bound's)
};

}  // namespace braid::control

#endif  // BRAID_CONTROL_COMPRESSION_GROUPS_H_
