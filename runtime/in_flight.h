// What the negotiation controller and the executor share: the collectives in flight on this
// rank (Note [Threads and locks], runtime/runtime_impl.h).
#ifndef BRAID_RUNTIME_IN_FLIGHT_H_
#define BRAID_RUNTIME_IN_FLIGHT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "compression/stage.h"
#include "device/device.h"
#include "runtime/handle.h"
#include "runtime/runtime.h"

namespace braid {

// What Enqueue's checks give a collective they accept.
struct Accepted {
  Accepted(const compression::CompressionMethod* m = nullptr) : method(m) {}  // NOLINT
  // All-reduce: its compression, resolved once (never null); else null.
  const compression::CompressionMethod* method = nullptr;
  // All-reduce: the plan pattern its method came from (CollectiveRequest::
  // compression_pattern, bounded), "" when none did.
  std::string pattern;
  // Note [Devices] (device/device.h): for a device tensor, the point of the caller's stream
  // at which its input is ready (recorded at enqueue); braid's work on it waits for that.
  // Null for host memory.
  std::shared_ptr<device::Event> ready;
};

// One collective this rank enqueued and has not completed.
struct TensorEntry {
  CollectiveRequest req;
  std::shared_ptr<Handle> handle;
  // All-reduce: its compression, resolved once at enqueue (never null); else null.
  const compression::CompressionMethod* method = nullptr;
  std::string request_bytes;  // the proto::Request sent, serialized (response cache key)
  // Note [Fast path]: held for the ranks' vote instead of sent to the coordinator, since.
  bool fast = false;
  absl::Time fast_since;
  uint64_t seq = 0;  // enqueue order on this rank (Note [Barrier order], controller_order.cc)
  std::shared_ptr<device::Event> ready;  // Accepted::ready
};

// The executor's view of the table of collectives in flight, which the controller keeps.
class InFlight {
 public:
  virtual ~InFlight() = default;
  // The entry of `name`, or null. It stays put until Finish erases it, which only the
  // executor's thread does, so the executor reads it without a lock.
  virtual TensorEntry* Find(const std::string& name) = 0;
  // Completes the handles of `names` with `s` and forgets them (names no longer in flight,
  // failed meanwhile by an abort, are skipped).
  virtual void Finish(const std::vector<std::string>& names, const absl::Status& s) = 0;
  // The job cannot go on (a bucket names a tensor this rank never submitted): every pending
  // and later collective fails with `s`.
  virtual void Abort(const absl::Status& s) = 0;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_IN_FLIGHT_H_
