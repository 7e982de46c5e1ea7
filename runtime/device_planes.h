// Note [GPU data planes]
//   A bucket on a GPU (memory the host cannot read) travels one of two planes:
//     NCCL         the bucket's tensors reduced where they are, by NCCL, on braid's stream
//                  (transport/nccl_communicator.h); uncompressed buckets only, since
//                  braid's compressors run on the host today;
//     host-staged  copied to the host, compressed and reduced there over the host data plane,
//                  copied back (Note [Host staging], runtime/allreduce_pipeline.h): every
//                  method, and several ranks on one GPU.
//   BRAID_GPU_DATA_PLANE, a job setting (every rank the same), chooses: `host` always
//   stages; `nccl` runs uncompressed buckets on NCCL or fails them; `auto` (the default)
//   runs them on NCCL where every rank can, and stages them otherwise.
//
//   Nothing of NCCL starts in a job that never reduces an uncompressed GPU bucket. At the
//   job's first such bucket, which every rank reaches at the same point of the agreed order,
//   the ranks exchange over the control channel whether each can run NCCL (the library
//   loads) and which physical GPU it is on (Device::identity); NCCL cannot run two ranks on
//   one GPU. If all can, rank 0 makes the communicator's unique id and broadcasts it over the
//   control channel, and every rank creates its communicator on the GPU of its tensors of
//   that bucket (within BRAID_TIMEOUT_S, Note [NCCL watchdog]). Otherwise `auto` stages the
//   job's GPU buckets from then on, saying why once in the log, and `nccl` fails them on
//   every rank with FailedPrecondition naming the ranks and the reason. Every rank decides
//   from the same exchanged facts, so all decide alike. One decision per job, not per GPU:
//   which GPU a rank's bucket is on is the rank's own, and a second exchange that some
//   ranks start and others do not would pair with their other control messages. So NCCL
//   runs one GPU per rank (as Horovod's and DDP's one process per GPU): a later bucket on
//   another GPU of this rank fails, ending the job (its peers wait for it in NCCL), with an
//   error that says so; a joined rank reduces on the communicator's GPU. The unique id thus
//   travels over braid's own control channel, not the registration reply: the GPU is known
//   only at that first bucket, and rank 0 is known to itself only once registered.
#ifndef BRAID_RUNTIME_DEVICE_PLANES_H_
#define BRAID_RUNTIME_DEVICE_PLANES_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "transport/communicator.h"
#include "transport/nccl_api.h"

namespace braid {

// BRAID_GPU_DATA_PLANE; the values are the job setting's wire values (proto JobSettings).
enum class GpuDataPlane { kAuto = 0, kNccl = 1, kHost = 2 };

// The NCCL of this process (device::DefaultNccl, or a test double); an error says why there
// is none. Called once at most, on braid-loop.
using NcclProvider = std::function<absl::StatusOr<transport::NcclApi*>()>;

class DevicePlanes {
 public:
  // `control` outlives this; `timeout` bounds the NCCL communicators' calls.
  DevicePlanes(GpuDataPlane setting, NcclProvider nccl, transport::Communicator* control,
               absl::Duration timeout);
  ~DevicePlanes();

  // The NCCL communicator that carries the uncompressed GPU bucket on `device`, or null when
  // it is staged through the host (Note [GPU data planes]). The first call runs the ranks'
  // exchange and, where NCCL runs, creates the communicator on `device`: every rank makes it
  // for the same bucket (braid-loop, the job's first uncompressed GPU all-reduce, in the
  // agreed order), whatever GPU each uses. Errors: FailedPrecondition under `nccl` when a
  // rank cannot run it (every rank alike); the control channel's; the communicator's
  // creation's (a decision's error is returned by every later call too). *this_rank_only
  // is set for the errors that are this rank's alone, which its peers' NCCL calls wait on:
  // its communicator's creation failed, or FailedPrecondition for a bucket on another GPU
  // than the communicator's (NCCL runs one GPU per rank).
  // Whether the job's GPU buckets are staged through the host (decided so, without error).
  bool staged() const;
  absl::StatusOr<transport::Communicator*> For(device::Device& device, bool* this_rank_only);
  // The GPU of the NCCL communicator, once made (a joined rank reduces there); else null.
  device::Device* nccl_device() const;

  // Thread-safe: aborts the NCCL communicator (transport::Communicator::Abort), and its
  // creation if under way.
  void Abort(const absl::Status& s);
  // The NCCL communicator's counters (braid-loop, where they count).
  transport::TransportStats stats() const;

 private:
  struct Plane {
    std::unique_ptr<transport::Communicator> nccl;  // null: staged
    absl::Status error;                             // the decision's, repeated
    bool error_is_own = false;  // the communicator's creation failed here, not everywhere
    std::string why;                                // how it travels, and why (logged)
  };
  // Runs the exchange and makes the plane of `device` (Note [GPU data planes]).
  Plane Decide(device::Device& device);
  // Every rank's facts over the control channel: `reasons` gets why NCCL cannot run (ranks
  // without it, ranks sharing a GPU); empty when it can. Errors: the control channel's.
  absl::Status Exchange(device::Device& device, const absl::StatusOr<transport::NcclApi*>& api,
                        std::vector<std::string>* reasons);
  // Rank 0's unique id to every rank into `id`, or why it has none into `reasons`.
  absl::Status ShareId(const absl::StatusOr<transport::NcclApi*>& api,
                       transport::NcclUniqueId* id, std::vector<std::string>* reasons);

  const GpuDataPlane setting_;
  NcclProvider nccl_;
  transport::Communicator* const control_;
  const absl::Duration timeout_;
  // The decision for `device` once made.
  absl::StatusOr<transport::Communicator*> Use(device::Device& device, bool* this_rank_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;  // guards the decision against Abort from other threads
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  Plane plane_ ABSL_GUARDED_BY(mu_);
  device::Device* plane_device_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);  // Abort's reason, for a plane made after it
};

}  // namespace braid

#endif  // BRAID_RUNTIME_DEVICE_PLANES_H_
