// Multi-process tests of braid::Runtime: a real gRPC coordinator process on 127.0.0.1
// (port 0), real rank processes, real UCX between them. Results are checked against
// references computed here; errors against their exact text.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/loop_affinity.h"
#include "runtime/runtime.h"
#include "tests/testing/coordinator_process.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/runtime_job.h"
#include "tests/testing/typed_values.h"
#include "tests/testing/thread_count.h"

namespace braid {
namespace {

using braid::testing::AllReduceOf;
using braid::testing::Checker;
using braid::testing::CoordinatorProcess;
using braid::testing::InitRuntime;
using braid::testing::RankExit;
using braid::testing::RunJob;
using braid::testing::RunRanks;
using braid::testing::RunRanksOptions;
using braid::testing::SetRankEnv;
using braid::testing::WaitFor;

class RuntimeWorldTest : public ::testing::TestWithParam<int> {};

// Every collective once, against references computed here.
TEST_P(RuntimeWorldTest, CollectivesMatchReference) {
  const int size = GetParam();
  RunJob(size, [size](int rank, Runtime& rt, Checker& c) {
    c.Expect(*rt.rank() == rank && *rt.size() == size, "rank/size from the coordinator");
    c.Expect(*rt.local_size() == size && *rt.local_rank() == rank, "local rank/size by host");
    // all-reduce: sum and average of float32; max of int32.
    const int64_t n = 1000;
    std::vector<float> in(n), out(n);
    for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>(rank * 1000 + i);
    if (c.Ok(WaitFor(rt.Enqueue(AllReduceOf("sum", in.data(), out.data(), n, ReduceOp::kSum))), "sum")) {
      for (int64_t i = 0; i < n; ++i) {
        float want = static_cast<float>(1000 * size * (size - 1) / 2 + size * i);
        if (!c.Expect(out[i] == want, absl::StrCat("sum[", i, "]=", out[i], " want ", want))) break;
      }
    }
    if (c.Ok(WaitFor(rt.Enqueue(AllReduceOf("avg", in.data(), out.data(), n, ReduceOp::kAverage))), "avg")) {
      for (int64_t i = 0; i < n; ++i) {
        float want = 1000.0f * (size - 1) / 2 + i;
        if (!c.Expect(std::abs(out[i] - want) < 1e-3, absl::StrCat("avg[", i, "]"))) break;
      }
    }
    {
      std::vector<int32_t> v(7), r(7);
      for (int i = 0; i < 7; ++i) v[i] = (rank * 7 + i * 3) % 11;
      CollectiveRequest q;
      q.name = "imax";
      q.dtype = DataType::kInt32;
      q.shape = {7};
      q.input = v.data();
      q.output = r.data();
      q.op = ReduceOp::kMax;
      if (c.Ok(WaitFor(rt.Enqueue(q)), "int max")) {
        for (int i = 0; i < 7; ++i) {
          int want = 0;
          for (int p = 0; p < size; ++p) want = std::max(want, (p * 7 + i * 3) % 11);
          c.Expect(r[i] == want, absl::StrCat("imax[", i, "]"));
        }
      }
    }
    // all-gather: rank r contributes r+1 rows of 3.
    {
      std::vector<float> mine((rank + 1) * 3);
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(rank * 100 + i);
      CollectiveRequest q;
      q.name = "gather";
      q.collective = Collective::kAllGather;
      q.shape = {rank + 1, 3};
      q.input = mine.data();
      auto h = rt.Enqueue(q);
      if (c.Ok(WaitFor(h), "allgather")) {
        const Handle& hd = **h;
        int64_t rows = size * (size + 1) / 2;
        c.Expect(hd.output_shape() == std::vector<int64_t>({rows, 3}), "allgather shape");
        const float* got = reinterpret_cast<const float*>(hd.output().data());
        size_t k = 0;
        for (int p = 0; p < size; ++p) {
          for (int i = 0; i < (p + 1) * 3; ++i, ++k) {
            if (!c.Expect(got[k] == static_cast<float>(p * 100 + i), "allgather value")) break;
          }
        }
      }
    }
    // broadcast from the last rank, in place.
    {
      std::vector<double> buf(5, rank);
      CollectiveRequest q;
      q.name = "bcast";
      q.collective = Collective::kBroadcast;
      q.dtype = DataType::kFloat64;
      q.shape = {5};
      q.input = buf.data();
      q.output = buf.data();
      q.root_rank = size - 1;
      if (c.Ok(WaitFor(rt.Enqueue(q)), "broadcast")) {
        for (double v : buf) c.Expect(v == size - 1, "broadcast value");
      }
    }
    // reduce-scatter: 2*size+1 rows of 2; rank r gets its share of the sum.
    {
      const int64_t rows = 2 * size + 1;
      std::vector<float> v(rows * 2);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + rank);
      CollectiveRequest q;
      q.name = "rs";
      q.collective = Collective::kReduceScatter;
      q.shape = {rows, 2};
      q.input = v.data();
      q.op = ReduceOp::kSum;
      auto h = rt.Enqueue(q);
      if (c.Ok(WaitFor(h), "reducescatter")) {
        int64_t my_rows = rows / size + (rank < rows % size ? 1 : 0);
        int64_t first = 0;
        for (int p = 0; p < rank; ++p) first += rows / size + (p < rows % size ? 1 : 0);
        c.Expect((*h)->output_shape() == std::vector<int64_t>({my_rows, 2}), "rs shape");
        const float* got = reinterpret_cast<const float*>((*h)->output().data());
        for (int64_t i = 0; i < my_rows * 2; ++i) {
          float want = static_cast<float>(size * (first * 2 + i) + size * (size - 1) / 2);
          c.Expect(got[i] == want, absl::StrCat("rs[", i, "]"));
        }
      }
    }
    // all-to-all with uneven splits: rank r sends p+1 rows (of 1) to rank p, valued 10r+p.
    {
      std::vector<int64_t> splits(size);
      std::vector<int32_t> v;
      for (int p = 0; p < size; ++p) {
        splits[p] = p + 1;
        for (int i = 0; i <= p; ++i) v.push_back(rank * 10 + p);
      }
      CollectiveRequest q;
      q.name = "a2a";
      q.collective = Collective::kAllToAll;
      q.dtype = DataType::kInt32;
      q.shape = {static_cast<int64_t>(v.size())};
      q.input = v.data();
      q.splits = splits;
      auto h = rt.Enqueue(q);
      if (c.Ok(WaitFor(h), "alltoall")) {
        c.Expect((*h)->output_shape() == std::vector<int64_t>({size * (rank + 1)}), "a2a shape");
        const int32_t* got = reinterpret_cast<const int32_t*>((*h)->output().data());
        for (int p = 0, k = 0; p < size; ++p) {
          for (int i = 0; i <= rank; ++i, ++k) c.Expect(got[k] == p * 10 + rank, "a2a value");
        }
      }
    }
    CollectiveRequest b;
    b.name = "barrier";
    b.collective = Collective::kBarrier;
    c.Ok(WaitFor(rt.Enqueue(b)), "barrier");
  });
}

// 50 tensors submitted in a different order on every rank all complete correctly.
TEST_P(RuntimeWorldTest, FiftyTensorsInDifferentOrdersPerRank) {
  const int size = GetParam();
  RunJob(size, [size](int rank, Runtime& rt, Checker& c) {
    const int kTensors = 50;
    std::vector<std::vector<float>> in(kTensors), out(kTensors);
    std::vector<int> order(kTensors);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(1234 + rank);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::shared_ptr<Handle>> handles(kTensors);
    for (int t : order) {
      int64_t n = 1 + t * 37;
      in[t].assign(n, static_cast<float>(rank + t));
      out[t].assign(n, -1.0f);
      auto h = rt.Enqueue(AllReduceOf(absl::StrCat("grad/", t), in[t].data(), out[t].data(), n,
                                      ReduceOp::kSum));
      if (!c.Ok(h.status(), "enqueue")) return;
      handles[t] = *h;
    }
    for (int t = 0; t < kTensors; ++t) {
      if (!c.Ok(handles[t]->Wait(absl::Seconds(30)), absl::StrCat("grad/", t))) continue;
      float want = static_cast<float>(size * t + size * (size - 1) / 2);
      c.Expect(std::all_of(out[t].begin(), out[t].end(), [&](float v) { return v == want; }),
               absl::StrCat("grad/", t, " value"));
    }
  });
}

// A shape mismatch and a dtype mismatch give every rank InvalidArgument naming the tensor and
// what each rank sent, within 5 s; the next collective still works.
TEST_P(RuntimeWorldTest, MismatchesGiveEveryRankTheSameErrorAndTheJobGoesOn) {
  const int size = GetParam();
  RunJob(size, [size](int rank, Runtime& rt, Checker& c) {
    std::vector<float> buf(16, 1.0f), out(16);
    // Rank 0 sends shape [2], every other rank [3].
    absl::Time t0 = absl::Now();
    absl::Status s = WaitFor(rt.Enqueue(
        AllReduceOf("bad_shape", buf.data(), out.data(), rank == 0 ? 2 : 3, ReduceOp::kSum)));
    std::string others = size == 2 ? "rank 1" : (size == 3 ? "ranks 1, 2" : "ranks 1, 2, 3");
    std::string want = "tensor 'bad_shape': shape differs across ranks: [2] on rank 0; [3] on " + others;
    c.Expect(s.code() == absl::StatusCode::kInvalidArgument && s.message() == want,
             "shape mismatch error: got '" + s.ToString() + "' want '" + want + "'");
    c.Expect(absl::Now() - t0 < absl::Seconds(5), "shape error within 5 s");
    // The last rank sends int32, the others float32.
    CollectiveRequest q = AllReduceOf("bad_dtype", buf.data(), out.data(), 4, ReduceOp::kSum);
    if (rank == size - 1) q.dtype = DataType::kInt32;
    t0 = absl::Now();
    s = WaitFor(rt.Enqueue(q));
    std::string lows = size == 2 ? "rank 0" : (size == 3 ? "ranks 0, 1" : "ranks 0, 1, 2");
    want = absl::StrCat("tensor 'bad_dtype': dtype differs across ranks: float32 on ", lows,
                        "; int32 on rank ", size - 1);
    c.Expect(s.code() == absl::StatusCode::kInvalidArgument && s.message() == want,
             "dtype mismatch error: got '" + s.ToString() + "' want '" + want + "'");
    c.Expect(absl::Now() - t0 < absl::Seconds(5), "dtype error within 5 s");
    // The job goes on.
    if (c.Ok(WaitFor(rt.Enqueue(AllReduceOf("after", buf.data(), out.data(), 16, ReduceOp::kSum))),
             "collective after the errors")) {
      c.Expect(out[0] == static_cast<float>(size), "value after the errors");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, RuntimeWorldTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return absl::StrCat(info.param, "ranks"); });

TEST(RuntimeTest, DuplicateInFlightNameIsAlreadyExists) {
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    std::vector<float> a(4, 1.0f), b(4);
    auto first = rt.Enqueue(AllReduceOf("dup", a.data(), b.data(), 4, ReduceOp::kSum));
    auto second = rt.Enqueue(AllReduceOf("dup", a.data(), b.data(), 4, ReduceOp::kSum));
    c.Expect(second.status().code() == absl::StatusCode::kAlreadyExists &&
                 second.status().message() ==
                     absl::StrCat("tensor 'dup' is already in flight on rank ", rank,
                                  ": wait for it to complete before reusing the name"),
             "duplicate: " + second.status().ToString());
    c.Ok(WaitFor(first), "first 'dup'");
    // Once complete, the name may be used again.
    c.Ok(WaitFor(rt.Enqueue(AllReduceOf("dup", a.data(), b.data(), 4, ReduceOp::kSum))), "reuse");
  });
}

// BeginGroup/EndGroup: all-reduces enqueued inside a group, 20 ms apart (long enough for the
// background loop to have sent each alone), travel in one bucket. The witness is scalecomp's
// selection, which runs over the whole bucket: four 25-element tensors at ratio 100 keep
// k = ceil(100 / 100) = 1 element in all when fused, but 1 each (4 payload floats) when not,
// as the same tensors give when each is waited for before the next. EndGroup without
// BeginGroup fails.
TEST(RuntimeTest, GroupTravelsAsOneBucket) {
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    const std::string spec = "scalecomp:ratio=100";
    for (bool grouped : {true, false}) {
      std::vector<std::vector<float>> in(4, std::vector<float>(25));
      std::vector<absl::StatusOr<std::shared_ptr<Handle>>> hs;
      if (grouped) rt.BeginGroup();
      for (int t = 0; t < 4; ++t) {
        for (int i = 0; i < 25; ++i) in[t][i] = static_cast<float>(1 + t * 25 + i + rank);
        CollectiveRequest r = AllReduceOf(absl::StrCat(grouped ? "g." : "u.", t), in[t].data(),
                                          in[t].data(), 25, ReduceOp::kSum);
        r.compression = spec;
        hs.push_back(rt.Enqueue(std::move(r)));
        if (grouped) {
          absl::SleepFor(absl::Milliseconds(20));
        } else {
          c.Ok(WaitFor(hs.back()), absl::StrCat("ungrouped tensor ", t));
        }
      }
      if (grouped) c.Ok(rt.EndGroup(), "EndGroup");
      int nonzero = 0;
      for (int t = 0; t < 4; ++t) {
        c.Ok(WaitFor(hs[t]), absl::StrCat("tensor ", t));
        for (float v : in[t]) nonzero += v != 0.0f;
      }
      // The largest |g + m| of the leader (rank 0 at step 0) is the last element of tensor 3:
      // sum over the two ranks 100 + 101.
      if (grouped) {
        c.Expect(nonzero == 1 && in[3][24] == 201.0f,
                 absl::StrCat("grouped: ", nonzero, " non-zero results, last ", in[3][24]));
      } else {
        c.Expect(nonzero == 4, absl::StrCat("ungrouped: ", nonzero, " non-zero results"));
      }
      auto report = rt.compression_report();
      c.Ok(report.status(), "compression_report");
      uint64_t payload = 0;
      for (const auto& ts : report->tensors) {
        if (absl::StartsWith(ts.name, grouped ? "g." : "u.")) payload += ts.bytes.payload_bytes;
      }
      c.Expect(payload == (grouped ? 4u : 16u),
               absl::StrCat(grouped ? "grouped" : "ungrouped", " payload bytes ", payload));
    }
    absl::Status s = rt.EndGroup();
    c.Expect(s.code() == absl::StatusCode::kFailedPrecondition &&
                 s.message() == "EndGroup() without a matching BeginGroup()",
             "EndGroup without BeginGroup: " + s.ToString());
  });
}

