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
#include "coordinator/job.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

struct ServiceOptions {
  // World size; 0 takes it from the first rank that registers (per job).
  int world_size = 0;
  // Ranks must present this secret when registering ("" = no check).
  std::string job_secret;
  // Register waits this long for the whole world (and for a running job to end).
  absl::Duration register_timeout = absl::Seconds(120);
  // The coordinator's own job settings (Note [Job settings]); absent fields: the ranks'.
  proto::JobSettings settings;
  // Time source; null: absl::Now. Tests step a fake clock and call Inspect().
  std::function<absl::Time()> clock;
};

// Identifies one negotiation stream: its job, its rank and its sink.
struct StreamKey {
  int64_t job_id = 0;
  int rank = -1;
  const StreamSink* sink = nullptr;
};

class CoordinatorService {
 public:
  using KeyValueDone = std::function<void(proto::KeyValueGetResponse)>;
  using StatusDone = std::function<void(absl::StatusOr<proto::StatusResponse>)>;

  explicit CoordinatorService(ServiceOptions options);
  ~CoordinatorService();

  // An id for a call that may wait (Register, KeyValueGet, Status); Cancel(id) completes it
  // early, when its caller went away. Ids are never reused.
  int64_t NewCallId();
  void Cancel(int64_t call_id);

  // Blocks nothing: `done` runs exactly once, never under the service's lock, maybe before
  // Register returns: with this rank's place, the job's settings and every rank's PeerInfo
  // once the world registered; or PermissionDenied (wrong secret), InvalidArgument (bad
  // world size, ranks, settings), DeadlineExceeded (the world did not register in time),
  // FailedPrecondition (another job kept running), Unavailable (shutting down), Cancelled.
  void Register(int64_t call_id, const proto::RegisterRequest& req, RegisterDone done);

  void KeyValueSet(const proto::KeyValueSetRequest& req);
  // `done` once the key exists or after req.timeout_ms (found = false).
  void KeyValueGet(int64_t call_id, const proto::KeyValueGetRequest& req, KeyValueDone done);

  // The first RequestList of a stream names its rank. FailedPrecondition when that rank
  // cannot negotiate now (job not formed, or the rank already left).
  absl::StatusOr<StreamKey> OpenStream(const proto::RequestList& hello,
                                       std::shared_ptr<StreamSink> sink);
  void OnRequests(const StreamKey& key, const proto::RequestList& msg);
  // The stream's read side ended (a goodbye was processed already, or the rank is lost).
  void OnStreamEnd(const StreamKey& key);

  void Heartbeat(const proto::HeartbeatRequest& req);

  // The job's status (StatusRequest says which job, and whether to wait for its end).
  // FailedPrecondition for a job the coordinator no longer knows.
  void Status(int64_t call_id, const proto::StatusRequest& req, StatusDone done);

  // A Shutdown RPC: the server stops (its monitor sees shutdown_requested()).
  void RequestShutdown(const proto::ShutdownRequest& req);
  bool shutdown_requested() const;
  // Stops serving: every stream gets a final ResponseList with shutdown set and is closed,
  // and every waiting call completes (Unavailable).
  void BeginShutdown();

  // The monitor's work (monitor.h): deadlines of waiting calls, liveness, stalls.
  void Inspect();

 private:
  struct Waiter {
    int64_t id;
    int64_t job_id;           // Status waits: the job whose end it waits for
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
