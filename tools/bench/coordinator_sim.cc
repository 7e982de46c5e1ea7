#include "tools/bench/coordinator_sim.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/client.h"
#include "proto/braid.pb.h"

namespace braid::bench {
namespace {

// What every rank's thread shares: the step barrier around the timed region, and each
// rank's completion time per step.
struct Shared {
  explicit Shared(const SimOptions& o)
      : opts(o), done_at(o.ranks, std::vector<absl::Time>(o.warmup + o.steps)) {}
  const SimOptions& opts;
  absl::Mutex mu;
  int arrived ABSL_GUARDED_BY(mu) = 0;    // ranks through their warm-up
  bool timed_started ABSL_GUARDED_BY(mu) = false;
  int finished ABSL_GUARDED_BY(mu) = 0;   // ranks through their last step
  absl::Time start;                       // written once, before timed_started
  std::vector<std::vector<absl::Time>> done_at;  // [rank][step], each rank its own row
};

// One simulated rank: a real client, and what its stream delivered during the current step.
class SimRank {
 public:
  SimRank(int rank, Shared* shared, const std::vector<int64_t>& sizes)
      : rank_(rank), shared_(shared), sizes_(sizes) {}

  absl::Status Run() {
    const SimOptions& o = shared_->opts;
    coordinator::ClientOptions co;
    co.address = o.address;
    co.job_secret = o.job_secret;
    co.connect_timeout = o.timeout;
    co.dedicated_connection = true;  // N ranks are N connections, as N processes would be
    auto client = coordinator::ConnectCoordinator(co);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    proto::RegisterRequest reg;
    reg.set_rank(rank_);
    reg.set_size(o.ranks);
    reg.set_local_rank(-1);
    reg.set_host("sim");
    reg.set_pid(getpid());
    reg.mutable_settings()->set_cache_capacity(o.cache_capacity);
    reg.mutable_settings()->set_fusion_threshold_bytes(o.fusion_threshold_bytes);
    // Like ranks on the slow path: every request goes to the coordinator (and its writes
    // may be coalesced, Note [Coalesced writes] in coordinator/server.cc).
    reg.mutable_settings()->set_fast_path(0);
    auto placed = client_->Register(reg, o.timeout);
    if (!placed.ok()) return placed.status();
    absl::Status s = client_->StartNegotiation(
        rank_, [this](const proto::ResponseList& rl) { OnMessage(rl); },
        [this](const absl::Status& st) {
          absl::MutexLock lock(&mu_);
          closed_ = true;
          if (!st.ok()) closed_status_ = st;
        });
    if (!s.ok()) return s;
    for (int step = 0; step < o.warmup + o.steps && s.ok(); ++step) {
      if (step == o.warmup) WaitForEveryRank();
      s = Step(step);
      shared_->done_at[rank_][step] = absl::Now();
    }
    if (s.ok()) Finished();
    client_->Close(absl::Seconds(5));
    return s;
  }

  int64_t names() const { return names_total_; }
  int64_t responses() const { return responses_total_; }
  int64_t errors() const { return errors_total_; }
  const std::string& first_error() const { return first_error_; }

