#include "runtime/runtime.h"

#include <cctype>

#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "compression/half_convert.h"
#include "compression/stage.h"
#include "coordinator/client.h"
#include "coordinator/server.h"
#include "glog/logging.h"
#include "runtime/heartbeat_report.h"
#include "runtime/registration.h"
#include "runtime/timeline.h"

namespace braid {
namespace {

absl::string_view CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kAllGather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllToAll: return "alltoall";
    case Collective::kBarrier: return "barrier";
  }
  return "unknown";
}

std::string Upper(absl::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Elements per row of dim 0 (the product of the trailing dimensions).
int64_t RowElements(const std::vector<int64_t>& shape) {
  return shape.empty() ? 1 : NumElements({shape.begin() + 1, shape.end()});
}

// Rows of dim 0 each rank gets in a reduce-scatter: even, the first rows % size one more.
std::vector<int64_t> EvenRows(int64_t rows, int size) {
  std::vector<int64_t> out(size, rows / size);
  for (int r = 0; r < rows % size; ++r) ++out[r];
  return out;
}

// float16 / bfloat16 / float32 / float64 -> the compression stage's float32 work buffer. The
// 16-bit conversions are the compression kernels' (vectorized, round to nearest even).
void ToFloat32(const void* in, DataType dtype, size_t n, float* out) {
  switch (dtype) {
    case DataType::kFloat32:
      if (n) std::memcpy(out, in, n * sizeof(float));
      return;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      compression::FromHalf(static_cast<const uint16_t*>(in), n, dtype == DataType::kBFloat16,
                            out);
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<const double*>(in)[i]);
      return;
    default:
      LOG(FATAL) << "compression of " << DataTypeName(dtype) << " tensors is refused at enqueue";
  }
}

// The inverse.
void FromFloat32(const float* in, DataType dtype, size_t n, void* out) {
  switch (dtype) {
    case DataType::kFloat32:
      if (n && out != in) std::memcpy(out, in, n * sizeof(float));
      return;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      compression::ToHalf(in, n, /*divisor=*/1.0f, dtype == DataType::kBFloat16,
                          static_cast<uint16_t*>(out));
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(out)[i] = in[i];
      return;
    default:
      LOG(FATAL) << "compression of " << DataTypeName(dtype) << " tensors is refused at enqueue";
  }
}

}  // namespace

class Runtime::Impl {
 public:
  ~Impl() { Shutdown().IgnoreError(); }