// Shutdown with work no other rank will ever match returns within 2 s (RunJob checks) and
// fails the pending handle with Cancelled; calls afterwards fail at once; init starts afresh.
TEST(RuntimeTest, ShutdownWithPendingWorkAndInitAgain) {
  const int size = 2;
  CoordinatorProcess coord(size);
  ASSERT_FALSE(coord.address().empty());
  RunRanksOptions o;
  o.ranks = size;
  o.deadline = absl::Seconds(60);
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv(coord.address(), rank, size);
    Checker c{rank};
    Runtime rt;
    std::vector<float> a(8, 1.0f), b(8);
    auto before = rt.Enqueue(AllReduceOf("x", a.data(), b.data(), 8, ReduceOp::kSum));
    c.Expect(before.status().code() == absl::StatusCode::kFailedPrecondition &&
                 before.status().message() == "braid is not initialized: call init() first",
             "enqueue before init: " + before.status().ToString());
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    c.Ok(InitRuntime(rt), "init twice is harmless");
    auto lonely = rt.Enqueue(AllReduceOf(absl::StrCat("only_on_rank_", rank), a.data(), b.data(),
                                         8, ReduceOp::kSum));
    c.Ok(lonely.status(), "enqueue");
    absl::SleepFor(absl::Milliseconds(200));
    absl::Time t0 = absl::Now();
    c.Ok(rt.Shutdown(), "shutdown");
    absl::Duration took = absl::Now() - t0;
    c.Expect(took < absl::Seconds(2), absl::StrCat("shutdown took ", absl::FormatDuration(took)));
    if (lonely.ok()) {
      absl::Status s = (*lonely)->Wait(absl::Seconds(1));
      // Cancelled by our own shutdown, or failed first because the peer already left.
      c.Expect(s.code() == absl::StatusCode::kCancelled ||
                   (s.code() == absl::StatusCode::kFailedPrecondition &&
                    s.message() == absl::StrCat("tensor 'only_on_rank_", rank,
                                                "' can never complete: rank ", 1 - rank,
                                                " already shut down")),
               "pending handle: " + s.ToString());
    }
    auto after = rt.Enqueue(AllReduceOf("y", a.data(), b.data(), 8, ReduceOp::kSum));
    c.Expect(after.status().code() == absl::StatusCode::kFailedPrecondition,
             "enqueue after shutdown: " + after.status().ToString());
    c.Expect(!rt.rank().ok(), "rank() after shutdown fails");
    // Init after Shutdown starts afresh.
    if (c.Ok(InitRuntime(rt), "init again")) {
      if (c.Ok(WaitFor(rt.Enqueue(AllReduceOf("again", a.data(), b.data(), 8, ReduceOp::kSum))),
               "allreduce after re-init")) {
        c.Expect(b[0] == 2.0f, "value after re-init");
      }
      c.Ok(rt.Shutdown(), "second shutdown");
    }
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank;
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  }
}