 private:
  absl::Status Step(int step) {
    const SimOptions& o = shared_->opts;
    std::vector<int> order(o.tensors);
    for (int i = 0; i < o.tensors; ++i) order[i] = i;
    std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(rank_) * 7919u + step);
    std::shuffle(order.begin(), order.end(), rng);
    {
      absl::MutexLock lock(&mu_);
      names_this_step_ = 0;
    }
    const int batches = std::max(1, std::min(o.batches, o.tensors));
    for (int b = 0; b < batches; ++b) {
      proto::RequestList list;
      list.set_rank(rank_);
      const int begin = o.tensors * b / batches, end = o.tensors * (b + 1) / batches;
      for (int k = begin; k < end; ++k) AddRequest(order[k], &list);
      absl::Status s = client_->Send(list);
      if (!s.ok()) return s;
    }
    absl::MutexLock lock(&mu_);
    auto done = [this, &o]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return names_this_step_ >= o.tensors || closed_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), o.timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "simulated rank ", rank_, ": step ", step, " got ", names_this_step_, " of ",
          o.tensors, " tensors within ", absl::FormatDuration(o.timeout)));
    }
    if (names_this_step_ < o.tensors) {
      return absl::UnavailableError(absl::StrCat("simulated rank ", rank_, ": stream closed: ",
                                                 closed_status_.message()));
    }
    return absl::OkStatus();
  }

  // Tensor i as the runtime sends it: its cache id once it has one, else the full request.
  void AddRequest(int i, proto::RequestList* list) {
    const std::string name = absl::StrCat("layer", i, ".grad");
    {
      absl::MutexLock lock(&mu_);
      if (auto it = cache_.find(name); it != cache_.end()) {
        list->add_cached_ids(it->second);
        return;
      }
    }
    proto::Request* r = list->add_requests();
    r->set_name(name);
    r->set_collective(proto::ALLREDUCE);
    r->set_dtype(proto::FLOAT32);
    r->add_shape(sizes_[i]);
    r->set_reduce_op(proto::AVERAGE);
    r->set_compression("none");
  }

  void OnMessage(const proto::ResponseList& rl) {
    absl::MutexLock lock(&mu_);
    for (const proto::Response& r : rl.responses()) {
      ++responses_total_;
      if (r.type() == proto::Response::ERROR) {
        ++errors_total_;
        if (first_error_.empty()) first_error_ = r.error_message();
      }
      for (int i = 0; i < r.names_size(); ++i) {
        if (r.type() == proto::Response::OK && i < r.cache_ids_size() && r.cache_ids(i) != 0) {
          cache_[r.names(i)] = r.cache_ids(i);
        }
      }
      names_this_step_ += r.names_size();
      names_total_ += r.type() == proto::Response::OK ? r.names_size() : 0;
    }
    for (int32_t id : rl.evicted_cache_ids()) {
      for (auto it = cache_.begin(); it != cache_.end(); ++it) {
        if (it->second == id) {
          cache_.erase(it);
          break;
        }
      }
    }
    if (rl.shutdown() || !rl.abort_message().empty()) {
      closed_ = true;
      if (!rl.abort_message().empty()) closed_status_ = absl::AbortedError(rl.abort_message());
    }
  }

  // The timed steps start together: every rank has finished its warm-up.
  void WaitForEveryRank() {
    const SimOptions& o = shared_->opts;
    absl::MutexLock lock(&shared_->mu);
    ++shared_->arrived;
    auto all = [this, &o]() ABSL_SHARED_LOCKS_REQUIRED(shared_->mu) {
      return shared_->arrived == o.ranks || shared_->timed_started;
    };
    shared_->mu.AwaitWithTimeout(absl::Condition(&all), o.timeout);
    if (!shared_->timed_started) {
      if (o.on_timed_start) o.on_timed_start();
      shared_->start = absl::Now();
      shared_->timed_started = true;
    }
  }

  // The last rank through its last step ends the timed region (before any goodbye).
  void Finished() {
    absl::MutexLock lock(&shared_->mu);
    if (++shared_->finished == shared_->opts.ranks && shared_->opts.on_timed_end) {
      shared_->opts.on_timed_end();
    }
  }

  const int rank_;
  Shared* const shared_;
  const std::vector<int64_t>& sizes_;
  std::unique_ptr<CoordinatorClient> client_;
  absl::Mutex mu_;
  std::map<std::string, int32_t> cache_ ABSL_GUARDED_BY(mu_);
  int names_this_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status closed_status_ ABSL_GUARDED_BY(mu_);
  int64_t names_total_ = 0, responses_total_ = 0, errors_total_ = 0;  // under mu_
  std::string first_error_;                                           // under mu_
};

}  // namespace

std::vector<int64_t> SimTensorSizes(int tensors, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> sizes(tensors);
  for (int i = 0; i < tensors; ++i) {
    // Alternating weights (16 K to 4 M elements) and biases (64 to 4 K elements).
    const int lo = i % 2 == 0 ? 14 : 6, hi = i % 2 == 0 ? 22 : 12;
    sizes[i] = int64_t{1} << std::uniform_int_distribution<int>(lo, hi)(rng);
  }
  return sizes;
}

absl::StatusOr<SimResult> RunSimulation(const SimOptions& options) {
  if (options.ranks < 1 || options.tensors < 1 || options.steps < 1 || options.warmup < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks, tensors, steps and warmup must be at least 1, got ", options.ranks, ", ",
        options.tensors, ", ", options.steps, ", ", options.warmup));
  }
  Shared shared(options);
  const std::vector<int64_t> sizes = SimTensorSizes(options.tensors, options.seed);
  std::vector<std::unique_ptr<SimRank>> ranks;
  std::vector<absl::Status> status(options.ranks);
  for (int r = 0; r < options.ranks; ++r) {
    ranks.push_back(std::make_unique<SimRank>(r, &shared, sizes));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < options.ranks; ++r) {
    threads.emplace_back([&, r] { status[r] = ranks[r]->Run(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }

  SimResult out;
  for (const auto& r : ranks) {
    out.names_received.push_back(r->names());
    out.responses_received.push_back(r->responses());
    out.errors.push_back(r->errors());
    if (out.first_error.empty()) out.first_error = r->first_error();
  }
  absl::Time previous = shared.start;
  for (int step = options.warmup; step < options.warmup + options.steps; ++step) {
    absl::Time done = absl::InfinitePast();
    for (int r = 0; r < options.ranks; ++r) done = std::max(done, shared.done_at[r][step]);
    out.step_times.push_back(done - previous);
    previous = done;
  }
  out.timed = previous - shared.start;
  out.steps_per_second = options.steps / absl::ToDoubleSeconds(out.timed);
  return out;
}

}  // namespace braid::bench
