// The runtime's statistics ledger: what every all-reduce cost this rank, per tensor and per
// compression method, since Init. The pipeline books each bucket here; the bindings, the
// heartbeats (braidctl status) and C++ callers read it, none of them through compression/.
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
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

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

// 2(n-1)/n · bytes: what a bandwidth-optimal all-reduce sends per rank (0 for one rank).
uint64_t ReferenceTransportBytes(uint64_t bytes, int world_size);

class StatisticsLedger {
 public:
  // Books one reduction of tensor `name` under `method`. Thread-safe.
  void Record(absl::string_view name, absl::string_view method, const ByteStats& b);
  // A snapshot of every counter. Thread-safe.
  CompressionReport Report() const;
  // Only the per-method totals (CompressionReport::methods), kept up to date as reductions
  // are booked, so this costs O(methods) however many tensors there are: it is what each
  // heartbeat to the coordinator carries. Thread-safe.
  std::vector<MethodCompressionStats> MethodTotals() const;

 private:
  mutable absl::Mutex mu_;  // a leaf: nothing else is locked under it
  // Tensor name -> method -> counters (heterogeneous lookup: no key is built per booking).
  using Methods = std::map<std::string, ByteStats, std::less<>>;
  std::map<std::string, Methods, std::less<>> tensors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, MethodCompressionStats, std::less<>> totals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace braid

#endif  // BRAID_RUNTIME_STATISTICS_H_