  absl::Status Init(const RuntimeConfig& config);
  absl::Status Shutdown();
  bool initialized() const {
    absl::MutexLock lock(&mu_);
    return state_ == State::kRunning;
  }
  absl::StatusOr<int> Get(int Impl::*field) const {
    absl::MutexLock lock(&mu_);
    BRAID_RETURN_IF_ERROR(CheckRunningLocked());
    return this->*field;
  }
  absl::StatusOr<std::shared_ptr<Handle>> Enqueue(CollectiveRequest req);
  absl::StatusOr<transport::TransportStats> transport_stats() const {
    absl::MutexLock lock(&mu_);
    BRAID_RETURN_IF_ERROR(CheckRunningLocked());
    return stats_;
  }
  absl::StatusOr<std::string> transport_description() const {
    absl::MutexLock lock(&mu_);
    BRAID_RETURN_IF_ERROR(CheckRunningLocked());
    return transport_description_;
  }
  absl::StatusOr<compression::CompressionReport> compression_report() const {
    {
      absl::MutexLock lock(&mu_);
      BRAID_RETURN_IF_ERROR(CheckRunningLocked());
    }
    return stage_->Report();  // stage_ changes only in Init, before the state is kRunning
  }
  absl::StatusOr<std::string> compression_state() const {
    BRAID_RETURN_IF_ERROR(CheckNoCompressionInFlight("compression_state()"));
    return stage_->SaveState(rank_, size_);
  }
  absl::Status LoadCompressionState(absl::string_view state) {
    BRAID_RETURN_IF_ERROR(CheckNoCompressionInFlight("load_compression_state()"));
    return stage_->LoadState(state, rank_, size_);
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;

 private:
  enum class State { kUninitialized, kRunning, kShutDown };
  struct Entry {
    CollectiveRequest req;
    std::shared_ptr<Handle> handle;
    std::string request_bytes;  // the proto::Request sent, serialized (response cache key)
  };

  absl::Status CheckRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition when not running or while a compressed all-reduce is in flight.
  absl::Status CheckNoCompressionInFlight(absl::string_view what) const;
  absl::Status CheckRequest(const CollectiveRequest& r) const;
  void Loop();
  void OnMessage(const proto::ResponseList& msg);
  void OnClosed(const absl::Status& s);
  void AbortJob(const absl::Status& s);
  void Execute(const proto::Response& resp);
  absl::Status Run(Entry& e, const proto::Response& resp);
  // A bucket of several all-reduces: packed into the fusion buffer, reduced once, unpacked.
  void RunFused(const proto::Response& resp, const std::vector<Entry*>& entries);
  // One bucket (one or more all-reduces) through the compression stage.
  void RunCompressed(const proto::Response& resp, const std::vector<Entry*>& entries);
  // The canonical compression of an all-reduce request ("none" when uncompressed).
  absl::StatusOr<std::string> ResolveCompression(const CollectiveRequest& r) const;
  void Finish(const std::string& name, const absl::Status& s);

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kUninitialized;
  RuntimeConfig config_;
  std::unique_ptr<coordinator::CoordinatorServer> hosted_;
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<transport::Communicator> comm_;
  std::map<std::string, Entry> table_ ABSL_GUARDED_BY(mu_);  // in flight on this rank
  std::vector<proto::Request> outgoing_ ABSL_GUARDED_BY(mu_);
  std::deque<proto::Response> responses_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool executing_ ABSL_GUARDED_BY(mu_) = false;  // the loop is running collectives
  int64_t negotiating_ ABSL_GUARDED_BY(mu_) = 0;  // requests sent, not yet answered
  // This rank's mirror of the coordinator's response cache: name -> (id, request bytes).
  std::map<std::string, std::pair<int32_t, std::string>> cache_ ABSL_GUARDED_BY(mu_);
  absl::Time last_send_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Held for the whole of Init and Shutdown: they may be called from any thread.
  absl::Mutex lifecycle_mu_;
  transport::TransportStats stats_ ABSL_GUARDED_BY(mu_);  // snapshot of comm_->stats()
  // comm_->Describe(), taken in Init before the background thread owns comm_.
  std::string transport_description_ ABSL_GUARDED_BY(mu_);
  // Fusion buffers, one per dtype, grown when needed and reused: no allocation per step
  // in steady state. Background thread only.
  std::map<DataType, std::vector<char>> fusion_buffers_;
  std::vector<float> compress_buffer_;  // float32 work buffer of the compression stage
  // Created by Init (per job: compressor state starts fresh); used by the background thread,
  // its Report() from any thread.
  std::unique_ptr<compression::CompressionStage> stage_;
  std::unique_ptr<Timeline> timeline_;  // null when BRAID_TIMELINE is unset
  std::thread loop_;
};

absl::Status Runtime::Impl::CheckRunningLocked() const {
  switch (state_) {
    case State::kRunning: return absl::OkStatus();
    case State::kUninitialized:
      return absl::FailedPreconditionError("braid is not initialized: call init() first");
    case State::kShutDown:
      return absl::FailedPreconditionError(
          "braid has been shut down: call init() again to start a new job");
  }
  return absl::InternalError("bad state");
}

absl::Status Runtime::Impl::CheckNoCompressionInFlight(absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  for (const auto& [name, e] : table_) {
    if (e.req.collective == Collective::kAllReduce && e.req.compression != "none") {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " on rank ", rank_, " while the compressed all-reduce '", name,
          "' is in flight: call it between steps, after synchronizing every all-reduce"));
    }
  }
  return absl::OkStatus();
}

