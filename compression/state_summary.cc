#include "compression/state_summary.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/state_io.h"

namespace braid::compression {
namespace {

constexpr uint32_t kReportVersion = 1;
// How many disagreements one message lists before "and N more".
constexpr size_t kListed = 6;
constexpr absl::string_view kNoneLoaded =
    "; no rank loaded its state (every rank keeps the one it had)";

void WriteSummary(const StateSummary& summary, StateWriter& w) {
  w.U32(static_cast<uint32_t>(summary.size()));
  for (const TensorSummary& t : summary) {
    w.String(t.method);
    w.String(t.tensor);
    w.I64(t.steps);
    w.U32(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) w.I64(d);
    w.U32(static_cast<uint32_t>(t.fields.size()));
    for (const SummaryField& f : t.fields) {
      w.String(f.name);
      w.U64(f.value);
      w.U32(f.hashed ? 1 : 0);
    }
  }
}

// "rank 3" or "ranks 0, 2".
std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

// "10 on rank 0, 5 on ranks 1, 2": each distinct value with the ranks that hold it, in the
// order of the first rank holding it.
std::string ByValue(const std::vector<std::string>& value_of_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < value_of_rank.size(); ++r) {
    auto it = groups.begin();
    while (it != groups.end() && it->first != value_of_rank[r]) ++it;
    if (it == groups.end()) it = groups.insert(groups.end(), {value_of_rank[r], {}});
    it->second.push_back(static_cast<int>(r));
  }
  std::vector<std::string> parts;
  for (const auto& [value, ranks] : groups) {
    parts.push_back(absl::StrCat(value, " on ", Ranks(ranks)));
  }
  return absl::StrJoin(parts, ", ");
}

bool AllEqual(const std::vector<std::string>& v) {
  for (const std::string& x : v) {
    if (x != v[0]) return false;
  }
  return true;
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// What differs in one tensor that every rank holds: `of_rank[r]` is rank r's summary.
void Compare(const std::vector<const TensorSummary*>& of_rank, std::vector<std::string>* out) {
  const TensorSummary& first = *of_rank[0];
  const std::string what = absl::StrCat("tensor '", first.tensor, "' (", first.method, "): ");
  std::vector<std::string> steps, shapes;
  for (const TensorSummary* t : of_rank) {
    steps.push_back(absl::StrCat(t->steps));
    shapes.push_back(Shape(t->shape));
  }
  if (!AllEqual(steps)) {
    out->push_back(absl::StrCat(what, "step counter ", ByValue(steps),
                                " (states taken at different steps)"));
  }
  if (!AllEqual(shapes)) out->push_back(absl::StrCat(what, "shape ", ByValue(shapes)));
  std::set<std::string> names;
  for (const TensorSummary* t : of_rank) {
    for (const SummaryField& f : t->fields) names.insert(f.name);
  }
  for (const std::string& name : names) {
    std::vector<std::string> values;
    bool hashed = false;
    for (const TensorSummary* t : of_rank) {
      const SummaryField* found = nullptr;
      for (const SummaryField& f : t->fields) {
        if (f.name == name) found = &f;
      }
      hashed |= found != nullptr && found->hashed;
      values.push_back(found == nullptr ? "none" : absl::StrCat(found->value));
    }
    if (AllEqual(values)) continue;
    if (!hashed) {
      out->push_back(absl::StrCat(what, name, " ", ByValue(values)));
      continue;
    }
    // A hash means nothing to a reader: say which ranks hold the same value.
    std::map<std::string, char> letter;
    for (std::string& v : values) {
      const char next = static_cast<char>('A' + letter.size() % 26);
      v = absl::StrCat("value ", std::string(1, letter.emplace(v, next).first->second));
    }
    out->push_back(absl::StrCat(what, name, " differs: ", ByValue(values)));
  }
}

// Every disagreement between the ranks' summaries, in (method, tensor) order.
std::vector<std::string> Disagreements(absl::Span<const LoadReport> reports) {
  const size_t n = reports.size();
  std::map<std::pair<std::string, std::string>, std::vector<const TensorSummary*>> keys;
  for (size_t r = 0; r < n; ++r) {
    for (const TensorSummary& t : reports[r].summary) {
      auto& of_rank = keys[{t.method, t.tensor}];
      of_rank.resize(n, nullptr);
      of_rank[r] = &t;
    }
  }
  std::vector<std::string> out;
  for (const auto& [key, of_rank] : keys) {
    std::vector<std::string> held;
    for (const TensorSummary* t : of_rank) held.push_back(t != nullptr ? "held" : "missing");
    if (!AllEqual(held)) {
      out.push_back(absl::StrCat("tensor '", key.second, "' (", key.first, "): ", ByValue(held),
                                 " (states of different models, or taken before and after "
                                 "its first step)"));
      continue;
    }
    Compare(of_rank, &out);
  }
  return out;
}

absl::Status SizeAndRankError(absl::Span<const LoadReport> reports, int world_size) {
  std::vector<std::string> sizes;
  bool other_size = false;
  for (const LoadReport& r : reports) {
    sizes.push_back(absl::StrCat(r.saved_world_size, r.saved_world_size == 1 ? " rank" : " ranks"));
    other_size |= r.saved_world_size != world_size;
  }
  if (other_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_compression_state: the states were saved by a job of ", ByValue(sizes),
        ", but this job has ", world_size,
        " (a state does not carry over to another world size)", kNoneLoaded));
  }
  std::map<int, std::vector<int>> by_saved;
  for (size_t r = 0; r < reports.size(); ++r) {
    by_saved[reports[r].saved_rank].push_back(static_cast<int>(r));
  }
  for (const auto& [saved, ranks] : by_saved) {
    if (ranks.size() < 2) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "load_compression_state: ", Ranks(ranks), " all restored the state saved by rank ", saved,
        " (each rank restores its own: error-feedback residuals are per rank)", kNoneLoaded));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SummaryDigest(const StateSummary& summary) {
  std::string bytes;
  StateWriter w(&bytes);
  WriteSummary(summary, w);
  return StableHash(bytes.data(), bytes.size());
}

