// braid-powersgd-bench: PowerSGD on a real model's gradient set against the uncompressed
// all-reduce of the same tensors, same ranks, same run.
//
//   braid-powersgd-bench [--methods none,powersgd:rank=1,powersgd:rank=2,powersgd:rank=4]
//       [--tls sm,tcp] [--ranks 2] [-n 5] [-w 2] [--repeat 3] [--json PATH]
//
// The gradient set is ResNet-18 for CIFAR-10: 62 tensors, 11,173,962 float32 (44.7 MB), random
// values (a magnitude per tensor, uniform in (-1, 1) times it; the same on every run). Per
// --tls entry (UCX_TLS=sm: shared memory; tcp: tcp on loopback, UCX_NET_DEVICES=lo) the bench
// forks --ranks ranks over a UCX Communicator and times, per method:
//   none       one in-place Communicator::AllReduce(kAverage) of all tensors, fused into one
//              buffer (as the runtime's fusion does with the default 64 MiB buckets);
//   powersgd:… Compressor::Reduce of the 62 tensors as one bucket (compress, both all-reduces,
//              decompress, error feedback; the step counter advances every call).
// Each timed call starts from a fresh copy of the gradients (the copy is not timed) after a
// Barrier; a rank's time is its mean per call, a repeat's time the max over ranks; the table
// shows the median over --repeat repeats (and min, max), the time spent inside collectives
// (a Communicator wrapper measures it; the rest is compute), the payload and transport bytes
// per rank and call, and time(none) / time(method). Methods rotate every repeat.
//
// Check (one call per method on a fresh compressor, so the residual is zero and the result is
// the orthogonal projection P̂·P̂ᵀ·mean(G) of the mean gradient): every rank recomputes the
// mean of all ranks' inputs in double; uncompressed tensors must equal it within float32
// rounding, compressed ones must satisfy ⟨mean − result, result⟩ ≈ 0 and ‖result‖ ≤ ‖mean‖;
// every rank must hold the same bits. Exit code 1 when a check fails, 2 on an error;
// --corrupt 2 doubles every checked result to show that the checks fail.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tools/cli.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/store.h"
#include "compression/compressor.h"
#include "compression/powersgd.h"
#include "compression/registry.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "tools/bench/bench_buffer.h"
#include "tools/bench/bench_math.h"
#include "tools/bench/bench_ranks.h"
#include "transport/communicator.h"
#include "transport/ucx_communicator.h"

namespace braid::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kProg = "braid-powersgd-bench";

struct Config {
  std::vector<std::string> methods;
  std::vector<std::string> tls;
  int ranks = 2;
  int iters = 5;
  int warmup = 2;
  int repeat = 3;
  std::string json_path;
  // Testing the checks: every checked result is multiplied by this first (1: off), so 2
  // must make the run fail with exit code 1.
  double corrupt = 1;
  absl::Duration timeout = absl::Seconds(120);
  absl::Duration deadline = absl::Minutes(30);
  int peer_error_handling = 0;  // UcxOptions::peer_error_handling for local peers (0/1)
};

// ResNet-18 for CIFAR-10 (3×3 first convolution, 10 classes), torchvision's parameter order.
std::vector<std::vector<int64_t>> ResNet18Shapes() {
  std::vector<std::vector<int64_t>> s = {{64, 3, 3, 3}, {64}, {64}};
  const int64_t stages[4] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int64_t out : stages) {
    for (int block = 0; block < 2; ++block) {
      const int64_t cin = block == 0 ? in : out;
      s.insert(s.end(), {{out, cin, 3, 3}, {out}, {out}, {out, out, 3, 3}, {out}, {out}});
      if (block == 0 && cin != out) s.insert(s.end(), {{out, cin, 1, 1}, {out}, {out}});
    }
    in = out;
  }
  s.insert(s.end(), {{10, 512}, {10}});
  return s;
}

// Element i of tensor t on `rank`: uniform in (-1, 1) from a counter hash, times 2^-(t % 8).
inline float Gradient(int rank, size_t t, size_t i) {
  uint64_t h = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(t) << 32) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  const double u = static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0;
  return static_cast<float>(std::ldexp(u, -static_cast<int>(t % 8)));
}