absl::Status Runtime::Impl::Init(const RuntimeConfig& config) {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kRunning) return absl::OkStatus();
  }
  config_ = config;
  LaunchInfo launch = config.launch;
  std::string address = config.coordinator;
  if (address.empty()) {
    const bool alone = launch.size <= 1 && launch.rank <= 0;
    if (alone) {
      // No launcher and no peers: a private coordinator on a free port.
      launch.rank = 0;
      launch.size = 1;
    }
    if (launch.rank == 0) {
      coordinator::ServerOptions so;
      so.bind_address = alone ? "127.0.0.1" : config.coordinator_host;
      so.port = alone ? 0 : config.coordinator_port;
      so.world_size = launch.size;
      so.job_secret = config.job_secret;
      // No settings of its own: every rank's registration proposes the job settings it set,
      // this one's included (Note [Job settings]).
      BRAID_ASSIGN_OR_RETURN(hosted_, coordinator::StartCoordinator(so));
      address = hosted_->address();
    } else if (launch.rank < 0) {
      return absl::InvalidArgumentError(
          "BRAID_COORDINATOR is not set and this process has no rank from a launcher "
          "(BRAID_RANK, RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK): run under braidrun");
    } else {
      address = absl::StrCat(config.coordinator_host, ":", config.coordinator_port);
    }
  }
  // Before the client: its heartbeats read the stage (braidctl status).
  compression::StageOptions stage_options;
  stage_options.seed = config.seed;
  stage_options.registry.test_methods = config.test_compressors;
  stage_ = std::make_unique<compression::CompressionStage>(stage_options);

  coordinator::ClientOptions co;
  co.address = address;
  co.connect_timeout = std::max(config.timeout, absl::Seconds(30));
  // Registration replaces it with the job's (coordinator/client.h).
  if (config.job.heartbeat_timeout) {
    co.heartbeat_interval = coordinator::HeartbeatInterval(*config.job.heartbeat_timeout);
  }
  // Heartbeats carry this rank's compression totals (braidctl status). stage_ exists before
  // the client and is replaced only by the next Init, after client_->Close().
  co.fill_heartbeat = [this](proto::HeartbeatRequest* hb) { AddCompressionTotals(*stage_, hb); };
  auto fail = [this](absl::Status s) {
    timeline_.reset();
    comm_.reset();
    client_.reset();
    if (hosted_) hosted_->Shutdown(absl::ZeroDuration());
    hosted_.reset();
    return s;
  };
  auto client = coordinator::ConnectCoordinator(co);
  if (!client.ok()) return fail(client.status());
  client_ = *std::move(client);

  // Note [Peers at registration]: one Register RPC, then the data plane connects.
  auto joined = JoinJob(config, launch, *client_);
  if (!joined.ok()) return fail(joined.status());
  const proto::RegisterResponse& registered = joined->registration;
  rank_ = registered.rank();
  size_ = registered.size();
  local_rank_ = registered.local_rank();
  local_size_ = registered.local_size();
  comm_ = std::move(joined->comm);

  if (!config.timeline_path.empty()) {
    // Rank 0 writes the path itself, rank r writes PATH.rank<r>.
    std::string path = rank_ == 0 ? config.timeline_path
                                  : absl::StrCat(config.timeline_path, ".rank", rank_);
    auto tl = Timeline::Open(path, rank_);
    if (!tl.ok()) return fail(tl.status());
    timeline_ = *std::move(tl);
  }

  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
    abort_ = absl::OkStatus();
    stats_ = transport::TransportStats{};
    transport_description_ = comm_->Describe();
    negotiating_ = 0;
    cache_.clear();
    outgoing_.clear();
    responses_.clear();
    state_ = State::kRunning;
  }
  absl::Status s = client_->StartNegotiation(
      rank_, [this](const proto::ResponseList& m) { OnMessage(m); },
      [this](const absl::Status& st) { OnClosed(st); });
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    state_ = State::kUninitialized;
    comm_.reset();
    return fail(s);
  }
  loop_ = std::thread([this] { Loop(); });
  VLOG(1) << "braid: rank " << rank_ << " of " << size_ << " joined via " << address;
  return absl::OkStatus();
}

absl::Status Runtime::Impl::Shutdown() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  bool busy;
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kRunning) return absl::OkStatus();
    stop_ = true;
    busy = executing_;
  }
  // Wake a collective blocked on peers that may never come. Work still in negotiation
  // needs no abort: the loop stops before running it.
  if (busy) comm_->Abort(absl::CancelledError("braid is shutting down"));
  if (loop_.joinable()) loop_.join();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : table_) {
      e.handle->Complete(absl::CancelledError(
          absl::StrCat("braid was shut down before '", name, "' completed")));
    }
    table_.clear();
    state_ = State::kShutDown;
  }
  client_->Close(absl::Milliseconds(500));
  comm_.reset();
  client_.reset();
  timeline_.reset();  // flushes
  if (hosted_) {
    hosted_->Shutdown(absl::Milliseconds(500));
    hosted_.reset();
  }
  return absl::OkStatus();
}

