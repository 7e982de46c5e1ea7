// braid-e2e-bench: all-reduce through the whole runtime (enqueue -> negotiation, by the
// coordinator or the ranks' fast path -> UCX collective -> handle) against the bare
// Communicator, side by side in one run.
//
//   braid-e2e-bench -b 4 -e 64M -f 4 -n 50 -w 10 --ranks 2 [--compare-fast-path] [--json PATH]
//
// Starts a coordinator process and N rank processes on this host. Every rank times each size
// both ways (bare first, then end to end) with per-iteration timings; the table shows, per
// size, the median over iterations of the slowest rank's time, and their ratio.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tools/cli.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "coordinator/server.h"
#include "nlohmann/json.hpp"
#include "runtime/runtime.h"
#include "tools/bench/bench_math.h"
#include "transport/ucx_communicator.h"

#define BRAID_RETURN_IF_ERROR_BENCH(expr)   \
  do {                                      \
    absl::Status st_ = (expr);              \
    if (!st_.ok()) return st_;              \
  } while (0)

namespace {

using braid::bench::Median;

struct Options {
  std::string min = "4", max = "64M", factor = "4";
  int iters = 50, warmup = 10, ranks = 2;
  std::string json_path;
  int step_tensors = 0;  // > 0: also time a training-like step of this many tensors
  int step_iters = 5;
  // Also time the step with its tensors laid out back to back in one input and one output
  // buffer, in the order they are enqueued (what gradient_as_bucket_view gives a framework):
  // the buckets are then reduced where they lie (Note [In place]).
  bool step_contiguous = false;
  // Runs every size and the step twice, with BRAID_FAST_PATH=1 then =0, in one run.
  bool compare_fast_path = false;
};

// The value at fraction q (0..1) of the sorted values (nearest rank); 0 for none.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

// One rank: returns 0 on success. Rank 0 writes the rows to `out_path` as JSON.
int RunRank(int rank, const Options& o, const std::vector<size_t>& sizes,
            const std::string& store_dir, const std::string& coordinator,
            const std::string& out_path) {
  braid::FileStore store(store_dir);
  braid::transport::UcxOptions uo;
  uo.rank = rank;
  uo.size = o.ranks;
  uo.store = &store;
  uo.store_prefix = "bare";
  auto comm_or = braid::transport::CreateUcxCommunicator(uo);
  if (!comm_or.ok()) {
    fprintf(stderr, "[rank %d] %s\n", rank, comm_or.status().ToString().c_str());
    return 1;
  }
  auto& comm = **comm_or;
  setenv("BRAID_COORDINATOR", coordinator.c_str(), 1);
  setenv("BRAID_RANK", std::to_string(rank).c_str(), 1);
  setenv("BRAID_SIZE", std::to_string(o.ranks).c_str(), 1);
  braid::Runtime rt;
  auto cfg = braid::ConfigFromProcessEnv();
  absl::Status s = !cfg.ok() ? cfg.status() : o.compare_fast_path ? absl::OkStatus() : rt.Init(*cfg);
  if (!s.ok()) {
    fprintf(stderr, "[rank %d] init: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  // Every size, bare then end to end through `rt`; appends one row per size (or, on a
  // second pass, the pass's figures under `suffix` to the rows already there).
  auto sweep = [&](braid::Runtime& rt, nlohmann::json& rows, const std::string& suffix) -> int {
  const bool first = rows.empty();
  size_t row = 0;
  absl::Status s;
  for (size_t bytes : sizes) {
    const size_t count = std::max<size_t>(1, bytes / sizeof(float));
    std::vector<float> in(count, 1.0f), out(count, 0.0f);
    std::vector<double> bare(o.iters), e2e(o.iters);
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      absl::Time t0 = absl::Now();
      s = comm.AllReduce(in.data(), out.data(), count, braid::DataType::kFloat32,
                         braid::ReduceOp::kSum);
      if (i >= o.warmup) bare[i - o.warmup] = absl::ToDoubleMicroseconds(absl::Now() - t0);
      if (!s.ok()) break;
    }
    s.Update(comm.Barrier());
    for (int i = 0; i < o.warmup + o.iters && s.ok(); ++i) {
      braid::CollectiveRequest req;
      req.name = "e2e";
      req.shape = {static_cast<int64_t>(count)};
      req.input = in.data();
      req.output = out.data();
      req.op = braid::ReduceOp::kSum;
      absl::Time t0 = absl::Now();
      auto h = rt.Enqueue(req);
      s = h.ok() ? (*h)->Wait(absl::Seconds(60)) : h.status();
      if (i >= o.warmup) e2e[i - o.warmup] = absl::ToDoubleMicroseconds(absl::Now() - t0);
    }
    if (!s.ok()) {
      fprintf(stderr, "[rank %d] %zu bytes: %s\n", rank, bytes, s.ToString().c_str());
      return 1;
    }
    if (out[0] != static_cast<float>(o.ranks)) {
      fprintf(stderr, "[rank %d] wrong result %f\n", rank, out[0]);
      return 1;
    }
    // The slowest rank's time of each iteration.
    std::vector<double> both(bare);
    both.insert(both.end(), e2e.begin(), e2e.end());
    s = comm.AllReduce(both.data(), both.data(), both.size(), braid::DataType::kFloat64,
                       braid::ReduceOp::kMax);
    if (!s.ok()) return 1;
    const std::vector<double> b_all(both.begin(), both.begin() + o.iters);
    const std::vector<double> e_all(both.begin() + o.iters, both.end());
    const double b = Median(b_all), e = Median(e_all);
    if (first) rows.push_back({{"bytes", count * sizeof(float)}});
    nlohmann::json& r = rows[row++];
    r["bare_us_median" + suffix] = b;
    r["bare_us_p25" + suffix] = Quantile(b_all, 0.25);
    r["bare_us_p75" + suffix] = Quantile(b_all, 0.75);
    r["e2e_us_median" + suffix] = e;
    r["e2e_us_p25" + suffix] = Quantile(e_all, 0.25);
    r["e2e_us_p75" + suffix] = Quantile(e_all, 0.75);
    r["ratio" + suffix] = e / b;
  }
  return 0;
  };
  // The training-like step, fused (and, on the last pass, with fusion off).
  auto time_step = [&](nlohmann::json& step, const std::string& suffix, bool last) -> int {
  absl::Status s;
  {
    // Mixed sizes from 1 KiB to 4 MiB, log-uniform, the same on every rank.
    std::vector<size_t> counts;
    size_t total = 0;
    for (int t = 0; t < o.step_tensors; ++t) {
      double f = static_cast<double>((t * 7919) % o.step_tensors) / std::max(1, o.step_tensors - 1);
      size_t bytes = static_cast<size_t>(1024.0 * std::pow(4096.0, f));
      counts.push_back(std::max<size_t>(1, bytes / sizeof(float)));
      total += counts.back();
    }
    std::vector<std::vector<float>> ins, outs;
    for (size_t c : counts) {
      ins.emplace_back(c, 1.0f);
      outs.emplace_back(c, 0.0f);
    }
    std::vector<float> fused_in(total, 1.0f), fused_out(total, 0.0f);
    // The contiguous layout: tensor t at the same offset of flat_in and flat_out.
    std::vector<float> flat_in(o.step_contiguous ? total : 0, 1.0f),
        flat_out(o.step_contiguous ? total : 0, 0.0f);
    std::vector<size_t> offsets;
    for (size_t t = 0, at = 0; t < counts.size(); at += counts[t++]) offsets.push_back(at);
    auto run_layout = [&](bool contiguous) -> absl::Status {
      std::vector<std::shared_ptr<braid::Handle>> hs;
      for (size_t t = 0; t < counts.size(); ++t) {
        braid::CollectiveRequest q;
        q.name = absl::StrCat(contiguous ? "flat." : "step.", t);
        q.shape = {static_cast<int64_t>(counts[t])};
        q.input = contiguous ? flat_in.data() + offsets[t] : ins[t].data();
        q.output = contiguous ? flat_out.data() + offsets[t] : outs[t].data();
        q.op = braid::ReduceOp::kSum;
        auto h = rt.Enqueue(q);
        if (!h.ok()) return h.status();
        hs.push_back(*h);
      }
      for (auto& h : hs) BRAID_RETURN_IF_ERROR_BENCH(h->Wait(absl::Seconds(60)));
      return absl::OkStatus();
    };
    auto run_step = [&] { return run_layout(false); };
    auto run_single = [&]() -> absl::Status {
      braid::CollectiveRequest q;
      q.name = "prefused";
      q.shape = {static_cast<int64_t>(total)};
      q.input = fused_in.data();
      q.output = fused_out.data();
      q.op = braid::ReduceOp::kSum;
      auto h = rt.Enqueue(q);
      return h.ok() ? (*h)->Wait(absl::Seconds(60)) : h.status();
    };
    auto time_it = [&](const std::function<absl::Status()>& fn, std::vector<double>* times) -> absl::Status {
      for (int i = 0; i < 2 + o.step_iters; ++i) {
        BRAID_RETURN_IF_ERROR_BENCH(comm.Barrier());
        absl::Time t0 = absl::Now();
        BRAID_RETURN_IF_ERROR_BENCH(fn());
        if (i >= 2) times->push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
      return absl::OkStatus();
    };
    std::vector<double> fused_step, single, unfused_step, contiguous_step;
    // Bytes packed into the fusion buffer per layout (FusionStats), over the timed steps.
    uint64_t packed[3] = {0, 0, 0}, buckets[3] = {0, 0, 0};
    if (o.step_contiguous) {
      // Side by side: each iteration runs the scattered step, the contiguous one and the
      // pre-fused buffer in turn, so the machine's load hits all three alike.
      const std::function<absl::Status()> fns[3] = {run_step, [&] { return run_layout(true); },
                                                   run_single};
      std::vector<double>* series[3] = {&fused_step, &contiguous_step, &single};
      for (int i = 0; i < 2 + o.step_iters && s.ok(); ++i) {
        for (int l = 0; l < 3 && s.ok(); ++l) {
          const braid::FusionStats before = rt.compression_report()->fusion;
          s = comm.Barrier();
          absl::Time t0 = absl::Now();
          if (s.ok()) s = fns[l]();
          if (s.ok() && i >= 2) {
            series[l]->push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
            const braid::FusionStats after = rt.compression_report()->fusion;
            packed[l] += after.packed_bytes - before.packed_bytes;
            buckets[l] += after.buckets - before.buckets;
          }
        }
      }
      if (s.ok() && flat_out.back() != static_cast<float>(o.ranks)) s = absl::InternalError("wrong contiguous step result");
    } else {
      s = time_it(run_step, &fused_step);
      if (s.ok()) s = time_it(run_single, &single);
    }
    if (s.ok() && outs.back()[0] != static_cast<float>(o.ranks)) s = absl::InternalError("wrong step result");
    // The same step with fusion off: rejoin with BRAID_FUSION_THRESHOLD=0.
    if (last) {
      if (s.ok()) s = rt.Shutdown();
      setenv("BRAID_FUSION_THRESHOLD", "0", 1);
      if (s.ok()) {
        auto cfg2 = braid::ConfigFromProcessEnv();
        s = cfg2.ok() ? rt.Init(*cfg2) : cfg2.status();
      }
      if (s.ok()) s = time_it(run_step, &unfused_step);
      unsetenv("BRAID_FUSION_THRESHOLD");
    } else {
      unfused_step = fused_step;  // not measured on this pass
    }
    if (!s.ok()) {
      fprintf(stderr, "[rank %d] step: %s\n", rank, s.ToString().c_str());
      return 1;
    }
    std::vector<double> all(fused_step);
    all.insert(all.end(), single.begin(), single.end());
    all.insert(all.end(), unfused_step.begin(), unfused_step.end());
    all.insert(all.end(), contiguous_step.begin(), contiguous_step.end());
    if (!comm.AllReduce(all.data(), all.data(), all.size(), braid::DataType::kFloat64,
                        braid::ReduceOp::kMax).ok()) {
      return 1;
    }
    const size_t k = fused_step.size();
    double f = Median({all.begin(), all.begin() + k});
    double one = Median({all.begin() + k, all.begin() + 2 * k});
    double u = Median({all.begin() + 2 * k, all.begin() + 3 * k});
    step["tensors"] = o.step_tensors;
    step["bytes"] = total * sizeof(float);
    step["fused_step_us_median" + suffix] = f;
    step["fused_step_us_p25" + suffix] = Quantile({all.begin(), all.begin() + k}, 0.25);
    step["fused_step_us_p75" + suffix] = Quantile({all.begin(), all.begin() + k}, 0.75);
    step["single_buffer_us_median" + suffix] = one;
    step["fused_over_single" + suffix] = f / one;
    step["single_buffer_us_p25" + suffix] = Quantile({all.begin() + k, all.begin() + 2 * k}, 0.25);
    step["single_buffer_us_p75" + suffix] = Quantile({all.begin() + k, all.begin() + 2 * k}, 0.75);
    if (o.step_contiguous) {
      const std::vector<double> c(all.begin() + 3 * k, all.end());
      step["contiguous_step_us_median" + suffix] = Median(c);
      step["contiguous_step_us_p25" + suffix] = Quantile(c, 0.25);
      step["contiguous_step_us_p75" + suffix] = Quantile(c, 0.75);
      step["contiguous_over_single" + suffix] = Median(c) / one;
      // Per step, on rank 0: buckets run and bytes copied into the fusion buffer.
      const double n = static_cast<double>(c.size());
      for (auto [l, name] : {std::make_pair(0, "scattered"), std::make_pair(1, "contiguous"),
                             std::make_pair(2, "single")}) {
        step[std::string(name) + "_buckets_per_step" + suffix] = buckets[l] / n;
        step[std::string(name) + "_packed_bytes_per_step" + suffix] = packed[l] / n;
      }
    }
    if (last) {
      step["unfused_step_us_median"] = u;
      step["unfused_over_single"] = u / one;
    }
  }
  return 0;
  };
  nlohmann::json rows = nlohmann::json::array(), step;
  const std::vector<std::string> passes =
      o.compare_fast_path ? std::vector<std::string>{"", "_slow"} : std::vector<std::string>{""};
  for (size_t p = 0; p < passes.size(); ++p) {
    if (o.compare_fast_path) {
      // Each pass is its own job at the coordinator, with the fast path on, then off.
      if (rt.initialized()) s = rt.Shutdown();
      setenv("BRAID_FAST_PATH", p == 0 ? "1" : "0", 1);
      auto cfg_pass = braid::ConfigFromProcessEnv();
      if (s.ok()) s = cfg_pass.ok() ? rt.Init(*cfg_pass) : cfg_pass.status();
      if (!s.ok()) {
        fprintf(stderr, "[rank %d] init: %s\n", rank, s.ToString().c_str());
        return 1;
      }
    }
    if (sweep(rt, rows, passes[p]) != 0) return 1;
    if (o.step_tensors > 0 && time_step(step, passes[p], p + 1 == passes.size()) != 0) return 1;
  }
  rt.Shutdown().IgnoreError();
  if (rank == 0) std::ofstream(out_path) << nlohmann::json{{"rows", rows}, {"step", step}}.dump(2);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"all-reduce end to end through braid's runtime vs the bare communicator"};
  Options o;
  app.add_option("-b,--minbytes", o.min)->capture_default_str();
  app.add_option("-e,--maxbytes", o.max)->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor)->capture_default_str();
  app.add_option("-n,--iters", o.iters)->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup)->capture_default_str();
  app.add_option("--ranks", o.ranks)->capture_default_str();
  app.add_option("--json", o.json_path, "write the rows as JSON here");
  app.add_option("--step-tensors", o.step_tensors,
                 "also time a step of this many float32 tensors (1 KiB..4 MiB) with fusion and "
                 "cache on, one pre-fused buffer of the same bytes, and the step with fusion off");
  app.add_option("--step-iters", o.step_iters)->capture_default_str();
  app.add_flag("--step-contiguous", o.step_contiguous,
               "also time the step with its tensors back to back in one buffer (reduced in "
               "place, no fusion-buffer copies), interleaved with the scattered step and the "
               "pre-fused buffer");
  app.add_flag("--compare-fast-path", o.compare_fast_path,
               "run every size and the step with BRAID_FAST_PATH=1, then =0, in this one run");
  BRAID_CLI_PARSE(app, argc, argv);

