// What the ranks of a job must agree on after restoring compression states, and the check that
// they do (Note [Restoring compression state]).
//
// Note [Restoring compression state]
// A compression state (CompressionStage::SaveState) is per rank: error-feedback residuals
// differ by rank. But most of it must be the same on every rank, or the next step goes wrong
// without an error: the step counters decide warm-up (start_step), scalecomp's leader, the
// random streams of fp4/int4/randomk and PowerSGD's Q draws, and PowerSGD's Q itself is
// identical on every rank after every step. Ranks that restored states taken at different
// steps, from another model or from another world size would run different collectives (a
// hang until the timeout), sum misaligned values (a wrong mean) or fail with an internal size
// error. So restoring is collective: every rank parses its state (refusing a malformed one by
// its declared sizes), summarizes what must agree (TensorSummary: per method and tensor the
// step counter, the shape and the compressor's SharedStateFields), and the ranks all-gather
// those summaries (LoadReport). Every rank then runs CheckLoadAgreement on the same reports,
// so every rank reaches the same verdict: all apply their state, or none does and all return
// the same error naming the ranks, the tensors and the fields that differ.
// A state also carries the digest of its own summary (stage.h), so what a summary holds
// (TensorSummary, each compressor's SharedStateFields) is part of the state format:
// changing it needs a new format version.
#ifndef BRAID_COMPRESSION_STATE_SUMMARY_H_
#define BRAID_COMPRESSION_STATE_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace braid::compression {

struct SummaryField {
  std::string name;     // SharedStateField::field
  uint64_t value = 0;
  bool hashed = false;  // SharedStateField::hashed
  bool operator==(const SummaryField& o) const {
    return name == o.name && value == o.value && hashed == o.hashed;
  }
};

// One tensor of one method, as every rank must hold it.
struct TensorSummary {
  std::string method;  // canonical spec
  std::string tensor;
  int64_t steps = 0;           // reductions so far, warm-up included
  std::vector<int64_t> shape;  // of its last reduction (empty: unknown, in a version 1 state)
  std::vector<SummaryField> fields;  // sorted by name
};
// Sorted by (method, tensor).
using StateSummary = std::vector<TensorSummary>;

// A stable 64-bit digest of a summary (the same in every process and run).
uint64_t SummaryDigest(const StateSummary& summary);

// One rank's part of the check.
struct LoadReport {
  absl::Status refused;  // OK, or why this rank could not load its state (malformed, ...)
  int saved_rank = -1, saved_world_size = -1;
  StateSummary summary;  // of the state this rank would hold after loading
};

// The wire form of a report between the ranks of one job (one build of braid).
std::string EncodeLoadReport(const LoadReport& report);
// InvalidArgument when `bytes` is not a report (checked by its declared sizes).
absl::StatusOr<LoadReport> DecodeLoadReport(absl::string_view bytes);

// `reports[r]` is rank r's. OK when every rank loaded a state saved by a job of
// `world_size` ranks, no two ranks loaded the same rank's state, and every summary is the
// same; else the error every rank returns: the code of the lowest rank's refusal (when some
// rank refused its state) or InvalidArgument, naming ranks, tensors and fields, and saying
// that no rank loaded its state.
absl::Status CheckLoadAgreement(absl::Span<const LoadReport> reports, int world_size);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_STATE_SUMMARY_H_
