// One job on the coordinator, from its first registration until the next job's: its
// registrations, ranks, negotiation table, negotiation streams, key-value store and counters.
// The next job is a new Job, so nothing of one job survives into the next. No gRPC types: the
// handlers (service.h) drive it with plain messages, and unit tests drive those.
//
// Not thread-safe: CoordinatorService's mutex guards every call. Completions of waiting
// calls are appended to a Completions list, which the service runs after releasing its lock.
#ifndef BRAID_COORDINATOR_JOB_H_
#define BRAID_COORDINATOR_JOB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/autotune.h"
#include "coordinator/compression_choice.h"
#include "coordinator/negotiation.h"
#include "proto/braid.pb.h"

namespace braid::coordinator {

// "rank 1 (pid 7 on h)", or "pid 7 on h" without a rank of its own: a registration in messages.
std::string Registrant(const proto::RegisterRequest& r);

// Deferred work (completions of waiting calls), run once the service's lock is released.
using Completions = std::vector<std::function<void()>>;

// One rank's negotiation stream as the coordinator's logic sees it. The gRPC layer implements
// it over a callback stream (server.cc); unit tests record what it is given.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Queues `msg`; never blocks. Messages arrive in the order Send was called.
  virtual void Send(const proto::ResponseList& msg) = 0;
  // The same, for a message sent to many streams: a sink that can keep `msg` itself instead
  // of a copy overrides it (with N ranks, a copy per stream costs N times the message).
  virtual void SendShared(std::shared_ptr<const proto::ResponseList> msg) { Send(*msg); }
  // Ends the stream once every queued message is written; later Sends are dropped.
  virtual void Close() = 0;
  // Whether lists queued while a write is in flight may go out merged into one (Note
  // [Coalesced writes] in server.cc). Off in a job with the fast path: its ranks count the
  // lists they received to agree where to apply them, so every rank must receive the same
  // lists (Note [Fast path] in runtime/fast_path.h).
  virtual void set_coalesce(bool on) {}
};

enum class RankState {
  kRegistered,   // registered, no negotiation stream yet
  kNegotiating,  // its stream is open
  kShutDown,     // said goodbye
  kLost,         // its stream closed without a goodbye, or it went silent
};
// "registered", "negotiating", "shut down", "lost": RankStatus.state, which braidctl shows.
absl::string_view RankStateName(RankState state);

using RegisterDone = std::function<void(absl::StatusOr<proto::RegisterResponse>)>;

// Bounds of a job's key-value store: tools rendezvous through it (a few keys per rank), so
// these are far above any real use and keep a caller from filling the coordinator's memory
// (at most max_keys * (max_key_bytes + max_value_bytes), 65 MiB by default).
struct KeyValueLimits {
  int max_keys = 1024;
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 64 * 1024;
};

class Job {
 public:
  struct Options {
    int64_t id = 1;
    int world_size = 0;                  // 0: the first registration's
    proto::JobSettings settings;         // the coordinator's own (Note [Job settings])
    absl::Duration register_timeout = absl::Seconds(120);
    KeyValueLimits kv_limits;
    // The coordinator exists for this one job (ServerOptions::single_job: hosted by rank 0 or
    // braidrun): ranks that disagree on the world size end it for every rank, those still to
    // register included (refusal()), not only for the ranks waiting.
    bool one_job = false;
    // Called (under the service's lock: it must not block or call the service) when a rank
    // is declared lost: silent past the heartbeat timeout, no stream in time, or its stream
    // closed without a goodbye; `worker` is its RegisterRequest.worker (-1: none). braidrun
    // ends such a rank when it still runs (Note [Lost ranks] in tools/braidrun/launcher.h).
    std::function<void(int rank, int worker, const std::string& why)> on_rank_lost;
    // Set: the job is one membership of an elastic job (Note [Elastic membership] in
    // service.h) and this says how many ranks it has, asked while it forms (Resize); an
    // error (too few ranks left) fails the registrations with it. The ranks register without
    // a world size of their own.
    std::function<absl::StatusOr<int>()> elastic_world_size;
    // Elastic: ServiceOptions::elastic_admit, asked of each registration as it arrives and
    // of those waiting at each Resize (a process drained after it registered is refused).
    std::function<absl::Status(int worker)> elastic_admit;
    // Under BRAID_AUTOTUNE (Note [Autotuning] in autotune.h).
    AutotuneOptions autotune;
    // Under compression `auto` (compression_choice.h).
    ChoiceOptions auto_compression;
  };
  Job(const Options& options, absl::Time now);