// Note [Threads and locks] (runtime/runtime_impl.h): a real rank (gRPC client, UCX data
// plane) runs as many threads of braid's own as docs/architecture.md states, one of each name,
// next to gRPC's and UCX's pools, and none is left after Shutdown.
TEST(RuntimeTest, ARankRunsTheThreadsTheArchitecturePageStates) {
  const int stated = braid::testing::StatedThreadsPerRank(BRAID_ARCHITECTURE_DOC);
  ASSERT_GT(stated, 0) << "docs/architecture.md: 'a rank runs N threads of braid's own'";
  RunJob(2, [stated](int rank, Runtime& rt, Checker& c) {
    std::vector<float> a(100, 1.0f), b(100);
    c.Ok(WaitFor(rt.Enqueue(AllReduceOf("t", a.data(), b.data(), 100, ReduceOp::kSum))), "t");
    std::map<std::string, int> names = braid::testing::ThreadNames();
    for (const char* n : {"braid-loop", "braid-coord-rx", "braid-heartbeat"}) {
      c.Expect(names[n] == 1, absl::StrCat(n, ": ", names[n], " threads"));
    }
    c.Expect(braid::testing::BraidThreads() == stated,
             absl::StrCat(braid::testing::BraidThreads(),
                          " threads named braid-*, docs/architecture.md says ", stated));
    c.Ok(rt.Shutdown(), "shutdown");
    c.Expect(braid::testing::BraidThreads() == 0, "braid's threads joined at shutdown");
  });
}