std::string EncodeLoadReport(const LoadReport& report) {
  std::string out;
  StateWriter w(&out);
  w.U32(kReportVersion);
  w.U32(static_cast<uint32_t>(report.refused.code()));
  w.String(report.refused.message());
  w.U32(static_cast<uint32_t>(report.saved_rank));
  w.U32(static_cast<uint32_t>(report.saved_world_size));
  WriteSummary(report.summary, w);
  return out;
}

absl::StatusOr<LoadReport> DecodeLoadReport(absl::string_view bytes) {
  StateReader in(bytes, "compression state report");
  LoadReport r;
  in.Check(in.U32() == kReportVersion, "another version of braid");
  const uint32_t code = in.U32();
  const std::string message = in.String("message");
  in.Check(code <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated),
           absl::StrCat("status code ", code));
  if (code != 0 && in.status().ok()) {
    r.refused = absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  r.saved_rank = static_cast<int32_t>(in.U32());
  r.saved_world_size = static_cast<int32_t>(in.U32());
  // The least a tensor takes: empty method and name, steps, no dims, no fields.
  r.summary.resize(in.Count("tensor count", 8 + 8 + 8 + 4 + 4));
  for (TensorSummary& t : r.summary) {
    t.method = in.String();
    t.tensor = in.String();
    t.steps = in.I64();
    t.shape.resize(in.Count("dimension count", 8));
    for (int64_t& d : t.shape) d = in.I64();
    t.fields.resize(in.Count("field count", 8 + 8 + 4));
    for (SummaryField& f : t.fields) {
      f.name = in.String();
      f.value = in.U64();
      f.hashed = in.U32() != 0;
    }
    if (!in.status().ok()) break;
  }
  in.Check(in.done(), "bytes left over");
  if (!in.status().ok()) return in.status();
  return r;
}

absl::Status CheckLoadAgreement(absl::Span<const LoadReport> reports, int world_size) {
  std::vector<std::string> refusals;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (size_t r = 0; r < reports.size(); ++r) {
    const absl::Status& s = reports[r].refused;
    if (s.ok()) continue;
    if (code == absl::StatusCode::kOk) code = s.code();
    refusals.push_back(absl::StrCat("rank ", r, ": ", s.message()));
  }
  if (!refusals.empty()) {
    return absl::Status(code, absl::StrCat("load_compression_state: ",
                                           absl::StrJoin(refusals, "; "), kNoneLoaded));
  }
  absl::Status s = SizeAndRankError(reports, world_size);
  if (!s.ok()) return s;
  const uint64_t digest = SummaryDigest(reports[0].summary);
  bool same = true;
  for (const LoadReport& r : reports) same &= SummaryDigest(r.summary) == digest;
  if (same) return absl::OkStatus();
  std::vector<std::string> found = Disagreements(reports);
  if (found.empty()) found.push_back("their summaries differ");  // not reached: no field differs
  const size_t more = found.size() > kListed ? found.size() - kListed : 0;
  found.resize(found.size() - more);
  if (more > 0) found.push_back(absl::StrCat("and ", more, " more"));
  return absl::InvalidArgumentError(absl::StrCat(
      "load_compression_state: the ranks restored compression states that disagree: ",
      absl::StrJoin(found, "; "), kNoneLoaded));
}

}  // namespace braid::compression
