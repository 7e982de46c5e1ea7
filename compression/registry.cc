#include "compression/registry.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "compression/methods.h"
#include "compression/powersgd.h"
#include "compression/sparse.h"

namespace braid::compression {
namespace {

enum class Kind {
  kInt,
  kBool,
  kFraction,
  kFloat,    // a finite number >= OptionDef::min_int
  kRatio,    // a finite number >= 1 (sparsifiers: dense size / k)
  kChoice,   // one of OptionDef::choices, '|'-separated
  kLeader,   // "cyclic", or a rank (an integer >= 0)
};

struct OptionDef {
  const char* name;
  Kind kind;
  const char* default_value;
  int64_t min_int = 0;  // kInt, kFloat: smallest value allowed
  const char* choices = "";  // kChoice: the values allowed, '|'-separated
};

struct MethodDef {
  const char* name;
  bool test_only;
  std::vector<OptionDef> options;
};

std::vector<OptionDef> SparseOptionDefs(bool leader) {
  std::vector<OptionDef> o = {{"ratio", Kind::kRatio, "100"},
                              {"beta", Kind::kFraction, "1"},
                              {"start_step", Kind::kInt, "0", 0}};
  if (leader) o.push_back({"leader", Kind::kLeader, "cyclic"});
  o.push_back({"granularity", Kind::kChoice, "bucket", 0, "bucket|tensor"});
  return o;
}

const std::vector<MethodDef>& Methods() {
  static const auto* methods = new std::vector<MethodDef>{
      {"none", false, {}},
      // A placeholder the runtime replaces per bucket (Note [Auto compression] in
      // runtime/auto_compression.h); its compressor, never run there, is none's.
      {"auto", false, {}},
      {"fp16", false, {{"start_step", Kind::kInt, "0", 0}}},
      {"bf16", false, {{"start_step", Kind::kInt, "0", 0}}},
      {"fp4", false,
       {{"chunk", Kind::kInt, "128", 2}, {"ef", Kind::kBool, "0"}, {"beta", Kind::kFraction, "1"},
        {"start_step", Kind::kInt, "0", 0}}},
      {"int4", false,
       {{"chunk", Kind::kInt, "128", 2}, {"ef", Kind::kBool, "0"}, {"beta", Kind::kFraction, "1"},
        {"start_step", Kind::kInt, "0", 0}}},
      {"powersgd", false,
       {{"rank", Kind::kInt, "1", 1},
        {"min_compression_rate", Kind::kFloat, "2", 1},
        {"ef", Kind::kBool, "1"},
        {"warm_start", Kind::kBool, "1"},
        {"orthogonalization_epsilon", Kind::kFloat, "0", 0},
        {"start_step", Kind::kInt, "0", 0}}},
      // Sparsifiers (sparse.h).
      {"scalecomp", false, SparseOptionDefs(/*leader=*/true)},
      {"topk", false, SparseOptionDefs(/*leader=*/false)},
      {"randomk", false, SparseOptionDefs(/*leader=*/false)},
      {"test_randomk", true, {{"keep", Kind::kFraction, "0.01"}, {"start_step", Kind::kInt, "0", 0}}},
  };
  return *methods;
}

// Normalises `value` for `def`, or explains what is wrong with it.
absl::StatusOr<std::string> Normalise(absl::string_view spec, const OptionDef& def,
                                      absl::string_view value) {
  auto bad = [&](const std::string& want) {
    return absl::InvalidArgumentError(absl::StrCat("compression '", spec, "': option '",
                                                   def.name, "' must be ", want, ", got '",
                                                   value, "'"));
  };
  switch (def.kind) {
    case Kind::kInt: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v) || v < def.min_int || v > (int64_t{1} << 30)) {
        return bad(absl::StrCat("an integer in [", def.min_int, ", 2^30]"));
      }
      return absl::StrCat(v);
    }
    case Kind::kBool: {
      if (value == "1" || value == "true") return std::string("1");
      if (value == "0" || value == "false") return std::string("0");
      return bad("0 or 1 (or false / true)");
    }
    case Kind::kFraction: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !(v > 0.0 && v <= 1.0)) {
        return bad("a number in (0, 1]");
      }
      return absl::StrCat(v);
    }
    case Kind::kFloat: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < def.min_int) {
        return bad(absl::StrCat("a finite number >= ", def.min_int));
      }
      // Shortest text that reads back as the same double (StrCat keeps 6 digits only).
      char buf[32];
      auto end = std::to_chars(buf, buf + sizeof buf, v + 0.0).ptr;  // + 0.0: "-0" -> "0"
      return std::string(buf, end);
    }
    case Kind::kRatio: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !(v >= 1.0 && v <= 1e12)) {
        return bad("a number in [1, 1e12]");
      }
      return absl::StrCat(v);
    }
    case Kind::kChoice: {
      for (absl::string_view c : absl::StrSplit(def.choices, '|')) {
        if (value == c) return std::string(c);
      }
      return bad(absl::StrJoin(absl::StrSplit(def.choices, '|'), " or "));
    }
    case Kind::kLeader: {
      int64_t v = 0;
      if (value == "cyclic") return std::string("cyclic");
      if (!absl::SimpleAtoi(value, &v) || v < 0 || v > (int64_t{1} << 30)) {
        return bad("cyclic or a rank (an integer >= 0)");
      }
      return absl::StrCat(v);
    }
  }
  return bad("valid");
}

}  // namespace

int64_t CompressionSpec::IntOption(const std::string& key) const {
  return std::strtoll(options.at(key).c_str(), nullptr, 10);
}