// A world of one process with no launcher at all: rank 0 hosts a private coordinator.
TEST(RuntimeTest, WorldOfSizeOneNeedsNoPeers) {
  RunRanksOptions o;
  o.ranks = 1;
  o.deadline = absl::Seconds(60);
  auto exits = RunRanks(o, [](int) {
    for (const char* v : {"BRAID_COORDINATOR", "BRAID_RANK", "BRAID_SIZE", "RANK", "WORLD_SIZE",
                          "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) {
      unsetenv(v);
    }
    Checker c{0};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    c.Expect(*rt.size() == 1 && *rt.rank() == 0, "size 1");
    std::vector<float> a{1, 2, 3}, b(3);
    if (c.Ok(WaitFor(rt.Enqueue(AllReduceOf("solo", a.data(), b.data(), 3, ReduceOp::kAverage))), "solo")) {
      c.Expect(b == a, "average of one rank is its input");
    }
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  EXPECT_EQ(exits[0].exit_code, 0);
}

// An idle 2-rank job uses under 0.2 s of CPU per rank over 10 s.
TEST(RuntimeTest, IdleJobCostsAlmostNoCpu) {
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    std::vector<float> a(4, 1.0f), b(4);
    c.Ok(WaitFor(rt.Enqueue(AllReduceOf("warm", a.data(), b.data(), 4, ReduceOp::kSum))), "warm");
    rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    absl::SleepFor(absl::Seconds(10));
    getrusage(RUSAGE_SELF, &r1);
    auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
    double cpu = secs(r1.ru_utime) - secs(r0.ru_utime) + secs(r1.ru_stime) - secs(r0.ru_stime);
    fprintf(stderr, "[rank %d] idle 10 s: %.3f s of CPU\n", rank, cpu);
    c.Expect(cpu < 0.2, absl::StrCat("idle CPU ", cpu, " s >= 0.2 s"));
  });
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

std::string RunCommand(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// A tensor only rank 0 submits shows as stalled in `braidctl status --json`, with rank 1
// missing, next to the right world size and count of tensors negotiated.
TEST(StallTest, BraidctlListsAStalledTensorWithItsMissingRank) {
  CoordinatorProcess coord(2);
  ASSERT_FALSE(coord.address().empty());
  const std::string dir = braid::testing::MakeTempDir("braid_stall_");
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(60);
  std::string status_json;
  int status_rc = -1;
  o.after_start = [&](const std::vector<pid_t>&) {
    // Rank 0 writes this file once "lonely" has waited past the stall check.
    absl::Time limit = absl::Now() + absl::Seconds(30);
    while (access((dir + "/stalled").c_str(), F_OK) != 0 && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    status_json = RunCommand(std::string(BRAIDCTL_PATH) + " status --json --coordinator " +
                                 coord.address(), &status_rc);
    FILE* f = fopen((dir + "/checked").c_str(), "w");
    if (f) fclose(f);
  };
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv(coord.address(), rank, 2);
    setenv("BRAID_STALL_CHECK_S", "1", 1);
    Checker c{rank};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    std::vector<float> a(4, 1.0f), b(4);
    for (int i = 0; i < 3; ++i) {
      c.Ok(WaitFor(rt.Enqueue(AllReduceOf(absl::StrCat("t", i), a.data(), b.data(), 4, ReduceOp::kSum))), "t");
    }
    if (rank == 0) {
      auto h = rt.Enqueue(AllReduceOf("lonely", a.data(), b.data(), 4, ReduceOp::kSum));
      c.Ok(h.status(), "enqueue lonely");
      absl::SleepFor(absl::Milliseconds(1600));
      FILE* f = fopen((dir + "/stalled").c_str(), "w");
      if (f) fclose(f);
    }
    absl::Time limit = absl::Now() + absl::Seconds(30);
    while (access((dir + "/checked").c_str(), F_OK) != 0 && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  ASSERT_EQ(status_rc, 0) << status_json;
  auto j = nlohmann::json::parse(status_json);
  EXPECT_EQ(j["size"], 2);
  EXPECT_EQ(j["tensors_negotiated"], "3");  // int64 fields are strings in proto3 JSON
  ASSERT_EQ(j["pending"].size(), 1u) << status_json;
  EXPECT_EQ(j["pending"][0]["name"], "lonely");
  EXPECT_EQ(j["pending"][0]["stalled"], true);
  EXPECT_EQ(j["pending"][0]["ready_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(j["pending"][0]["missing_ranks"], nlohmann::json::array({1}));
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["state"], "negotiating");
  ASSERT_EQ(j["compression"].size(), 1u) << status_json;
  EXPECT_EQ(j["compression"][0]["method"], "none");
  EXPECT_EQ(j["compression"][0]["tensors"], "3");
  EXPECT_EQ(j["compression"][0]["bytes_before"], "48");  // 3 tensors of 4 float32
  EXPECT_EQ(j["bytes_negotiated"], "48");
}

// With BRAID_STALL_SHUTDOWN_S=2 every rank's pending and later work fails with the stall
// message (also on the rank that never submitted the tensor) within 10 s, and the job
// still shuts down cleanly.
TEST(StallTest, StallShutdownFailsEveryRankWithTheStallMessage) {
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    std::vector<float> a(4, 1.0f), b(4);
    absl::Time t0 = absl::Now();
    absl::Status s;
    if (rank == 0) {
      s = WaitFor(rt.Enqueue(AllReduceOf("lonely", a.data(), b.data(), 4, ReduceOp::kSum)),
                  absl::Seconds(10));
    } else {
      absl::SleepFor(absl::Seconds(3));  // by then the job was aborted: later work fails too
      s = WaitFor(rt.Enqueue(AllReduceOf("later", a.data(), b.data(), 4, ReduceOp::kSum)),
                  absl::Seconds(7));
    }
    const std::string want_prefix =
        "stalled: tensor 'lonely' was submitted by rank 0 but not by rank 1 for 2s";
    c.Expect(s.code() == absl::StatusCode::kDeadlineExceeded &&
                 s.message().substr(0, want_prefix.size()) == want_prefix,
             "stall error: " + s.ToString());
    c.Expect(absl::Now() - t0 < absl::Seconds(10), "stall error within 10 s");
  }, absl::Seconds(60), 30, {{"BRAID_STALL_CHECK_S", "1"}, {"BRAID_STALL_SHUTDOWN_S", "2"}});
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// One step of many mixed-dtype tensors, submitted at once so the coordinator can fuse them.
// Each rank writes every result, back to back, to `path`.
void MixedStep(int rank, Runtime& rt, Checker& c, const std::string& path) {
  const int kTensors = 60;
  std::mt19937 rng(77 + rank);
  std::vector<std::vector<char>> in(kTensors), out(kTensors);
  std::vector<std::shared_ptr<Handle>> handles;
  for (int t = 0; t < kTensors; ++t) {
    DataType dt = t % 3 == 0 ? DataType::kInt32 : (t % 3 == 1 ? DataType::kFloat32 : DataType::kFloat64);
    int64_t n = 1 + (t * 7919) % 5000;
    in[t].resize(n * DataTypeSize(dt));
    out[t].resize(in[t].size());
    for (int64_t i = 0; i < n; ++i) {
      double v = std::uniform_real_distribution<double>(-1, 1)(rng);
      braid::testing::WriteValue(in[t].data(), i, dt, dt == DataType::kInt32 ? v * 1000 : v);
    }
    CollectiveRequest q;
    q.name = absl::StrCat("mixed.", t);
    q.dtype = dt;
    q.shape = {n};
    q.input = in[t].data();
    q.output = out[t].data();
    q.op = dt == DataType::kInt32 ? ReduceOp::kSum : ReduceOp::kAverage;
    auto h = rt.Enqueue(q);
    if (!c.Ok(h.status(), "enqueue")) return;
    handles.push_back(*h);
  }
  FILE* f = fopen(path.c_str(), "wb");
  for (int t = 0; t < kTensors; ++t) {
    c.Ok(handles[t]->Wait(absl::Seconds(30)), absl::StrCat("mixed.", t));
    fwrite(out[t].data(), 1, out[t].size(), f);
  }
  fclose(f);
}

std::vector<char> ReadAll(const std::string& path) {
  std::vector<char> data;
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) return data;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) data.insert(data.end(), buf, buf + n);
  fclose(f);
  return data;
}

// Fusion on and off give equal results (bit-identical for int32, within float tolerance
// otherwise), and two runs of the same configuration are bit-identical.
TEST_P(RuntimeWorldTest, FusionOnAndOffAgreeAndRunsRepeatBitForBit) {
  const int size = GetParam();
  const std::string dir = braid::testing::MakeTempDir("braid_fusion_");
  for (const char* run : {"fused_a", "fused_b", "unfused"}) {
    const std::string threshold = std::string(run) == "unfused" ? "0" : "67108864";
    RunJob(size, [&](int rank, Runtime& rt, Checker& c) {
      MixedStep(rank, rt, c, absl::StrCat(dir, "/", run, ".", rank));
    }, absl::Seconds(120), 30, {{"BRAID_FUSION_THRESHOLD", threshold}});
  }
  for (int r = 0; r < size; ++r) {
    auto a = ReadAll(absl::StrCat(dir, "/fused_a.", r));
    auto b = ReadAll(absl::StrCat(dir, "/fused_b.", r));
    auto u = ReadAll(absl::StrCat(dir, "/unfused.", r));
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(a, b) << "rank " << r << ": two fused runs differ";
    ASSERT_EQ(a.size(), u.size());
    // Stronger than the tolerance below: the transport reduces every element in one
    // canonical order (ucx_communicator.cc, Note [Canonical reduction order]), so fusion
    // does not change a single bit.
    EXPECT_EQ(a, u) << "rank " << r << ": fused and unfused results differ";
    // Walk the same layout MixedStep wrote.
    size_t off = 0;
    for (int t = 0; t < 60; ++t) {
      DataType dt = t % 3 == 0 ? DataType::kInt32 : (t % 3 == 1 ? DataType::kFloat32 : DataType::kFloat64);
      int64_t n = 1 + (t * 7919) % 5000;
      for (int64_t i = 0; i < n; ++i) {
        if (dt == DataType::kInt32) {
          ASSERT_EQ(reinterpret_cast<int32_t*>(a.data() + off)[i], reinterpret_cast<int32_t*>(u.data() + off)[i]);
        } else if (dt == DataType::kFloat32) {
          ASSERT_NEAR(reinterpret_cast<float*>(a.data() + off)[i], reinterpret_cast<float*>(u.data() + off)[i], 1e-6);
        } else {
          ASSERT_NEAR(reinterpret_cast<double*>(a.data() + off)[i], reinterpret_cast<double*>(u.data() + off)[i], 1e-12);
        }
      }
      off += n * DataTypeSize(dt);
    }
  }
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// Note [Pipelined copy] (runtime/allreduce_pipeline.h): steps of 24 scattered float32
// tensors of 240-800 KB (half of them reduced in place), whose buckets are large enough for
// the pipelined algorithms' gathered form, give the same bits with the pipelined copy on
// (the default) and off, and with it on on rank 0 alone; each sums values whose rounding
// depends on the order.
TEST_P(RuntimeWorldTest, PipelinedCopyOnAndOffGiveBitIdenticalResults) {
  const int size = GetParam();
  const std::string dir = braid::testing::MakeTempDir("braid_pipelined_copy_");
  constexpr int kSteps = 3, kTensors = 24;
  for (const char* run : {"on", "off", "mixed"}) {
    RunJob(size, [&](int rank, Runtime& rt, Checker& c) {
      FILE* f = fopen(absl::StrCat(dir, "/", run, ".", rank).c_str(), "wb");
      std::mt19937 rng(99 + rank);
      for (int step = 0; step < kSteps && c.failures == 0; ++step) {
        std::vector<std::vector<float>> in(kTensors), out(kTensors);
        std::vector<std::shared_ptr<Handle>> hs;
        for (int t = 0; t < kTensors; ++t) {
          // Tensor 5 is empty, its pointers null: it must not split the bucket.
          in[t].resize(t == 5 ? 0 : 60000 + (t * 7919) % 140000);
          for (float& v : in[t]) v = std::uniform_real_distribution<float>(-1, 1)(rng);
          out[t].assign(t % 2 == 0 ? 0 : in[t].size(), 0.0f);
        }
        // Submitted together, so they fuse.
        for (int t = 0; t < kTensors; ++t) {
          const auto n = static_cast<int64_t>(in[t].size());
          float* o = t % 2 == 0 ? in[t].data() : out[t].data();
          auto h = rt.Enqueue(AllReduceOf(absl::StrCat("big.", t), in[t].data(), o, n,
                                          ReduceOp::kAverage));
          if (c.Ok(h.status(), "enqueue")) hs.push_back(*h);
        }
        for (int t = 0; t < kTensors && t < static_cast<int>(hs.size()); ++t) {
          c.Ok(hs[t]->Wait(absl::Seconds(30)), absl::StrCat("step ", step, " big.", t));
          const std::vector<float>& r = t % 2 == 0 ? in[t] : out[t];
          fwrite(r.data(), sizeof(float), r.size(), f);
        }
      }
      fclose(f);
    }, absl::Seconds(120), 30,
           {{"BRAID_PIPELINED_COPY", std::string(run) == "off" ? "0" : "1"},
            {"BRAID_CYCLE_TIME_MS", "50"}},
           [&](int rank) {
             if (std::string(run) == "mixed" && rank != 0) setenv("BRAID_PIPELINED_COPY", "0", 1);
           });
  }
  for (int r = 0; r < size; ++r) {
    const std::vector<char> on = ReadAll(absl::StrCat(dir, "/on.", r));
    ASSERT_FALSE(on.empty());
    EXPECT_TRUE(on == ReadAll(absl::StrCat(dir, "/off.", r))) << "rank " << r << ": on and off";
    EXPECT_TRUE(on == ReadAll(absl::StrCat(dir, "/mixed.", r))) << "rank " << r << ": mixed";
  }
}

// The CPUs the thread of this process named `name` may run on ("" when there is none).
std::string ThreadCpus(const std::string& name) {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return "";
  std::string out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat("/proc/self/task/", e->d_name, "/comm"));
    std::string n;
    std::getline(comm, n);
    if (n != name) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(std::atoi(e->d_name), sizeof(set), &set) != 0) break;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) absl::StrAppend(&out, out.empty() ? "" : ",", c);
    }
  }
  closedir(d);
  return out;
}

