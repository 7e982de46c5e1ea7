// Multi-process tests of the sparsifiers (scalecomp, topk, randomk; compression/sparse.h):
// real rank processes, real UCX over shared memory.
//  - Correctness, 2-4 ranks: each rank runs the Compressors on a UCX Communicator for several
//    steps and checks its result against the reference (tests/testing/sparse_reference.h)
//    that it computes itself from every rank's inputs (each rank can regenerate any rank's),
//    and that every rank holds the same bits.
//  - Byte counters, 2, 3, 4 and 8 ranks: scalecomp's payload is 4·k per rank whatever n and
//    its bytes sent stay within 2× the payload plus its part of the index broadcast; topk
//    receives (n - 1)·k·8 bytes (the gradient build-up); randomk sends no indices.
//  - Through braid::Runtime (a real coordinator): a NaN on one rank fails the tensor on every
//    rank, naming it and the rank, and the next step runs on the memory kept from before.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/store.h"
#include "compression/registry.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/runtime_job.h"
#include "tests/testing/sparse_reference.h"
#include "transport/ucx_communicator.h"

namespace braid {
namespace {

using braid::testing::Dyadic;
using braid::testing::RefK;
using braid::testing::SparseReference;
using compression::TensorView;
using transport::Communicator;

struct Checker {
  int rank;
  int failures = 0;
  bool Expect(bool ok, const std::string& what) {
    if (!ok && ++failures <= 20) fprintf(stderr, "[rank %d] FAILED: %s\n", rank, what.c_str());
    return ok;
  }
};

// Forks `size` ranks connected by UCX (shared memory) and runs body(rank, comm, checker) on
// each; every rank must exit 0.
void RunWorld(int size, const std::function<void(int, Communicator&, Checker&)>& body) {
  const std::string dir = braid::testing::MakeTempDir("braid_sparse_mp");
  braid::testing::RunRanksOptions o;
  o.ranks = size;
  o.deadline = absl::Seconds(180);
  auto exits = braid::testing::RunRanks(o, [&](int rank) {
    setenv("UCX_TLS", "sm", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    FileStore store(dir);
    transport::UcxOptions u;
    u.rank = rank;
    u.size = size;
    u.store = &store;
    u.timeout = absl::Seconds(60);
    u.connect_timeout = absl::Seconds(60);
    auto comm = transport::CreateUcxCommunicator(u);
    if (!comm.ok()) {
      fprintf(stderr, "[rank %d] connect: %s\n", rank, comm.status().ToString().c_str());
      return 2;
    }
    Checker c{rank};
    body(rank, **comm, c);
    // Nobody closes endpoints while a peer still reads the last result.
    c.Expect((*comm)->Barrier().ok(), "final barrier");
    return c.failures == 0 ? 0 : 1;
  });
  for (const braid::testing::RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " failed (see its stderr)";
  }
}

// One bucket of tensors `sizes` on this rank, filled with Dyadic inputs for `step`.
struct Bucket {
  std::vector<size_t> sizes;
  std::vector<std::vector<float>> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> names;
  std::vector<TensorView> views;

  Bucket(std::vector<size_t> s, int rank, int step) : sizes(std::move(s)) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      names.push_back(absl::StrCat("t", t));
      shapes.push_back({static_cast<int64_t>(sizes[t])});
      data.emplace_back(sizes[t]);
      for (size_t i = 0; i < sizes[t]; ++i) data[t][i] = Dyadic(rank, step, t, i);
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      views.push_back({names[t], shapes[t], data[t].data(), sizes[t]});
    }
  }
  std::vector<float> Flat() const {
    std::vector<float> f;
    for (const auto& d : data) f.insert(f.end(), d.begin(), d.end());
    return f;
  }
};

// One Reduce of `bucket`; payload per tensor out.
absl::Status Reduce(compression::Compressor& c, Communicator& comm, Bucket& b, int64_t step,
                    std::vector<uint64_t>* payload) {
  std::vector<int64_t> steps(b.sizes.size(), step);
  payload->assign(b.sizes.size(), 0);
  compression::StepContext ctx;
  ctx.op = ReduceOp::kAverage;
  ctx.steps = steps;
  ctx.payload_bytes = absl::MakeSpan(*payload);
  return c.Reduce(b.views, comm, ctx);
}

std::unique_ptr<compression::Compressor> Make(const std::string& spec) {
  return std::move(compression::CreateCompressor(compression::ParseCompressionSpec(spec).value()))
      .value();
}

// Every rank holds `mine` exactly: all-gather a fingerprint.
void ExpectSameOnEveryRank(Communicator& comm, Checker& c, const std::vector<float>& mine,
                           const std::string& what) {
  uint64_t h = 1469598103934665603ull;
  for (float v : mine) {
    uint32_t w;
    std::memcpy(&w, &v, 4);
    h = (h ^ w) * 1099511628211ull;
  }
  std::vector<uint64_t> all(comm.size());
  std::vector<size_t> eight(comm.size(), sizeof(uint64_t));
  if (!c.Expect(comm.AllGather(&h, sizeof(h), all.data(), eight).ok(), what + ": all-gather")) {
    return;
  }
  for (int r = 0; r < comm.size(); ++r) {
    c.Expect(all[r] == h, absl::StrCat(what, ": rank ", r, " holds other bits than rank ",
                                       comm.rank()));
  }
}

struct Case {
  std::string spec;
  SparseReference ref;  // ignored when compare_reference is false
  std::vector<size_t> sizes;
  int steps;
  bool compare_reference = true;
};

class SparseWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(SparseWorldTest, ResultsEqualTheReferenceAndAreIdenticalOnEveryRank) {
  const int n = GetParam();
  RunWorld(n, [n](int rank, Communicator& comm, Checker& c) {
    std::vector<Case> cases;
    const std::vector<size_t> bucket = {3000, 0, 129, 1};
    cases.push_back({"scalecomp:ratio=10,beta=0.5", {}, bucket, 2 * n + 1});
    cases.back().ref.ratio = 10;
    cases.back().ref.beta = 0.5f;
    cases.push_back({"scalecomp:ratio=5,granularity=tensor", {}, bucket, n + 1});
    cases.back().ref.ratio = 5;
    cases.back().ref.per_tensor = true;
    // k = 349526 values: 1.4 MB, so the all-reduce is the transport's ring, not recursive
    // doubling (the sums stay exact either way).
    cases.push_back({"scalecomp:ratio=3", {}, {1 << 20}, 2});
    cases.back().ref.ratio = 3;
    cases.push_back({"topk:ratio=10", {}, bucket, 3});
    cases.back().ref.ratio = 10;
    cases.back().ref.topk = true;
    cases.push_back({"randomk:ratio=10", {}, bucket, 3, /*compare_reference=*/false});
    for (const Case& k : cases) {
      auto compressor = Make(k.spec);
      std::vector<std::vector<float>> want;
      if (k.compare_reference) {
        want = k.ref.Run(n, k.steps, k.sizes, braid::testing::Dyadic);
      }
      for (int step = 0; step < k.steps; ++step) {
        const std::string what = absl::StrCat(k.spec, " step ", step);
        Bucket b(k.sizes, rank, step);
        std::vector<uint64_t> payload;
        if (!c.Expect(Reduce(*compressor, comm, b, step, &payload).ok(), what)) return;
        const std::vector<float> got = b.Flat();
        if (k.compare_reference) {
          size_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            if (got[i] != want[step][i] && ++bad <= 3) {
              c.Expect(false, absl::StrCat(what, ": element ", i, " = ", got[i], ", reference ",
                                           want[step][i]));
            }
          }
          c.Expect(bad == 0, absl::StrCat(what, ": ", bad, " elements differ from the reference"));
        }
        ExpectSameOnEveryRank(comm, c, got, what);
      }
    }
  });
}

