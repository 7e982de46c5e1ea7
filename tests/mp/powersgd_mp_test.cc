// Multi-process tests of PowerSGD through braid::Runtime: a real coordinator process, 2 and 4
// real rank processes, real UCX. Every rank derives every rank's input from seeds, so exact
// averages are computed here independently.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/runtime_job.h"

namespace braid {
namespace {

using braid::testing::Checker;
using braid::testing::RunJob;
using braid::testing::WaitFor;

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool compressed;  // under powersgd:rank=2 (rows·cols > (rows+cols)·2·2)
  int64_t rows, cols;
};

// A layer's weight, a conv kernel (32 × 144), biases, and a 4 × 4 matrix too small to compress.
const std::vector<Tensor>& Tensors() {
  static const auto* t = new std::vector<Tensor>{
      {"fc.weight", {64, 48}, true, 64, 48},
      {"conv.weight", {32, 16, 3, 3}, true, 32, 144},
      {"fc.bias", {64}, false, 0, 0},
      {"tiny.weight", {4, 4}, false, 0, 0},
      {"conv.bias", {32}, false, 0, 0},
  };
  return *t;
}

int64_t Count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Rank r's gradient of tensor t at `step`: small integers times 1/8, so any sum over up to 4
// ranks and its division by 2 or 4 are exact in float32.
std::vector<float> Input(int rank, size_t t, int step, int64_t n) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (i * 7 + static_cast<int64_t>(t) * 13 + step * 5 + rank * 11) % 17 - 8;
    x[i] = static_cast<float>(k) / 8.0f;
  }
  return x;
}

// Reduces one step of every tensor (all enqueued before waiting, so they share buckets).
// Returns each tensor's status.
// `poison_rank` puts an infinity into every tensor of its own.
std::vector<absl::Status> Step(Runtime& rt, int rank, int step,
                               std::vector<std::vector<float>>* out, int poison_rank = -1) {
  std::vector<std::vector<float>> in(Tensors().size());
  std::vector<absl::StatusOr<std::shared_ptr<Handle>>> handles;
  out->assign(Tensors().size(), {});
  for (size_t t = 0; t < Tensors().size(); ++t) {
    const Tensor& T = Tensors()[t];
    in[t] = Input(rank, t, step, Count(T.shape));
    if (rank == poison_rank) in[t][5] = std::numeric_limits<float>::infinity();
    (*out)[t].assign(in[t].size(), -1.0f);
    CollectiveRequest r;
    r.name = T.name;
    r.dtype = DataType::kFloat32;
    r.shape = T.shape;
    r.input = in[t].data();
    r.output = (*out)[t].data();
    r.op = ReduceOp::kAverage;
    r.compression = "powersgd:rank=2";
    handles.push_back(rt.Enqueue(r));
  }
  std::vector<absl::Status> s;
  for (auto& h : handles) s.push_back(WaitFor(h));
  return s;
}

// Every rank holds exactly `mine` (checked by all-gathering its bytes uncompressed).
void ExpectIdentical(Runtime& rt, Checker& c, const std::string& name,
                     const std::vector<float>& mine) {
  const int size = *rt.size();
  const size_t bytes = mine.size() * sizeof(float);
  std::vector<uint8_t> all(bytes * size);
  CollectiveRequest r;
  r.name = name + "/identical";
  r.collective = Collective::kAllGather;
  r.dtype = DataType::kUInt8;
  r.shape = {static_cast<int64_t>(bytes)};
  r.input = mine.data();
  r.output = all.data();
  r.output_capacity_bytes = all.size();
  if (!c.Ok(WaitFor(rt.Enqueue(r)), name + " all-gather")) return;
  for (int p = 0; p < size; ++p) {
    c.Expect(std::memcmp(all.data() + p * bytes, mine.data(), bytes) == 0,
             absl::StrCat(name, ": rank ", p, "'s result differs from rank ", *rt.rank(), "'s"));
  }
}

class PowerSgdWorldTest : public ::testing::TestWithParam<int> {};