// Note [Loop thread affinity] in real rank processes: two ranks on one host, by default,
// each bind their braid-loop thread to a CPU of their own (on a machine of 2 or more CPUs),
// and all-reduce as before; BRAID_LOOP_CPU=none leaves it on every CPU the process has.
TEST(LoopAffinityMpTest, TwoRanksOnAHostBindTheirLoopThreadsApartByDefault) {
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "one CPU";
  const std::string dir = braid::testing::MakeTempDir("braid_loop_cpu_");
  for (const char* setting : {"auto", "none"}) {
    RunJob(2, [&](int rank, Runtime& rt, Checker& c) {
      std::vector<float> x(1000, 1.0f + rank);
      c.Ok(WaitFor(rt.Enqueue(AllReduceOf("x", x.data(), x.data(), 1000, ReduceOp::kSum))),
           "all-reduce");
      c.Expect(x[0] == 3.0f && x[999] == 3.0f, "all-reduce value");
      std::ofstream(absl::StrCat(dir, "/", setting, ".", rank)) << ThreadCpus("braid-loop");
    }, absl::Seconds(60), 30, {{"BRAID_LOOP_CPU", setting}});
  }
  auto read = [&](const std::string& f) {
    std::ifstream in(absl::StrCat(dir, "/", f));
    std::string s;
    std::getline(in, s);
    return s;
  };
  std::string all;
  for (int c : allowed) absl::StrAppend(&all, all.empty() ? "" : ",", c);
  EXPECT_EQ(read("auto.0"), std::to_string(allowed[0]));
  EXPECT_EQ(read("auto.1"), std::to_string(allowed[allowed.size() / 2]));
  EXPECT_EQ(read("none.0"), all);
  EXPECT_EQ(read("none.1"), all);
}