absl::Status Runtime::Impl::CheckRequest(const CollectiveRequest& r) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " '", r.name,
                                                   "' on rank ", rank_, ": ", why));
  };
  if (r.name.empty()) return bad("a name is required");
  if (!IsValidDataType(static_cast<int32_t>(r.dtype))) return bad("unknown dtype");
  for (int64_t d : r.shape) {
    if (d < 0) return bad(absl::StrCat("negative dimension ", d));
  }
  const int64_t n = NumElements(r.shape);
  if (r.collective != Collective::kBarrier && n > 0 && r.input == nullptr) {
    return bad("input buffer is null");
  }
  if ((r.collective == Collective::kAllReduce || r.collective == Collective::kBroadcast) &&
      n > 0 && r.output == nullptr) {
    return bad("output buffer is null");
  }
  if (r.collective == Collective::kAllReduce || r.collective == Collective::kReduceScatter) {
    if (!IsValidReduceOp(static_cast<int32_t>(r.op))) {
      return bad(absl::StrCat("unknown reduce op ", static_cast<int32_t>(r.op)));
    }
    absl::Status s = CheckReduceOp(r.dtype, r.op);
    if (!s.ok()) return bad(std::string(s.message()));
  }
  if ((r.collective == Collective::kAllGather || r.collective == Collective::kAllToAll ||
       r.collective == Collective::kReduceScatter) && r.shape.empty()) {
    return bad("needs at least one dimension, got a scalar");
  }
  if (r.collective == Collective::kAllToAll) {
    if (r.splits.empty()) {
      if (r.shape[0] % size_ != 0) {
        return bad(absl::StrCat("dim 0 (", r.shape[0], ") does not divide evenly among ", size_,
                                " ranks: pass splits"));
      }
    } else {
      if (static_cast<int>(r.splits.size()) != size_) {
        return bad(absl::StrCat("splits has ", r.splits.size(), " entries for ", size_, " ranks"));
      }
      int64_t sum = 0;
      for (int64_t s : r.splits) {
        if (s < 0) return bad("negative split");
        sum += s;
      }
      if (sum != r.shape[0]) {
        return bad(absl::StrCat("splits sum to ", sum, " but dim 0 is ", r.shape[0]));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Runtime::Impl::ResolveCompression(const CollectiveRequest& r) const {
  // Compression applies to floating-point sum / average all-reduces. The job's default
  // (BRAID_COMPRESSION) silently skips other tensors, as Horovod's compressors do; a method
  // asked for explicitly on one of them is an error.
  const bool eligible = r.collective == Collective::kAllReduce && IsFloatingPoint(r.dtype) &&
                        (r.op == ReduceOp::kSum || r.op == ReduceOp::kAverage);
  if (r.compression.empty()) return eligible ? config_.compression : std::string("none");
  auto canonical = stage_->Canonicalize(r.compression);
  if (!canonical.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(r.collective), " '", r.name,
                                                   "' on rank ", rank_, ": ",
                                                   canonical.status().message()));
  }
  if (*canonical != "none" && !eligible) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(r.collective), " '", r.name, "' on rank ", rank_, ": compression '",
        *canonical, "' applies only to allreduce of floating-point tensors with op sum or average, "
        "got ", DataTypeName(r.dtype), " / ", ReduceOpName(r.op)));
  }
  return *canonical;
}

absl::StatusOr<std::shared_ptr<Handle>> Runtime::Impl::Enqueue(CollectiveRequest req) {
  absl::MutexLock lock(&mu_);
  BRAID_RETURN_IF_ERROR(CheckRunningLocked());
  BRAID_RETURN_IF_ERROR(CheckRequest(req));
  if (table_.count(req.name)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "tensor '", req.name, "' is already in flight on rank ", rank_,
        ": wait for it to complete before reusing the name"));
  }
  auto handle = std::make_shared<Handle>();
  if (!abort_.ok()) {
    handle->Complete(abort_);
    return handle;
  }
  proto::Request p;
  p.set_name(req.name);
  p.set_collective(static_cast<proto::Collective>(req.collective));
  p.set_dtype(static_cast<proto::DataType>(req.dtype));
  for (int64_t d : req.shape) p.add_shape(d);
  p.set_device(proto::CPU);
  p.set_reduce_op(static_cast<proto::ReduceOp>(req.op));
  p.set_root_rank(req.root_rank);
  p.set_process_set_id(req.process_set_id);
  BRAID_ASSIGN_OR_RETURN(req.compression, ResolveCompression(req));
  p.set_compression(req.compression == "none" ? "" : req.compression);
  std::string request_bytes = p.SerializeAsString();
  outgoing_.push_back(std::move(p));
  if (timeline_) timeline_->Begin(req.name, "NEGOTIATE", absl::StrCat("\"collective\": \"", CollectiveName(req.collective), "\""));
  std::string name = req.name;
  table_.emplace(name, Entry{std::move(req), handle, std::move(request_bytes)});
  return handle;
}

