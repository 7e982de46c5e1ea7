// Runtime's lifecycle (Init, Shutdown) and its public facade. Note [Threads and locks] in
// runtime_impl.h says which threads Init starts.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/client.h"
#include "coordinator/server.h"
#include "device/nccl.h"
#include "glog/logging.h"
#include "runtime/heartbeat_report.h"
#include "runtime/job_identity.h"
#include "runtime/launcher_watch.h"
#include "runtime/loop_affinity.h"
#include "runtime/resolve.h"
#include "runtime/registration.h"
#include "runtime/runtime_impl.h"

namespace braid {

Runtime::Impl::Impl() = default;
Runtime::Impl::~Impl() { Shutdown().IgnoreError(); }

bool Runtime::Impl::initialized() const { return controller_.running(); }

absl::StatusOr<int> Runtime::Impl::Get(int Impl::*field) const {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  return this->*field;  // set by Init before the job runs, and only by the next Init
}

absl::StatusOr<transport::TransportStats> Runtime::Impl::transport_stats() const {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  absl::MutexLock lock(&parts_mu_);
  return executor_->stats();
}

absl::StatusOr<std::string> Runtime::Impl::transport_description() const {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  absl::MutexLock lock(&parts_mu_);
  return transport_description_;
}

absl::StatusOr<CompressionReport> Runtime::Impl::compression_report() const {
  BRAID_RETURN_IF_ERROR(controller_.CheckRunning());
  return ledger_->Report();  // ledger_ changes only in Init, before the job runs
}

absl::Status Runtime::Impl::Init(const RuntimeConfig& config, RuntimeDeps deps) {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  if (controller_.running()) return absl::OkStatus();
  {
    absl::MutexLock lock(&init_cancel_mu_);
    init_cancelled_ = false;
  }
  absl::Status s = InitLocked(config, std::move(deps));
  {
    absl::MutexLock lock(&init_cancel_mu_);
    registering_ = nullptr;
  }
  if (!s.ok()) ReleaseParts();
  return s;
}

void Runtime::Impl::CancelInit() {
  absl::MutexLock lock(&init_cancel_mu_);
  init_cancelled_ = true;
  if (registering_ != nullptr) registering_->CancelRegister();
}

namespace {

// What a rank does before anything else of Init: warn of misspelt BRAID_ and Horovod's
// variables (config.h: EnvironmentWarnings) and watch its launcher.
void BeforeInit(const RuntimeConfig& config) {
  // braidrun (which hands its ranks BRAID_LAUNCHER_PIPE) warned once for the whole job;
  // without it (no launcher, or another one, even one setting BRAID_RANK), the first local
  // rank of each host does, once. Atomic: runtimes of one process may start on several
  // threads at once (tests do).
  static std::atomic<bool> warned{false};
  if (config.launcher_pipe_fd < 0 && config.launch.local_rank <= 0 && !warned.exchange(true)) {
    for (const std::string& w : config.environment_warnings) LOG(WARNING) << "braid: " << w;
  }
  // Note [Ranks die with their launcher]: first, so a rank waiting to register is covered.
  if (config.launcher_pipe_fd >= 0) {
    if (absl::Status s = WatchLauncher(config.launcher_pipe_fd, config.launcher_pipe_inode,
                                       config.launch.rank);
        !s.ok()) {
      LOG(WARNING) << "braid: " << s.message();
    }
  }
}

}  // namespace

absl::Status Runtime::Impl::InitLocked(const RuntimeConfig& config, RuntimeDeps deps) {
  config_ = config;
  BeforeInit(config);
  // Before the client: its heartbeats read the ledger (braidctl status).
  BRAID_RETURN_IF_ERROR(MakeCompression(config));
  devices_ = deps.devices ? std::move(deps.devices) : device::MakeDefaultDevices(config.cuda_unverified);
  nccl_ = deps.nccl ? std::move(deps.nccl) : NcclProvider(device::DefaultNccl);
  CoordinatorClientSetup setup;
  setup.fill_heartbeat = [this](proto::HeartbeatRequest* hb) {
    AddCompressionTotals(*ledger_, hb);
    controller_.AddFastPathTotals(hb);
  };
  ranks_waiting_.store(0);
  ranks_leaving_.store(0);
  setup.on_heartbeat_response = [this](const proto::HeartbeatResponse& r) {
    ranks_waiting_.store(r.ranks_waiting());
    ranks_leaving_.store(r.ranks_leaving());
  };
  LaunchInfo launch = config.launch;
  // Note [Job identity]: the secret every call to the coordinator carries, which also keys
  // the data plane's tags. An injected coordinator client presents its own.
  std::optional<JobSecret> secret;
  if (!deps.coordinator) {
    const bool alone = config.coordinator.empty() && launch.size <= 1 && launch.rank <= 0;
    auto resolved = ResolveJobSecret(config, launch, alone);
    if (!resolved.ok()) return resolved.status();
    secret = *std::move(resolved);
  }
  BRAID_ASSIGN_OR_RETURN(client_, deps.coordinator
                                      ? deps.coordinator(setup)
                                      : ConnectDefaultCoordinator(config, *secret, &launch, setup));
  std::unique_ptr<DataPlane> data_plane =
      deps.data_plane ? std::move(deps.data_plane)
                      : MakeUcxDataPlane(config, secret ? secret->secret : config.job_secret);
  {
    absl::MutexLock lock(&init_cancel_mu_);
    if (init_cancelled_) return absl::CancelledError("init() was interrupted");
    registering_ = client_.get();
  }
  // Note [Peers at registration]: one Register RPC, then the data plane connects.
  auto join = JoinJob(config, launch, *client_, *data_plane);
  if (!join.ok()) return secret ? ExplainRefusedSecret(join.status(), *secret) : join.status();
  Joined joined = *std::move(join);
  const proto::RegisterResponse& registered = joined.registration;
  rank_ = registered.rank();
  size_ = registered.size();
  local_rank_ = registered.local_rank();
  local_size_ = registered.local_size();
  homogeneous_ = registered.homogeneous() ? 1 : 0;
  channels_ = std::move(joined.channels);
  timeline_max_bytes_ = config.timeline_max_bytes;
  BRAID_RETURN_IF_ERROR(OpenTimeline(config.timeline_path));
  BRAID_RETURN_IF_ERROR(StartLoop(registered.settings()));
  VLOG(1) << "braid: rank " << rank_ << " of " << size_ << " joined ("
          << channels_.data->Describe() << ")";
  return absl::OkStatus();
}

absl::Status Runtime::Impl::MakeCompression(const RuntimeConfig& config) {
  ledger_ = std::make_unique<StatisticsLedger>();
  compression::StageOptions stage_options;
  stage_options.seed = config.seed;
  stage_options.registry.test_methods = config.test_compressors;
  stage_ = std::make_unique<compression::CompressionStage>(stage_options);
  test_compressors_ = config.test_compressors;
  default_plan_ = nullptr;
  {
    absl::MutexLock lock(&plans_mu_);  // parsed under another job's test methods
    plans_.clear();
  }
  if (compression::CompressionPlan::IsPlan(config.compression)) {
    absl::StatusOr<std::shared_ptr<const compression::CompressionPlan>> plan =
        PlanOf(config.compression);
    if (!plan.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BRAID_COMPRESSION: ", plan.status().message()));
    }
    default_plan_ = *plan;
    default_method_ = &stage_->none();
    return absl::OkStatus();
  }
  auto default_method = stage_->Resolve(config.compression);
  if (!default_method.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BRAID_COMPRESSION: ", default_method.status().message()));
  }
  default_method_ = *default_method;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Runtime::Impl::HostCoordinator(const RuntimeConfig& config,
                                                           const JobSecret& secret,
                                                           const LaunchInfo& launch, bool alone) {
  coordinator::ServerOptions so;
  so.bind_address = alone ? "127.0.0.1" : config.coordinator_host;
  so.port = alone ? 0 : config.coordinator_port;
  so.world_size = launch.size;
  so.job_secret = secret.secret;
  so.single_job = true;  // another job's ranks on this port are refused at once
  so.register_timeout = RegistrationTimeout(config);  // before the ranks' own deadline
  so.tls_cert_file = config.tls_cert_file;
  so.tls_key_file = config.tls_key_file;
  // No settings of its own: every rank's registration proposes the job settings it set,
  // this one's included (Note [Job settings]).
  BRAID_ASSIGN_OR_RETURN(hosted_, coordinator::StartCoordinator(so));
  return hosted_->address();
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> Runtime::Impl::ConnectDefaultCoordinator(
    const RuntimeConfig& config, const JobSecret& secret, LaunchInfo* launch,
    const CoordinatorClientSetup& setup) {
  std::string address = config.coordinator;
  if (address.empty()) {
    const bool alone = launch->size <= 1 && launch->rank <= 0;
    if (alone) {
      // No launcher and no peers: a private coordinator on a free port.
      launch->rank = 0;
      launch->size = 1;
    }
    if (!alone) {
      // Once, with a bounded wait: a host that does not resolve fails every rank at once
      // naming it, not rank 0 as "cannot listen" and the others a minute later.
      BRAID_RETURN_IF_ERROR(
          CheckHostResolves(config.coordinator_host, config.coordinator_host_from));
    }
    if (launch->rank == 0) {
      BRAID_ASSIGN_OR_RETURN(address, HostCoordinator(config, secret, *launch, alone));
    } else if (launch->rank < 0) {
      return absl::InvalidArgumentError(
          "BRAID_COORDINATOR is not set and this process has no rank from a launcher "
          "(BRAID_RANK, RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK): run under braidrun");
    } else {
      address = coordinator::HostPort(config.coordinator_host, config.coordinator_port);
    }
  }
  coordinator::ClientOptions co;
  co.address = address;
  co.job_secret = secret.secret;
  co.tls_ca_file = config.tls_ca_file;
  // Waiting for the coordinator to come up is part of registering: BRAID_REGISTER_TIMEOUT_S
  // bounds it when set.
  co.connect_timeout = config.register_timeout.value_or(std::max(config.timeout, absl::Seconds(30)));
  co.cancelled = [this] {
    absl::MutexLock lock(&init_cancel_mu_);
    return init_cancelled_;
  };
  if (hosted_ == nullptr && config.coordinator.empty()) {
    co.unreachable_hint = absl::StrCat(
        ": rank 0 hosts it, on ", config.coordinator_host, " (", config.coordinator_host_from,
        ") at port ", config.coordinator_port, " (", config.coordinator_port_from,
        "): is rank 0 running, and do every rank's settings of these agree?");
  }
  // Registration replaces it with the job's (coordinator/client.h).
  if (config.job.heartbeat_timeout) {
    co.heartbeat_interval = coordinator::HeartbeatInterval(*config.job.heartbeat_timeout);
  }
  co.fill_heartbeat = setup.fill_heartbeat;
  co.on_heartbeat_response = setup.on_heartbeat_response;
  // The timeline marks when each rank reported. Asked once, as the stream opens: a timeline
  // begun later by StartTimeline has no per-rank "ready" marks.
  co.report_ages = !config.timeline_path.empty();
  return coordinator::ConnectCoordinator(co);
}

void Runtime::Impl::MakeExecutor(const proto::JobSettings& job) {
  absl::MutexLock lock(&parts_mu_);
  transport_description_ = channels_.data->Describe();
  planes_ = DataPlaneRegistry();
  planes_.Add(MemoryKind::kHost, channels_.data.get());
  // Note [GPU data planes]: job-wide, so every rank decides alike.
  device_planes_ = std::make_unique<DevicePlanes>(static_cast<GpuDataPlane>(job.gpu_data_plane()),
                                                  nccl_, channels_.control.get(), config_.timeout);
  Executor::Parts ep;
  ep.planes = &planes_;
  ep.control = channels_.control.get();
  ep.stage = stage_.get();
  auto_compression_ = std::make_unique<AutoCompression>(stage_.get());
  ep.auto_compression = auto_compression_.get();
  ep.ledger = ledger_.get();
  ep.in_flight = &controller_;
  ep.pipelined_copy = config_.pipelined_copy;
  ep.devices = devices_;
  ep.device_timeout = config_.timeout;
  ep.device_planes = device_planes_.get();
  ep.timeline = [this] { return timeline(); };
  ep.process_set_ranks = [this](int32_t id) { return SetRanksOf(id); };
  // Note [Settings changes]: a process set's channels run with the job's pipeline settings.
  if (channels_.subset) {
    ep.set_channels = [subset = channels_.subset, chunk = job.ring_chunk_bytes(),
                       window = static_cast<int>(job.ring_window())](
                          uint32_t slot, const std::vector<int>& ranks) {
      transport::Channels c = subset(slot, ranks);
      if (c.data) c.data->SetPipeline(static_cast<size_t>(chunk), window);
      return c;
    };
  }
  ep.apply_process_set_change = [this](const Bucket& b) { ApplyProcessSetChange(b); };
  executor_ = std::make_unique<Executor>(ep);
}

absl::Status Runtime::Impl::StartLoop(const proto::JobSettings& job) {
  MakeExecutor(job);
  ResetProcessSets();
  Executor* executor = executor_.get();  // braid-loop's; replaced only by the next Init
  NegotiationController::Parts cp;
  cp.rank = rank_;
  cp.size = size_;
  cp.client = client_.get();
  cp.control = channels_.control.get();
  cp.abort_data_plane = [executor](const absl::Status& s) { executor->Abort(s); };
  cp.first_timeout = [executor](const absl::Status& s) { return executor->FirstTimeout(s); };
  cp.timeline = [this] { return timeline(); };
  cp.process_set_ranks = [this](int32_t id) { return SetRanksOf(id); };
  cp.cycle_time = config_.cycle_time;
  // Note [Fast path]: job-wide, so every rank votes or none does.
  cp.fast_path = job.fast_path() != 0 && job.cache_capacity() > 0;
  cp.fusion_threshold = job.fusion_threshold_bytes();
  // Well before the stall check, so a tensor a rank stopped sending is reported in time, and
  // before the negotiation deadline, so a tensor held for the vote reaches the coordinator
  // before that deadline makes the job out of step (Note [Resynchronization]).
  cp.fallback_after = std::min(absl::Seconds(1), absl::Milliseconds(job.stall_check_ms()) / 2);
  if (job.negotiation_timeout_ms() > 0) {
    cp.fallback_after =
        std::min(cp.fallback_after, absl::Milliseconds(job.negotiation_timeout_ms()) / 2);
  }
  BRAID_RETURN_IF_ERROR(controller_.Start(cp));
  StepSettings* steps = MakeStepSettings(job);
  loop_ = std::thread([this, executor, steps] { Loop(*executor, *steps); });
  // Named by its creator, so the name is there by the time Init returns.
  pthread_setname_np(loop_.native_handle(), "braid-loop");
  // Note [Loop thread affinity]: a rank that cannot bind its loop thread runs unbound.
  const int cpu = ChooseLoopCpu(config_.loop_cpu, AllowedCpus(), local_rank_, local_size_);
  if (cpu >= 0) {
    if (absl::Status s = BindThread(loop_.native_handle(), cpu); !s.ok()) {
      LOG(WARNING) << "braid: " << s.message() << " (BRAID_LOOP_CPU=" << config_.loop_cpu
                   << "); it runs where the scheduler puts it";
    }
  }
  return absl::OkStatus();
}

void Runtime::Impl::Loop(Executor& executor, StepSettings& steps) {
  // The one queue between the two parts: what the controller's cycle agreed, in order.
  std::deque<Bucket> buckets;
  while (controller_.NextBuckets(&buckets)) {
    for (const Bucket& b : buckets) {
      if (steps.Before(b)) executor.Run(b);
    }
    buckets.clear();
    controller_.CycleDone();
  }
}

void Runtime::Impl::ReleaseParts() {
  OpenTimeline("").IgnoreError();  // flushes
  {
    // The NCCL communicators end (aborted: a peer that is gone never holds up a shutdown)
    // before the control channel they were made over. The executor, which points at them
    // as at the channels, runs no more (braid-loop has ended).
    absl::MutexLock lock(&parts_mu_);
    device_planes_.reset();
  }
  channels_ = transport::Channels();
  client_.reset();
  if (hosted_) hosted_->Shutdown(absl::ZeroDuration());
  hosted_.reset();
}

absl::Status Runtime::Impl::Shutdown() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  if (!controller_.running()) return absl::OkStatus();
  // Wake a collective blocked on peers that may never come. Work still in negotiation
  // needs no abort: the loop stops before running it.
  if (controller_.RequestStop()) {
    absl::MutexLock lock(&parts_mu_);
    executor_->Abort(absl::CancelledError("braid is shutting down"));
  }
  if (loop_.joinable()) loop_.join();
  controller_.EndJob();
  client_->Close(absl::Milliseconds(500));
  if (hosted_) {
    // The other ranks may still be finishing their last collectives: stopping the
    // coordinator now would cancel them ("the coordinator ended the job"). Wait for every
    // rank's goodbye (or its loss, which fails what waited on it), as long as any wait.
    if (!hosted_->WaitForJobEnd(config_.timeout)) {
      LOG(WARNING) << "braid: rank " << rank_ << " stops the coordinator it hosts although "
                   << "not every rank shut down within " << config_.timeout
                   << " (BRAID_TIMEOUT_S)";
    }
    hosted_->Shutdown(absl::Milliseconds(500));
  }
  ReleaseParts();
  return absl::OkStatus();
}

// ---- The facade ----

Runtime::Runtime() : impl_(std::make_unique<Impl>()) {}
Runtime::~Runtime() = default;
absl::Status Runtime::Init(const RuntimeConfig& config) { return impl_->Init(config, {}); }
void Runtime::CancelInit() { impl_->CancelInit(); }
absl::Status Runtime::Init(const RuntimeConfig& config, RuntimeDeps deps) {
  return impl_->Init(config, std::move(deps));
}
absl::Status Runtime::Shutdown() { return impl_->Shutdown(); }
bool Runtime::initialized() const { return impl_->initialized(); }
absl::StatusOr<int> Runtime::rank() const { return impl_->Get(&Impl::rank_); }
absl::StatusOr<int> Runtime::size() const { return impl_->Get(&Impl::size_); }
absl::StatusOr<int> Runtime::local_rank() const { return impl_->Get(&Impl::local_rank_); }
absl::StatusOr<int> Runtime::local_size() const { return impl_->Get(&Impl::local_size_); }
absl::StatusOr<bool> Runtime::is_homogeneous() const {
  absl::StatusOr<int> v = impl_->Get(&Impl::homogeneous_);
  if (!v.ok()) return v.status();
  return *v != 0;
}
absl::StatusOr<int> Runtime::ranks_waiting() const {
  BRAID_RETURN_IF_ERROR(impl_->Get(&Impl::rank_).status());  // FailedPrecondition uninitialized
  return impl_->ranks_waiting_.load();
}
absl::StatusOr<int> Runtime::ranks_leaving() const {
  BRAID_RETURN_IF_ERROR(impl_->Get(&Impl::rank_).status());  // FailedPrecondition uninitialized
  return impl_->ranks_leaving_.load();
}
absl::Status Runtime::ReportFailure(const std::string& name, const absl::Status& cause) {
  return impl_->ReportFailure(name, cause);
}
absl::StatusOr<std::shared_ptr<Handle>> Runtime::Enqueue(CollectiveRequest request) {
  return impl_->Enqueue(std::move(request));
}
void Runtime::BeginGroup() { impl_->BeginGroup(); }
absl::Status Runtime::EndGroup() { return impl_->EndGroup(); }
absl::StatusOr<int32_t> Runtime::AddProcessSet(std::vector<int> ranks, bool members_only) {
  return impl_->AddProcessSet(std::move(ranks), members_only);
}
absl::Status Runtime::RemoveProcessSet(int32_t id) { return impl_->RemoveProcessSet(id); }
absl::StatusOr<std::vector<int>> Runtime::ProcessSetRanks(int32_t id) const {
  return impl_->ProcessSetRanks(id);
}
absl::StatusOr<std::map<int32_t, std::vector<int>>> Runtime::ProcessSets() const {
  return impl_->ProcessSets();
}
absl::StatusOr<transport::TransportStats> Runtime::transport_stats() const {
  return impl_->transport_stats();
}
absl::StatusOr<std::string> Runtime::transport_description() const {
  return impl_->transport_description();
}
absl::StatusOr<CompressionReport> Runtime::compression_report() const {
  return impl_->compression_report();
}
absl::StatusOr<std::string> Runtime::compression_state() const {
  return impl_->compression_state();
}
absl::Status Runtime::LoadCompressionState(absl::string_view state) {
  return impl_->LoadCompressionState(state, absl::OkStatus());
}
absl::Status Runtime::RefuseCompressionState(const absl::Status& why) {
  if (why.ok()) return absl::InvalidArgumentError("RefuseCompressionState needs an error");
  return impl_->LoadCompressionState("", why);
}
absl::StatusOr<int> Runtime::ForgetCompressionState(absl::Span<const std::string> names) {
  return impl_->ForgetCompressionState(names);
}

Runtime& GlobalRuntime() {
  static Runtime* runtime = new Runtime();  // never destroyed: bindings shut it down explicitly
  return *runtime;
}

}  // namespace braid