double CompressionSpec::FloatOption(const std::string& key) const {
  return std::strtod(options.at(key).c_str(), nullptr);
}

std::vector<std::string> CompressionMethods(const RegistryOptions& options) {
  std::vector<std::string> out;
  for (const MethodDef& m : Methods()) {
    if (!m.test_only || options.test_methods) out.push_back(m.name);
  }
  return out;
}

absl::StatusOr<CompressionSpec> ParseCompressionSpec(absl::string_view spec,
                                                     const RegistryOptions& options) {
  spec = absl::StripAsciiWhitespace(spec);
  if (spec.empty()) spec = "none";
  std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  const absl::string_view method = absl::StripAsciiWhitespace(parts.first);
  const MethodDef* def = nullptr;
  for (const MethodDef& m : Methods()) {
    if (m.name == method && (!m.test_only || options.test_methods)) def = &m;
  }
  if (def == nullptr) {
    bool test_only = false;
    for (const MethodDef& m : Methods()) test_only = test_only || (m.test_only && m.name == method);
    return absl::InvalidArgumentError(absl::StrCat(
        "compression '", spec, "': unknown method '", method,
        "'; valid methods: ", absl::StrJoin(CompressionMethods(options), ", "),
        test_only ? " (test-only methods need BRAID_TEST_COMPRESSORS=1)" : ""));
  }
  CompressionSpec out;
  out.method = def->name;
  for (const OptionDef& o : def->options) out.options[o.name] = o.default_value;
  const bool has_options = spec.find(':') != absl::string_view::npos;
  if (has_options) {
    std::set<std::string> seen;
    for (absl::string_view item : absl::StrSplit(parts.second, ',')) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
      kv.first = absl::StripAsciiWhitespace(kv.first);
      kv.second = absl::StripAsciiWhitespace(kv.second);
      if (kv.first.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "compression '", spec, "': empty option; write method:option=value,option=value"));
      }
      if (!seen.insert(std::string(kv.first)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("compression '", spec, "': option '", kv.first, "' given twice"));
      }
      const OptionDef* odef = nullptr;
      for (const OptionDef& o : def->options) {
        if (o.name == kv.first) odef = &o;
      }
      if (odef == nullptr) {
        std::vector<std::string> names;
        for (const OptionDef& o : def->options) names.push_back(o.name);
        return absl::InvalidArgumentError(absl::StrCat(
            "compression '", spec, "': unknown option '", kv.first, "' for ", def->name,
            names.empty() ? std::string("; it takes no options")
                          : absl::StrCat("; valid options: ", absl::StrJoin(names, ", "))));
      }
      auto value = Normalise(spec, *odef, kv.second);
      if (!value.ok()) return value.status();
      out.options[odef->name] = *value;
    }
  }
  out.canonical = out.method;
  std::vector<std::string> changed;
  for (const OptionDef& o : def->options) {
    // Compare normalised forms, so "chunk=0128" and the default "128" are the same.
    std::string dflt = *Normalise(spec, o, o.default_value);
    if (out.options[o.name] != dflt) changed.push_back(absl::StrCat(o.name, "=", out.options[o.name]));
  }
  std::sort(changed.begin(), changed.end());
  if (!changed.empty()) absl::StrAppend(&out.canonical, ":", absl::StrJoin(changed, ","));
  if (out.options.count("start_step")) out.start_step = out.IntOption("start_step");
  if ((out.method == "fp4" || out.method == "int4") && out.options["beta"] != "1" &&
      out.options["ef"] == "0") {
    return absl::InvalidArgumentError(absl::StrCat(
        "compression '", spec, "': option 'beta' filters the error-feedback memory: it needs ef=1"));
  }
  return out;
}

bool MethodApplies(const CompressionSpec& spec, DataType dtype, ReduceOp op) {
  if (spec.method == "none") return true;
  return IsFloatingPoint(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAverage);
}

absl::StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const CompressionSpec& spec) {
  if (spec.method == "none" || spec.method == "auto") return MakeNoneCompressor();
  if (spec.method == "fp16") return MakeCastCompressor(DataType::kFloat16, spec.canonical);
  if (spec.method == "bf16") return MakeCastCompressor(DataType::kBFloat16, spec.canonical);
  if (spec.method == "fp4" || spec.method == "int4") {
    FourBitOptions o;
    o.format = spec.method == "fp4" ? FourBitFormat::kFp4 : FourBitFormat::kInt4;
    o.chunk = static_cast<size_t>(spec.IntOption("chunk"));
    o.error_feedback = spec.IntOption("ef") != 0;
    o.beta = static_cast<float>(spec.FloatOption("beta"));
    return MakeFourBitCompressor(o, spec.canonical);
  }
  if (spec.method == "powersgd") {
    PowerSgdOptions o;
    o.rank = static_cast<int>(spec.IntOption("rank"));
    o.min_compression_rate = spec.FloatOption("min_compression_rate");
    o.error_feedback = spec.IntOption("ef") != 0;
    o.warm_start = spec.IntOption("warm_start") != 0;
    o.orthogonalization_epsilon = spec.FloatOption("orthogonalization_epsilon");
    return MakePowerSgdCompressor(o, spec.canonical);
  }
  if (spec.method == "scalecomp" || spec.method == "topk" || spec.method == "randomk") {
    return CreateSparseCompressor(spec);
  }
  if (spec.method == "test_randomk") {
    return MakeRandomKCompressor(spec.FloatOption("keep"), spec.canonical);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("compression '", spec.canonical, "' has no compressor to create"));
}

}  // namespace braid::compression