void Runtime::Impl::OnMessage(const proto::ResponseList& msg) {
  if (!msg.abort_message().empty()) {
    AbortJob(absl::Status(static_cast<absl::StatusCode>(msg.abort_code()), msg.abort_message()));
  }
  if (msg.shutdown()) {
    AbortJob(absl::CancelledError("the coordinator ended the job"));
  }
  if (timeline_) {
    const absl::Time now = absl::Now();
    for (const auto& r : msg.responses()) {
      for (int i = 0; i < r.names_size(); ++i) {
        const std::string& name = r.names(i);
        for (int p = 0; p < size_; ++p) {
          size_t k = static_cast<size_t>(i) * size_ + p;
          if (k < static_cast<size_t>(r.report_age_us_size())) {
            timeline_->Mark(name, absl::StrCat("rank ", p, " ready"),
                            now - absl::Microseconds(r.report_age_us(static_cast<int>(k))));
          }
        }
        timeline_->End(name, "NEGOTIATE", now);
        if (r.type() == proto::Response::OK) timeline_->Begin(name, "QUEUE", "", now);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& r : msg.responses()) {
    negotiating_ -= r.names_size();
    for (int i = 0; i < r.cache_ids_size() && i < r.names_size(); ++i) {
      auto entry = table_.find(r.names(i));
      if (r.cache_ids(i) != 0 && entry != table_.end()) {
        cache_[r.names(i)] = {r.cache_ids(i), entry->second.request_bytes};
      }
    }
    responses_.push_back(r);
  }
  for (int32_t id : msg.evicted_cache_ids()) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->second.first == id) {
        cache_.erase(it);
        break;
      }
    }
  }
  if (negotiating_ < 0) negotiating_ = 0;
}

void Runtime::Impl::OnClosed(const absl::Status& s) {
  if (!s.ok()) AbortJob(s);
}

void Runtime::Impl::AbortJob(const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    if (!abort_.ok()) return;
    abort_ = s;
  }
  // Thread-safe: fails the collective in flight at once instead of at its timeout.
  comm_->Abort(s);
}

void Runtime::Impl::Loop() {
  while (true) {
    proto::RequestList out;
    std::deque<proto::Response> todo;
    absl::Status abort;
    {
      absl::MutexLock lock(&mu_);
      // Note [Cycle]: event-driven, so an idle job costs no CPU. Responses run as soon as
      // they arrive. New requests go out at once when nothing is being negotiated (the
      // first tensor after an idle period pays no cycle latency); while earlier requests
      // are still negotiating, new ones are batched for up to BRAID_CYCLE_TIME_MS after
      // the last send, so a burst of tensors costs one message per rank.
      auto urgent = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !responses_.empty() || (!abort_.ok() && !table_.empty());
      };
      auto anything = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !responses_.empty() || (!abort_.ok() && !table_.empty()) ||
               !outgoing_.empty();
      };
      while (true) {
        mu_.Await(absl::Condition(&anything));
        if (urgent() || negotiating_ == 0) break;
        const absl::Time due = last_send_ + config_.cycle_time;
        if (absl::Now() >= due) break;
        mu_.AwaitWithDeadline(absl::Condition(&urgent), due);
      }
      if (stop_) return;
      abort = abort_;
      if (!abort.ok()) {
        for (auto& [name, e] : table_) e.handle->Complete(abort);
        table_.clear();
        outgoing_.clear();
        responses_.clear();
        negotiating_ = 0;
        continue;
      }
      out.set_rank(rank_);
      for (auto& r : outgoing_) {
        // A request identical to a cached one travels as its id (Note [Response cache]).
        auto it = cache_.find(r.name());
        auto entry = table_.find(r.name());
        if (it != cache_.end() && entry != table_.end() &&
            it->second.second == entry->second.request_bytes) {
          out.add_cached_ids(it->second.first);
        } else {
          *out.add_requests() = std::move(r);
        }
      }
      negotiating_ += static_cast<int64_t>(outgoing_.size());
      if (!outgoing_.empty()) last_send_ = absl::Now();
      outgoing_.clear();
      todo.swap(responses_);
      executing_ = !todo.empty();
    }
    if (out.requests_size() > 0 || out.cached_ids_size() > 0) {
      absl::Status s = client_->Send(out);
      if (!s.ok()) AbortJob(s);
    }
    for (const proto::Response& r : todo) Execute(r);
    absl::MutexLock lock(&mu_);
    executing_ = false;
  }
}