// Bytes of one step of each method on n ranks (1 Mi elements, ratio 4: k = 262144, so the
// values travel by a bandwidth-optimal all-reduce), checked against the bounds above.
class SparseBytesTest : public ::testing::TestWithParam<int> {};

TEST_P(SparseBytesTest, ScaleCompStaysFlatWhileTopKBuildsUp) {
  const int n = GetParam();
  RunWorld(n, [n](int rank, Communicator& comm, Checker& c) {
    const size_t count = size_t{1} << 20, k = RefK(count, 4);
    // The index broadcast alone, from the same root as scalecomp's first step (rank 0).
    std::vector<uint8_t> indices((k + 1) * 4);
    const uint64_t b0 = comm.stats().bytes_sent;
    c.Expect(comm.Broadcast(indices.data(), indices.size(), 0).ok(), "broadcast");
    const uint64_t broadcast_sent = comm.stats().bytes_sent - b0;
    for (const std::string spec : {"scalecomp:ratio=4", "topk:ratio=4", "randomk:ratio=4"}) {
      auto compressor = Make(spec);
      Bucket b({count}, rank, 0);
      std::vector<uint64_t> payload;
      const transport::TransportStats before = comm.stats();
      if (!c.Expect(Reduce(*compressor, comm, b, 0, &payload).ok(), spec)) return;
      const uint64_t sent = comm.stats().bytes_sent - before.bytes_sent;
      const uint64_t received = comm.stats().bytes_received - before.bytes_received;
      if (rank == 0) {
        fprintf(stderr, "%d ranks, %-18s k=%zu payload %8llu B, sent %8llu B, received %9llu B"
                        " (index broadcast: %llu B sent)\n",
                n, spec.c_str(), k, static_cast<unsigned long long>(payload[0]),
                static_cast<unsigned long long>(sent), static_cast<unsigned long long>(received),
                static_cast<unsigned long long>(broadcast_sent));
      }
      const std::string what = absl::StrCat(spec, " on ", n, " ranks: payload ", payload[0],
                                            " sent ", sent, " received ", received);
      if (spec == "topk:ratio=4") {
        c.Expect(payload[0] == 8 * k, what);
        // Every other rank's k (index, value) pairs arrive: (n - 1)·k·8, growing with n.
        const uint64_t build_up = static_cast<uint64_t>(n - 1) * k * 8;
        c.Expect(received >= build_up && received <= build_up + 1024, what);
        continue;
      }
      c.Expect(payload[0] == 4 * k, what + ": the payload is 4·k, whatever the number of ranks");
      const uint64_t index_part = spec == "scalecomp:ratio=4" ? broadcast_sent : 0;
      c.Expect(sent <= 2 * payload[0] + index_part, what);
      c.Expect(sent > 0 || n == 1, what);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SparseWorldTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "ranks");
                         });
// Eight ranks too (more than the cores here: one step per method keeps it short).
INSTANTIATE_TEST_SUITE_P(Ranks, SparseBytesTest, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "ranks");
                         });

