// The compression state for checkpoints (compression/stage.h, state_summary.h): every method
// that keeps state resumes bit-identically; malformed states are refused by their declared
// sizes before anything is allocated for them, naming the field; and the ranks' summaries
// agree, or the message names the ranks, tensors and fields that differ. Ranks are threads
// (thread_world.h).
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "compression/stage.h"
#include "compression/state_summary.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "tests/testing/test_device.h"
#include "tests/unit/thread_world.h"

// The largest single allocation while `g_track` is set: a loader that sizes a buffer from an
// unchecked count shows here, whether or not the allocation succeeds.
namespace {
std::atomic<bool> g_track{false};
std::atomic<size_t> g_largest{0};
}  // namespace

// GCC cannot see that these replace the global pair together, and warns that free() meets
// a pointer from operator new.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (g_track.load(std::memory_order_relaxed)) {
    size_t seen = g_largest.load();
    while (n > seen && !g_largest.compare_exchange_weak(seen, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace braid::compression {
namespace {

using braid::testing::ThreadWorld;

// ---- Bit-identical resume, every method that keeps state --------------------------------

std::vector<int64_t> kShapeW = {24, 18}, kShapeB = {50};

std::vector<float> Grad(int rank, int tensor, int step, size_t n) {
  std::mt19937 gen(1000 * step + 10 * tensor + rank);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& v : x) v = d(gen);
  return x;
}

std::vector<uint32_t> Bits(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  std::memcpy(b.data(), x.data(), x.size() * sizeof(float));
  return b;
}

// One bucket of `views` under `spec`, its tensors on `device` (null: the host), as the
// pipeline plans and reduces it.
absl::Status ReduceOn(CompressionStage& stage, transport::Communicator& comm,
                      const std::string& spec, absl::Span<const TensorView> views,
                      device::Device* device) {
  const CompressionMethod& method = *stage.Resolve(spec).value();
  std::vector<BucketTensor> tensors;
  for (const TensorView& v : views) tensors.push_back({v.name, v.shape, v.dtype, v.count});
  absl::StatusOr<PlannedBucket> planned = stage.Plan(method, tensors, device);
  if (!planned.ok()) return planned.status();
  return stage.Reduce(*std::move(planned), views, ReduceOp::kAverage, comm);
}

// Steps `from`..`to` of a bucket of "w" and "b"; each step's results (bits) appended. The
// inputs are rank `data_rank`'s (-1: this rank's); the tensors are on `device` (null: the
// host).
void RunSteps(CompressionStage& stage, transport::Communicator& comm, const std::string& spec,
              int from, int to, std::vector<std::vector<uint32_t>>* record, int data_rank = -1,
              device::Device* device = nullptr) {
  const int rank = data_rank >= 0 ? data_rank : comm.rank();
  for (int step = from; step <= to; ++step) {
    std::vector<float> w = Grad(rank, 0, step, 432), b = Grad(rank, 1, step, 50);
    std::vector<TensorView> views = {{"w", kShapeW, w.data(), w.size()},
                                     {"b", kShapeB, b.data(), b.size()}};
    const absl::Status s = ReduceOn(stage, comm, spec, views, device);
    ASSERT_TRUE(s.ok()) << spec << ": " << s;
    if (record == nullptr) continue;
    w.insert(w.end(), b.begin(), b.end());
    record->push_back(Bits(w));
  }
}

// The state of one rank alone after steps 1..`steps` of `spec`.
std::string StateAfter(const std::string& spec, int steps) {
  std::string state;
  ThreadWorld(1).Run([&](int, transport::Communicator& comm) {
    CompressionStage stage(StageOptions{});
    RunSteps(stage, comm, spec, 1, steps, nullptr);
    state = stage.SaveState(0, 1).value();
  });
  return state;
}

class ResumeTest : public ::testing::TestWithParam<const char*> {};

// Run 4 steps, save, run 3 more; a new job that loads the state and runs the same 3 steps
// gets the same bits on every rank, and ends with the same state. Without the state the same
// steps differ (so the comparison can fail).
TEST_P(ResumeTest, LoadedStateContinuesBitIdentically) {
  const std::string spec = GetParam();
  std::vector<std::string> saved(2), end_first(2), end_resumed(2);
  std::vector<std::vector<std::vector<uint32_t>>> first(2), resumed(2), cold(2);
  ThreadWorld(2).Run([&](int r, transport::Communicator& comm) {
    CompressionStage stage(StageOptions{});
    RunSteps(stage, comm, spec, 1, 4, nullptr);
    saved[r] = stage.SaveState(r, 2).value();
    RunSteps(stage, comm, spec, 5, 7, &first[r]);
    end_first[r] = stage.SaveState(r, 2).value();
  });
  ThreadWorld(2).Run([&](int r, transport::Communicator& comm) {
    CompressionStage stage(StageOptions{});
    ASSERT_TRUE(stage.LoadState(saved[r], r, 2).ok());
    EXPECT_EQ(stage.SaveState(r, 2).value(), saved[r])
        << "saving what was loaded gives the same bytes";
    RunSteps(stage, comm, spec, 5, 7, &resumed[r]);
    end_resumed[r] = stage.SaveState(r, 2).value();
  });
  ThreadWorld(2).Run([&](int r, transport::Communicator& comm) {
    CompressionStage stage(StageOptions{});
    RunSteps(stage, comm, spec, 5, 7, &cold[r]);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(resumed[r].size(), 3u);
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(resumed[r][s], first[r][s]) << spec << ": rank " << r << " step " << 5 + s;
    }
    EXPECT_EQ(end_resumed[r], end_first[r]) << spec << ": rank " << r << "'s state at the end";
    EXPECT_NE(cold[r], first[r]) << spec << ": without the state the steps must differ";
  }
  EXPECT_EQ(first[0], first[1]) << "every rank holds the same result";
}

INSTANTIATE_TEST_SUITE_P(EveryStatefulMethod, ResumeTest,
                         ::testing::Values("fp4:ef=1", "int4:beta=0.5,ef=1",
                                           "fp4:ef=1,start_step=5", "scalecomp:ratio=8",
                                           "scalecomp:beta=0.5,granularity=tensor,ratio=8",
                                           "topk:ratio=8", "randomk:ratio=8",
                                           "powersgd:rank=2"));

// ---- A state loaded for another spec ---------------------------------------------------

// The warnings logged while it lives.
class WarningLog : public google::LogSink {
 public:
  WarningLog() { google::AddLogSink(this); }
  ~WarningLog() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const struct ::tm*,
            const char* message, size_t length) override {
    absl::MutexLock lock(&mu_);
    if (severity == google::GLOG_WARNING) lines_.emplace_back(message, length);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_;
};

// A state loaded for "fp4:ef=1" does nothing for a job that runs "fp4:chunk=64,ef=1" (other
// scales, another arithmetic): the tensors start afresh, and a warning per tensor says so,
// once; the same spec, spelled otherwise, takes the state and warns of nothing.
TEST(LoadedStateTest, AStateLoadedForAnotherSpecIsNamedInAWarning) {
  const std::string saved = StateAfter("fp4:ef=1", 2);
  for (const char* spec : {"fp4:chunk=64,ef=1", "fp4:chunk=128,ef=1"}) {
    WarningLog log;
    ThreadWorld(1).Run([&](int, transport::Communicator& comm) {
      CompressionStage stage(StageOptions{});
      ASSERT_TRUE(stage.LoadState(saved, 0, 1).ok());
      RunSteps(stage, comm, spec, 3, 4, nullptr);
    });
    std::vector<std::string> about;
    for (const std::string& line : log.lines()) {
      if (absl::StrContains(line, "was loaded for")) about.push_back(line);
    }
    if (std::string(spec) == "fp4:chunk=128,ef=1") {
      EXPECT_TRUE(about.empty()) << about.front();
      continue;
    }
    ASSERT_EQ(about.size(), 2u) << "one per tensor, once";
    EXPECT_EQ(about[0], "tensor 'w': its compression state was loaded for 'fp4:ef=1', but it "
                        "now runs under 'fp4:chunk=64,ef=1', which starts from a fresh state "
                        "(the loaded one stays unused)");
  }
}

// ---- The state on the tensors' device (Note [Compression state on the device]) ----------

struct DeviceCase {
  const char* spec;
  int64_t state_floats;  // what the method keeps of "w" and "b" after a step
  int64_t shared_floats = 0;  // what of it a checkpoint's digest reads too (Q)
};
void PrintTo(const DeviceCase& c, std::ostream* os) { *os << c.spec; }

// EF methods keep a residual of each tensor (432 + 50 floats); PowerSGD keeps "w"'s Q
// (18 x 2) and residual (24 x 18), and nothing of the vector "b", which it sends as it is;
// a checkpoint reads Q twice: for the state and for the digest of what the ranks share.
class DeviceStateTest : public ::testing::TestWithParam<DeviceCase> {};

// The same steps with the tensors on a host-backed device that reports itself as cuda:r
// give the host's bits and the host's checkpoint; the state is allocated on the device,
// a checkpoint copies exactly the state's bytes from it, and a loaded checkpoint is copied
// onto the device at its first step, which continues as the unbroken job does.
TEST_P(DeviceStateTest, StateLivesOnTheTensorsDeviceAndCheckpointsCopyIt) {
  const std::string spec = GetParam().spec;
  const int64_t state_bytes = GetParam().state_floats * 4;
  const int64_t saved_bytes = state_bytes + GetParam().shared_floats * 4;
  std::vector<std::string> host_saved(2), device_saved(2);
  std::vector<std::vector<std::vector<uint32_t>>> host_bits(2), device_bits(2), resumed(2);
  ThreadWorld(2).Run([&](int r, transport::Communicator& comm) {
    CompressionStage stage(StageOptions{});
    RunSteps(stage, comm, spec, 1, 4, &host_bits[r]);
    host_saved[r] = stage.SaveState(r, 2).value();
    RunSteps(stage, comm, spec, 5, 5, &host_bits[r]);
  });
  ThreadWorld(2).Run([&](int r, transport::Communicator& comm) {
    braid::testing::TestDevice gpu({DeviceType::kCUDA, r});
    CompressionStage stage(StageOptions{});
    RunSteps(stage, comm, spec, 1, 4, &device_bits[r], -1, &gpu);
    EXPECT_GT(gpu.allocations, 0) << spec << ": the state is allocated on the device";
    const int64_t before = gpu.copied_bytes;
    device_saved[r] = stage.SaveState(r, 2).value();
    EXPECT_EQ(gpu.copied_bytes - before, saved_bytes) << spec << ": the checkpoint's copies";
  });
  ThreadWorld(2).Run([&](int r, transport::Communicator& comm) {
    braid::testing::TestDevice gpu({DeviceType::kCUDA, r});
    CompressionStage stage(StageOptions{});
    ASSERT_TRUE(stage.LoadState(device_saved[r], r, 2).ok());
    RunSteps(stage, comm, spec, 5, 5, &resumed[r], -1, &gpu);
    EXPECT_EQ(gpu.copied_bytes, state_bytes) << spec << ": the loaded state, onto the device";
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(host_bits[r].size(), 5u);
    ASSERT_EQ(device_bits[r].size(), 4u);
    for (int step = 0; step < 4; ++step) {
      EXPECT_EQ(device_bits[r][step], host_bits[r][step]) << spec << ": step " << step + 1;
    }
    EXPECT_EQ(device_saved[r], host_saved[r]) << spec << ": rank " << r << "'s checkpoint";
    ASSERT_EQ(resumed[r].size(), 1u);
    EXPECT_EQ(resumed[r][0], host_bits[r][4]) << spec << ": step 5 after the resume";
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryStatefulMethod, DeviceStateTest,
    ::testing::Values(DeviceCase{"fp4:ef=1", 482}, DeviceCase{"int4:beta=0.5,ef=1", 482},
                      DeviceCase{"scalecomp:ratio=8", 482},
                      DeviceCase{"scalecomp:beta=0.5,granularity=tensor,ratio=8", 482},
                      DeviceCase{"topk:ratio=8", 482}, DeviceCase{"randomk:ratio=8", 482},
                      DeviceCase{"powersgd:rank=2", 18 * 2 + 24 * 18, 18 * 2}),
    [](const ::testing::TestParamInfo<DeviceCase>& info) {
      std::string name = info.param.spec;  // test names take letters, digits and '_' only
      for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

// A device whose memory the host cannot read (a real GPU's) never reaches the compressors,
// whose arithmetic is host code: FailedPrecondition naming the device, nothing allocated.
TEST(DeviceStateLimitsTest, ADeviceTheHostCannotReadIsRefused) {
  ThreadWorld(1).Run([&](int, transport::Communicator& comm) {
    braid::testing::TestDevice gpu({DeviceType::kCUDA, 3});
    gpu.readable_from_host = false;
    CompressionStage stage(StageOptions{});
    std::vector<float> w(8, 1.0f);
    const std::vector<int64_t> shape = {8};
    const std::vector<TensorView> views = {{"w", shape, w.data(), w.size()}};
    const absl::Status s = ReduceOn(stage, comm, "fp4:ef=1", views, &gpu);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(), "compression 'fp4:ef=1': the bucket is in cuda:3 memory, which "
                           "braid's compressors cannot read yet");
    EXPECT_EQ(gpu.allocations, 0);
  });
}

// Every method that keeps state fails a bucket whose state its device cannot hold with the
// device's error naming the tensor; the failed step counts for nothing (no step counter
// moved, no state kept), so the next one, with memory again, runs as a fresh job's first.
TEST(DeviceStateLimitsTest, AStateTheDeviceCannotHoldFailsNamingTheTensor) {
  for (const char* spec : {"fp4:ef=1", "scalecomp:ratio=8", "topk:ratio=8", "randomk:ratio=8",
                           "powersgd:rank=2"}) {
    ThreadWorld(1).Run([&](int, transport::Communicator& comm) {
      braid::testing::TestDevice gpu({DeviceType::kCUDA, 0});
      gpu.fail_allocations = true;
      CompressionStage stage(StageOptions{});
      std::vector<float> w = Grad(0, 0, 1, 432), b = Grad(0, 1, 1, 50);
      const std::vector<TensorView> views = {{"w", kShapeW, w.data(), w.size()},
                                             {"b", kShapeB, b.data(), b.size()}};
      const absl::Status s = ReduceOn(stage, comm, spec, views, &gpu);
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << spec << ": " << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "tensor 'w'")) << spec << ": " << s;
      gpu.fail_allocations = false;
      std::vector<std::vector<uint32_t>> after, fresh;
      RunSteps(stage, comm, spec, 1, 1, &after, -1, &gpu);
      CompressionStage other(StageOptions{});
      RunSteps(other, comm, spec, 1, 1, &fresh, -1, &gpu);
      EXPECT_EQ(after, fresh) << spec << ": the failed step left no trace";
    });
  }
}

// ---- Malformed states: refused by their declared sizes, naming the field ---------------

// Builds states byte by byte, as the format in stage.h says.
struct Bytes {
  std::string s;
  Bytes& U32(uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); return *this; }
  Bytes& U64(uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Bytes& Str(const std::string& v) { U64(v.size()); s += v; return *this; }
  // "BRDCMPST", version 2, rank 0 of 1, `digest`.
  static Bytes Header(uint64_t digest = 0) {
    Bytes b;
    b.s = "BRDCMPST";
    b.U32(2).U32(0).U32(1).U64(digest);
    return b;
  }
};

// The status of ParseState and the largest allocation it made.
std::pair<absl::Status, size_t> ParseTracked(const std::string& state) {
  CompressionStage stage(StageOptions{});
  g_largest = 0;
  g_track = true;
  absl::Status s = stage.ParseState(state).status();
  g_track = false;
  return {s, g_largest.load()};
}

TEST(StateLimitsTest, CraftedCountsAreRefusedBeforeAnyAllocation) {
  struct Case {
    std::string what, state, message;
  };
  // The error-feedback state of fp4:ef=1 declaring 10^7 tensors in 12 bytes.
  std::string ef = "EFBK";
  ef.append("\x01\0\0\0", 4).append("\x80\x96\x98\0", 4);
  const std::vector<Case> cases = {
      {"methods", Bytes::Header().U32(0xffffffffu).s,
       "compression state: method count 4294967295 declared, but the 0 bytes left hold at "
       "most 0 (at byte 32)"},
      {"tensors", Bytes::Header().U32(1).Str("fp4:ef=1").U32(10000000).s,
       "compression state: tensor count of 'fp4:ef=1' 10000000 declared, but the 0 bytes left "
       "hold at most 0 (at byte 52)"},
      {"dimensions", Bytes::Header().U32(1).Str("fp4").U32(1).Str("w").U64(3).U32(200000000).s,
       "compression state: tensor 'w' of 'fp4': dimension count 200000000 declared, but the 0 "
       "bytes left hold at most 0 (at byte 68)"},
      {"a name", Bytes::Header().U32(1).Str("fp4").U32(1).U64(1u << 30).U64(0).U64(0).U64(0).s,
       "compression state: tensor name in 'fp4' of 1073741824 bytes past the end (24 left) (at "
       "byte 55)"},
      {"residuals", Bytes::Header().U32(1).Str("fp4:ef=1").U32(0).Str(ef).s,
       "compression 'fp4:ef=1': error-feedback state: tensor count 10000000 declared, but the "
       "0 bytes left hold at most 0 (at byte 12)"},
      {"a residual", Bytes::Header().U32(1).Str("topk").U32(0).Str(
           std::string("EFBK\x01\0\0\0\x01\0\0\0", 12) + std::string("\x01\0\0\0\0\0\0\0w", 9) +
           std::string("\0\0\0\x40\0\0\0\0", 8)).s,
       "compression 'topk': error-feedback state: tensor 'w': residual of 1073741824 float32 "
       "values past the end (0 bytes left) (at byte 29)"},
  };
  for (const Case& c : cases) {
    auto [status, largest] = ParseTracked(c.state);
    EXPECT_EQ(status, absl::InvalidArgumentError(c.message)) << c.what;
    EXPECT_LT(largest, size_t{1} << 16) << c.what << ": allocated " << largest << " bytes";
  }
}

// A state saved by a rank its world does not have (rank -1, rank 2 of 2, a world of 0) was
// saved by no rank: refused, rather than compared as one (the ranks' check of who saved
// what, CheckLoadAgreement, would take it for a rank of the job).
TEST(StateLimitsTest, ASavedRankOutsideItsWorldIsRefused) {
  CompressionStage stage(StageOptions{});
  struct Case {
    uint32_t rank, size;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {0xffffffffu, 2, "saved by rank -1 of a world of 2, which has no such rank"},
           {2, 2, "saved by rank 2 of a world of 2, which has no such rank"},
           {0, 0, "saved by rank 0 of a world of 0, which has no such rank"}}) {
    Bytes b;
    b.s = "BRDCMPST";
    b.U32(2).U32(c.rank).U32(c.size).U64(0).U32(0);
    EXPECT_EQ(stage.ParseState(b.s).status(),
              absl::InvalidArgumentError(absl::StrCat("compression state: ", c.message,
                                                      " (at byte 20)")));
  }
}

// A state whose step counter was changed after it was written fails its digest.
TEST(StateLimitsTest, AlteredStateFailsItsDigest) {
  std::string state = StateAfter("fp4:ef=1", 3);
  CompressionStage stage(StageOptions{});
  ASSERT_TRUE(stage.ParseState(state).ok());
  // The first tensor ("b") follows the spec: magic, version, rank, size, digest, count (32
  // bytes), spec (8 + 8), tensor count (4), name (8 + 1): its step counter is at byte 61.
  ASSERT_EQ(state[61], 3);
  state[61] = 2;
  absl::Status s = stage.ParseState(state).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("compression state: its digest does not match its "
                                          "contents (saved "),
            std::string::npos)
      << s;
  // Non-finite residuals are refused too (Update never keeps one).
  std::string bad = Bytes::Header().U32(1).Str("fp4:ef=1").U32(0).Str(
      std::string("EFBK\x01\0\0\0\x01\0\0\0", 12) + std::string("\x01\0\0\0\0\0\0\0w", 9) +
      std::string("\x01\0\0\0\0\0\0\0\0\0\xc0\x7f", 12)).s;
  EXPECT_EQ(stage.ParseState(bad).status().message(),
            "compression 'fp4:ef=1': error-feedback state: tensor 'w': non-finite residual "
            "values (at byte 33)");
  // A valid empty state of a world of one, in a world of two.
  EXPECT_EQ(std::string(stage.LoadState(Bytes::Header(SummaryDigest({})).U32(0).s, 0, 2).message()),
            "compression state: saved by a job of 1 rank, but this job has 2 (a state does not "
            "carry over to another world size)");
}

// ---- Agreement across ranks ---------------------------------------------------------------

// Rank r's report after running `steps[r]` steps of `spec` on rank r's inputs alone (a
// world of one), reported as saved by rank r of 2.
std::vector<LoadReport> Reports(const std::string& spec, const std::vector<int>& steps) {
  std::vector<LoadReport> reports(steps.size());
  for (size_t r = 0; r < steps.size(); ++r) {
    ThreadWorld(1).Run([&](int, transport::Communicator& comm) {
      CompressionStage stage(StageOptions{});
      RunSteps(stage, comm, spec, 1, steps[r], nullptr, static_cast<int>(r));
      // A world of 2 has no rank 2: saved as rank r % 2, reported as rank r.
      auto parsed = CompressionStage(StageOptions{}).ParseState(
          stage.SaveState(static_cast<int>(r % 2), 2).value());
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      reports[r].saved_rank = static_cast<int>(r);
      reports[r].saved_world_size = (*parsed)->saved_world_size;
      reports[r].summary = CompressionStage(StageOptions{}).Summarize(parsed->get());
    });
  }
  return reports;
}

constexpr char kNone[] = "; no rank loaded its state (every rank keeps the one it had)";

TEST(AgreementTest, SameStatesAgree) {
  EXPECT_TRUE(CheckLoadAgreement(Reports("fp4:ef=1", {3, 3}), 2).ok());
}

TEST(AgreementTest, StatesOfDifferentStepsNameTheCounters) {
  EXPECT_EQ(CheckLoadAgreement(Reports("scalecomp:ratio=8", {3, 4}), 2),
            absl::InvalidArgumentError(absl::StrCat(
                "load_compression_state: the ranks restored compression states that disagree: "
                "tensor 'b' (scalecomp:ratio=8): step counter 3 on rank 0, 4 on rank 1 (states "
                "taken at different steps); tensor 'w' (scalecomp:ratio=8): step counter 3 on "
                "rank 0, 4 on rank 1 (states taken at different steps)",
                kNone)));
}

TEST(AgreementTest, PowerSgdFactorsThatDifferAreNamed) {
  // The same step counts, but each rank's Q came from its own data alone.
  std::vector<LoadReport> reports = Reports("powersgd:rank=2", {2, 2});
  reports[1].summary = Reports("powersgd:rank=2", {2, 2})[0].summary;
  ASSERT_TRUE(CheckLoadAgreement(reports, 2).ok()) << "rank 0's own data on both: equal";
  reports = Reports("powersgd:rank=2", {2, 2});
  EXPECT_EQ(CheckLoadAgreement(reports, 2),
            absl::InvalidArgumentError(absl::StrCat(
                "load_compression_state: the ranks restored compression states that disagree: "
                "tensor 'w' (powersgd:rank=2): Q differs: value A on rank 0, value B on rank 1",
                kNone)));
}

TEST(AgreementTest, ModelsWorldSizesRanksAndRefusals) {
  std::vector<LoadReport> reports = Reports("topk:ratio=8", {2, 2});
  reports[1].summary.pop_back();  // "w": rank 1's model has no such tensor
  reports[1].summary[0].shape = {5, 10};
  reports[1].summary[0].fields[0].value = 7;
  EXPECT_EQ(CheckLoadAgreement(reports, 2),
            absl::InvalidArgumentError(absl::StrCat(
                "load_compression_state: the ranks restored compression states that disagree: "
                "tensor 'b' (topk:ratio=8): shape [50] on rank 0, [5, 10] on rank 1; tensor 'b' "
                "(topk:ratio=8): residual length 50 on rank 0, 7 on rank 1; tensor 'w' "
                "(topk:ratio=8): held on rank 0, missing on rank 1 (states of different "
                "models, or taken before and after its first step)",
                kNone)));

  reports = Reports("topk:ratio=8", {2, 2, 2});
  reports[1].saved_world_size = 4;
  EXPECT_EQ(CheckLoadAgreement(reports, 3),
            absl::InvalidArgumentError(absl::StrCat(
                "load_compression_state: the states were saved by a job of 2 ranks on ranks 0, "
                "2, 4 ranks on rank 1, but this job has 3 (a state does not carry over to "
                "another world size)",
                kNone)));
  for (LoadReport& r : reports) r.saved_world_size = 3;
  reports[2].saved_rank = 0;  // Reports gave ranks 0, 1, 2: now 0, 1, 0
  EXPECT_EQ(CheckLoadAgreement(reports, 3),
            absl::InvalidArgumentError(absl::StrCat(
                "load_compression_state: ranks 0, 2 all restored the state saved by rank 0 "
                "(each rank restores its own: error-feedback residuals are per rank)",
                kNone)));

  reports[1].refused = absl::FailedPreconditionError("in flight");
  reports[2].refused = absl::InvalidArgumentError("truncated");
  EXPECT_EQ(CheckLoadAgreement(reports, 3),
            absl::FailedPreconditionError(absl::StrCat(
                "load_compression_state: rank 1: in flight; rank 2: truncated", kNone)));
}

TEST(AgreementTest, LongListsAreCut) {
  std::vector<LoadReport> reports = Reports("randomk:ratio=8", {1, 1});
  for (int t = 0; t < 10; ++t) {
    TensorSummary extra;
    extra.method = "randomk:ratio=8";
    extra.tensor = absl::StrCat("x", t);
    reports[0].summary.push_back(extra);
  }
  const std::string message(CheckLoadAgreement(reports, 2).message());
  EXPECT_NE(message.find("tensor 'x5' (randomk:ratio=8): held on rank 0, missing on rank 1 "
                         "(states of different models, or taken before and after its first "
                         "step); and 4 more; no rank"),
            std::string::npos)
      << message;
}

TEST(AgreementTest, ReportsTravelIntactAndCraftedOnesAreRefused) {
  std::vector<LoadReport> reports = Reports("powersgd:rank=2", {2, 3});
  reports[0].refused = absl::InvalidArgumentError("why");
  for (const LoadReport& r : reports) {
    auto back = DecodeLoadReport(EncodeLoadReport(r));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->refused, r.refused);
    EXPECT_EQ(back->saved_rank, r.saved_rank);
    EXPECT_EQ(SummaryDigest(back->summary), SummaryDigest(r.summary));
  }
  // Version, OK, "", rank 0, size 1, then 2^31 tensors in no bytes.
  std::string crafted(16, '\0');
  crafted[0] = 1;
  crafted.append(std::string("\0\0\0\0\x01\0\0\0\0\0\0\x80", 12));
  g_largest = 0;
  g_track = true;
  absl::Status s = DecodeLoadReport(crafted).status();
  g_track = false;
  EXPECT_EQ(s, absl::InvalidArgumentError(
                   "compression state report: tensor count 2147483648 declared, but the 0 bytes "
                   "left hold at most 0 (at byte 28)"));
  EXPECT_LT(g_largest.load(), size_t{1} << 16);
}

}  // namespace
}  // namespace braid::compression
