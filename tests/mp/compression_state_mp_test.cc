// Multi-process tests of restoring the compression state (Note [Restoring compression state],
// compression/state_summary.h) through braid::Runtime: a real coordinator process, 2 real
// rank processes, real UCX.
//   - A job that resumes from a saved state continues bit for bit as the uninterrupted one,
//     for every method that keeps state (PowerSGD, the sparsifiers, 4-bit with ef=1).
//   - Ranks that restore states that disagree (taken at different steps, of another model,
//     of another world size, the same rank's state twice, a malformed one, one loaded while a
//     compressed all-reduce is in flight) all get the same error within seconds, naming the
//     ranks and what differs, and nothing changes on any rank.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compression/stage.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/runtime_job.h"

namespace braid {
namespace {

using braid::testing::Checker;
using braid::testing::RunJob;
using braid::testing::WaitFor;

// One tensor per method ("t<i>"), so no two share a bucket whatever the timing.
const std::vector<std::string> kMethods = {"powersgd:rank=2", "scalecomp:ratio=8",
                                           "topk:ratio=8",    "randomk:ratio=8",
                                           "fp4:ef=1",        "int4:ef=1,start_step=4"};
const std::vector<int64_t> kShape = {24, 18};
constexpr int64_t kCount = 24 * 18;

std::vector<float> Input(int rank, size_t t, int step) {
  std::vector<float> x(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    x[i] = std::sin(0.37f * i + 1.3f * t + 0.71f * step + 2.9f * rank) * (1 + i % 7);
  }
  return x;
}

// One step of every method in `methods` (tensor i named prefix + i): the results' bytes, or
// a failure recorded in `c`.
std::string Step(Runtime& rt, Checker& c, int rank, int step,
                 const std::vector<std::string>& methods = kMethods,
                 const std::string& prefix = "t") {
  std::vector<std::vector<float>> in(methods.size()), out(methods.size());
  std::vector<absl::StatusOr<std::shared_ptr<Handle>>> handles;
  for (size_t t = 0; t < methods.size(); ++t) {
    in[t] = Input(rank, t, step);
    out[t].assign(kCount, -1.0f);
    CollectiveRequest r = testing::AllReduceOf(absl::StrCat(prefix, t), in[t].data(),
                                               out[t].data(), kCount, ReduceOp::kAverage);
    r.shape = kShape;
    r.compression = methods[t];
    handles.push_back(rt.Enqueue(r));
  }
  std::string bytes;
  for (size_t t = 0; t < methods.size(); ++t) {
    c.Ok(WaitFor(handles[t]), absl::StrCat("step ", step, " ", methods[t]));
    bytes.append(reinterpret_cast<const char*>(out[t].data()), kCount * sizeof(float));
  }
  return bytes;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}
std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Job 1: steps 1-3, save, steps 4-6. Job 2: load, steps 4-6: the same bytes on every rank.
TEST(CompressionStateMpTest, ResumedJobIsBitIdenticalForEveryMethodWithState) {
  const std::string dir = braid::testing::MakeTempDir("braid_compression_state");
  RunJob(2, [&](int rank, Runtime& rt, Checker& c) {
    for (int step = 1; step <= 3; ++step) Step(rt, c, rank, step);
    auto state = rt.compression_state();
    if (!c.Ok(state.status(), "compression_state")) return;
    WriteFile(absl::StrCat(dir, "/state.rank", rank), *state);
    std::string later;
    for (int step = 4; step <= 6; ++step) later += Step(rt, c, rank, step);
    WriteFile(absl::StrCat(dir, "/steps.rank", rank), later);
  });
  RunJob(2, [&](int rank, Runtime& rt, Checker& c) {
    if (!c.Ok(rt.LoadCompressionState(ReadFile(absl::StrCat(dir, "/state.rank", rank))),
              "load")) {
      return;
    }
    std::string later;
    for (int step = 4; step <= 6; ++step) later += Step(rt, c, rank, step);
    const std::string want = ReadFile(absl::StrCat(dir, "/steps.rank", rank));
    c.Expect(later.size() == want.size(), "the uninterrupted job's steps were recorded");
    for (size_t t = 0; t < kMethods.size() * 3 && later.size() == want.size(); ++t) {
      const size_t at = t * kCount * sizeof(float);
      c.Expect(std::memcmp(later.data() + at, want.data() + at, kCount * sizeof(float)) == 0,
               absl::StrCat(kMethods[t % kMethods.size()], " at step ",
                            4 + t / kMethods.size(), ": not bit-identical to the uninterrupted "
                                                     "job"));
    }
  });
}

// Loads `state` and expects `want` (every rank gets the same), within 5 s.
void ExpectLoadFails(Runtime& rt, Checker& c, const std::string& state, const absl::Status& want,
                     const std::string& what) {
  const absl::Time t0 = absl::Now();
  const absl::Status got = rt.LoadCompressionState(state);
  c.Expect(got == want, absl::StrCat(what, ": got ", got.ToString(), "\n  want ", want.ToString()));
  c.Expect(absl::Now() - t0 < absl::Seconds(5),
           absl::StrCat(what, ": took ", absl::FormatDuration(absl::Now() - t0)));
}

TEST(CompressionStateMpTest, RanksThatRestoredDifferentStatesAllFailNamingTheMismatch) {
  const std::string dir = braid::testing::MakeTempDir("braid_compression_agree");
  const std::vector<std::string> methods = {"fp4:ef=1,start_step=1", "scalecomp:ratio=8"};
  const std::string none = "; no rank loaded its state (every rank keeps the one it had)";
  const std::string models = " (states of different models, or taken before and after its "
                             "first step)";
  RunJob(2, [&](int rank, Runtime& rt, Checker& c) {
    // The state of another model (tensors u0, u1), then forgotten.
    for (int step = 1; step <= 3; ++step) Step(rt, c, rank, step, methods, "u");
    const std::string other_model = *rt.compression_state();
    c.Expect(*rt.ForgetCompressionState({"u0", "u1"}) == 2, "forgot u0 and u1");
    for (int step = 1; step <= 2; ++step) Step(rt, c, rank, step, methods);
    const std::string s2 = *rt.compression_state();
    Step(rt, c, rank, 3, methods);
    const std::string s3 = *rt.compression_state();
    WriteFile(absl::StrCat(dir, "/s3.rank", rank), s3);
    // Rank 0 wrote its file before this step, which rank 1 completes only with rank 0.
    const std::string step4 = Step(rt, c, rank, 4, methods);
    c.Ok(rt.LoadCompressionState(s3), "both ranks load their own state of step 3");
    c.Expect(*rt.compression_state() == s3, "the state saved after loading is the one loaded");

    ExpectLoadFails(rt, c, rank == 0 ? s2 : s3, absl::InvalidArgumentError(absl::StrCat(
        "load_compression_state: the ranks restored compression states that disagree: tensor "
        "'t0' (fp4:ef=1,start_step=1): step counter 2 on rank 0, 3 on rank 1 (states taken at "
        "different steps); tensor 't1' (scalecomp:ratio=8): step counter 2 on rank 0, 3 on "
        "rank 1 (states taken at different steps)", none)), "states of steps 2 and 3");
    ExpectLoadFails(rt, c, rank == 0 ? s3 : other_model, absl::InvalidArgumentError(absl::StrCat(
        "load_compression_state: the ranks restored compression states that disagree: tensor "
        "'t0' (fp4:ef=1,start_step=1): held on rank 0, missing on rank 1", models, "; tensor "
        "'u0' (fp4:ef=1,start_step=1): missing on rank 0, held on rank 1", models, "; tensor "
        "'t1' (scalecomp:ratio=8): held on rank 0, missing on rank 1", models, "; tensor 'u1' "
        "(scalecomp:ratio=8): missing on rank 0, held on rank 1", models, none)),
        "a state of another model on rank 1");
    ExpectLoadFails(rt, c, rank == 1 ? "BRDCMPST" : s3, absl::InvalidArgumentError(absl::StrCat(
        "load_compression_state: rank 1: compression state: truncated at byte 8 (4 more bytes "
        "expected, 0 left)", none)), "a malformed state on rank 1");
    const std::string of_one = compression::CompressionStage({}).SaveState(0, 1).value();
    ExpectLoadFails(rt, c, rank == 0 ? of_one : s3,
                    absl::InvalidArgumentError(absl::StrCat(
                        "load_compression_state: the states were saved by a job of 1 rank on "
                        "rank 0, 2 ranks on rank 1, but this job has 2 (a state does not carry "
                        "over to another world size)", none)), "a state of a world of one");
    ExpectLoadFails(rt, c, ReadFile(absl::StrCat(dir, "/s3.rank0")),
                    absl::InvalidArgumentError(absl::StrCat(
                        "load_compression_state: ranks 0, 1 all restored the state saved by "
                        "rank 0 (each rank restores its own: error-feedback residuals are per "
                        "rank)", none)), "rank 0's state on both ranks");
    c.Expect(*rt.compression_state() == s3, "after the failed loads every rank's state is as "
                                            "it was");

    // A compressed all-reduce in flight on rank 0 only: its refusal reaches rank 1 too.
    std::vector<float> x(kCount, 1.0f), y(kCount);
    CollectiveRequest inflight = testing::AllReduceOf("inflight", x.data(), y.data(), kCount,
                                                      ReduceOp::kAverage);
    inflight.compression = "fp4";
    absl::StatusOr<std::shared_ptr<Handle>> h = absl::UnknownError("not enqueued");
    if (rank == 0) h = rt.Enqueue(inflight);
    ExpectLoadFails(rt, c, s3, absl::FailedPreconditionError(absl::StrCat(
        "load_compression_state: rank 0: load_compression_state() on rank 0 while the "
        "compressed all-reduce 'inflight' is in flight: call it between steps, after "
        "synchronizing every all-reduce", none)), "a compressed all-reduce in flight on rank 0");
    if (rank == 1) h = rt.Enqueue(inflight);
    c.Ok(WaitFor(h), "the all-reduce in flight completes afterwards");

    // Then the agreed state loads, and step 4 repeats bit for bit.
    c.Ok(rt.LoadCompressionState(s3), "loading the agreed state after the failures");
    c.Expect(Step(rt, c, rank, 4, methods) == step4, "step 4 after reloading: not bit-identical");
  });
}

}  // namespace
}  // namespace braid
