// Note [Data planes]: the executor takes the data plane that carries a bucket's tensors from
// a small registry keyed by where the tensors' memory is. Host memory has the host data
// plane (UCX; the in-process transport in tests). A plane for device memory is one more
// entry here, not an edit of the executor. Control traffic never goes through the registry:
// it has its own channel (Note [Channels], transport/channels.h).
#ifndef BRAID_RUNTIME_DATA_PLANES_H_
#define BRAID_RUNTIME_DATA_PLANES_H_

#include <map>

#include "absl/status/status.h"
#include "transport/communicator.h"

namespace braid {

// Where a collective's tensors live, as far as the data plane cares.
enum class MemoryKind { kHost };

// Not thread-safe to change: filled once by the composition root before the executor runs;
// then read-only (For, ForEach) on braid-loop, Abort from any thread through the planes'
// own thread-safe Abort.
class DataPlaneRegistry {
 public:
  // `plane` outlives the registry's use.
  void Add(MemoryKind kind, transport::Communicator* plane) { planes_[kind] = plane; }
  // The plane for `kind`; null when there is none.
  transport::Communicator* For(MemoryKind kind) const {
    auto it = planes_.find(kind);
    return it == planes_.end() ? nullptr : it->second;
  }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [kind, plane] : planes_) fn(*plane);
  }

 private:
  std::map<MemoryKind, transport::Communicator*> planes_;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_DATA_PLANES_H_