  int64_t id() const { return opts_.id; }
  proto::JobPhase phase() const { return phase_; }
  int world_size() const { return world_size_; }
  bool ended() const { return phase_ == proto::JOB_ENDED; }
  // Not OK once the job refuses every registration (Options::one_job): the next registration
  // gets this, rather than starting another job.
  const absl::Status& refusal() const { return refusal_; }
  // Whether process `pid` on `host` is one of the job's ranks.
  bool HasRankProcess(const std::string& host, int64_t pid) const;
  // How many ranks still in the job (registered or negotiating) `pred(worker)` holds for
  // (worker: RegisterRequest.worker, -1 without one).
  int CountActiveRanks(const std::function<bool(int worker)>& pred) const;
  // Whether anything happened yet (a registration arrived).
  bool started() const { return register_rpcs_ > 0; }

  // ---- Registration ----
  // Adds a registration (call id `id`); `done` runs exactly once, through `out`: when the
  // world is complete (this rank's RegisterResponse, or the formation's error on every rank),
  // or earlier with an error (world size mismatch) or through RemoveRegistration.
  void AddRegistration(int64_t id, const proto::RegisterRequest& request, RegisterDone done,
                       absl::Time now, Completions* out);
  // Completes registration `id` with `why` if it is still waiting; false if it is not.
  bool RemoveRegistration(int64_t id, const absl::Status& why, Completions* out);
  // Elastic: re-asks Options::elastic_world_size while the job forms and forms it once that
  // many ranks registered (a rank that died while the others registered lowers it).
  void Resize(absl::Time now, Completions* out);

  // ---- Negotiation streams ----
  // Attaches `sink` as `rank`'s stream when `token` is the rank's (RegisterResponse's
  // rank_token; compared in constant time); `report_ages`: the rank wants each Response's
  // report_age_us. PermissionDenied for another token (the rank's current stream is
  // untouched); FailedPrecondition before the job formed, after it ended, or for a rank that
  // already left it.
  absl::Status OpenStream(int rank, absl::string_view token, std::shared_ptr<StreamSink> sink,
                          absl::Time now, bool report_ages = false);
  // A RequestList from `rank`'s stream `sink` (ignored when that is no longer its stream).
  void OnRequests(int rank, const StreamSink* sink, const proto::RequestList& msg,
                  absl::Time now);
  // `rank`'s stream `sink` ended; without a goodbye the rank is lost and the job aborted.
  void OnStreamEnd(int rank, const StreamSink* sink, absl::Time now);

  // Whether `token` is `rank`'s token in this job (compared in constant time).
  bool IsRankToken(int rank, absl::string_view token) const {
    return !token.empty() && CheckToken(rank, token, "").ok();
  }
  // PermissionDenied unless `token` is req.rank's; FailedPrecondition before the job formed.
  absl::Status Heartbeat(const proto::HeartbeatRequest& req, absl::string_view token,
                         absl::Time now);

  // ---- Key-value store (per job, bounded by Options::kv_limits) ----
  void CountKeyValueRpc() { ++kv_rpcs_; }
  // InvalidArgument for a key or value over the limits, or a new key in a full store.
  absl::Status KeyValueSet(const std::string& key, const std::string& value);
  const std::string* KeyValueGet(const std::string& key) const;

  // The monitor's work: registrations past their deadline (every waiting one fails with the
  // first, naming the missing ranks), ranks
  // silent past the heartbeat timeout (lost: the job is aborted), stalled tensors (Note
  // [Stall inspector]) and tensors past the negotiation timeout (Note [Failure reports] in
  // negotiation.h).
  void Inspect(absl::Time now, Completions* out);
  // Fails every pending and later operation on every rank with `s` (first abort wins).
  void Abort(const absl::Status& s);
  // The coordinator is stopping: every waiting registration fails with `why`, every stream
  // gets a final ResponseList with shutdown set and is closed.
  void Shutdown(const absl::Status& why, Completions* out);

  void FillStatus(absl::Time now, proto::StatusResponse* out) const;
  // FillStatus's process sets (the job has a negotiation table).
  void FillProcessSets(proto::StatusResponse* out) const;

 private:
  struct Pending {
    int64_t id;
    proto::RegisterRequest request;
    absl::Time deadline;
    RegisterDone done;
  };
  struct Rank {
    std::string host;
    int64_t pid = 0;
    int worker = -1;  // RegisterRequest.worker
    RankState state = RankState::kRegistered;
    absl::Time last_seen = absl::InfinitePast();
    // The rank's latest byte counters per group of tensors (from its heartbeats: Note
    // [Compression groups]; per method from a rank that predates the groups), cumulative.
    std::vector<proto::MethodBytes> compression;
    // What it ran that the ranks agreed without the coordinator (BRAID_FAST_PATH), cumulative:
    // per method (the job's totals), and per group of all-reduces (the compression rows).
    std::vector<proto::MethodNegotiated> fast_path;
    std::vector<proto::MethodNegotiated> fast_path_groups;
    int64_t fast_path_buckets = 0;
    std::map<int32_t, int64_t> fast_path_sets;  // process set -> tensors
    std::shared_ptr<StreamSink> stream;  // null unless negotiating
    std::string token;                   // RegisterResponse.rank_token (Note [Who may join])
    int64_t applied_sequence = 0;        // RequestList.applied_sequence, once it sent one
    bool reports_applied = false;        // whether it ever did
    bool report_ages = false;            // wants Response.report_age_us
  };