void Runtime::Impl::Finish(const std::string& name, const absl::Status& s) {
  transport::TransportStats stats = comm_->stats();  // comm_ is this thread's
  absl::MutexLock lock(&mu_);
  stats_ = stats;
  auto it = table_.find(name);
  if (it == table_.end()) return;
  it->second.handle->Complete(s);
  table_.erase(it);
}

void Runtime::Impl::Execute(const proto::Response& resp) {
  if (resp.type() == proto::Response::ERROR) {
    absl::Status err(static_cast<absl::StatusCode>(resp.error_code()), resp.error_message());
    for (const std::string& name : resp.names()) Finish(name, err);
    return;
  }
  std::vector<Entry*> entries;
  for (const std::string& name : resp.names()) {
    Entry* e = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = table_.find(name);
      if (it != table_.end()) e = &it->second;  // stays put: only this thread erases
    }
    if (e == nullptr) {
      LOG(ERROR) << "rank " << rank_ << ": coordinator scheduled '" << name
                 << "', which this rank did not submit";
      AbortJob(absl::InternalError(absl::StrCat("rank ", rank_, " was told to run '", name,
                                                "', which it never submitted")));
      return;
    }
    entries.push_back(e);
  }
  const std::string phase = Upper(CollectiveName(entries[0]->req.collective));
  const std::string args = absl::StrCat("\"bucket\": ", resp.bucket_id(), ", \"tensors\": ",
                                        resp.names_size());
  if (timeline_) {
    for (const std::string& name : resp.names()) timeline_->End(name, "QUEUE");
  }
  if (entries[0]->req.collective == Collective::kAllReduce &&
      entries[0]->req.compression != "none") {
    RunCompressed(resp, entries);
    return;
  }
  if (entries.size() > 1) {
    RunFused(resp, entries);
    return;
  }
  if (timeline_) {
    timeline_->Begin(resp.names(0), phase,
                     absl::StrCat(args, ", \"bytes\": ",
                                  NumElements(entries[0]->req.shape) * DataTypeSize(entries[0]->req.dtype)));
  }
  const uint64_t sent_before = comm_->stats().bytes_sent;
  absl::Status s = Run(*entries[0], resp);
  if (timeline_) timeline_->End(resp.names(0), phase);
  if (s.ok() && entries[0]->req.collective == Collective::kAllReduce) {
    stage_->RecordUncompressed(resp.names(0),
                               NumElements(entries[0]->req.shape) * DataTypeSize(entries[0]->req.dtype),
                               comm_->stats().bytes_sent - sent_before, size_);
  }
  Finish(resp.names(0), s);
}

