// Compression per layer: a plan maps parameter-name patterns to compression specs.
//
// Note [Compression plans]
//   A plan is a JSON object whose keys are patterns of tensor names and whose values are
//   compression specs (compression/registry.h), in the order written:
//
//     {"*.bias": "none", "embedding.*": "scalecomp:ratio=100", "*": "powersgd:rank=4"}
//
//   A tensor gets the spec of the first pattern that matches its whole name (Python's
//   fnmatch globs, matched alike on every rank: Note [Plan globs], compression_plan.cc:
//   `*` any run of characters, dots included; `?` one; `[seq]`, `[!seq]` a set), and `none`
//   when no pattern matches: end a plan with "*" to compress the rest. A key given twice, or
//   a set without its `]`, is refused. Two keys that start with `$` are the plan's options,
//   not patterns (no tensor name a framework makes starts with `$`):
//     "$min_elements": N          (default 1024) a tensor of fewer elements is sent
//                                 uncompressed: its all-reduce costs latency, not bytes;
//     "$min_compression_rate": X  (default 2, >= 1, PowerSGD's min_compression_rate) a
//                                 tensor whose estimated rate (EstimatedRate) under its
//                                 method is below X is sent uncompressed: the method cannot
//                                 pay for its error and its work there.
//   A method that does not apply to the tensor (an integer dtype, an op other than sum or
//   average: MethodApplies) sends it uncompressed too, as a job default does. The rule is the
//   plan's only: a single spec ("fp4") keeps compressing every tensor it applies to.
//
//   Every rank resolves the same plan for the same name, shape, dtype and op alike, so the
//   resolved spec, which is what travels to the coordinator, agrees across ranks; a plan
//   itself never leaves the rank.
#ifndef BRAID_COMPRESSION_COMPRESSION_PLAN_H_
#define BRAID_COMPRESSION_COMPRESSION_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "compression/registry.h"

namespace braid::compression {

// What a plan gives one tensor.
struct PlanChoice {
  std::string spec;     // the canonical spec the tensor is reduced with ("none" included)
  std::string pattern;  // the pattern that matched; empty when none did
  // Why the matched rule's method was not used ("64 elements, fewer than $min_elements
  // 1024", "powersgd:rank=4's estimated rate 1 is below $min_compression_rate 2", "fp16 does
  // not apply to int32 / average"); empty when it was.
  std::string skipped;
};

class CompressionPlan {
 public:
  // The options' defaults: $min_elements, $min_compression_rate.
  static constexpr int64_t kDefaultMinElements = 1024;
  static constexpr double kDefaultMinCompressionRate = 2.0;

  // Whether `text` is a plan (a JSON object) rather than a single spec.
  static bool IsPlan(absl::string_view text);
  // Parses and checks a plan (Note [Compression plans]). InvalidArgument naming the key for:
  // text that is not a JSON object, a value that is not a string, an empty pattern, a spec
  // the registry refuses, an unknown `$` option or a bad option value.
  static absl::StatusOr<CompressionPlan> Parse(absl::string_view text,
                                               const RegistryOptions& options = {});

  // The spec for the tensor `name` of `shape`, `dtype`, reduced with `op`.
  PlanChoice For(absl::string_view name, absl::Span<const int64_t> shape, DataType dtype,
                 ReduceOp op) const;

  // The plan as compact JSON, each spec canonical and the options explicit, in the order
  // written: two plans that mean the same have the same text.
  const std::string& canonical() const { return canonical_; }
  int64_t min_elements() const { return min_elements_; }
  double min_compression_rate() const { return min_rate_; }

 private:
  struct Rule {
    std::string pattern;
    CompressionSpec spec;
  };
  std::vector<Rule> rules_;
  int64_t min_elements_ = kDefaultMinElements;
  double min_rate_ = kDefaultMinCompressionRate;
  std::string canonical_;
};

// The longest compression text a call accepts: kMaxCompressionPlanBytes for a plan,
// kMaxCompressionSpecBytes for a spec (common/limits.h).
size_t MaxCompressionBytes(absl::string_view text);

// The compression rate (dense bytes / bytes a rank sends) `spec` is estimated to reach on
// one tensor of `shape` and `dtype`, for the plans' rule: none 1; fp16/bf16 dtype bits / 16;
// fp4/int4 dtype bits / (4 + 32 / chunk) (a float32 scale per chunk); powersgd rank R on a
// tensor of two or more dimensions seen as rows x cols (the first dimension by the rest)
// rows·cols·bits / ((rows + cols)·R·32) (P and Q in float32), else 1 (PowerSGD sends it as
// it is); randomk ratio·bits / 32 (float32 values, indices from a shared seed); scalecomp
// and topk ratio·bits / 64 (a float32 value and an int32 index per kept element; topk
// receives n - 1 times what it sends, which this does not count). A method not listed:
// taken to pay (infinity).
double EstimatedRate(const CompressionSpec& spec, absl::Span<const int64_t> shape,
                     DataType dtype);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_COMPRESSION_PLAN_H_