// A 3-step run with the timeline on: each rank's file parses as JSON and shows, for every
// tensor, NEGOTIATE with a mark per rank, QUEUE, and the collective (inside the fusion
// buffer's copies when a bucket packed as three passes held several tensors; a gathered
// one copies inside its ALLREDUCE: Note [Pipelined copy]).
TEST(TimelineTest, ThreeStepsGiveAValidTraceWithEveryPhaseForEveryTensor) {
  const std::string dir = braid::testing::MakeTempDir("braid_timeline_");
  const std::string path = dir + "/timeline.json";
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    std::vector<std::vector<float>> in(5, std::vector<float>(1000, 1.0f)), out = in;
    for (int step = 0; step < 3; ++step) {
      std::vector<std::shared_ptr<Handle>> hs;
      for (int t = 0; t < 5; ++t) {
        auto h = rt.Enqueue(AllReduceOf(absl::StrCat("layer", t), in[t].data(), out[t].data(), 1000, ReduceOp::kSum));
        if (c.Ok(h.status(), "enqueue")) hs.push_back(*h);
      }
      for (auto& h : hs) c.Ok(h->Wait(absl::Seconds(30)), "step");
    }
  }, absl::Seconds(60), 30, {{"BRAID_TIMELINE", path}});
  for (const std::string& file : {path, path + ".rank1"}) {
    std::ifstream f(file);
    ASSERT_TRUE(f.good()) << file;
    nlohmann::json trace = nlohmann::json::parse(f);  // throws (fails the test) if invalid
    std::map<int, std::string> row;                    // tid -> tensor
    std::map<std::string, std::multiset<std::string>> seen;  // tensor -> "PHASE/ph"
    for (const auto& e : trace) {
      if (e["ph"] == "M") row[e["tid"].get<int>()] = e["args"]["name"];
    }
    for (const auto& e : trace) {
      if (e["ph"] == "M") continue;
      seen[row[e["tid"].get<int>()]].insert(e["name"].get<std::string>() + "/" + e["ph"].get<std::string>());
    }
    ASSERT_EQ(seen.size(), 5u) << file;
    for (const auto& [tensor, phases] : seen) {
      for (const char* p : {"NEGOTIATE/B", "NEGOTIATE/E", "QUEUE/B", "QUEUE/E", "ALLREDUCE/B",
                            "ALLREDUCE/E", "rank 0 ready/i", "rank 1 ready/i"}) {
        EXPECT_EQ(phases.count(p), 3u) << file << " " << tensor << " " << p;
      }
      // Fused steps add the fusion buffer's copies, as many begins as ends.
      EXPECT_EQ(phases.count("MEMCPY_IN_FUSION_BUFFER/B"), phases.count("MEMCPY_IN_FUSION_BUFFER/E"));
      EXPECT_EQ(phases.count("MEMCPY_OUT_FUSION_BUFFER/B"), phases.count("MEMCPY_IN_FUSION_BUFFER/B"));
    }
  }
}

