// The runtime's statistics ledger: what every all-reduce cost this rank, per tensor, per
// compression method and per group of tensors (Note [Compression groups] in
// control/compression_groups.h: the method and the plan pattern that gave it), since Init.
// The pipeline books each bucket here; the bindings, the heartbeats (braidctl status) and
// C++ callers read it, none of them through compression/.
//
// Byte counters, never mixed:
//   uncompressed_bytes  the tensor's bytes in its own dtype, per reduction;
//   payload_bytes       the representation this rank contributed (what a compression ratio
//                       divides). A method's payload counts every tensor negotiated under its
//                       spec: what the compressor sends for it, including tensors it sends
//                       uncompressed (1-D tensors under PowerSGD: count·4 bytes), and the
//                       whole tensor for a warm-up step (start_step) and for none;
//   transport_bytes     what this rank actually sent on the data plane for it (measured per
//                       bucket, apportioned to its tensors by payload);
//   reference_transport_bytes  what a bandwidth-optimal all-reduce of the uncompressed
//                       tensor sends per rank, 2(n-1)/n · uncompressed_bytes (n ranks), so
//                       transport savings compare against one yardstick for every method.
#ifndef BRAID_RUNTIME_STATISTICS_H_
#define BRAID_RUNTIME_STATISTICS_H_

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "control/compression_groups.h"

namespace braid {

struct ByteStats {
  uint64_t reductions = 0;
  uint64_t uncompressed_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t transport_bytes = 0;
  uint64_t reference_transport_bytes = 0;

  void Add(const ByteStats& o);
  // uncompressed_bytes / payload_bytes (0 when nothing was sent).
  double compression_ratio() const;
};

struct TensorCompressionStats {
  std::string name;
  std::string method;   // canonical spec, "none" for uncompressed
  std::string pattern;  // its group's pattern (CompressionGroupStats::pattern)
  ByteStats bytes;
};

struct MethodCompressionStats {
  std::string method;
  // Distinct tensor names reduced with it; a name the per-tensor table dropped (Note
  // [Bounded per-tensor statistics]) counts again when it comes back.
  uint64_t tensors = 0;
  ByteStats bytes;
};

// Note [Compression groups] (control/compression_groups.h): the all-reduces of one method
// whose compression came from one plan pattern.
struct CompressionGroupStats {
  std::string method;
  // The plan pattern that gave the method ("*.bias"); "" when no plan did (a single spec,
  // the job's or the call's); under compression `auto`, the pattern with " (auto)" after it,
  // or "(auto)" alone (AutoCompressionPattern); control::kOtherPatterns for the patterns
  // beyond control::kMaxCompressionGroups.
  std::string pattern;
  uint64_t tensors = 0;  // distinct tensor names, as MethodCompressionStats::tensors
  ByteStats bytes;
};

// The pattern a tensor whose compression is `auto` books its bytes under, with the method auto
// chose for it (Note [Auto compression], runtime/auto_compression.h): "(auto)" when `pattern`
// (its plan pattern) is empty, else "<pattern> (auto)".
std::string AutoCompressionPattern(absl::string_view pattern);

// What fusion cost this rank (Note [One pipeline], runtime/allreduce_pipeline.h): every
// all-reduce bucket either goes through the fusion buffer (copied or converted in, and as
// many bytes back out) or is reduced where its tensors lie (a lone tensor, or a bucket whose
// tensors lie back to back, as gradients allocated as bucket views do).
struct FusionStats {
  uint64_t buckets = 0;         // all-reduce buckets run
  // Those that went through the fusion buffer, and their bytes: packed there, or gathered
  // through it (Note [Pipelined copy], runtime/allreduce_pipeline.h: only the pipeline
  // pieces that span tensors are copied, but the whole bucket counts).
  uint64_t packed_buckets = 0;
  uint64_t packed_bytes = 0;
  uint64_t in_place_bytes = 0;  // bytes of the buckets reduced where they lie
};

struct CompressionReport {
  std::vector<MethodCompressionStats> methods;  // sorted by method
  // Sorted by (method, pattern); bounded (Note [Compression groups]).
  std::vector<CompressionGroupStats> groups;
  // Sorted by (name, method, pattern); the kMaxTensorStats names reduced most recently at most.
  std::vector<TensorCompressionStats> tensors;
  FusionStats fusion;
};

// Note [Bounded per-tensor statistics]
// A job that all-reduces a new name every step (names with a step number in them) would grow
// the per-tensor table by an entry per step for ever (20,000 entries, 5 MB after 20,000
// steps). So the table keeps the kMaxTensorStats names reduced most recently and drops the
// least recently reduced name when a new one comes (a model's gradients, reduced every step,
// stay). The per-method and per-group totals are booked apart from the table and stay exact
// whatever it drops: reductions and bytes always; `tensors` counts a dropped name again if
// it returns.
// 4096 is four times the response cache's default capacity (BRAID_CACHE_CAPACITY), so every
// name the cache can hold fits, with room for names that come and go.
inline constexpr size_t kMaxTensorStats = 4096;

// 2(n-1)/n · bytes: what a bandwidth-optimal all-reduce sends per rank (0 for one rank).
uint64_t ReferenceTransportBytes(uint64_t bytes, int world_size);

class StatisticsLedger {
 public:
  // `max_tensors`: the names the per-tensor table keeps (Note [Bounded per-tensor
  // statistics]); at least 1.
  explicit StatisticsLedger(size_t max_tensors = kMaxTensorStats);