void Runtime::Impl::RunFused(const proto::Response& resp, const std::vector<Entry*>& entries) {
  const DataType dtype = entries[0]->req.dtype;
  const size_t elem = DataTypeSize(dtype);
  size_t total = 0;
  for (const Entry* e : entries) total += NumElements(e->req.shape);
  std::vector<char>& buf = fusion_buffers_[dtype];
  if (buf.size() < total * elem) buf.resize(total * elem);  // value-initialised: touched once
  // Every tensor's row shows the bucket's phases (hooks for COMPRESS / DECOMPRESS go here).
  auto phase = [&](const char* what, bool begin) {
    if (!timeline_) return;
    for (const std::string& name : resp.names()) {
      if (begin) {
        timeline_->Begin(name, what, absl::StrCat("\"bucket\": ", resp.bucket_id(),
                                                  ", \"tensors\": ", resp.names_size(),
                                                  ", \"bytes\": ", total * elem));
      } else {
        timeline_->End(name, what);
      }
    }
  };
  phase("MEMCPY_IN_FUSION_BUFFER", true);
  size_t offset = 0;
  for (const Entry* e : entries) {
    size_t bytes = NumElements(e->req.shape) * elem;
    if (bytes) std::memcpy(buf.data() + offset, e->req.input, bytes);
    offset += bytes;
  }
  phase("MEMCPY_IN_FUSION_BUFFER", false);
  phase("ALLREDUCE", true);
  const uint64_t sent_before = comm_->stats().bytes_sent;
  absl::Status s = comm_->AllReduce(buf.data(), buf.data(), total, dtype, entries[0]->req.op);
  phase("ALLREDUCE", false);
  if (s.ok()) {
    const uint64_t sent = comm_->stats().bytes_sent - sent_before;
    for (const Entry* e : entries) {
      const uint64_t count = NumElements(e->req.shape);
      // The bucket's bytes on the wire, apportioned by size.
      stage_->RecordUncompressed(e->req.name, count * elem,
                                 total == 0 ? 0 : sent * count / total, size_);
    }
  }
  phase("MEMCPY_OUT_FUSION_BUFFER", true);
  offset = 0;
  for (const Entry* e : entries) {
    size_t bytes = NumElements(e->req.shape) * elem;
    if (s.ok() && bytes) std::memcpy(e->req.output, buf.data() + offset, bytes);
    offset += bytes;
  }
  phase("MEMCPY_OUT_FUSION_BUFFER", false);
  for (const std::string& name : resp.names()) Finish(name, s);
}

void Runtime::Impl::RunCompressed(const proto::Response& resp,
                                  const std::vector<Entry*>& entries) {
  const DataType dtype = entries[0]->req.dtype;
  const std::string& spec = entries[0]->req.compression;
  size_t total = 0;
  for (const Entry* e : entries) total += NumElements(e->req.shape);
  // One float32 tensor reduces in place in its output; anything else goes through the work
  // buffer (converted from float16 / bfloat16 / float64, fused when there are several).
  const bool direct = entries.size() == 1 && dtype == DataType::kFloat32;
  std::vector<compression::TensorView> views;
  if (!direct && compress_buffer_.size() < total) compress_buffer_.resize(total);
  size_t offset = 0;
  for (Entry* e : entries) {
    const size_t n = NumElements(e->req.shape);
    float* data = direct ? static_cast<float*>(e->req.output) : compress_buffer_.data() + offset;
    if (direct) {
      if (n && e->req.output != e->req.input) std::memcpy(data, e->req.input, n * sizeof(float));
    } else {
      ToFloat32(e->req.input, dtype, n, data);
    }
    views.push_back({e->req.name, e->req.shape, data, n});
    offset += n;
  }
  auto phase = [&](bool begin) {
    if (!timeline_) return;
    for (const std::string& name : resp.names()) {
      if (begin) {
        timeline_->Begin(name, "ALLREDUCE", absl::StrCat("\"bucket\": ", resp.bucket_id(),
                                                         ", \"tensors\": ", resp.names_size(),
                                                         ", \"compression\": \"", spec, "\""));
      } else {
        timeline_->End(name, "ALLREDUCE");
      }
    }
  };
  phase(true);
  absl::Status s = stage_->Reduce(spec, views, DataTypeSize(dtype), entries[0]->req.op, *comm_);
  phase(false);
  if (s.ok() && !direct) {
    for (size_t i = 0; i < entries.size(); ++i) {
      FromFloat32(views[i].data, dtype, views[i].count, entries[i]->req.output);
    }
  }
  for (const std::string& name : resp.names()) Finish(name, s);
}

