// The executor: runs agreed buckets (Note [Execution step], control/bucket.h) in the order
// every rank receives them, on the data plane, and completes their handles. All-reduces go
// through the pipeline (allreduce_pipeline.h: pack -> Compressor::Reduce -> unpack), every
// other collective straight to the data plane; the small exchanges that only size a
// collective (an all-to-all's splits) and barriers go over the control channel. It knows
// nothing of how buckets were agreed (the negotiation controller, controller.h): a bucket in,
// handles completed out.
//
// Threads: Run is called by one thread at a time (braid-loop); Abort, stats and
// FirstTimeout from any thread. No lock of the executor's is held across a data-plane call.
#ifndef BRAID_RUNTIME_EXECUTOR_H_
#define BRAID_RUNTIME_EXECUTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "compression/stage.h"
#include "control/bucket.h"
#include "runtime/allreduce_pipeline.h"
#include "runtime/auto_compression.h"
#include "runtime/data_planes.h"
#include "runtime/device_planes.h"
#include "runtime/in_flight.h"
#include "runtime/statistics.h"
#include "runtime/timeline.h"
#include "transport/channels.h"
#include "transport/communicator.h"

namespace braid {

class Executor {
 public:
  struct Parts {
    // Tensors go over the plane of their memory (Note [Data planes]); all-to-all split
    // exchanges and barriers over `control` (Note [Channels], transport/channels.h).
    const DataPlaneRegistry* planes = nullptr;
    transport::Communicator* control = nullptr;
    compression::CompressionStage* stage = nullptr;  // a joined rank's compression
    StatisticsLedger* ledger = nullptr;              // the pipeline books bytes there
    InFlight* in_flight = nullptr;                   // the entries buckets name
    // BRAID_PIPELINED_COPY (Note [Pipelined copy], runtime/allreduce_pipeline.h).
    bool pipelined_copy = true;
    // Note [Devices] (device/device.h): the devices buckets' tensors are on, and the longest
    // wait for a device's work (BRAID_TIMEOUT_S).
    // Shared: the fusion buffers the executor keeps on those devices are freed through them.
    std::shared_ptr<const device::DeviceRegistry> devices;
    absl::Duration device_timeout = absl::Seconds(60);
    // Note [GPU data planes] (runtime/device_planes.h): the NCCL plane of uncompressed GPU
    // buckets of the whole world; null: every GPU bucket is staged through the host.
    DevicePlanes* device_planes = nullptr;
    // The timeline events go to now, or null (runtime_impl.h: Impl::timeline()).
    std::function<std::shared_ptr<Timeline>()> timeline;
    // Note [Process sets] (control/process_sets.h): the ranks of a set (nullopt: none), the
    // channels of a set over the world's point-to-point layer (transport::Channels::subset;
    // null: only the whole world's set runs here), and what a change of the sets does
    // (called on braid-loop when its bucket runs, before its handle completes).
    std::function<std::optional<std::vector<int>>(int32_t)> process_set_ranks;
    std::function<transport::Channels(uint32_t, const std::vector<int>&)> set_channels;
    std::function<void(const Bucket&)> apply_process_set_change;
    // Note [Auto compression]: the method `auto` buckets run with; null: as none.
    AutoCompression* auto_compression = nullptr;
  };
  // Every part outlives the executor.
  explicit Executor(const Parts& parts);

  // Runs `bucket` (an error bucket fails its tensors) and completes the handles of its
  // tensors through InFlight::Finish. A bucket naming a tensor this rank never submitted
  // (and did not join for, Note [Join]) aborts the job through InFlight::Abort.
  //
  // Note [Poisoned data plane]: a bucket that timed out on the data plane (DeadlineExceeded)
  // or could not grow its fusion buffer (ResourceExhausted, Note [Allocation failure]) leaves
  // the data plane aborted mid-collective: no later collective of this rank can pair with
  // its peers' again. So its error also aborts the job through InFlight::Abort: every
  // pending and later collective of this rank fails at once with that same error, rather
  // than negotiating first (which waits on peers that may never answer) and failing only on
  // the data plane. Buckets already agreed fail with it too.
  void Run(const Bucket& bucket);

  // Fails the collective in flight on every data plane and the control channel at once, and
  // every later one (transport::Communicator::Abort). Thread-safe; never waits for Run.
  void Abort(const absl::Status& s);

  // The first data-plane timeout of the job (a bucket's, naming its tensors, or the fast
  // path's vote's): `s` when none was kept yet, which is then kept. Every bucket that fails
  // with a timeout after the first reports the first: the data plane is poisoned by then
  // and repeats it.
  absl::Status FirstTimeout(const absl::Status& s);

  // The counters of the data planes and the control channel together, as of the last bucket
  // that finished.
  transport::TransportStats stats() const;