// Forwards to a Communicator and adds up the seconds spent inside its collectives.
class TimedCommunicator : public transport::Communicator {
 public:
  explicit TimedCommunicator(transport::Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  absl::Status AllReduce(const void* s, void* r, size_t n, DataType d, ReduceOp op) override {
    return Timed([&] { return c_.AllReduce(s, r, n, d, op); });
  }
  absl::Status ReduceScatter(const void* s, void* r, absl::Span<const size_t> n, DataType d,
                             ReduceOp op) override {
    return Timed([&] { return c_.ReduceScatter(s, r, n, d, op); });
  }
  absl::Status AllGather(const void* s, size_t b, void* r, absl::Span<const size_t> rb) override {
    return Timed([&] { return c_.AllGather(s, b, r, rb); });
  }
  absl::Status AllToAll(const void* s, absl::Span<const size_t> sb, void* r,
                        absl::Span<const size_t> rb) override {
    return Timed([&] { return c_.AllToAll(s, sb, r, rb); });
  }
  absl::Status Broadcast(void* b, size_t n, int root) override {
    return Timed([&] { return c_.Broadcast(b, n, root); });
  }
  absl::Status Barrier() override { return c_.Barrier(); }
  void Abort(absl::Status reason) override { c_.Abort(std::move(reason)); }
  transport::TransportStats stats() const override { return c_.stats(); }
  std::string Describe() const override { return c_.Describe(); }
  double seconds = 0;

 private:
  template <typename F>
  absl::Status Timed(F&& f) {
    const auto t0 = Clock::now();
    absl::Status s = f();
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    return s;
  }
  transport::Communicator& c_;
};

// One method on one rank: the bucket's views over `work`, and its compressor.
struct Runner {
  std::string method;
  std::unique_ptr<compression::Compressor> compressor;  // null for none
  int64_t step = 0;
  std::vector<uint64_t> payload;