  void Form(absl::Time now, Completions* out);
  void Goodbye(int rank, absl::Time now);
  void Lose(int rank, const std::string& why);
  // Sends `rl` to every rank's stream, numbered (ResponseList.sequence).
  void Broadcast(proto::ResponseList rl);
  // The autotuner's start: the job's settings, the ring chunk resolved by topology.
  proto::TunedSettings StartSettings() const;
  // Takes `rank`'s step samples; sends a settings change when the autotuner or compression
  // `auto`'s chooser decides one.
  void OnSamples(int rank, const proto::RequestList& msg);
  void OnAutoSample(int rank, const proto::TuningSample& sample);
  // Sends `change` to every rank (Note [Settings changes]).
  void SendSettingsChange(proto::SettingsChange change);
  // FillStatus's settings changed during the job, since when and why, and the autotuner's
  // state.
  void FillSettingsChange(proto::StatusResponse* out) const;
  // Sends the negotiation table's replies for single ranks, each to its rank alone.
  void SendReplies();
  // A failure report of a rank that failed inside a collective: the job is aborted.
  void AbortForFailure(int rank, const proto::FailureReport& f);
  // Records the rank's applied sequence and forgets what every rank has seen evicted.
  void NoteApplied(int rank, const proto::RequestList& msg);
  // "only 2 of 4 ranks registered within 2m: ...; missing: ranks 1, 3".
  std::string MissingRegistrations() const;
  // The error for `req`, whose world size is not the job's; fails every waiting registration
  // with it too (the world cannot form) and ends the job.
  absl::Status DisagreeOnWorldSize(const proto::RegisterRequest& req, Completions* out);
  // Fails every waiting registration with `why` and ends the job before it began (its
  // status "registration failed: WHY"): registrations that missed their deadline, or that
  // disagree on the world size.
  void FailRegistrations(const absl::Status& why, Completions* out);
  void InspectLiveness(absl::Time now);
  void InspectStalls(absl::Time now);
  // OK when `token` is `rank`'s (`rank` in range); PermissionDenied naming `what` else.
  absl::Status CheckToken(int rank, absl::string_view token, absl::string_view what) const;
  void InspectNegotiationDeadline(absl::Time now);
  void MaybeEnd(absl::Time now);
  // One row per group (method, pattern), bounded (Note [Compression groups]).
  std::vector<proto::CompressionStat> CompressionStats() const;
  // Per method: the largest of the ranks' fast-path reports (every rank runs the same work).
  std::map<std::string, proto::MethodNegotiated> FastPathByMethod() const;
  // The same per group of all-reduces, by (method, pattern).
  std::map<std::pair<std::string, std::string>, proto::MethodNegotiated> FastPathByGroup() const;
  std::string JobState() const;
  absl::Duration heartbeat_timeout() const {
    return absl::Milliseconds(settings_.heartbeat_timeout_ms());
  }

  const Options opts_;
  int world_size_;
  proto::JobPhase phase_ = proto::JOB_FORMING;
  std::vector<Pending> pending_;  // registration order
  proto::JobSettings settings_;   // decided when the job forms
  absl::Time formed_at_ = absl::InfinitePast();
  absl::Time first_registration_ = absl::InfinitePast();
  std::unique_ptr<NegotiationTable> table_;
  // Note [Settings changes] (runtime/step_settings.h): the autotuner (BRAID_AUTOTUNE only),
  // the last change sent and the step from which the ranks reported it in force.
  std::unique_ptr<Autotuner> autotuner_;
  // Compression `auto`'s chooser, from the first sample with `auto` figures; it decides
  // once autotuning (if any) is done.
  std::unique_ptr<CompressionChooser> chooser_;
  proto::SettingsChange settings_change_;
  int64_t settings_since_step_ = 0;
  std::vector<Rank> ranks_;
  std::set<int> clean_;           // ranks that said goodbye
  absl::Status abort_;
  absl::Status refusal_;
  bool shutting_down_ = false;
  std::set<std::string> stall_logged_;
  std::map<std::string, std::string> kv_;
  // Counters of this job only (StatusResponse).
  int64_t register_rpcs_ = 0;
  int64_t kv_rpcs_ = 0;
  int64_t cycles_ = 0;
  int64_t responses_sent_ = 0;
  int64_t sequence_ = 0;  // of the last list broadcast
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_JOB_H_