absl::Status Runtime::Impl::Run(Entry& e, const proto::Response& resp) {
  const CollectiveRequest& r = e.req;
  const size_t elem = DataTypeSize(r.dtype);
  const int64_t n = NumElements(r.shape);
  Handle& h = *e.handle;
  // Output the caller sized, or one the handle owns when the caller gave none (or too little).
  auto output_for = [&](size_t bytes, std::vector<int64_t> shape, bool caller_sized) -> void* {
    h.set_output_shape(std::move(shape));
    if (r.output != nullptr && (caller_sized || r.output_capacity_bytes >= bytes)) return r.output;
    h.mutable_output().resize(bytes);
    return h.mutable_output().data();
  };
  switch (r.collective) {
    case Collective::kAllReduce:
      return comm_->AllReduce(r.input, r.output, n, r.dtype, r.op);
    case Collective::kBroadcast: {
      if (rank_ == resp.root_rank() && r.output != r.input && n > 0) {
        std::memcpy(r.output, r.input, n * elem);
      }
      return comm_->Broadcast(r.output, n * elem, resp.root_rank());
    }
    case Collective::kBarrier:
      return comm_->Barrier();
    case Collective::kAllGather: {
      const int64_t row = RowElements(r.shape);
      std::vector<size_t> bytes(size_);
      int64_t rows = 0;
      for (int p = 0; p < size_; ++p) {
        bytes[p] = resp.first_dims(p) * row * elem;
        rows += resp.first_dims(p);
      }
      std::vector<int64_t> shape = r.shape;
      shape[0] = rows;
      void* out = output_for(rows * row * elem, shape, false);
      return comm_->AllGather(r.input, bytes[rank_], out, bytes);
    }
    case Collective::kReduceScatter: {
      const int64_t row = RowElements(r.shape);
      std::vector<int64_t> rows = EvenRows(r.shape[0], size_);
      std::vector<size_t> counts(size_);
      for (int p = 0; p < size_; ++p) counts[p] = rows[p] * row;
      std::vector<int64_t> shape = r.shape;
      shape[0] = rows[rank_];
      void* out = output_for(counts[rank_] * elem, shape, r.output != nullptr);
      return comm_->ReduceScatter(r.input, out, counts, r.dtype, r.op);
    }
    case Collective::kAllToAll: {
      const int64_t row = RowElements(r.shape);
      std::vector<int64_t> send_rows = r.splits.empty() ? EvenRows(r.shape[0], size_) : r.splits;
      std::vector<int64_t> recv_rows(size_);
      std::vector<size_t> eight(size_, sizeof(int64_t));
      BRAID_RETURN_IF_ERROR(comm_->AllToAll(send_rows.data(), eight, recv_rows.data(), eight));
      std::vector<size_t> sb(size_), rb(size_);
      int64_t total = 0;
      for (int p = 0; p < size_; ++p) {
        sb[p] = send_rows[p] * row * elem;
        rb[p] = recv_rows[p] * row * elem;
        total += recv_rows[p];
      }
      std::vector<int64_t> shape = r.shape;
      shape[0] = total;
      void* out = output_for(total * row * elem, shape, false);
      return comm_->AllToAll(r.input, sb, out, rb);
    }
  }
  return absl::InternalError("unknown collective");
}

Runtime::Runtime() : impl_(std::make_unique<Impl>()) {}
Runtime::~Runtime() = default;
absl::Status Runtime::Init(const RuntimeConfig& config) { return impl_->Init(config); }
absl::Status Runtime::Shutdown() { return impl_->Shutdown(); }
bool Runtime::initialized() const { return impl_->initialized(); }
absl::StatusOr<int> Runtime::rank() const { return impl_->Get(&Impl::rank_); }
absl::StatusOr<int> Runtime::size() const { return impl_->Get(&Impl::size_); }
absl::StatusOr<int> Runtime::local_rank() const { return impl_->Get(&Impl::local_rank_); }
absl::StatusOr<int> Runtime::local_size() const { return impl_->Get(&Impl::local_size_); }
absl::StatusOr<std::shared_ptr<Handle>> Runtime::Enqueue(CollectiveRequest request) {
  return impl_->Enqueue(std::move(request));
}
absl::StatusOr<transport::TransportStats> Runtime::transport_stats() const {
  return impl_->transport_stats();
}
absl::StatusOr<std::string> Runtime::transport_description() const {
  return impl_->transport_description();
}
absl::StatusOr<compression::CompressionReport> Runtime::compression_report() const {
  return impl_->compression_report();
}
absl::StatusOr<std::string> Runtime::compression_state() const {
  return impl_->compression_state();
}
absl::Status Runtime::LoadCompressionState(absl::string_view state) {
  return impl_->LoadCompressionState(state);
}

Runtime& GlobalRuntime() {
  static Runtime* runtime = new Runtime();  // never destroyed: bindings shut it down explicitly
  return *runtime;
}

}  // namespace braid