  absl::Status Call(transport::Communicator& comm, std::vector<compression::TensorView>& views,
                    float* work, size_t total) {
    if (!compressor) {
      payload.assign(1, total * sizeof(float));
      return comm.AllReduce(work, work, total, DataType::kFloat32, ReduceOp::kAverage);
    }
    std::vector<int64_t> steps(views.size(), step++);
    payload.assign(views.size(), 0);
    compression::StepContext ctx;
    ctx.op = ReduceOp::kAverage;
    ctx.steps = steps;
    ctx.payload_bytes = absl::MakeSpan(payload);
    return compressor->Reduce(views, comm, ctx);
  }
  uint64_t payload_total() const {
    uint64_t s = 0;
    for (uint64_t p : payload) s += p;
    return s;
  }
};

absl::StatusOr<std::unique_ptr<compression::Compressor>> MakeCompressor(const std::string& m) {
  if (m == "none") return std::unique_ptr<compression::Compressor>();
  BRAID_ASSIGN_OR_RETURN(compression::CompressionSpec spec, compression::ParseCompressionSpec(m));
  return compression::CreateCompressor(spec);
}

struct Row {
  std::string method;
  double ms = 0, ms_min = 0, ms_max = 0, collective_ms = 0;
  double payload_bytes = 0, sent_bytes = 0, speedup = 0;
  int64_t wrong = 0;
  bool identical = true;
};

// Which tensors `method` compresses (none: no tensor).
std::vector<bool> CompressedTensors(const std::string& method,
                                    const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<bool> out(shapes.size(), false);
  if (method == "none") return out;
  const compression::CompressionSpec spec = *compression::ParseCompressionSpec(method);
  if (spec.method != "powersgd") return out;
  compression::PowerSgdOptions o;
  o.rank = static_cast<int>(spec.IntOption("rank"));
  o.min_compression_rate = spec.FloatOption("min_compression_rate");
  for (size_t t = 0; t < shapes.size(); ++t) out[t] = compression::PlanPowerSgd(shapes[t], o).compressed;
  return out;
}

// The check described at the top, for `result` (all tensors back to back) on this rank.
// Returns the number of tensors that failed it.
int64_t CheckResult(const std::vector<std::vector<int64_t>>& shapes, const float* result,
                    int ranks, const std::vector<bool>& compressed) {
  int64_t wrong = 0;
  size_t off = 0;
  for (size_t t = 0; t < shapes.size(); ++t) {
    size_t n = 1;
    for (int64_t d : shapes[t]) n *= static_cast<size_t>(d);
    double dot = 0, rr = 0, mm = 0, maxdiff = 0, maxabs = 0;
    for (size_t i = 0; i < n; ++i) {
      double mean = 0;
      for (int r = 0; r < ranks; ++r) mean += Gradient(r, t, i);
      mean /= ranks;
      const double x = result[off + i];
      dot += (mean - x) * x;
      rr += x * x;
      mm += mean * mean;
      maxdiff = std::max(maxdiff, std::fabs(mean - x));
      maxabs = std::max(maxabs, std::fabs(mean));
    }
    off += n;
    const bool exact = maxdiff <= maxabs * 0x1p-22;
    const bool projection =
        rr > 0 && std::fabs(dot) <= 1e-3 * std::sqrt(rr * mm) && rr <= mm * (1 + 1e-5);
    if (!(compressed[t] ? projection : exact)) ++wrong;
  }
  return wrong;
}

// Checks `result` (total floats: the method's output on fresh inputs) on every rank and agrees
// on the verdict: r->wrong (tensors failing CheckResult, the most on any rank) and
// r->identical (every rank holds the same bits).
absl::Status CheckOnEveryRank(const Config& cfg, transport::Communicator& comm,
                              const std::vector<std::vector<int64_t>>& shapes, float* result,
                              size_t total, Row* r) {
  if (cfg.corrupt != 1) {
    for (size_t i = 0; i < total; ++i) result[i] *= static_cast<float>(cfg.corrupt);
  }
  double agree[3] = {static_cast<double>(CheckResult(shapes, result, comm.size(),
                                                     CompressedTensors(r->method, shapes))),
                     0, 0};
  const auto* bytes = reinterpret_cast<const uint8_t*>(result);
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the result's bytes
  for (size_t i = 0; i < total * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  agree[1] = static_cast<double>(h >> 11);  // exact in a double
  agree[2] = -agree[1];
  BRAID_RETURN_IF_ERROR(comm.AllReduce(agree, agree, 3, DataType::kFloat64, ReduceOp::kMax));
  r->wrong = static_cast<int64_t>(agree[0]);
  r->identical = agree[1] == -agree[2];  // max == min over ranks
  return absl::OkStatus();
}

// Times every method on this rank; rank 0 fills `rows`.
absl::Status Measure(const Config& cfg, TimedCommunicator& comm, std::vector<Row>* rows) {
  const auto shapes = ResNet18Shapes();
  size_t total = 0;
  for (const auto& s : shapes) {
    size_t n = 1;
    for (int64_t d : s) n *= static_cast<size_t>(d);
    total += n;
  }
  Buffer pristine(total * sizeof(float)), work(total * sizeof(float));
  std::vector<compression::TensorView> views;
  size_t off = 0;
  for (size_t t = 0; t < shapes.size(); ++t) {
    size_t n = 1;
    for (int64_t d : shapes[t]) n *= static_cast<size_t>(d);
    for (size_t i = 0; i < n; ++i) pristine.floats()[off + i] = Gradient(comm.rank(), t, i);
    views.push_back({"", shapes[t], work.floats() + off, n});
    off += n;
  }
  std::vector<std::string> names;
  for (size_t t = 0; t < shapes.size(); ++t) names.push_back(absl::StrCat("grad.", t));
  for (size_t t = 0; t < shapes.size(); ++t) views[t].name = names[t];

  const size_t nm = cfg.methods.size();
  std::vector<Runner> runners(nm);
  for (size_t k = 0; k < nm; ++k) {
    runners[k].method = cfg.methods[k];
    BRAID_ASSIGN_OR_RETURN(runners[k].compressor, MakeCompressor(cfg.methods[k]));
  }
  std::vector<std::vector<double>> times(nm), coll(nm);
  std::vector<double> sent(nm);
  for (size_t k = 0; k < nm; ++k) {  // warm-up
    for (int w = 0; w < cfg.warmup; ++w) {
      std::memcpy(work.data, pristine.data, total * sizeof(float));
      BRAID_RETURN_IF_ERROR(runners[k].Call(comm, views, work.floats(), total));
    }
  }
  for (int rep = 0; rep < cfg.repeat; ++rep) {
    for (size_t i = 0; i < nm; ++i) {
      const size_t k = (i + static_cast<size_t>(rep)) % nm;
      double t = 0, c = 0;
      uint64_t bytes = 0;
      for (int it = 0; it < cfg.iters; ++it) {
        std::memcpy(work.data, pristine.data, total * sizeof(float));
        BRAID_RETURN_IF_ERROR(comm.Barrier());
        comm.seconds = 0;
        const uint64_t sent0 = comm.stats().bytes_sent;
        const auto t0 = Clock::now();
        BRAID_RETURN_IF_ERROR(runners[k].Call(comm, views, work.floats(), total));
        t += std::chrono::duration<double>(Clock::now() - t0).count();
        c += comm.seconds;
        bytes += comm.stats().bytes_sent - sent0;
      }
      double agree[3] = {t / cfg.iters, c / cfg.iters, static_cast<double>(bytes) / cfg.iters};
      BRAID_RETURN_IF_ERROR(comm.AllReduce(agree, agree, 3, DataType::kFloat64, ReduceOp::kMax));
      times[k].push_back(agree[0] * 1e3);
      coll[k].push_back(agree[1] * 1e3);
      sent[k] = agree[2];
    }
  }
  for (size_t k = 0; k < nm; ++k) {
    Row r;
    r.method = cfg.methods[k];
    r.ms = Median(times[k]);
    r.ms_min = *std::min_element(times[k].begin(), times[k].end());
    r.ms_max = *std::max_element(times[k].begin(), times[k].end());
    r.collective_ms = Median(coll[k]);
    r.payload_bytes = static_cast<double>(runners[k].payload_total());
    r.sent_bytes = sent[k];
    // The check, on a fresh compressor (zero residual, first step).
    BRAID_ASSIGN_OR_RETURN(runners[k].compressor, MakeCompressor(cfg.methods[k]));
    runners[k].step = 0;
    std::memcpy(work.data, pristine.data, total * sizeof(float));
    BRAID_RETURN_IF_ERROR(runners[k].Call(comm, views, work.floats(), total));
    BRAID_RETURN_IF_ERROR(CheckOnEveryRank(cfg, comm, shapes, work.floats(), total, &r));
    rows->push_back(r);
  }
  for (Row& r : *rows) {
    if (rows->front().method == "none" && r.ms > 0) r.speedup = rows->front().ms / r.ms;
  }
  return comm.Barrier();
}

void PrintRows(const std::string& tls, const std::string& transports, const std::vector<Row>& rows) {
  std::printf("# --tls %s: %s\n", tls.c_str(), transports.c_str());
  std::printf("# %-22s %9s %9s %9s %12s %10s %13s %13s %8s %6s %5s\n", "method", "time(ms)",
              "min", "max", "in coll(ms)", "compute", "payload B", "sent B", "vs none",
              "wrong", "same");
  for (const Row& r : rows) {
    std::printf("  %-22s %9.2f %9.2f %9.2f %12.2f %10.2f %13.0f %13.0f %7.2fx %6lld %5s\n",
                r.method.c_str(), r.ms, r.ms_min, r.ms_max, r.collective_ms,
                r.ms - r.collective_ms, r.payload_bytes, r.sent_bytes, r.speedup,
                static_cast<long long>(r.wrong), r.identical ? "yes" : "NO");
  }
  std::fflush(stdout);
}

int RunRank(const Config& cfg, const std::string& tls, int rank, const std::string& dir,
            const std::string& json_part) {
  std::vector<Row> rows;
  std::string transports;
  absl::Status status = [&]() -> absl::Status {
    FileStore store(dir);
    transport::UcxOptions opts;
    opts.peer_error_handling = cfg.peer_error_handling != 0;
    opts.rank = rank;
    opts.size = cfg.ranks;
    opts.store = &store;
    opts.store_prefix = "powersgd-bench";
    opts.timeout = opts.connect_timeout = cfg.timeout;
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<transport::Communicator> comm,
                           transport::CreateUcxCommunicator(opts));
    transports = comm->Describe();
    TimedCommunicator timed(*comm);
    return Measure(cfg, timed, &rows);
  }();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: --tls %s rank %d: %s\n", kProg, tls.c_str(), rank,
                 status.ToString().c_str());
    return 2;
  }
  int64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong + (r.identical ? 0 : 1);
  if (rank == 0) {
    PrintRows(tls, transports, rows);
    nlohmann::json j = {{"tls", tls}, {"transports", transports}, {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      j["rows"].push_back({{"method", r.method}, {"time_ms", r.ms}, {"time_ms_min", r.ms_min},
                           {"time_ms_max", r.ms_max}, {"collective_ms", r.collective_ms},
                           {"payload_bytes", r.payload_bytes}, {"sent_bytes", r.sent_bytes},
                           {"speedup_vs_none", r.speedup}, {"wrong_tensors", r.wrong},
                           {"identical", r.identical}});
    }
    std::ofstream(json_part) << j.dump();
  }
  return wrong > 0 ? 1 : 0;
}