 private:
  // `timeline`: where the pipeline records the bucket's phases, or null.
  // `s`, after aborting the data plane with it: a bucket that fails on this rank before its
  // collectives started leaves the peers inside them (Note [Allocation failure]). A GPU
  // bucket's peers may be in NCCL or in the control channel: every plane is aborted then,
  // and the job ends (Note [GPU data planes], runtime/device_planes.h).
  absl::Status NotRun(const absl::Status& s);
  // Where an all-reduce bucket's tensors are: `own` (this rank's first entry of it, null when
  // it joined for all of them) says, else this rank's last device of the bucket's type.
  absl::StatusOr<BucketPlace> PlaceOf(const Bucket& bucket, const TensorEntry* own);
  absl::Status RunAllReduce(const Bucket& bucket, const std::vector<TensorEntry*>& entries,
                            Timeline* timeline);
  // The data plane of an all-reduce bucket at `place` under `method`: the host's, or the
  // NCCL plane's (Note [GPU data planes], runtime/device_planes.h; place->device_plane then
  // set). Errors: DevicePlanes::For's, every rank's alike.
  // Note [Auto compression]: the method an `auto` bucket runs with, into `method`; the
  // tensors' patterns become their AutoCompressionPattern (runtime/statistics.h), so their
  // bytes count in groups that say auto chose the method.
  absl::Status ChooseAuto(const Bucket& bucket, std::vector<AllReduceTensor>* tensors,
                          DataType dtype, ReduceOp op,
                          const compression::CompressionMethod** method);
  absl::StatusOr<transport::Communicator*> PlaneOf(const Bucket& bucket,
                                                   const compression::CompressionMethod& method,
                                                   BucketPlace* place);
  absl::Status RunCollective(TensorEntry& e, const Bucket& bucket);
  absl::Status RunAllGather(TensorEntry& e, const Bucket& bucket);
  absl::Status RunReduceScatter(TensorEntry& e);
  absl::Status RunAllToAll(TensorEntry& e);
  // Note [Join]: this rank has joined and takes part in `bucket` without entries of its own.
  bool JoinedIn(const Bucket& bucket) const;
  absl::Status RunJoined(const Bucket& bucket);
  // The entries of the bucket's tensors (null where this rank joined); false when it named
  // one this rank never submitted (the job is aborted then).
  bool Resolve(const Bucket& bucket, std::vector<TensorEntry*>* entries);
  // A failed bucket's error naming its tensors: a timeout's (DataPlaneTimeout), a GPU
  // bucket's that does not name them already; else `s`.
  absl::Status Named(const Bucket& bucket, const absl::Status& s);
  // The error of a bucket whose collective timed out on the data plane (`s`, which names
  // the peers waited on, transport/context.h): the same, naming the bucket's tensors too.
  absl::Status DataPlaneTimeout(const Bucket& bucket, const absl::Status& s);
  // Whether the bucket may travel the NCCL plane if it is on a GPU (Note [GPU data planes]):
  // uncompressed, of the whole world, in a runtime with GPU planes.
  bool MayRunOnNccl(const Bucket& bucket, const compression::CompressionMethod& method) const {
    return parts_.device_planes != nullptr && method.is_none() && bucket.process_set_id == 0;
  }
  // "allreduce of tensors 'a', 'b' (bucket 7)": the bucket as errors name it.
  static std::string BucketNamed(const Bucket& bucket);
  void Finish(const std::vector<std::string>& names, const absl::Status& s);
  // Note [Poisoned data plane]: the error that aborted the data plane, or OK.
  absl::Status Poisoned() const;
  void Poison(const absl::Status& s);

  // The host data plane (Note [Data planes]): a bucket's memory kind comes with device
  // tensors; until then every bucket is host memory. The bucket's process set's, while it
  // runs (Note [Process sets]).
  transport::Communicator& HostPlane() const { return *cur_.data; }

  // The communicators a bucket runs on: the world's, or its process set's, with this
  // rank's rank in them and their size.
  struct Comms {
    transport::Communicator* data = nullptr;
    transport::Communicator* control = nullptr;
    int rank = 0;
    int size = 1;
    const std::vector<int>* ranks = nullptr;  // the set's, ascending; null: the world
  };
  // False when this rank is not in the bucket's set (it skips the bucket); an error when
  // the set is unknown here.
  absl::StatusOr<bool> SelectComms(const Bucket& bucket);
  Comms WorldComms() const;  // the whole job's
  // Runs a change of the process sets and completes its handle.
  void RunProcessSetChange(const Bucket& bucket);
  struct SetChannels {
    std::vector<int> ranks;
    transport::Channels channels;
  };

  const Parts parts_;
  const int rank_;
  const int size_;
  Comms cur_;  // the bucket's (braid-loop's alone)
  std::map<int32_t, SetChannels> set_channels_;  // braid-loop's alone, by set id
  // Where a collective whose result size the runtime decides writes: the caller's
  // allocator's memory (CollectiveRequest::allocate_output), the output the caller sized, or
  // one the handle owns when the caller gave neither (or too little). An allocator that
  // fails is ResourceExhausted naming the tensor, with the data plane aborted (Note
  // [Allocation failure]: the peers are in the collective), which ends the job.
  absl::StatusOr<void*> OutputFor(TensorEntry& e, size_t bytes, std::vector<int64_t> shape,
                                  bool caller_sized);

  // Declared before the pipeline, whose fusion buffers are freed through these devices.
  std::shared_ptr<const device::DeviceRegistry> devices_;
  AllReducePipeline pipeline_;
  std::map<DeviceType, DeviceRef> last_device_;  // per type, the last a bucket of ours used
  std::vector<std::string> auto_patterns_;  // braid-loop's: ChooseAuto's, viewed by tensors
  // braid-loop's: the bucket running is on a GPU; it failed here before its collectives
  // (NotRun), which ends the job once it is done.
  bool gpu_bucket_ = false;
  bool nccl_candidate_ = false;  // ... and may run on NCCL (uncompressed, the whole world)
  bool gpu_not_run_ = false;
  mutable absl::Mutex mu_;  // a leaf
  absl::Status first_timeout_ ABSL_GUARDED_BY(mu_);
  absl::Status poisoned_ ABSL_GUARDED_BY(mu_);  // Note [Poisoned data plane]
  transport::TransportStats stats_ ABSL_GUARDED_BY(mu_);
  transport::TransportStats removed_sets_stats_;  // braid-loop's: channels of removed sets
};

}  // namespace braid

#endif  // BRAID_RUNTIME_EXECUTOR_H_
