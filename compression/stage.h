// The compression stage as the runtime uses it: validates specs, keeps one Compressor per
// canonical spec (and with it the per-tensor state), runs warm-up steps uncompressed, and
// counts bytes.
//
// Byte counters, never mixed:
//   uncompressed_bytes  the tensor's bytes in its own dtype, per reduction;
//   payload_bytes       the compressed representation this rank contributed (what a
//                       compression ratio divides);
//   transport_bytes     what this rank actually sent on the data plane for it (measured);
//   reference_transport_bytes  what a bandwidth-optimal all-reduce of the uncompressed
//                       tensor sends per rank, 2(n-1)/n · uncompressed_bytes (n ranks), so
//                       transport savings compare against the same yardstick for every method.
// Warm-up reductions (start_step) count under their method with payload = uncompressed.
#ifndef BRAID_COMPRESSION_STAGE_H_
#define BRAID_COMPRESSION_STAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "compression/compressor.h"
#include "compression/registry.h"

namespace braid::compression {

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
  std::string method;  // canonical spec, "none" for uncompressed
  ByteStats bytes;
};

struct MethodCompressionStats {
  std::string method;
  uint64_t tensors = 0;  // distinct tensor names reduced with it
  ByteStats bytes;
};

struct CompressionReport {
  std::vector<MethodCompressionStats> methods;  // sorted by method
  std::vector<TensorCompressionStats> tensors;  // sorted by (name, method)
};

struct StageOptions {
  uint64_t seed = 0;  // BRAID_SEED: stochastic rounding streams derive from it
  RegistryOptions registry;
};

class CompressionStage {
 public:
  explicit CompressionStage(const StageOptions& options) : options_(options) {}

  // The canonical form of `spec` ("" and "none" give "none"); InvalidArgument as
  // ParseCompressionSpec. Thread-safe.
  absl::StatusOr<std::string> Canonicalize(absl::string_view spec) const;

  // Reduces one bucket in place with the compressor of canonical spec `spec` (not "none").
  // `element_bytes` is the size of the tensors' own dtype (for the uncompressed counters).
  // Tensors still in their warm-up (start_step) are all-reduced as float32 instead.
  // Background thread only.
  absl::Status Reduce(const std::string& spec, absl::Span<const TensorView> tensors,
                      size_t element_bytes, ReduceOp op, transport::Communicator& comm);

  // Counts one uncompressed ("none") reduction of `bytes` bytes, of which this rank sent
  // `transport_bytes`. Background thread only.
  void RecordUncompressed(absl::string_view name, uint64_t bytes, uint64_t transport_bytes,
                          int world_size);

  // A snapshot of every counter. Thread-safe.
  CompressionReport Report() const;

  // Checkpointing (a training checkpoint keeps this next to the model): this rank's
  // compression state, i.e. per method the state its Compressor keeps across steps
  // (Compressor::SaveState: PowerSGD's Q and residuals, ...) and the step counter of every
  // tensor (warm-up and random streams follow it), so that LoadState in a new job continues
  // bit-identically. The state is per rank (residuals differ across ranks). Format, integers
  // little-endian, lengths in bytes:
  //   "BRDCMPST" (8 bytes), version u32 = 1, rank i32, world size i32, method count u32,
  //   then per method:
  //     spec: u64 length + bytes (canonical, e.g. "powersgd:rank=2"),
  //     tensor count u32, per tensor: name (u64 length + bytes), reductions so far i64,
  //     compressor state: u64 length + bytes (the method's own format, e.g. powersgd.h;
  //     empty when it keeps none).
  // Thread-safe; waits for a bucket being reduced. Byte counters are not part of the state.
  std::string SaveState(int rank, int world_size) const;
  // Restores a SaveState result: each method in it gets a fresh compressor holding its
  // saved state, and its tensors' step counters; methods not in it are left as they are.
  // A state saved on another rank or world size loads with a warning (the residuals are
  // that rank's). InvalidArgument, with nothing changed, when `state` is malformed, names an
  // unknown method or holds a state its compressor refuses. Thread-safe.
  absl::Status LoadState(absl::string_view state, int rank, int world_size);
  // Only the per-method totals (CompressionReport::methods), kept up to date as reductions
  // are recorded, so this costs O(methods) however many tensors there are: it is what each
  // heartbeat to the coordinator carries. Thread-safe.
  std::vector<MethodCompressionStats> MethodTotals() const;

 private:
  struct Method {
    CompressionSpec spec;
    std::unique_ptr<Compressor> compressor;
  };
  absl::StatusOr<Method*> GetMethod(const std::string& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  void Record(absl::string_view name, const std::string& method, const ByteStats& b);

  StageOptions options_;
  // Held by Reduce for a whole bucket and by SaveState / LoadState (lock order: state_mu_,
  // then mu_).
  mutable absl::Mutex state_mu_;
  std::map<std::string, Method> methods_ ABSL_GUARDED_BY(state_mu_);
  // (canonical spec, tensor name) -> reductions so far (warm-up included).
  std::map<std::pair<std::string, std::string>, int64_t> steps_ ABSL_GUARDED_BY(state_mu_);
  // Scratch for one Reduce call.
  std::vector<uint64_t> payload_;
  std::vector<int64_t> step_values_;

  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, ByteStats> stats_ ABSL_GUARDED_BY(mu_);
  // The sums of stats_ per method (the same numbers Report() derives), by method.
  std::map<std::string, MethodCompressionStats> totals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_STAGE_H_