int RunParent(const Config& cfg) {
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf("# %s: ResNet-18 (CIFAR-10) gradients: 62 tensors, 11173962 float32 (44.7 MB), "
              "%d ranks, average; %d calls x %d repeats (+%d warm-up); %ld cores, /proc/loadavg "
              "at start: %s\n# time = median over repeats of the max over ranks of the mean per "
              "call; sent = transport bytes per rank and call; vs none = time(none) / time\n",
              kProg, cfg.ranks, cfg.iters, cfg.repeat, cfg.warmup, sysconf(_SC_NPROCESSORS_ONLN),
              load.c_str());
  nlohmann::json all = {{"load_at_start", load}, {"ranks", cfg.ranks}, {"runs", nlohmann::json::array()}};
  int worst = 0;
  for (const std::string& tls : cfg.tls) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "braid-powersgd-bench-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return 2;
    // Set before the fork, before anything touches UCX (lo only, or tcp also picks eth0).
    setenv("UCX_TLS", tls.c_str(), 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    const std::string part = tmpl + "/rows.json";
    RanksOptions opts;
    opts.ranks = cfg.ranks;
    opts.deadline = cfg.deadline;
    opts.prog = kProg;
    const RanksRun run =
        RunRanks(opts, [&](int r) { return RunRank(cfg, tls, r, tmpl, part); });
    worst = std::max(worst, ReportRanks(run, kProg, " (a check failed)"));
    std::ifstream in(part);
    if (in) all["runs"].push_back(nlohmann::json::parse(in, nullptr, false));
    std::error_code ec;
    std::filesystem::remove_all(tmpl, ec);
  }
  if (!cfg.json_path.empty()) std::ofstream(cfg.json_path) << all.dump(2) << "\n";
  std::printf("# %s\n", worst == 0 ? "all checks passed" : "CHECKS FAILED or errors (see above)");
  return worst;
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  using namespace braid::bench;
  CLI::App app{"PowerSGD vs uncompressed all-reduce on ResNet-18's gradients, 2 ranks over UCX"};
  Config cfg;
  std::string methods = "none,powersgd:rank=1,powersgd:rank=2,powersgd:rank=4", tls = "sm,tcp";
  double timeout_s = 120, deadline_s = 1800;
  app.add_option("--methods", methods, "comma-separated: none and compression specs")
      ->capture_default_str();
  app.add_option("--tls", tls, "UCX_TLS values to run, comma-separated (sm, tcp)")
      ->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "local ranks")->capture_default_str()->check(CLI::Range(1, 16));
  app.add_option("-n,--iters", cfg.iters, "timed calls per repeat")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", cfg.warmup, "untimed calls per method")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--repeat", cfg.repeat, "repeats (medians over them)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--json", cfg.json_path, "also write the tables here as JSON");
  app.add_option("--peer-error-handling", cfg.peer_error_handling,
                 "UcxOptions::peer_error_handling for local peers: 0 or 1")
      ->envname("BRAID_UCX_PEER_ERROR_HANDLING")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--corrupt", cfg.corrupt,
                 "testing the checks: multiply every checked result by this (the run must then "
                 "exit 1)")
      ->capture_default_str();
  app.add_option("--timeout", timeout_s, "seconds without progress before a collective fails")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--deadline", deadline_s, "seconds per --tls run before its ranks are killed")
      ->capture_default_str()->check(CLI::PositiveNumber);
  BRAID_CLI_PARSE(app, argc, argv);
  for (absl::string_view m : absl::StrSplit(methods, ',', absl::SkipEmpty())) {
    if (m != "none") {
      auto spec = braid::compression::ParseCompressionSpec(m);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s: %s\n", kProg, spec.status().ToString().c_str());
        return 2;
      }
    }
    cfg.methods.emplace_back(m);
  }
  for (absl::string_view t : absl::StrSplit(tls, ',', absl::SkipEmpty())) cfg.tls.emplace_back(t);
  if (cfg.methods.empty() || cfg.tls.empty()) {
    std::fprintf(stderr, "%s: --methods and --tls must not be empty\n", kProg);
    return 2;
  }
  cfg.timeout = absl::Seconds(timeout_s);
  cfg.deadline = absl::Seconds(deadline_s);
  if (!google::IsGoogleLoggingInitialized()) google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return RunParent(cfg);
}
