// The coordinator's handlers, free of gRPC types: rendezvous, negotiation streams, heartbeats,
// status, shutdown and the key-value store, over plain proto messages, completion callbacks
// and StreamSinks. server.cc adapts them to gRPC's callback API; tests/unit drives them
// directly, with a fake clock.
//
// Note [One job at a time]: the service runs one Job at a time. A job forms as its ranks
// register, runs, and ends when every rank has shut down or was lost. A registration that
// arrives while a job runs waits (up to the register timeout) for it to end: a rank that
// shut down may init again before its peers have left. The first registration after the end
// starts the next job, a new Job with every counter and table at zero; status then describes
// the new job, and the ended one stays readable by its id until the job after that starts.
// A coordinator that serves one job only (braidrun's, or the one rank 0 hosts) refuses at
// once a registration that arrives while its job runs from a process that is none of the
// job's ranks: it is another job's rank, pointed at the same port.
//
// Note [Elastic membership]: under braidrun --min-np/--max-np each job is one membership of
// an elastic job, its id the membership number. A rank lost ends the membership: every
// survivor's pending and later collectives fail (Unavailable, naming the lost rank), and
// braid.torch.elastic restores the last commit, shuts down and registers again (without a
// rank or a world size of its own). Those registrations wait for the membership to end (every
// rank shut down or lost) and form the next one once as many ranks registered as braidrun
// counts processes still running (asked again as each registers and at every Inspect, so a
// process that dies during the change lowers the count instead of stalling it). A token of
// an earlier membership is refused (Job::CheckToken), and each membership's ranks open new
// data-plane endpoints, so nothing of the old membership reaches the new one.
//
// Ranks leave gracefully too (Horovod's host removal): braidrun drains the processes of a host
// its discovery script no longer lists. Heartbeats count the membership's ranks that leave
// (HeartbeatResponse.ranks_leaving) as they count the processes waiting to join; at the next
// commit braid.torch.elastic ends the membership without a restore (HostsUpdatedInterrupt),
// and a leaving process's registration is refused with kElasticLeave's reason
// (ServiceOptions::elastic_admit): it shuts down and exits 0, the others form the next
// membership without it.
//
// Every handler first admits its caller (Note [Who may join] in admission.h).
#ifndef BRAID_COORDINATOR_SERVICE_H_
#define BRAID_COORDINATOR_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/admission.h"
#include "coordinator/job.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

// The start of the reason a drained process's registration is refused with (Failed
// Precondition): braid.torch.elastic recognises its own departure by it (the Python module's
// ELASTIC_LEAVE).
inline constexpr char kElasticLeave[] = "this process leaves the elastic job";

struct ServiceOptions {
  // World size; 0 takes it from the first rank that registers (per job).
  int world_size = 0;
  // Every call must present this secret (Note [Who may join]); "" refuses every call.
  std::string job_secret;
  // Register waits this long for the whole world (and for a running job to end).
  absl::Duration register_timeout = absl::Seconds(120);
  // One job only at a time, and a registration while it runs is refused at once instead of
  // waiting for it to end (Note [One job at a time]).
  bool single_job = false;
  // Bounds of each job's key-value store.
  KeyValueLimits kv_limits;
  // The coordinator's own job settings (Note [Job settings]); absent fields: the ranks'.
  proto::JobSettings settings;
  // Time source; null: absl::Now. Tests step a fake clock and call Inspect().
  std::function<absl::Time()> clock;
  // Told of every rank declared lost (Job::Options::on_rank_lost); may be null.
  std::function<void(int rank, int worker, const std::string& why)> on_rank_lost;
  // Set: the jobs are the memberships of one elastic job (Note [Elastic membership]), each
  // as large as this says when it forms (braidrun: its ranks' processes that still run).
  std::function<absl::StatusOr<int>()> elastic_world_size;
  // Elastic: OK when process `worker` (RegisterRequest.worker) may join the next membership;
  // else the reason it leaves the job (braidrun drains it), which its registration fails
  // with (asked as it arrives and again while it waits: Job::Options::elastic_admit).
  // elastic_leaving: whether a rank's process is drained, counted in HeartbeatResponse.
  // ranks_leaving while it is a rank. Asked under the service's lock (they must return at
  // once). May be null.
  std::function<absl::Status(int worker)> elastic_admit;
  std::function<bool(int worker)> elastic_leaving;
  // Under BRAID_AUTOTUNE (Note [Autotuning] in autotune.h): the search's parameters.
  AutotuneOptions autotune;
};

// Identifies one negotiation stream: its job, its rank and its sink.
struct StreamKey {
  int64_t job_id = 0;
  int rank = -1;
  const StreamSink* sink = nullptr;
};