  // Books one reduction of tensor `name` under `method`, its compression given by the plan
  // pattern `pattern` ("" for none; CompressionGroupStats::pattern), in its group (Note
  // [Compression groups]: past the bound, its method's kOtherPatterns group). Thread-safe.
  void Record(absl::string_view name, absl::string_view method, absl::string_view pattern,
              const ByteStats& b);
  // The same with no plan pattern.
  void Record(absl::string_view name, absl::string_view method, const ByteStats& b) {
    Record(name, method, "", b);
  }
  // Books one all-reduce bucket: `packed_bytes` written into the fusion buffer (0 when it was
  // reduced where it lies), `bytes` its size in its own dtype. Thread-safe.
  void RecordBucket(bool packed, uint64_t packed_bytes, uint64_t bytes);
  // A snapshot of every counter. Thread-safe.
  CompressionReport Report() const;
  // Only the per-method totals (CompressionReport::methods), kept up to date as reductions
  // are booked, so this costs O(methods) however many tensors there are: it is what each
  // heartbeat to the coordinator carries. Thread-safe.
  std::vector<MethodCompressionStats> MethodTotals() const;
  // Only the per-group totals (CompressionReport::groups), likewise O(groups): what each
  // heartbeat carries for braidctl status's groups. Thread-safe.
  std::vector<CompressionGroupStats> GroupTotals() const;

 private:
  // A name's counters, per method and pattern, and its place in the recency list.
  struct Entry;
  using Patterns = std::map<std::string, ByteStats, std::less<>>;
  using Methods = std::map<std::string, Patterns, std::less<>>;
  // Tensor name -> its entry (heterogeneous lookup: no key is built per booking).
  using Table = std::map<std::string, Entry, std::less<>>;
  struct Entry {
    Methods methods;
    std::list<Table::iterator>::iterator recency;
  };
  // `name`'s entry, made the most recently booked (made anew, dropping the least recently
  // booked name when the table is full: Note [Bounded per-tensor statistics]).
  Entry& Touch(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<CompressionGroupStats> GroupsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_tensors_;
  mutable absl::Mutex mu_;  // a leaf: nothing else is locked under it
  Table tensors_ ABSL_GUARDED_BY(mu_);
  // tensors_'s entries, the most recently booked first (map iterators stay valid).
  std::list<Table::iterator> recency_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, MethodCompressionStats, std::less<>> totals_ ABSL_GUARDED_BY(mu_);
  struct GroupCounts {
    uint64_t tensors = 0;
    ByteStats bytes;
  };
  control::CompressionGroups<GroupCounts> groups_ ABSL_GUARDED_BY(mu_);
  FusionStats fusion_ ABSL_GUARDED_BY(mu_);
};

}  // namespace braid

#endif  // BRAID_RUNTIME_STATISTICS_H_