  std::vector<size_t> sizes;
  auto lo = braid::bench::ParseSize(o.min), hi = braid::bench::ParseSize(o.max);
  auto factor = braid::bench::ParseSize(o.factor);
  if (!lo.ok() || !hi.ok() || !factor.ok()) {
    fprintf(stderr, "braid-e2e-bench: bad size: %s\n",
            (!lo.ok() ? lo.status() : !hi.ok() ? hi.status() : factor.status()).ToString().c_str());
    return 2;
  }
  for (size_t b = *lo; b <= *hi; b *= std::max<size_t>(2, *factor)) sizes.push_back(b);
  char dir_template[] = "/tmp/braid_e2e_XXXXXX";
  std::string dir = mkdtemp(dir_template);
  setenv("UCX_NET_DEVICES", "lo", 0);

  // The coordinator in its own process (fork before anything starts gRPC or UCX here); the
  // ranks inherit its secret.
  const std::string secret = braid::RandomSecret();
  setenv("BRAID_JOB_SECRET", secret.c_str(), 1);
  unsetenv("BRAID_JOB_SECRET_FILE");
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t coord = fork();
  if (coord == 0) {
    close(fds[0]);
    braid::coordinator::ServerOptions so;
    so.world_size = o.ranks;
    so.job_secret = secret;
    auto server = braid::coordinator::StartCoordinator(so);
    int port = server.ok() ? (*server)->port() : 0;
    if (write(fds[1], &port, sizeof(port)) != sizeof(port) || !server.ok()) _exit(2);
    (*server)->Wait();
    _exit(0);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port) || port == 0) {
    fprintf(stderr, "coordinator did not start\n");
    return 1;
  }
  const std::string coordinator = absl::StrCat("127.0.0.1:", port);
  const std::string out_path = dir + "/rows.json";

  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(r, o, sizes, dir, coordinator, out_path));
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  kill(coord, SIGTERM);
  waitpid(coord, nullptr, 0);
  if (failed) return 1;

  nlohmann::json result = nlohmann::json::parse(std::ifstream(out_path));
  const nlohmann::json& rows = result["rows"];
  printf("# braid-e2e-bench: float32 sum all-reduce, %d ranks, %d iterations (+%d warm-up)\n",
         o.ranks, o.iters, o.warmup);
  if (o.compare_fast_path) {
    // Medians, with the 25th-75th percentiles in brackets; e2e minus bare in microseconds.
    printf("# fast path on (BRAID_FAST_PATH=1) vs off (=0), each against bare in its own pass\n");
    printf("# %10s | %9s %24s %9s %9s | %9s %24s %9s %9s\n", "size (B)", "bare (us)",
           "fast e2e (us) [p25-p75]", "fast/bare", "fast-bare", "bare (us)",
           "slow e2e (us) [p25-p75]", "slow/bare", "slow-bare");
    for (const auto& r : rows) {
      auto med = [&](const char* k) { return r[k].get<double>(); };
      printf("  %10zu | %9.1f %9.1f [%6.1f-%6.1f] %9.3f %9.1f | %9.1f %9.1f [%6.1f-%6.1f] %9.3f %9.1f\n",
             r["bytes"].get<size_t>(), med("bare_us_median"), med("e2e_us_median"),
             med("e2e_us_p25"), med("e2e_us_p75"), med("ratio"),
             med("e2e_us_median") - med("bare_us_median"), med("bare_us_median_slow"),
             med("e2e_us_median_slow"), med("e2e_us_p25_slow"), med("e2e_us_p75_slow"),
             med("ratio_slow"), med("e2e_us_median_slow") - med("bare_us_median_slow"));
    }
  } else {
    printf("# %12s %16s %16s %8s\n", "size (B)", "bare (us, med)", "e2e (us, med)", "e2e/bare");
    for (const auto& r : rows) {
      printf("  %12zu %16.2f %16.2f %8.3f\n", r["bytes"].get<size_t>(), r["bare_us_median"].get<double>(),
             r["e2e_us_median"].get<double>(), r["ratio"].get<double>());
    }
  }
  const nlohmann::json& step = result["step"];
  if (!step.is_null()) {
    printf("# step of %d tensors, %zu bytes: fused+cached %.0f us, one pre-fused buffer %.0f us, "
           "fusion off %.0f us; fused/single %.3f, unfused/single %.3f\n",
           step["tensors"].get<int>(), step["bytes"].get<size_t>(),
           step["fused_step_us_median"].get<double>(), step["single_buffer_us_median"].get<double>(),
           step["unfused_step_us_median"].get<double>(), step["fused_over_single"].get<double>(),
           step["unfused_over_single"].get<double>());
    if (o.compare_fast_path) {
      printf("# step with the fast path on: %.0f us [p25-p75 %.0f-%.0f], fused/single %.3f; "
             "off: %.0f us [%.0f-%.0f], fused/single %.3f (single buffer %.0f us in that pass)\n",
             step["fused_step_us_median"].get<double>(), step["fused_step_us_p25"].get<double>(),
             step["fused_step_us_p75"].get<double>(), step["fused_over_single"].get<double>(),
             step["fused_step_us_median_slow"].get<double>(),
             step["fused_step_us_p25_slow"].get<double>(),
             step["fused_step_us_p75_slow"].get<double>(),
             step["fused_over_single_slow"].get<double>(),
             step["single_buffer_us_median_slow"].get<double>());
    }
    if (o.step_contiguous) {
      // Same run, interleaved per iteration; medians with the 25th-75th percentiles.
      auto fig = [&](const std::string& k) {
        return absl::StrFormat("%.0f us [%.0f-%.0f]", step[k + "_us_median"].get<double>(),
                               step[k + "_us_p25"].get<double>(), step[k + "_us_p75"].get<double>());
      };
      printf("# step, interleaved: scattered %s, contiguous %s, one pre-fused buffer %s; "
             "scattered/single %.3f, contiguous/single %.3f\n",
             fig("fused_step").c_str(), fig("contiguous_step").c_str(),
             fig("single_buffer").c_str(), step["fused_over_single"].get<double>(),
             step["contiguous_over_single"].get<double>());
      printf("# per step: scattered %.1f buckets, %.0f bytes packed; contiguous %.1f buckets, "
             "%.0f bytes packed; pre-fused %.1f buckets, %.0f bytes packed\n",
             step["scattered_buckets_per_step"].get<double>(),
             step["scattered_packed_bytes_per_step"].get<double>(),
             step["contiguous_buckets_per_step"].get<double>(),
             step["contiguous_packed_bytes_per_step"].get<double>(),
             step["single_buckets_per_step"].get<double>(),
             step["single_packed_bytes_per_step"].get<double>());
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << nlohmann::json{{"ranks", o.ranks}, {"iters", o.iters}, {"rows", rows}, {"step", step}}.dump(2);
  }
  return 0;
}
