// Compression plans (Note [Compression plans], compression_plan.h).
#include "compression/compression_plan.h"

#include <fnmatch.h>

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace braid::compression {
namespace {

constexpr absl::string_view kMinElements = "$min_elements";
constexpr absl::string_view kMinRate = "$min_compression_rate";

// "2", "1.5": the shortest text of a rate.
std::string RateText(double x) { return absl::StrFormat("%g", x); }

}  // namespace

bool CompressionPlan::IsPlan(absl::string_view text) {
  text = absl::StripLeadingAsciiWhitespace(text);
  return !text.empty() && text.front() == '{';
}

absl::StatusOr<CompressionPlan> CompressionPlan::Parse(absl::string_view text,
                                                       const RegistryOptions& options) {
  // nlohmann's ordered_json keeps the keys in the order written, which is the plan's order
  // of precedence; a hand-written parser would only repeat it.
  const nlohmann::ordered_json json =
      nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        "a compression plan must be a JSON object of name patterns to specs, e.g. "
        "{\"*.bias\": \"none\", \"*\": \"fp4\"}");
  }
  CompressionPlan plan;
  nlohmann::ordered_json canonical = nlohmann::ordered_json::object();
  for (const auto& [key, value] : json.items()) {
    const std::string where = absl::StrCat("compression plan, key '", key, "'");
    if (!key.empty() && key[0] == '$') {
      if (!value.is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": must be a number"));
      }
      const double v = value.get<double>();
      if (key == kMinElements && v >= 0 && v == std::floor(v) && v < 1e15) {
        plan.min_elements_ = static_cast<int64_t>(v);
      } else if (key == kMinRate && v >= 1 && std::isfinite(v)) {
        plan.min_rate_ = v;
      } else if (key == kMinElements || key == kMinRate) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", value.dump(), " is out of range (", kMinElements,
            ": an integer >= 0; ", kMinRate, ": a number >= 1)"));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": unknown option (the options are ", kMinElements, " and ", kMinRate, ")"));
      }
      continue;
    }
    if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty pattern"));
    if (!value.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": its spec must be a string"));
    }
    absl::StatusOr<CompressionSpec> spec = ParseCompressionSpec(value.get<std::string>(), options);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", spec.status().message()));
    }
    canonical[key] = spec->canonical;
    plan.rules_.push_back({key, *std::move(spec)});
  }
  canonical[std::string(kMinElements)] = plan.min_elements_;
  canonical[std::string(kMinRate)] = plan.min_rate_;
  plan.canonical_ = canonical.dump();
  return plan;
}

PlanChoice CompressionPlan::For(absl::string_view name, absl::Span<const int64_t> shape,
                                DataType dtype, ReduceOp op) const {
  PlanChoice choice;
  choice.spec = "none";
  const std::string text(name);  // fnmatch wants a terminated string
  const Rule* rule = nullptr;
  for (const Rule& r : rules_) {
    if (fnmatch(r.pattern.c_str(), text.c_str(), 0) == 0) {
      rule = &r;
      break;
    }
  }
  if (rule == nullptr) return choice;
  choice.pattern = rule->pattern;
  if (rule->spec.method == "none") return choice;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;  // the shape was checked at enqueue: no overflow
  if (!MethodApplies(rule->spec, dtype, op)) {
    choice.skipped = absl::StrCat(rule->spec.canonical, " does not apply to ",
                                  DataTypeName(dtype), " / ", ReduceOpName(op));
  } else if (count < min_elements_) {
    choice.skipped = absl::StrCat(count, " elements, fewer than ", kMinElements, " ",
                                  min_elements_);
  } else if (const double rate = EstimatedRate(rule->spec, shape, dtype); rate < min_rate_) {
    choice.skipped = absl::StrCat(rule->spec.canonical, "'s estimated rate ", RateText(rate),
                                  " is below ", kMinRate, " ", RateText(min_rate_));
  } else {
    choice.spec = rule->spec.canonical;
  }
  return choice;
}

double EstimatedRate(const CompressionSpec& spec, absl::Span<const int64_t> shape,
                     DataType dtype) {
  const double bits = 8.0 * DataTypeSize(dtype);
  const std::string& m = spec.method;
  if (m == "none") return 1.0;
  if (m == "fp16" || m == "bf16") return bits / 16.0;
  if (m == "fp4" || m == "int4") {
    return bits / (4.0 + 32.0 / static_cast<double>(spec.IntOption("chunk")));
  }
  if (m == "powersgd") {
    if (shape.size() < 2 || shape[0] == 0) return 1.0;
    const double rows = static_cast<double>(shape[0]);
    double cols = 1;
    for (size_t i = 1; i < shape.size(); ++i) cols *= static_cast<double>(shape[i]);
    return rows * cols / ((rows + cols) * static_cast<double>(spec.IntOption("rank")));
  }
  if (m == "scalecomp" || m == "topk" || m == "randomk") {
    return spec.FloatOption("ratio") * bits / 64.0;
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace braid::compression