// Three steps: compressed tensors bit-identical on every rank and finite, the rest exactly
// averaged, and the payload bytes (rows + cols)·R·4 per compressed matrix plus 4 per
// element of the others, per step.
TEST_P(PowerSgdWorldTest, IdenticalResultsExactAveragesAndPayloadBytes) {
  const int size = GetParam();
  RunJob(size, [size](int rank, Runtime& rt, Checker& c) {
    const int steps = 3;
    for (int step = 0; step < steps; ++step) {
      std::vector<std::vector<float>> out;
      std::vector<absl::Status> s = Step(rt, rank, step, &out);
      for (size_t t = 0; t < Tensors().size(); ++t) {
        const Tensor& T = Tensors()[t];
        const std::string what = absl::StrCat("step ", step, " ", T.name);
        if (!c.Ok(s[t], what)) continue;
        ExpectIdentical(rt, c, what, out[t]);
        if (T.compressed) {
          bool finite = true;
          for (float v : out[t]) finite = finite && std::isfinite(v);
          c.Expect(finite, what + ": non-finite result");
          continue;
        }
        int wrong = 0;
        for (size_t i = 0; i < out[t].size(); ++i) {
          double sum = 0;
          for (int p = 0; p < size; ++p) sum += Input(p, t, step, out[t].size())[i];
          if (out[t][i] != static_cast<float>(sum / size) && ++wrong <= 3) {
            c.Expect(false, absl::StrCat(what, "[", i, "] = ", out[t][i], ", mean ", sum / size));
          }
        }
      }
    }
    auto report = rt.compression_report();
    if (!c.Ok(report.status(), "compression_report")) return;
    std::map<std::string, TensorCompressionStats> by_name;
    for (const auto& t : report->tensors) by_name[t.name] = t;
    uint64_t total = 0;
    for (const Tensor& T : Tensors()) {
      const auto& b = by_name[T.name];
      const uint64_t per_step = T.compressed ? (T.rows + T.cols) * 2 * 4 : 4 * Count(T.shape);
      total += steps * per_step;
      c.Expect(b.method == "powersgd:rank=2", T.name + ": method " + b.method);
      c.Expect(b.bytes.payload_bytes == steps * per_step,
               absl::StrCat(T.name, ": payload ", b.bytes.payload_bytes, " bytes, expected ",
                            steps * per_step));
      c.Expect(b.bytes.uncompressed_bytes == static_cast<uint64_t>(4 * steps * Count(T.shape)),
               absl::StrCat(T.name, ": uncompressed ", b.bytes.uncompressed_bytes));
    }
    bool found = false;
    for (const auto& m : report->methods) {
      if (m.method != "powersgd:rank=2") continue;
      found = true;
      c.Expect(m.tensors == Tensors().size() && m.bytes.payload_bytes == total,
               absl::StrCat("method totals: ", m.tensors, " tensors, payload ",
                            m.bytes.payload_bytes, ", expected ", total));
      c.Expect(m.bytes.transport_bytes > 0 && m.bytes.transport_bytes < m.bytes.reference_transport_bytes / 5,
               absl::StrCat("transport ", m.bytes.transport_bytes, " vs uncompressed reference ",
                            m.bytes.reference_transport_bytes));
    }
    c.Expect(found, "no powersgd:rank=2 totals");
  });
}

// Infinities on the last rank fail every bucket on every rank, naming the tensors and the
// rank (fusion decides which tensors share a bucket, so every tensor gets one); the state is
// untouched, so the next step equals a job that never saw them, and the saved state
// round-trips through the runtime.
TEST_P(PowerSgdWorldTest, NonFiniteGradientFailsEveryRankAndLeavesNoTrace) {
  const int size = GetParam();
  const std::string dir = braid::testing::MakeTempDir("braid_powersgd_nonfinite");
  for (bool faulty : {true, false}) {
    RunJob(size, [&, size](int rank, Runtime& rt, Checker& c) {
      std::vector<std::vector<float>> out;
      for (const absl::Status& s : Step(rt, rank, 0, &out)) c.Ok(s, "step 0");
      if (faulty) {
        auto state = rt.compression_state();
        c.Ok(state.status(), "compression_state");
        std::vector<absl::Status> s = Step(rt, rank, 1, &out, size - 1);
        for (size_t t = 0; t < Tensors().size(); ++t) {
          const std::string& name = Tensors()[t].name;
          c.Expect(s[t].code() == absl::StatusCode::kInvalidArgument &&
                       absl::StrContains(s[t].message(), "'" + name + "'") &&
                       absl::StrContains(s[t].message(), "hold NaN or infinite values (rank(s) " +
                                                             std::to_string(size - 1) + ")"),
                   name + ": " + s[t].ToString());
        }
        c.Expect(state.ok() && *rt.compression_state() == *state, "the failed step changed the state");
        c.Ok(rt.LoadCompressionState(*state), "load_compression_state");
        c.Expect(*rt.compression_state() == *state, "state round trip");
      }
      for (const absl::Status& s : Step(rt, rank, 1, &out)) c.Ok(s, "step 1");
      // Both jobs write their step-1 results; the second compares.
      const std::string path = absl::StrCat(dir, "/rank", rank, faulty ? ".faulty" : ".clean");
      FILE* f = fopen(path.c_str(), "wb");
      for (const auto& v : out) fwrite(v.data(), sizeof(float), v.size(), f);
      fclose(f);
      if (!faulty) {
        FILE* g = fopen(absl::StrCat(dir, "/rank", rank, ".faulty").c_str(), "rb");
        bool same = g != nullptr;
        for (const auto& v : out) {
          std::vector<float> back(v.size());
          same = same && fread(back.data(), sizeof(float), back.size(), g) == back.size() &&
                 std::memcmp(back.data(), v.data(), v.size() * sizeof(float)) == 0;
        }
        if (g) fclose(g);
        c.Expect(same, "step 1 after the failed step differs from a clean job's step 1");
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, PowerSgdWorldTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "ranks");
                         });

}  // namespace
}  // namespace braid