// Through braid::Runtime, one tensor per bucket (BRAID_FUSION_THRESHOLD=0): rank 2 submits a
// NaN at step 1. Every rank's handle fails with the same error naming the tensor and rank 2,
// the other tensor of that step is fine, and step 2 gives what the reference gives with step 1
// left out (the memory was kept). The byte counters show payload = 4·k per reduction.
TEST(SparseRuntimeTest, NonFiniteGradientFailsOnEveryRankAndTheMemoryIsKept) {
  using braid::testing::AllReduceOf;
  using braid::testing::WaitFor;
  const int n = 3;
  const std::vector<size_t> sizes = {2000, 300};
  braid::testing::RunJob(n, [&](int rank, Runtime& rt, braid::testing::Checker& c) {
    const std::string spec = "scalecomp:ratio=20,beta=0.5";
    SparseReference ref;
    ref.ratio = 20;
    ref.beta = 0.5f;
    // grad.0 succeeds at steps 0, 1, 2; grad.1 at steps 0 and 2 only, which its memory and
    // its step count (hence its leader) see as its steps 0 and 1.
    std::vector<std::vector<std::vector<float>>> want(2);
    want[0] = ref.Run(n, 3, {sizes[0]}, [](int r, int step, size_t, size_t i) {
      return Dyadic(r, step, 0, i);
    });
    want[1] = ref.Run(n, 2, {sizes[1]}, [](int r, int step, size_t, size_t i) {
      return Dyadic(r, step == 0 ? 0 : 2, 1, i);
    });
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> in(2), out(2);
      std::vector<absl::StatusOr<std::shared_ptr<Handle>>> handles;
      for (size_t t = 0; t < 2; ++t) {
        in[t].resize(sizes[t]);
        for (size_t i = 0; i < sizes[t]; ++i) in[t][i] = Dyadic(rank, step, t, i);
        if (step == 1 && rank == 2 && t == 1) in[t][17] = NAN;
        out[t].assign(sizes[t], -1.0f);
        CollectiveRequest r = AllReduceOf(absl::StrCat("grad.", t), in[t].data(),
                                          out[t].data(), sizes[t], ReduceOp::kAverage);
        r.compression = spec;
        handles.push_back(rt.Enqueue(r));
      }
      for (size_t t = 0; t < 2; ++t) {
        const absl::Status s = WaitFor(handles[t]);
        const std::string what = absl::StrCat("step ", step, " grad.", t);
        if (step == 1 && t == 1) {
          c.Expect(s == absl::InvalidArgumentError(
                            "compression 'scalecomp:beta=0.5,ratio=20': non-finite gradient "
                            "(NaN or Inf) in tensor 'grad.1' on rank 2; every rank rejects "
                            "this step and keeps its error-feedback memory"),
                   what + ": " + s.ToString());
          continue;
        }
        if (!c.Ok(s, what)) continue;
        const int ref_step = t == 0 ? step : (step == 0 ? 0 : 1);
        c.Expect(out[t] == want[t][ref_step], what + ": differs from the reference");
      }
    }
    auto report = rt.compression_report();
    if (!c.Ok(report.status(), "compression_report")) return;
    for (const auto& t : report->tensors) {
      if (t.name != "grad.0") continue;
      const uint64_t k = RefK(2000, 20);
      c.Expect(t.bytes.reductions == 3 && t.bytes.payload_bytes == 3 * 4 * k &&
                   t.bytes.uncompressed_bytes == 3 * 4 * 2000,
               absl::StrCat("grad.0: ", t.bytes.reductions, " reductions, payload ",
                            t.bytes.payload_bytes, ", uncompressed ", t.bytes.uncompressed_bytes));
    }
  }, absl::Seconds(120), 30, {{"BRAID_FUSION_THRESHOLD", "0"}});
}

}  // namespace
}  // namespace braid
