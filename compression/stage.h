// The compression stage as the runtime uses it: validates specs, keeps one Compressor per
// canonical spec (and with it the per-tensor state), runs warm-up steps uncompressed, and
// counts bytes.
//
// Byte counters (DESIGN.md), never mixed:
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
  // Only the per-method totals (CompressionReport::methods), kept up to date as reductions
  // are recorded, so this costs O(methods) however many tensors there are: it is what each
  // heartbeat to the coordinator carries. Thread-safe.
  std::vector<MethodCompressionStats> MethodTotals() const;

 private:
  struct Method {
    CompressionSpec spec;
    std::unique_ptr<Compressor> compressor;
  };
  absl::StatusOr<Method*> GetMethod(const std::string& spec);
  void Record(absl::string_view name, const std::string& method, const ByteStats& b);

  StageOptions options_;
  std::map<std::string, Method> methods_;  // background thread only
  // (canonical spec, tensor name) -> compressed reductions so far.
  std::map<std::pair<std::string, std::string>, int64_t> steps_;
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
