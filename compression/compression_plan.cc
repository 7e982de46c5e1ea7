// Compression plans (Note [Compression plans], compression_plan.h).
#include "compression/compression_plan.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/limits.h"
#include "nlohmann/json.hpp"

namespace braid::compression {
namespace {

constexpr absl::string_view kMinElements = "$min_elements";
constexpr absl::string_view kMinRate = "$min_compression_rate";

// "2", "1.5": the shortest text of a rate.
std::string RateText(double x) { return absl::StrFormat("%g", x); }

// Note [Plan globs]
// Patterns are matched by this file's own glob, not fnmatch(3): glibc's depends on the
// process's environment (LC_CTYPE decides what `?` and a set match on non-ASCII names;
// POSIXLY_CORRECT whether `[^...]` negates), and ranks must resolve a name alike whatever
// their environment. The syntax is Python's fnmatch, which a Python user knows: `*` any run
// of characters (dots included), `?` one character, `[seq]` one of a set (ranges `a-z`; a
// `]` first is literal), `[!seq]` none of it; no escapes. Characters are UTF-8 code points
// (a byte that is not valid UTF-8 counts as one).

// Bytes of the character at `i` (1 for a byte that does not start valid UTF-8).
size_t CharLen(absl::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 1;
  }
  return n;
}

// The code point of the `n`-byte character at `i`.
uint32_t CodePoint(absl::string_view s, size_t i, size_t n) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t v = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return v;
}

// The end of the set that starts with the `[` at `p` (one past its `]`), or npos when it is
// not closed.
size_t SetEnd(absl::string_view pattern, size_t p) {
  size_t i = p + 1;
  if (i < pattern.size() && pattern[i] == '!') ++i;
  if (i < pattern.size() && pattern[i] == ']') ++i;  // literal
  const size_t close = pattern.find(']', i);
  return close == absl::string_view::npos ? close : close + 1;
}

// Whether the code point `ch` is in the set `pattern[p, end)`.
bool InSet(absl::string_view pattern, size_t p, size_t end, uint32_t ch) {
  size_t i = p + 1;
  const bool negate = pattern[i] == '!';
  if (negate) ++i;
  bool in = false;
  for (bool first = true; i < end - 1; first = false) {
    if (!first && pattern[i] == ']') break;
    const size_t n = CharLen(pattern, i);
    const uint32_t lo = CodePoint(pattern, i, n);
    i += n;
    if (i + 1 < end - 1 && pattern[i] == '-') {
      const size_t m = CharLen(pattern, i + 1);
      const uint32_t hi = CodePoint(pattern, i + 1, m);
      i += 1 + m;
      in = in || (lo <= ch && ch <= hi);
    } else {
      in = in || ch == lo;
    }
  }
  return in != negate;
}

// Whether `name` matches `pattern` whole (Note [Plan globs]). Greedy with backtracking to
// the last `*`: linear in practice, at worst |pattern|·|name|.
bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  size_t p = 0, n = 0;
  size_t star_p = absl::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = ++p;
      star_n = n;
      continue;
    }
    const size_t len = CharLen(name, n);
    if (p < pattern.size()) {
      const size_t plen = CharLen(pattern, p);
      size_t end = 0;
      if (pattern[p] == '?') {
        p += plen;
        n += len;
        continue;
      }
      if (pattern[p] == '[' && (end = SetEnd(pattern, p)) != absl::string_view::npos) {
        if (InSet(pattern, p, end, CodePoint(name, n, len))) {
          p = end;
          n += len;
          continue;
        }
      } else if (pattern.substr(p, plen) == name.substr(n, len)) {
        p += plen;
        n += len;
        continue;
      }
    }
    if (star_p == absl::string_view::npos) return false;
    star_n += CharLen(name, star_n);
    n = star_n;
    p = star_p;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

bool CompressionPlan::IsPlan(absl::string_view text) {
  text = absl::StripLeadingAsciiWhitespace(text);
  return !text.empty() && text.front() == '{';
}

absl::StatusOr<CompressionPlan> CompressionPlan::Parse(absl::string_view text,
                                                       const RegistryOptions& options) {
  // nlohmann's ordered_json keeps the keys in the order written, which is the plan's order
  // of precedence; a hand-written parser would only repeat it. It keeps a repeated key at
  // its first place with its last value, which would reorder the plan silently: refused.
  std::set<std::string> keys;
  std::string repeated;
  const auto track = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                         nlohmann::ordered_json& parsed) {
    if (event == nlohmann::ordered_json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second && repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(text.begin(), text.end(), track);
  } catch (const nlohmann::ordered_json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("compression plan: not JSON: ", e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        "a compression plan must be a JSON object of name patterns to specs, e.g. "
        "{\"*.bias\": \"none\", \"*\": \"fp4\"}");
  }
  if (!repeated.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression plan, key '", repeated, "': given twice (the first match wins: keep one)"));
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
    for (size_t i = key.find('['); i != std::string::npos; i = key.find('[', i + 1)) {
      const size_t end = SetEnd(key, i);
      if (end == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the set at character ", i + 1, " has no closing ']'"));
      }
      i = end - 1;
    }
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
  const Rule* rule = nullptr;
  for (const Rule& r : rules_) {
    if (GlobMatch(r.pattern, name)) {
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

size_t MaxCompressionBytes(absl::string_view text) {
  return CompressionPlan::IsPlan(text) ? kMaxCompressionPlanBytes : kMaxCompressionSpecBytes;
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
    // P and Q travel as float32 whatever the dtype.
    return rows * cols * bits /
           ((rows + cols) * static_cast<double>(spec.IntOption("rank")) * 32.0);
  }
  if (m == "randomk") return spec.FloatOption("ratio") * bits / 32.0;  // no indices
  if (m == "scalecomp" || m == "topk") return spec.FloatOption("ratio") * bits / 64.0;
  return std::numeric_limits<double>::infinity();
}

}  // namespace braid::compression