// A timeline path that is a directory is a clear error at init.
TEST(TimelineTest, DirectoryPathIsAnErrorAtInit) {
  RunRanksOptions o;
  o.ranks = 1;
  o.deadline = absl::Seconds(30);
  auto exits = RunRanks(o, [](int) {
    for (const char* v : {"BRAID_COORDINATOR", "BRAID_RANK", "BRAID_SIZE"}) unsetenv(v);
    setenv("BRAID_TIMELINE", "/tmp", 1);
    Runtime rt;
    auto cfg = ConfigFromProcessEnv();
    absl::Status s = rt.Init(*cfg);
    return s.code() == absl::StatusCode::kInvalidArgument &&
                   s.message() == "BRAID_TIMELINE='/tmp' is a directory; give a file path"
               ? 0 : 1;
  });
  EXPECT_EQ(exits[0].exit_code, 0);
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// More distinct names per step than the response cache holds: every step still gives
// correct results on every rank while entries are evicted and renegotiated.
TEST_P(RuntimeWorldTest, CacheEvictionKeepsResultsCorrect) {
  const int size = GetParam();
  RunJob(size, [size](int rank, Runtime& rt, Checker& c) {
    const int kNames = 12;
    for (int step = 0; step < 4; ++step) {
      std::vector<std::vector<float>> in(kNames), out(kNames);
      std::vector<std::shared_ptr<Handle>> hs;
      for (int t = 0; t < kNames; ++t) {
        in[t].assign(3 + t, static_cast<float>(rank + step + t));
        out[t].assign(in[t].size(), 0.0f);
        auto h = rt.Enqueue(AllReduceOf(absl::StrCat("p", t), in[t].data(), out[t].data(),
                                        static_cast<int64_t>(in[t].size()), ReduceOp::kSum));
        if (c.Ok(h.status(), "enqueue")) hs.push_back(*h);
      }
      for (int t = 0; t < kNames && t < static_cast<int>(hs.size()); ++t) {
        if (!c.Ok(hs[t]->Wait(absl::Seconds(30)), absl::StrCat("p", t))) continue;
        float want = static_cast<float>(size * (step + t) + size * (size - 1) / 2);
        c.Expect(std::all_of(out[t].begin(), out[t].end(), [&](float v) { return v == want; }),
                 absl::StrCat("step ", step, " p", t));
      }
    }
  }, absl::Seconds(120), 30, {{"BRAID_CACHE_CAPACITY", "5"}});
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// A rank that shuts down while a peer waits on it: the peer's tensor fails at once with a
// message naming the rank, instead of waiting forever.
TEST(RuntimeTest, TensorWaitingForARankThatShutDownFails) {
  RunJob(2, [](int rank, Runtime& rt, Checker& c) {
    if (rank == 1) return;  // leaves at once (RunJob shuts it down)
    std::vector<float> a(4, 1.0f), b(4);
    absl::SleepFor(absl::Milliseconds(500));
    absl::Status s = WaitFor(rt.Enqueue(AllReduceOf("x", a.data(), b.data(), 4, ReduceOp::kSum)),
                             absl::Seconds(10));
    c.Expect(s.code() == absl::StatusCode::kFailedPrecondition &&
                 s.message() == "tensor 'x' can never complete: rank 1 already shut down",
             "got " + s.ToString());
  });
}

// A port nothing listens on now (bound to port 0, read back, closed).
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// Rank 0 hosts the coordinator and leaves first: its Shutdown waits for the others' goodbyes
// (Runtime::Shutdown), so rank 1, still working, gets the agreed error for a tensor rank 0
// can never join, not a coordinator that vanished under it ("the coordinator ended the
// job", Cancelled), and rank 0's Shutdown returns once rank 1 left.
TEST(RuntimeTest, HostingRankLeavingFirstLetsTheOthersFinish) {
  const int port = UnusedPort();
  ASSERT_GT(port, 0);
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(60);
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv("", rank, 2);
    unsetenv("BRAID_COORDINATOR");
    setenv("BRAID_COORDINATOR_PORT", std::to_string(port).c_str(), 1);
    Checker c{rank};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    std::vector<float> a(4, 1.0f), b(4);
    c.Ok(WaitFor(rt.Enqueue(AllReduceOf("both", a.data(), b.data(), 4, ReduceOp::kSum))), "both");
    const absl::Time t0 = absl::Now();
    if (rank == 1) {
      absl::SleepFor(absl::Milliseconds(500));
      absl::Status s = WaitFor(
          rt.Enqueue(AllReduceOf("x", a.data(), b.data(), 4, ReduceOp::kSum)), absl::Seconds(10));
      c.Expect(s.code() == absl::StatusCode::kFailedPrecondition &&
                   s.message() == "tensor 'x' can never complete: rank 0 already shut down",
               "got " + s.ToString());
    }
    c.Ok(rt.Shutdown(), "shutdown");
    if (rank == 0) {
      c.Expect(absl::Now() - t0 >= absl::Milliseconds(450),
               absl::StrCat("rank 0's Shutdown returned after ",
                            absl::FormatDuration(absl::Now() - t0), ", before rank 1 left"));
    }
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " failed (see its stderr)";
  }
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// The compression row of `braidctl status --json` for `method`, or null.
nlohmann::json CompressionRow(const nlohmann::json& status, const std::string& method) {
  for (const auto& c : status["compression"]) {
    if (c["method"] == method) return c;
  }
  return nullptr;
}

// Ranks report their compression byte counters with their heartbeats: `braidctl status`
// shows them summed over ranks, per method, while the job runs and (from each rank's last
// report as it leaves) after it ended. An fp16 all-reduce of N float32 elements on 2 ranks
// is 2 x 4N bytes uncompressed and 2 x 2N payload.
TEST(StatusTest, BraidctlShowsCompressionBytesSummedOverRanks) {
  constexpr int64_t kN = 1000;
  CoordinatorProcess coord(2);
  ASSERT_FALSE(coord.address().empty());
  const std::string dir = braid::testing::MakeTempDir("braid_status_");
  const std::string braidctl =
      std::string(BRAIDCTL_PATH) + " status --coordinator " + coord.address();
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(90);
  std::string live_json, live_table;
  int live_rc = -1, table_rc = -1;
  o.after_start = [&](const std::vector<pid_t>&) {
    // Poll until both ranks' heartbeats carried the fp16 all-reduce (they beat every 0.5 s
    // with BRAID_HEARTBEAT_TIMEOUT_S=2), under a deadline.
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    while (absl::Now() < limit) {
      live_json = RunCommand(braidctl + " --json", &live_rc);
      if (live_rc == 0) {
        auto row = CompressionRow(nlohmann::json::parse(live_json, nullptr, false), "fp16");
        if (row.is_object() && row["ranks_reporting"] == 2) break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    live_table = RunCommand(braidctl, &table_rc);
    FILE* f = fopen((dir + "/checked").c_str(), "w");
    if (f) fclose(f);
  };
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv(coord.address(), rank, 2);
    setenv("BRAID_HEARTBEAT_TIMEOUT_S", "2", 1);
    Checker c{rank};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    std::vector<float> a(kN, 0.25f), b(kN);
    CollectiveRequest r = AllReduceOf("g.fp16", a.data(), b.data(), kN, ReduceOp::kSum);
    r.compression = "fp16";
    c.Ok(WaitFor(rt.Enqueue(r)), "fp16 all-reduce");
    c.Ok(WaitFor(rt.Enqueue(AllReduceOf("g.none", a.data(), b.data(), kN, ReduceOp::kSum))),
         "uncompressed all-reduce");
    const absl::Time limit = absl::Now() + absl::Seconds(45);
    while (access((dir + "/checked").c_str(), F_OK) != 0 && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank;
  int final_rc = -1;
  const std::string final_json = RunCommand(braidctl + " --json", &final_rc);

  // int64 fields are strings in proto3 JSON; byte fields are summed over the 2 ranks.
  auto expect_rows = [&](const std::string& json, const char* when) {
    SCOPED_TRACE(when);
    auto j = nlohmann::json::parse(json, nullptr, false);
    ASSERT_TRUE(j.is_object()) << json;
    auto fp16 = CompressionRow(j, "fp16");
    ASSERT_TRUE(fp16.is_object()) << json;
    EXPECT_EQ(fp16["ranks_reporting"], 2) << json;
    EXPECT_EQ(fp16["tensors"], "1");
    EXPECT_EQ(fp16["reductions"], "2");
    EXPECT_EQ(fp16["uncompressed_bytes"], std::to_string(2 * 4 * kN));
    EXPECT_EQ(fp16["payload_bytes"], std::to_string(2 * 2 * kN));  // half of uncompressed
    EXPECT_EQ(fp16["reference_transport_bytes"], std::to_string(2 * 4 * kN));  // 2 x 2(n-1)/n
    EXPECT_GT(std::stoll(fp16["transport_bytes"].get<std::string>()), 0);
    EXPECT_EQ(fp16["bytes_before"], std::to_string(4 * kN));  // negotiated, one rank's share
    EXPECT_EQ(fp16["bytes_after"], std::to_string(2 * kN));
    EXPECT_EQ(fp16["ratio"], 2.0);
    auto none = CompressionRow(j, "none");
    ASSERT_TRUE(none.is_object()) << json;
    EXPECT_EQ(none["payload_bytes"], none["uncompressed_bytes"]);
    EXPECT_EQ(none["uncompressed_bytes"], std::to_string(2 * 4 * kN));
    EXPECT_EQ(none["ratio"], 1.0);
  };
  ASSERT_EQ(live_rc, 0) << live_json;
  expect_rows(live_json, "while the job runs");
  ASSERT_EQ(final_rc, 0) << final_json;
  expect_rows(final_json, "after every rank shut down");

  // The table: per method and pattern ("-": no plan), tensors, uncompressed, payload,
  // transport, ratio, ranks.
  ASSERT_EQ(table_rc, 0) << live_table;
  EXPECT_NE(live_table.find("UNCOMPRESSED"), std::string::npos) << live_table;
  bool found = false;
  for (const absl::string_view line : absl::StrSplit(live_table, '\n')) {
    if (!absl::StartsWith(line, "fp16 ")) continue;
    found = true;
    std::vector<std::string> cols = absl::StrSplit(line, ' ', absl::SkipEmpty());
    ASSERT_EQ(cols.size(), 8u) << line;
    EXPECT_EQ(cols[1], "-");
    EXPECT_EQ(cols[2], "1");
    EXPECT_EQ(cols[3], std::to_string(2 * 4 * kN));
    EXPECT_EQ(cols[4], std::to_string(2 * 2 * kN));
    EXPECT_EQ(cols[6], "2.00");
    EXPECT_EQ(cols[7], "2");
  }
  EXPECT_TRUE(found) << live_table;
}

}  // namespace
}  // namespace braid