class CoordinatorService {
 public:
  using KeyValueDone = std::function<void(absl::StatusOr<proto::KeyValueGetResponse>)>;
  using StatusDone = std::function<void(absl::StatusOr<proto::StatusResponse>)>;

  explicit CoordinatorService(ServiceOptions options);
  ~CoordinatorService();

  // An id for a call that may wait (Register, KeyValueGet, Status); Cancel(id) completes it
  // early, when its caller went away. Ids are never reused.
  int64_t NewCallId();
  void Cancel(int64_t call_id);

  // Every call below is refused with PermissionDenied when `caller` did not present the job
  // secret (and, for streams and heartbeats, the rank's token), before it touches the job.

  // Blocks nothing: `done` runs exactly once, never under the service's lock, maybe before
  // Register returns: with this rank's place, token, the job's settings and every rank's
  // PeerInfo once the world registered; or PermissionDenied (no or wrong secret),
  // InvalidArgument (bad world size, ranks, settings), DeadlineExceeded (the world did not
  // register in time), FailedPrecondition (another job kept running, or, single_job, is
  // running), Unavailable (shutting down), Cancelled.
  void Register(int64_t call_id, const Caller& caller, const proto::RegisterRequest& req,
                RegisterDone done);

  // InvalidArgument past the store's bounds (KeyValueLimits).
  absl::Status KeyValueSet(const Caller& caller, const proto::KeyValueSetRequest& req);
  // `done` once the key exists or after req.timeout_ms (found = false).
  void KeyValueGet(int64_t call_id, const Caller& caller, const proto::KeyValueGetRequest& req,
                   KeyValueDone done);

  // Whether `caller` may open a Negotiate stream at all (the secret); the gRPC layer asks
  // before it reads the stream's first message.
  absl::Status AdmitStream(const Caller& caller);
  // The first RequestList of a stream names its rank, and the caller must hold that rank's
  // token. PermissionDenied for a wrong token (another rank's, an earlier job's);
  // FailedPrecondition when that rank cannot negotiate now (job not formed, or the rank
  // already left).
  absl::StatusOr<StreamKey> OpenStream(const Caller& caller, const proto::RequestList& hello,
                                       std::shared_ptr<StreamSink> sink);
  void OnRequests(const StreamKey& key, const proto::RequestList& msg);
  // The stream's read side ended (a goodbye was processed already, or the rank is lost).
  void OnStreamEnd(const StreamKey& key);

  // PermissionDenied unless the caller holds req.rank's token for the current job. `resp`
  // (may be null) gets the registrations waiting for the next membership and the ranks
  // leaving (ServiceOptions::elastic_admit).
  absl::Status Heartbeat(const Caller& caller, const proto::HeartbeatRequest& req,
                         proto::HeartbeatResponse* resp = nullptr);

  // The job's status (StatusRequest says which job, and whether to wait for its end).
  // FailedPrecondition for a job the coordinator no longer knows.
  void Status(int64_t call_id, const Caller& caller, const proto::StatusRequest& req,
              StatusDone done);

  // A Shutdown RPC: the server stops (its monitor sees shutdown_requested()).
  absl::Status RequestShutdown(const Caller& caller, const proto::ShutdownRequest& req);
  bool shutdown_requested() const;
  // Stops serving: every stream gets a final ResponseList with shutdown set and is closed,
  // and every waiting call completes (Unavailable).
  void BeginShutdown();

  // The monitor's work (monitor.h): deadlines of waiting calls, liveness, stalls.
  void Inspect();

  // Calls refused so far (Note [Who may join]).
  int64_t refusals() const { return admission_.refusals(); }

 private:
  struct Waiter {
    int64_t id = 0;
    int64_t job_id = 0;       // Status waits: the job whose end it waits for
    absl::Time deadline;
    std::string key;          // KeyValueGet waits: the key
    KeyValueDone kv_done;
    StatusDone status_done;
  };
  struct Queued {             // a registration waiting for the running job to end
    int64_t id;
    proto::RegisterRequest request;
    absl::Time deadline;
    RegisterDone done;
  };

  absl::Time Now() const { return opts_.clock ? opts_.clock() : absl::Now(); }
  Job* FindJobLocked(int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next job (the current one has ended) and admits the queued registrations.
  void NextJobLocked(Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After anything that may have ended the job: completes what waited for its end.
  void AfterChangeLocked(Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteStatusLocked(Waiter& w, Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterLocked(int64_t id, const proto::RegisterRequest& req, RegisterDone done,
                      absl::Time now, Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Job::Options JobOptions(int64_t id) const;

  const ServiceOptions opts_;
  const absl::Time start_;
  Admission admission_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Job> job_ ABSL_GUARDED_BY(mu_);       // the current job
  std::unique_ptr<Job> previous_ ABSL_GUARDED_BY(mu_);  // the one before, ended
  std::vector<Queued> queued_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  int64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_SERVICE_H_
