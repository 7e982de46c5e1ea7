// The response cache's fast path (Note [Fast path], runtime/fast_path.h) against the slow
// path, in real rank processes with a real coordinator process and real UCX: the same
// workload with BRAID_FAST_PATH=1 and =0 gives bit-identical results, the same errors and
// the same `braidctl status` counts; a tensor one rank stops submitting is reported stalled.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/runtime.h"
#include "tests/testing/coordinator_process.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/runtime_job.h"
#include "tests/testing/typed_values.h"

namespace braid {
namespace {

using braid::testing::AllReduceOf;
using braid::testing::Checker;
using braid::testing::CoordinatorProcess;
using braid::testing::InitRuntime;
using braid::testing::RankExit;
using braid::testing::RunRanks;
using braid::testing::RunRanksOptions;
using braid::testing::SetRankEnv;
using braid::testing::WaitFor;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string RunCommand(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string ReadFile(const std::string& path) {
  std::string data;
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) return data;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  fclose(f);
  return data;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

void Touch(const std::string& path) {
  FILE* f = fopen(path.c_str(), "w");
  if (f) fclose(f);
}

// Runs `body` on `size` ranks against a fresh coordinator process with `env`, and returns
// `braidctl status --json` once every rank has shut down (their last heartbeats are in).
nlohmann::json RunAndStatus(int size, const Env& env,
                            const std::function<void(int, Runtime&, Checker&)>& body,
                            const std::function<void()>& during = {}) {
  CoordinatorProcess coord(size);
  EXPECT_FALSE(coord.address().empty()) << "coordinator did not start";
  RunRanksOptions o;
  o.ranks = size;
  o.deadline = absl::Seconds(90);
  if (during) o.after_start = [&](const std::vector<pid_t>&) { during(); };
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv(coord.address(), rank, size);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    Checker c{rank};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    body(rank, rt, c);
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " failed (see its stderr)";
  }
  int rc = -1;
  const std::string json = RunCommand(
      std::string(BRAIDCTL_PATH) + " status --json --coordinator " + coord.address(), &rc);
  EXPECT_EQ(rc, 0) << json;
  return nlohmann::json::parse(json, nullptr, false);
}

// Values that differ by rank, step and element, exact in every dtype used.
double Value(int rank, int step, int t, int64_t i) {
  return static_cast<double>(((rank + 1) * 37 + step * 11 + t * 5 + i) % 97 - 48) / 16.0;
}

// 50 steps of 12 all-reduces (float32 and float64 averages, int32 sums, fp16 on some float32
// ones), submitted in a different order on every rank, and every fifth step a broadcast.
// Every result is appended to `path`.
void MixedWorkload(int rank, int size, Runtime& rt, Checker& c, const std::string& path) {
  constexpr int kSteps = 50, kTensors = 12;
  FILE* f = fopen(path.c_str(), "wb");
  std::mt19937 rng(1234 + rank);
  for (int step = 0; step < kSteps && c.failures == 0; ++step) {
    std::vector<std::vector<char>> in(kTensors), out(kTensors);
    std::vector<int> order(kTensors);
    for (int t = 0; t < kTensors; ++t) order[t] = t;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::shared_ptr<Handle>> hs(kTensors);
    for (int t : order) {
      const DataType dt = t % 3 == 0 ? DataType::kInt32
                                     : (t % 3 == 1 ? DataType::kFloat32 : DataType::kFloat64);
      const int64_t n = 1 + (t * 977) % 3000;
      in[t].resize(n * DataTypeSize(dt));
      out[t].resize(in[t].size());
      for (int64_t i = 0; i < n; ++i) {
        const double v = Value(rank, step, t, i);
        braid::testing::WriteValue(in[t].data(), i, dt, dt == DataType::kInt32 ? v * 16 : v);
      }
      CollectiveRequest q;
      q.name = absl::StrCat("grad.", t);
      q.dtype = dt;
      q.shape = {n};
      q.input = in[t].data();
      q.output = out[t].data();
      q.op = dt == DataType::kInt32 ? ReduceOp::kSum : ReduceOp::kAverage;
      if (t % 4 == 1 && dt != DataType::kInt32) q.compression = "fp16";
      auto h = rt.Enqueue(q);
      if (c.Ok(h.status(), "enqueue")) hs[t] = *h;
    }
    for (int t = 0; t < kTensors; ++t) {
      if (hs[t] && c.Ok(hs[t]->Wait(absl::Seconds(30)), absl::StrCat("step ", step, " grad.", t))) {
        fwrite(out[t].data(), 1, out[t].size(), f);
      }
    }
    if (step % 5 == 0) {
      std::vector<double> buf(33, rank + step);
      CollectiveRequest q;
      q.name = "bcast";
      q.collective = Collective::kBroadcast;
      q.dtype = DataType::kFloat64;
      q.shape = {33};
      q.input = buf.data();
      q.output = buf.data();
      q.root_rank = step % size;
      c.Ok(WaitFor(rt.Enqueue(q)), "broadcast");
      c.Expect(buf[0] == step % size + step, absl::StrCat("broadcast from ", step % size));
      fwrite(buf.data(), sizeof(double), buf.size(), f);
    }
  }
  fclose(f);
}

int64_t Int(const nlohmann::json& v) {  // proto3 JSON writes int64 as a string
  return v.is_string() ? std::stoll(v.get<std::string>()) : (v.is_number() ? v.get<int64_t>() : -1);
}

class FastPathWorldTest : public ::testing::TestWithParam<int> {};

// The acceptance test of the fast path: on and off, bit for bit, and the same status counts
// (each tensor of each step counted once, with its bytes and method).
TEST_P(FastPathWorldTest, OnAndOffGiveBitIdenticalResultsAndTheSameStatusCounts) {
  const int size = GetParam();
  const std::string dir = braid::testing::MakeTempDir("braid_fastpath_");
  nlohmann::json status[2];
  for (int on = 0; on < 2; ++on) {
    status[on] = RunAndStatus(size, {{"BRAID_FAST_PATH", on ? "1" : "0"}},
                              [&](int rank, Runtime& rt, Checker& c) {
                                MixedWorkload(rank, size, rt, c,
                                              absl::StrCat(dir, "/", on, ".", rank));
                              });
  }
  for (int r = 0; r < size; ++r) {
    const std::string off = ReadFile(absl::StrCat(dir, "/0.", r));
    const std::string fast = ReadFile(absl::StrCat(dir, "/1.", r));
    ASSERT_FALSE(off.empty());
    EXPECT_EQ(off.size(), fast.size()) << "rank " << r;
    EXPECT_TRUE(off == fast) << "rank " << r << ": results differ with the fast path on";
  }
  // 50 steps x 12 all-reduces + 10 broadcasts; bytes: one rank's share.
  int64_t bytes = 0;
  for (int t = 0; t < 12; ++t) bytes += (1 + (t * 977) % 3000) * (t % 3 == 2 ? 8 : 4);
  bytes = bytes * 50 + 10 * 33 * 8;
  for (int on = 0; on < 2; ++on) {
    SCOPED_TRACE(on ? "fast path on" : "fast path off");
    const nlohmann::json& j = status[on];
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(Int(j["tensors_negotiated"]), 50 * 12 + 10);
    EXPECT_EQ(Int(j["bytes_negotiated"]), bytes);
    EXPECT_EQ(Int(j["tensors_pending"]), 0);
    int64_t fp16 = -1, none = -1;
    for (const auto& row : j["compression"]) {
      if (row["method"] == "fp16") fp16 = Int(row["tensors"]);
      if (row["method"] == "none") none = Int(row["tensors"]);
    }
    EXPECT_EQ(fp16, 50 * 2);  // grad.1 (float32), grad.5 (float64)
    // The method rows count all-reduces only; the broadcasts are in the totals above.
    EXPECT_EQ(none, 50 * 10);
  }
  // The fast path did the agreeing: the coordinator heard from each rank only for the first
  // step's tensors (and the broadcast's root changes), not once per step.
  EXPECT_GE(Int(status[0]["cycles"]), 50 * size);
  EXPECT_LT(Int(status[1]["cycles"]), 20 * size);
}

INSTANTIATE_TEST_SUITE_P(Ranks, FastPathWorldTest, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat(info.param, "ranks"); });

// What changes mid-run goes back to the coordinator, with the slow path's outcome: a new
// shape under a cached name renegotiates, a new name negotiates, a shape that differs
// across ranks fails on every rank with the coordinator's message, and a cache of 4 entries
// for 6 names evicts all the time. Both ways write the same results and errors.
TEST(FastPathTest, ChangesMidRunBehaveAsOnTheSlowPath) {
  const std::string dir = braid::testing::MakeTempDir("braid_fastpath_changes_");
  auto body = [&](const std::string& tag) {
    return [&dir, tag](int rank, Runtime& rt, Checker& c) {
      FILE* f = fopen(absl::StrCat(dir, "/", tag, ".", rank).c_str(), "w");
      for (int step = 0; step < 20; ++step) {
        std::vector<std::string> names = {"a", "b", "c", "d", "e"};
        if (step >= 12) names.push_back("new");
        std::vector<std::vector<float>> in(names.size()), out(names.size());
        std::vector<std::shared_ptr<Handle>> hs;
        for (size_t t = 0; t < names.size(); ++t) {
          int64_t n = 3 + static_cast<int64_t>(t);
          if (names[t] == "a" && step >= 8) n = 7;                // changes on every rank
          if (names[t] == "b" && step == 15 && rank == 1) n = 5;  // differs across ranks
          in[t].assign(n, static_cast<float>(rank + step + t));
          out[t].assign(n, 0.0f);
          auto h = rt.Enqueue(AllReduceOf(names[t], in[t].data(), out[t].data(), n, ReduceOp::kSum));
          hs.push_back(c.Ok(h.status(), "enqueue") ? *h : nullptr);
        }
        for (size_t t = 0; t < names.size(); ++t) {
          if (!hs[t]) continue;
          absl::Status s = hs[t]->Wait(absl::Seconds(30));
          fprintf(f, "step %d %s: %s", step, names[t].c_str(), s.ToString().c_str());
          for (float v : out[t]) fprintf(f, " %g", v);
          fprintf(f, "\n");
          if (names[t] == "b" && step == 15) {
            c.Expect(s.code() == absl::StatusCode::kInvalidArgument &&
                         s.message() == "tensor 'b': shape differs across ranks: [4] on rank 0; [5] on rank 1",
                     "mismatch: " + s.ToString());
            continue;
          }
          const float want = static_cast<float>(2 * (step + t) + 1);
          c.Ok(s, absl::StrCat("step ", step, " ", names[t]));
          c.Expect(out[t].size() == in[t].size() &&
                       std::all_of(out[t].begin(), out[t].end(), [&](float v) { return v == want; }),
                   absl::StrCat("step ", step, " ", names[t], " value"));
        }
      }
      fclose(f);
    };
  };
  RunAndStatus(2, {{"BRAID_FAST_PATH", "0"}, {"BRAID_CACHE_CAPACITY", "4"}}, body("slow"));
  nlohmann::json j =
      RunAndStatus(2, {{"BRAID_FAST_PATH", "1"}, {"BRAID_CACHE_CAPACITY", "4"}}, body("fast"));
  for (int r = 0; r < 2; ++r) {
    const std::string slow = ReadFile(absl::StrCat(dir, "/slow.", r));
    ASSERT_FALSE(slow.empty());
    EXPECT_EQ(slow, ReadFile(absl::StrCat(dir, "/fast.", r))) << "rank " << r;
  }
  // 20 steps x 5 + 8 steps of "new", the mismatch counted once.
  EXPECT_EQ(Int(j["tensors_negotiated"]), 20 * 5 + 8);
}

// A rank that stops submitting one cached tensor while the job goes on: the tensor leaves
// the fast path and `braidctl status` reports it stalled, naming the missing rank.
TEST(FastPathTest, ATensorOneRankStopsSubmittingIsReportedStalled) {
  const std::string dir = braid::testing::MakeTempDir("braid_fastpath_stall_");
  std::string pending;
  auto during = [&] {
    // Poll braidctl (under a deadline) until "lonely" shows as stalled, as a user would.
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    while (absl::Now() < limit) {
      int rc = -1;
      // The coordinator's address is in the ranks' environment only; ranks write it here.
      const std::string address = ReadFile(dir + "/address");
      if (!address.empty()) {
        auto j = nlohmann::json::parse(
            RunCommand(std::string(BRAIDCTL_PATH) + " status --json --coordinator " + address, &rc),
            nullptr, false);
        if (rc == 0 && j.is_object() && j["pending"].size() == 1 && j["pending"][0]["stalled"] == true) {
          pending = j["pending"][0].dump();
          break;
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    Touch(dir + "/checked");
  };
  RunAndStatus(2, {{"BRAID_FAST_PATH", "1"}, {"BRAID_STALL_CHECK_S", "1"}},
               [&](int rank, Runtime& rt, Checker& c) {
    if (rank == 0) {
      FILE* f = fopen((dir + "/address").c_str(), "w");
      fputs(getenv("BRAID_COORDINATOR"), f);
      fclose(f);
    }
    std::vector<float> a(4, 1.0f), b(4), l(4), in(4, 1.0f);
    std::shared_ptr<Handle> lonely;
    const absl::Time limit = absl::Now() + absl::Seconds(40);
    // The ranks stop at the same step: rank 0 alone looks for "checked" and adds 1 to the
    // first element of "t" when it has, which every rank then sees in the sum. (Each rank
    // looking for itself lets one run a step more, whose "t" then rightly fails with
    // "rank 1 already shut down".)
    bool stop = false;
    for (int step = 0; !stop; ++step) {
      // From step 3 on, rank 1 no longer submits "lonely"; rank 0 submits it once more.
      if (step < 3 || (rank == 0 && step == 3)) {
        auto h = rt.Enqueue(AllReduceOf("lonely", a.data(), l.data(), 4, ReduceOp::kSum));
        if (c.Ok(h.status(), "enqueue lonely")) lonely = *h;
      }
      in[0] = rank == 0 && (Exists(dir + "/checked") || absl::Now() >= limit) ? 2.0f : 1.0f;
      if (!c.Ok(WaitFor(rt.Enqueue(AllReduceOf("t", in.data(), b.data(), 4, ReduceOp::kSum))),
                "t")) {
        break;
      }
      stop = b[0] != 2.0f;
      if (step < 3) c.Ok(lonely->Wait(absl::Seconds(30)), "lonely");
      absl::SleepFor(absl::Milliseconds(10));  // a training step's compute
    }
    // Still pending on rank 0, or failed as on the slow path once rank 1 has shut down.
    if (rank == 0) {
      c.Expect(lonely && (!lonely->Poll() ||
                          lonely->status() == absl::FailedPreconditionError(
                              "tensor 'lonely' can never complete: rank 1 already shut down")),
               "lonely on rank 0: " + (lonely ? lonely->status().ToString() : std::string("none")));
    }
  }, during);
  ASSERT_FALSE(pending.empty()) << "'lonely' was never reported stalled";
  auto p = nlohmann::json::parse(pending);
  EXPECT_EQ(p["name"], "lonely");
  EXPECT_EQ(p["ready_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(p["missing_ranks"], nlohmann::json::array({1}));
}

}  // namespace
}  // namespace braid
