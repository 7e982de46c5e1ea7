// braid-compress-bench: what gradient compression costs and saves on one host, in one run.
//
//   braid-compress-bench [--parts codec,allreduce] [--methods none,fp4,scalecomp:ratio=100,...]
//       [--codec-bytes 64M] [--chunk 128] -b 64M -e 64M -f 2 -n 10 -w 2 --repeat 5
//       --ranks 2 --tls tcp|sm [--json PATH]
//
// (a) codec: single-thread throughput of the codecs against memcpy, in the parent process
//     before any rank starts. fp4 / int4 run compression/quantize.h directly, one 128-element
//     chunk at a time as the 4-bit Compressor does: ChunkScale + Encode over the whole
//     buffer (quantize), Decode over the whole buffer (dequantize), and both back to back
//     (round trip). fp16 / bf16 run the cast Compressor's own loops through its Reduce on a
//     one-rank communicator whose all-reduce is a no-op, so only the round trip is known;
//     so do the sparsifiers (scalecomp, topk, randomk: memory, top-k, gather, memory update,
//     scatter), one row per spec, checked with sparse_bench.h; with a sparsifier, the top-k
//     selection alone is timed too (k = N/100, each algorithm of compression/topk.h).
//     GB/s counts float32 input bytes (memcpy: bytes copied); memcpy copies a buffer of the
//     same size in the same run. Every element of the round trip is checked against the
//     codec's documented error bound (quantize.h, cast_compressor.cc).
// (b) allreduce: one float32 tensor per size, averaged over `ranks` forked ranks on a UCX
//     Communicator (UCX_TLS from --tls, UCX_NET_DEVICES=lo, set before UCX starts). "none"
//     times Communicator::AllReduce(kAverage) in place; every other method times
//     Compressor::Reduce (compression/registry.h) on one TensorView. Per method and size:
//     the transport bytes this rank sent per call (TransportStats::bytes_sent) and the payload
//     bytes the Compressor reports, then one more call on fresh inputs checked element by
//     element against the exact mean, recomputed here in float64 from every rank's input
//     (each rank can regenerate any rank's input), with the method's error bound
//     (four_bit.h, cast_compressor.cc; a sparsifier's non-zero results against the mean,
//     at most k of them), and a hash showing every rank holds the same bits. The ratio
//     columns: float32 bytes / payload, and none's transport bytes / the method's.
//
// Method (nccl-tests, BENCHMARKS.md): buffers allocated and touched once; per repeat and
// method `warmup` untimed calls, a Barrier, `iters` timed calls; a rank's time is its mean per
// call, the repeat's time is the max over ranks, the table shows the median over repeats (and
// their min and max). Methods run in an order rotated by one each repeat so a burst of
// outside load is spread over all of them. Timed calls run back to back on their own output
// (as nccl-tests' in-place runs): after the first call every rank holds the same values,
// which costs the codecs the same as fresh gradients; only the checked call gets fresh inputs.
//
// Exit code: 0; 1 when any element was outside its bound or ranks disagreed; 2 on an error.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tools/cli.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "compression/compressor.h"
#include "compression/quantize.h"
#include "compression/registry.h"
#include "compression/sparse.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "tools/bench/bench_buffer.h"
#include "tools/bench/bench_math.h"
#include "tools/bench/bench_ranks.h"
#include "tools/bench/sparse_bench.h"
#include "transport/communicator.h"
#include "common/store.h"
#include "transport/ucx_communicator.h"

namespace braid::bench {
namespace {

using Clock = std::chrono::steady_clock;
using compression::FourBitFormat;

constexpr const char* kProg = "braid-compress-bench";

// ---------------------------------------------------------------------------------------
// Configuration and methods.

// kSparse: scalecomp, topk, randomk (sparse_bench.h). kSelect: top-k selection alone (codec).
enum class Kind { kNone, kFp16, kBf16, kFp4, kInt4, kSparse, kSelect, kOther };

struct Method {
  std::string name;  // the --methods entry, e.g. "fp4"
  compression::CompressionSpec spec;
  Kind kind = Kind::kOther;
  size_t chunk = 0;  // fp4 / int4: elements per scale
};

struct Config {
  bool run_codec = true;
  bool run_allreduce = true;
  std::vector<Method> methods;
  uint64_t codec_bytes = uint64_t{64} << 20;
  size_t codec_chunk = 128;
  std::vector<uint64_t> sizes;
  int iters = 10;
  int warmup = 2;
  int repeat = 5;
  int ranks = 2;
  std::string tls = "tcp";
  std::string json_path;
  // Testing the checks (fault injection by a flag): every checked result is multiplied by
  // this before it is checked, so 2 turns a mean into a sum; the run must then report wrong
  // results. 1: off.
  double corrupt = 1;
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration deadline = absl::Minutes(20);
  transport::UcxOptions ucx_base;
};

Kind KindOf(const std::string& method) {
  if (method == "none") return Kind::kNone;
  if (method == "fp16") return Kind::kFp16;
  if (method == "bf16") return Kind::kBf16;
  if (method == "fp4") return Kind::kFp4;
  if (method == "int4") return Kind::kInt4;
  if (IsSparseMethod(method)) return Kind::kSparse;
  return Kind::kOther;
}

absl::StatusOr<Method> ParseMethod(const std::string& text) {
  BRAID_ASSIGN_OR_RETURN(compression::CompressionSpec spec,
                         compression::ParseCompressionSpec(text));
  Method m;
  m.name = text;
  m.kind = KindOf(spec.method);
  if (m.kind == Kind::kFp4 || m.kind == Kind::kInt4) {
    m.chunk = static_cast<size_t>(spec.IntOption("chunk"));
  }
  m.spec = std::move(spec);
  return m;
}


template <typename F>
double SecondsOf(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------
// Inputs and error bounds (independent of compression/: own hash, own scale rules).

// splitmix64's finaliser.
inline uint64_t Hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Gradient-like input of element i on `rank`: a triangular variate on (-1, 1) times a
// magnitude 2^-k that changes every 4096 elements (k = 0..12, the same on every rank, as a
// layer's gradients share a scale), so the per-chunk scales matter.
constexpr size_t kMagnitudeBlock = 4096;
inline float InputValue(int rank, size_t i) {
  static const float kMagnitude[13] = {1.0f,        0.5f,        0.25f,       0.125f,
                                       0.0625f,     0.03125f,    0.015625f,   0.0078125f,
                                       0.00390625f, 0.001953125f, 0.0009765625f, 0.00048828125f,
                                       0.000244140625f};
  const uint64_t h = Hash64((static_cast<uint64_t>(rank) << 48) ^ i);
  const float u1 = static_cast<float>(h >> 40) * 0x1p-24f;
  const float u2 = static_cast<float>((h >> 16) & 0xffffffu) * 0x1p-24f;
  return (u1 + u2 - 1.0f) * kMagnitude[(i / kMagnitudeBlock) % 13];
}

void FillInput(float* x, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) x[i] = InputValue(rank, i);
}

// Smallest power of two >= v (v >= 0; 0 for 0): the fp4 GradScale rule of quantize.h.
double Pow2Ceil(double v) {
  if (v <= 0) return 0;
  int e = 0;
  const double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? v : std::ldexp(1.0, e);
}

// Relative slack for float32 rounding in scales and sums the bounds below ignore.
constexpr double kSlack = 1 + 1e-5;

// One quantization of x (|x| in a chunk whose largest magnitude is `max_abs`): the largest
// error quantize.h allows. fp4: (3/4)·s, s = 2^ceil(log2 max); int4: s = max / 7.
double FourBitStepBound(Kind kind, double max_abs) {
  return kind == Kind::kFp4 ? 0.75 * Pow2Ceil(max_abs) : max_abs / 7.0;
}

// Largest error of one round trip through the codec of `kind` for an element x in a chunk of
// largest magnitude `chunk_max` (fp16: unit roundoff 2^-11 plus its underflow of 2^-25;
// bf16: 2^-8).
double CodecBound(Kind kind, double x, double chunk_max) {
  switch (kind) {
    case Kind::kFp4:
    case Kind::kInt4: return FourBitStepBound(kind, chunk_max) * kSlack;
    case Kind::kFp16: return std::ldexp(std::fabs(x), -11) + 0x1p-25;
    case Kind::kBf16: return std::ldexp(std::fabs(x), -8);
    default: return std::numeric_limits<double>::infinity();
  }
}

// What the check of one all-reduce found on one rank.
struct ReduceCheck {
  double max_err = 0;           // max |result - exact mean|
  double max_err_over_bound = 0;
  int64_t out_of_bound = 0;
  uint32_t hash = 2166136261u;  // FNV-1a over the result's words
  // Gain: the least-squares slope of result on mean, 1 + Σ(result - mean)·mean / Σ mean².
  // fp4 / int4 round stochastically and without bias, so Σ(result - mean)·mean is a sum of
  // zero-mean terms each within ±bound·|mean|: by Azuma-Hoeffding it exceeds
  // 8·sqrt(Σ (bound·mean)²) with probability below 1e-13. `biased` says it did, which catches
  // a result off by a constant factor (a sum returned for a mean) that the element-wise
  // bounds of 4-bit codes are too loose to see once enough elements are averaged.
  double gain = 1;
  bool biased = false;
};

// Checks result[0..count) (the average over `ranks` ranks of InputValue) element by element.
// Bounds for the mean of x_0..x_{n-1}:
//   none:       float32 sum and division: (n+1)·2^-24·(1/n)·Σ|x_r|
//   fp16/bf16:  (n+1)·u·(1/n)·Σ|x_r| (+ (n+1)·2^-25 fp16 underflow)   (cast_compressor.cc)
//   fp4:        (1/n)·Σ_r (3/4)·s_r + (3/4)·s_out                      (four_bit.h)
//   int4:       (1/n)·Σ_r s_r + s_out
//   scalecomp, randomk: 0 where not selected, else as none; at most k elements non-zero
//   topk:       0, or a sum over the ranks that selected the element: within 2·(1/n)·Σ|x_r|;
//               at most n·k elements non-zero
// with s_r the scale of the element's chunk on rank r and s_out that of the reduced chunk,
// bounded here by the scale of (max|mean| + the first term), since every reduced element is
// within the first term of the mean.
ReduceCheck CheckReduced(const Method& m, const float* result, size_t count, int ranks) {
  ReduceCheck c;
  const double n = ranks;
  const size_t block = m.chunk > 0 ? m.chunk : 4096;
  std::vector<double> x(static_cast<size_t>(ranks) * block);
  std::vector<double> mean(block), abs_sum(block);
  double err_dot_mean = 0, mean_sq = 0, bound_mean_sq = 0;
  size_t nonzero = 0;
  for (size_t begin = 0; begin < count; begin += block) {
    const size_t len = std::min(block, count - begin);
    double first_term = 0, mean_max = 0;
    for (size_t j = 0; j < len; ++j) mean[j] = abs_sum[j] = 0;
    for (int r = 0; r < ranks; ++r) {
      double rank_max = 0;
      for (size_t j = 0; j < len; ++j) {
        const double v = InputValue(r, begin + j);
        mean[j] += v;
        abs_sum[j] += std::fabs(v);
        rank_max = std::max(rank_max, std::fabs(v));
      }
      if (m.kind == Kind::kFp4 || m.kind == Kind::kInt4) {
        first_term += FourBitStepBound(m.kind, rank_max) / n;
      }
    }
    for (size_t j = 0; j < len; ++j) {
      mean[j] /= n;
      mean_max = std::max(mean_max, std::fabs(mean[j]));
    }
    const double four_bit_bound =
        (first_term + FourBitStepBound(m.kind, (mean_max + first_term) * kSlack)) * kSlack;
    for (size_t j = 0; j < len; ++j) {
      const float got = result[begin + j];
      const double mean_abs = abs_sum[j] / n;
      double bound;
      switch (m.kind) {
        case Kind::kNone: bound = (n + 1) * 0x1p-24 * mean_abs; break;
        case Kind::kFp16: bound = ((n + 1) * 0x1p-11 * mean_abs + (n + 1) * 0x1p-25) * kSlack; break;
        case Kind::kBf16: bound = (n + 1) * 0x1p-8 * mean_abs * kSlack; break;
        case Kind::kFp4:
        case Kind::kInt4: bound = four_bit_bound; break;
        case Kind::kSparse:  // 0 (not selected), or the mean as a float32 all-reduce gives it;
          // topk: the sum over the ranks that selected the element, divided by n
          bound = got == 0.0f               ? std::numeric_limits<double>::infinity()
                  : m.spec.method == "topk" ? 2 * mean_abs * kSlack
                                            : (n + 1) * 0x1p-24 * mean_abs;
          nonzero += got != 0.0f ? 1 : 0;
          break;
        default: bound = std::numeric_limits<double>::infinity();
      }
      const double signed_err = static_cast<double>(got) - mean[j];
      const double err = std::fabs(signed_err);
      err_dot_mean += signed_err * mean[j];
      mean_sq += mean[j] * mean[j];
      bound_mean_sq += bound * bound * mean[j] * mean[j];
      // NaN compares false: count it explicitly.
      if (!(err <= bound)) ++c.out_of_bound;
      if (std::isnan(err)) {
        c.max_err = std::numeric_limits<double>::infinity();
      } else {
        c.max_err = std::max(c.max_err, err);
        if (bound > 0) c.max_err_over_bound = std::max(c.max_err_over_bound, err / bound);
      }
      uint32_t w;
      std::memcpy(&w, &got, 4);
      c.hash = (c.hash ^ w) * 16777619u;
    }
  }
  if (m.kind == Kind::kSparse) {  // no more elements than the method selects
    const size_t limit = SparseLimit(m.spec, count, ranks);
    if (nonzero > limit) c.out_of_bound += static_cast<int64_t>(nonzero - limit);
  }
  if (mean_sq > 0) c.gain = 1 + err_dot_mean / mean_sq;
  const bool unbiased_method = m.kind == Kind::kFp4 || m.kind == Kind::kInt4;
  // NaN in the sums compares false: biased too.
  c.biased = unbiased_method && !(std::fabs(err_dot_mean) <= 8 * std::sqrt(bound_mean_sq));
  return c;
}

// ---------------------------------------------------------------------------------------
// (a) Codec throughput, single thread.

struct CodecRow {
  std::string method;
  std::optional<double> quantize_gbps, dequantize_gbps;  // empty: not separable (fp16/bf16)
  double roundtrip_gbps = 0;
  int64_t out_of_bound = 0;
  double max_err_over_bound = 0;
};

struct CodecResult {
  bool ran = false;
  uint64_t bytes = 0;
  size_t count = 0;
  size_t chunk = 0;
  int repeat = 0;
  double memcpy_gbps = 0;
  std::vector<CodecRow> rows;
};

// A one-rank Communicator whose collectives are copies (or nothing), so that a cast
// Compressor's Reduce is exactly its two conversion loops, and a sparsifier's its selection,
// gather, memory update and scatter. Nothing else is needed by the codecs timed here.
class SelfCommunicator : public transport::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    if (send != recv) std::memcpy(recv, send, count * DataTypeSize(dtype));
    return absl::OkStatus();
  }
  absl::Status ReduceScatter(const void*, void*, absl::Span<const size_t>, DataType,
                             ReduceOp) override {
    return absl::UnimplementedError("SelfCommunicator::ReduceScatter");
  }
  absl::Status AllGather(const void* send, size_t bytes, void* recv,
                         absl::Span<const size_t>) override {
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    return absl::OkStatus();
  }
  absl::Status AllToAll(const void*, absl::Span<const size_t>, void*,
                        absl::Span<const size_t>) override {
    return absl::UnimplementedError("SelfCommunicator::AllToAll");
  }
  absl::Status Broadcast(void*, size_t, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort(absl::Status) override {}
  transport::TransportStats stats() const override { return {}; }
  std::string Describe() const override { return "self"; }
};

// The 4-bit Compressor's step 1 over a whole buffer: chunk c's scale in scales[c], its codes
// at packed + c * PackedBytes(chunk).
void QuantizeBuffer(FourBitFormat f, const float* x, size_t count, size_t chunk, float* scales,
                    uint8_t* packed) {
  const size_t stride = compression::PackedBytes(chunk);
  for (size_t begin = 0, c = 0; begin < count; begin += chunk, ++c) {
    const size_t len = std::min(chunk, count - begin);
    const float s = compression::ChunkScale(f, x + begin, len);
    scales[c] = s;
    compression::Encode(f, x + begin, len, s, /*seed=*/12345u, begin, packed + c * stride);
  }
}

void DequantizeBuffer(FourBitFormat f, const float* scales, const uint8_t* packed, size_t count,
                      size_t chunk, float* out) {
  const size_t stride = compression::PackedBytes(chunk);
  for (size_t begin = 0, c = 0; begin < count; begin += chunk, ++c) {
    const size_t len = std::min(chunk, count - begin);
    compression::Decode(f, packed + c * stride, len, scales[c], out + begin);
  }
}

// Round trip `out` of `in` against CodecBound, per chunk of `chunk` elements.
void CheckRoundTrip(Kind kind, const float* in, const float* out, size_t count, size_t chunk,
                    CodecRow* row) {
  row->out_of_bound = 0;
  row->max_err_over_bound = 0;
  for (size_t begin = 0; begin < count; begin += chunk) {
    const size_t len = std::min(chunk, count - begin);
    double chunk_max = 0;
    for (size_t j = 0; j < len; ++j) chunk_max = std::max<double>(chunk_max, std::fabs(in[begin + j]));
    for (size_t j = 0; j < len; ++j) {
      const double x = in[begin + j];
      const double err = std::fabs(static_cast<double>(out[begin + j]) - x);
      const double bound = CodecBound(kind, x, chunk_max);
      if (!(err <= bound)) ++row->out_of_bound;
      if (bound > 0 && !std::isnan(err)) {
        row->max_err_over_bound = std::max(row->max_err_over_bound, err / bound);
      }
    }
  }
}

absl::StatusOr<CodecResult> RunCodec(const Config& cfg) {
  CodecResult res;
  res.ran = true;
  res.count = std::max<size_t>(1, static_cast<size_t>(cfg.codec_bytes / sizeof(float)));
  res.bytes = res.count * sizeof(float);
  res.chunk = cfg.codec_chunk;
  res.repeat = cfg.repeat;
  const size_t chunks = (res.count + res.chunk - 1) / res.chunk;
  Buffer in(res.bytes), out(res.bytes);
  Buffer scales(chunks * sizeof(float)), packed(chunks * compression::PackedBytes(res.chunk));
  FillInput(in.floats(), res.count, 0);

  auto name_of = [](Kind k) -> std::string {
    switch (k) {
      case Kind::kFp4: return "fp4";
      case Kind::kInt4: return "int4";
      case Kind::kFp16: return "fp16";
      case Kind::kBf16: return "bf16";
      default: return "?";
    }
  };
  // The codecs to time: every non-"none" method, once per kind (the chunk is --chunk here),
  // but every sparsifier spec on its own (the ratio matters); with a sparsifier also top-k
  // selection alone at k = N/100, by each algorithm (compression/topk.h).
  std::vector<Kind> kinds;
  std::vector<std::string> names;
  std::vector<const Method*> sparse;  // kSparse: its method
  for (const Method& m : cfg.methods) {
    if (m.kind == Kind::kNone || m.kind == Kind::kOther) continue;
    if (m.kind != Kind::kSparse && std::find(kinds.begin(), kinds.end(), m.kind) != kinds.end()) {
      continue;
    }
    kinds.push_back(m.kind);
    names.push_back(m.kind == Kind::kSparse ? m.name : name_of(m.kind));
    sparse.push_back(m.kind == Kind::kSparse ? &m : nullptr);
  }
  std::vector<compression::TopKAlgorithm> select_by;
  if (std::find(kinds.begin(), kinds.end(), Kind::kSparse) != kinds.end()) {
    for (auto a : {compression::TopKAlgorithm::kNthElement,
                   compression::TopKAlgorithm::kSampledThreshold}) {
      select_by.resize(kinds.size() + 1);
      select_by.back() = a;
      kinds.push_back(Kind::kSelect);
      names.push_back(a == compression::TopKAlgorithm::kNthElement ? "select:nth_element"
                                                                   : "select:sampled");
      sparse.push_back(nullptr);
    }
  }
  std::vector<std::unique_ptr<compression::Compressor>> cast(kinds.size());
  SelfCommunicator self;
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (kinds[k] == Kind::kFp16 || kinds[k] == Kind::kBf16) {
      BRAID_ASSIGN_OR_RETURN(compression::CompressionSpec spec,
                             compression::ParseCompressionSpec(kinds[k] == Kind::kFp16 ? "fp16"
                                                                                        : "bf16"));
      BRAID_ASSIGN_OR_RETURN(cast[k], compression::CreateCompressor(spec));
    } else if (kinds[k] == Kind::kSparse) {
      BRAID_ASSIGN_OR_RETURN(cast[k], compression::CreateCompressor(sparse[k]->spec));
    }
  }
  compression::TopKSelector selector;
  const size_t select_k = compression::SparseK(res.count, 100);
  std::vector<std::vector<uint64_t>> selected(kinds.size());

  // Timings per kind (index kinds.size() is memcpy), per repeat.
  const size_t nk = kinds.size();
  std::vector<std::vector<double>> q_s(nk), dq_s(nk), rt_s(nk + 1);
  const int64_t tensor_shape[1] = {static_cast<int64_t>(res.count)};
  int64_t steps[1] = {0};
  uint64_t payload[1] = {0};
  auto cast_round_trip = [&](size_t k) -> absl::Status {
    std::memcpy(out.data, in.data, res.bytes);  // Reduce works in place: fresh input, untimed
    compression::TensorView tv{"codec", absl::MakeConstSpan(tensor_shape), out.floats(),
                               res.count};
    compression::StepContext ctx;
    ctx.op = ReduceOp::kSum;
    ctx.steps = absl::MakeConstSpan(steps);
    ctx.payload_bytes = absl::MakeSpan(payload);
    const auto t0 = Clock::now();
    absl::Status s = cast[k]->Reduce(absl::MakeConstSpan(&tv, 1), self, ctx);
    rt_s[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    ++steps[0];
    return s;
  };
  auto measure = [&](size_t k, bool record) -> absl::Status {
    if (k == nk) {
      const double t = SecondsOf([&] { std::memcpy(out.data, in.data, res.bytes); });
      if (record) rt_s[k].push_back(t);
      return absl::OkStatus();
    }
    if (cast[k]) {
      BRAID_RETURN_IF_ERROR(cast_round_trip(k));
      if (!record) rt_s[k].pop_back();
      return absl::OkStatus();
    }
    if (kinds[k] == Kind::kSelect) {
      const double t = TimeSelection(&selector, in.floats(), res.count, select_k, select_by[k],
                                     &selected[k]);
      if (record) rt_s[k].push_back(t);
      return absl::OkStatus();
    }
    const FourBitFormat f = kinds[k] == Kind::kFp4 ? FourBitFormat::kFp4 : FourBitFormat::kInt4;
    auto* sc = reinterpret_cast<float*>(scales.data);
    auto* pk = reinterpret_cast<uint8_t*>(packed.data);
    const double tq = SecondsOf([&] { QuantizeBuffer(f, in.floats(), res.count, res.chunk, sc, pk); });
    const double tdq =
        SecondsOf([&] { DequantizeBuffer(f, sc, pk, res.count, res.chunk, out.floats()); });
    const double trt = SecondsOf([&] {
      QuantizeBuffer(f, in.floats(), res.count, res.chunk, sc, pk);
      DequantizeBuffer(f, sc, pk, res.count, res.chunk, out.floats());
    });
    if (record) {
      q_s[k].push_back(tq);
      dq_s[k].push_back(tdq);
      rt_s[k].push_back(trt);
    }
    return absl::OkStatus();
  };

  // One untimed pass of each (first-touch of the Compressors' scratch, warm code).
  for (size_t k = 0; k <= nk; ++k) BRAID_RETURN_IF_ERROR(measure(k, false));
  for (int r = 0; r < cfg.repeat; ++r) {
    for (size_t i = 0; i <= nk; ++i) {
      BRAID_RETURN_IF_ERROR(measure((i + static_cast<size_t>(r)) % (nk + 1), true));
    }
  }
  volatile char sink = out.data[res.bytes / 2];  // keep the copies observable
  (void)sink;

  auto gbps = [&](const std::vector<double>& secs) {
    return GigabytesPerSecond(res.bytes, Median(secs));
  };
  res.memcpy_gbps = gbps(rt_s[nk]);
  for (size_t k = 0; k < nk; ++k) {
    CodecRow row;
    row.method = names[k];
    row.roundtrip_gbps = gbps(rt_s[k]);
    if (kinds[k] == Kind::kSelect) {  // the two algorithms must pick the same indices
      const std::vector<uint64_t>& first = selected[kinds.size() - 2];
      row.out_of_bound = selected[k] == first ? 0 : 1;
      res.rows.push_back(row);
      continue;
    }
    if (kinds[k] == Kind::kSparse) cast[k]->Reset("codec");  // the check starts from no memory
    if (!cast[k]) {
      row.quantize_gbps = gbps(q_s[k]);
      row.dequantize_gbps = gbps(dq_s[k]);
    }
    // The data check: one more round trip of the pristine input.
    if (cast[k]) {
      BRAID_RETURN_IF_ERROR(cast_round_trip(k));
    } else {
      const FourBitFormat f = kinds[k] == Kind::kFp4 ? FourBitFormat::kFp4 : FourBitFormat::kInt4;
      QuantizeBuffer(f, in.floats(), res.count, res.chunk, reinterpret_cast<float*>(scales.data),
                     reinterpret_cast<uint8_t*>(packed.data));
      DequantizeBuffer(f, reinterpret_cast<float*>(scales.data),
                       reinterpret_cast<uint8_t*>(packed.data), res.count, res.chunk,
                       out.floats());
    }
    if (cfg.corrupt != 1) {
      for (size_t i = 0; i < res.count; ++i) out.floats()[i] *= static_cast<float>(cfg.corrupt);
    }
    if (kinds[k] == Kind::kSparse) {
      size_t chosen = 0;
      row.out_of_bound = CheckSparseRoundTrip(
          in.floats(), out.floats(), res.count, SparseLimit(sparse[k]->spec, res.count, 1),
          sparse[k]->spec.method != "randomk", &chosen);
    } else {
      CheckRoundTrip(kinds[k], in.floats(), out.floats(), res.count, res.chunk, &row);
    }
    res.rows.push_back(row);
  }
  return res;
}

void PrintCodec(std::FILE* o, const CodecResult& c) {
  std::fprintf(o,
               "# codec throughput: one thread, %llu B of float32 (%zu elements), chunk %zu, "
               "median of %d repeats (+1 untimed)\n"
               "# GB/s of float32 input (memcpy: bytes copied); ratio = round trip / memcpy "
               "(goal >= 0.25); fp16/bf16 and the sparsifiers: the Compressor's Reduce on one "
               "rank (sparsifiers: memory, top-k, gather, memory update, scatter); "
               "select:*: top-k selection alone, k = N/100\n"
               "# memcpy (one thread, same size, same run): %.2f GB/s\n",
               static_cast<unsigned long long>(c.bytes), c.count, c.chunk, c.repeat,
               c.memcpy_gbps);
  std::fprintf(o, "#%9s %12s %12s %12s %9s %12s %9s\n", "method", "quant GB/s", "dequant GB/s",
               "q+dq GB/s", "q+dq/cpy", "out_of_bound", "err/bound");
  auto opt = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%12.3f", *v) : absl::StrFormat("%12s", "-");
  };
  std::fprintf(o, "%10s %12s %12s %12.3f %8.3fx %12s %9s\n", "memcpy", "-", "-", c.memcpy_gbps,
               1.0, "-", "-");
  for (const CodecRow& r : c.rows) {
    std::fprintf(o, "%10s %s %s %12.3f %8.3fx %12lld %9.3f\n", r.method.c_str(),
                 opt(r.quantize_gbps).c_str(), opt(r.dequantize_gbps).c_str(), r.roundtrip_gbps,
                 c.memcpy_gbps > 0 ? r.roundtrip_gbps / c.memcpy_gbps : 0.0,
                 static_cast<long long>(r.out_of_bound), r.max_err_over_bound);
  }
  std::fflush(o);
}

// ---------------------------------------------------------------------------------------
// (b) All-reduce, fp4 (and the others) vs none.

struct ReduceRow {
  std::string method;
  std::string spec;
  uint64_t bytes = 0;
  size_t count = 0;
  double time_us = 0;  // median over repeats of (max over ranks of the mean per call)
  double time_us_min = 0, time_us_max = 0;
  double algbw_gbps = 0, busbw_gbps = 0;
  std::optional<double> speedup;  // time of "none" / this time, when "none" ran
  double payload_ratio = 1;       // float32 bytes / payload bytes (sparsifiers: dense / k)
  std::optional<double> wire_ratio;  // none's transport bytes / this method's, when none ran
  double transport_bytes = 0;     // per rank per call, max over ranks
  double payload_bytes = 0;       // per rank per call (the Compressor's count)
  ReduceCheck check;              // max_err / ratio: max over ranks; out_of_bound: total
  bool identical = true;          // every rank's result hashed the same
};

struct Outcome {
  std::string load_at_start;  // /proc/loadavg when the run began: the machine is shared
  CodecResult codec;
  std::string transports;
  std::vector<ReduceRow> rows;
};

nlohmann::json ToJson(const Config& cfg, const Outcome& out, const absl::Status& error) {
  nlohmann::json j;
  j["bench"] = kProg;
  j["cores"] = sysconf(_SC_NPROCESSORS_ONLN);
  j["loadavg_at_start"] = out.load_at_start;
  if (out.codec.ran) {
    const CodecResult& c = out.codec;
    nlohmann::json rows = nlohmann::json::array();
    for (const CodecRow& r : c.rows) {
      nlohmann::json row = {{"method", r.method},
                            {"roundtrip_gbps", r.roundtrip_gbps},
                            {"roundtrip_over_memcpy",
                             c.memcpy_gbps > 0 ? r.roundtrip_gbps / c.memcpy_gbps : 0.0},
                            {"out_of_bound", r.out_of_bound},
                            {"max_err_over_bound", r.max_err_over_bound}};
      row["quantize_gbps"] = r.quantize_gbps ? nlohmann::json(*r.quantize_gbps) : nullptr;
      row["dequantize_gbps"] = r.dequantize_gbps ? nlohmann::json(*r.dequantize_gbps) : nullptr;
      rows.push_back(row);
    }
    j["codec"] = {{"bytes", c.bytes},        {"count", c.count},
                  {"chunk", c.chunk},        {"repeat", c.repeat},
                  {"memcpy_gbps", c.memcpy_gbps}, {"rows", rows}};
  }
  if (cfg.run_allreduce) {
    nlohmann::json rows = nlohmann::json::array();
    for (const ReduceRow& r : out.rows) {
      nlohmann::json row = {{"method", r.method},
                            {"spec", r.spec},
                            {"bytes", r.bytes},
                            {"count", r.count},
                            {"time_us", r.time_us},
                            {"time_us_min", r.time_us_min},
                            {"time_us_max", r.time_us_max},
                            {"algbw_gbps", r.algbw_gbps},
                            {"busbw_gbps", r.busbw_gbps},
                            {"transport_bytes_per_rank", r.transport_bytes},
                            {"payload_bytes_per_rank", r.payload_bytes},
                            {"max_abs_error", r.check.max_err},
                            {"max_err_over_bound", r.check.max_err_over_bound},
                            {"out_of_bound", r.check.out_of_bound},
                            {"gain", r.check.gain},
                            {"biased", r.check.biased},
                            {"identical_across_ranks", r.identical}};
      row["speedup_vs_none"] = r.speedup ? nlohmann::json(*r.speedup) : nullptr;
      row["payload_ratio"] = r.payload_ratio;
      row["wire_ratio_vs_none"] = r.wire_ratio ? nlohmann::json(*r.wire_ratio) : nullptr;
      rows.push_back(row);
    }
    j["allreduce"] = {{"ranks", cfg.ranks},         {"tls", cfg.tls},
                      {"transports", out.transports}, {"dtype", "float32"},
                      {"op", "average"},            {"iters", cfg.iters},
                      {"warmup", cfg.warmup},       {"repeat", cfg.repeat},
                      {"rows", rows}};
  }
  j["error"] = error.ok() ? nlohmann::json(nullptr) : nlohmann::json(error.ToString());
  return j;
}

absl::Status WriteJsonFile(const Config& cfg, const Outcome& out, const absl::Status& error) {
  if (cfg.json_path.empty()) return absl::OkStatus();
  const std::string tmp = cfg.json_path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    f << ToJson(cfg, out, error).dump(2) << "\n";
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, cfg.json_path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

void PrintReduceHeader(std::FILE* o, const Config& cfg, const std::string& transports) {
  std::vector<std::string> specs;
  for (const Method& m : cfg.methods) specs.push_back(m.spec.canonical);
  std::fprintf(o,
               "# all-reduce of one float32 tensor, average, %d ranks, --tls %s; methods: %s\n"
               "# transports: %s\n"
               "# time = mean per call of %d calls after %d warm-up, max over ranks, median "
               "(min, max) of %d repeats; algbw = float32 bytes / time, busbw = algbw * "
               "2(n-1)/n\n"
               "# wire = transport bytes sent per rank per call (TransportStats), payload = "
               "the Compressor's count; err = |result - exact mean| of one call on fresh inputs;\n"
               "# ratio: float32 bytes / payload (sparsifiers: dense size / k); wire x: none's "
               "wire bytes / this method's (indices counted)\n"
               "# err/bound: max over elements (the method's bound); wrong: elements past it; "
               "gain: slope of result on mean (1; '!': biased)\n",
               cfg.ranks, cfg.tls.c_str(), absl::StrJoin(specs, " ").c_str(), transports.c_str(),
               cfg.iters, cfg.warmup, cfg.repeat);
  std::fprintf(o,
               "#%11s %10s %12s %11s %11s %11s %7s %7s %7s %12s %12s %7s %7s %10s %9s %6s %8s "
               "%4s\n",
               "size (B)", "count", "method", "time(us)", "min", "max", "algbw", "busbw",
               "speedup", "wire B", "payload B", "ratio", "wire x", "max|err|", "err/bound",
               "wrong", "gain", "same");
  std::fflush(o);
}

void PrintReduceRow(std::FILE* o, const ReduceRow& r) {
  std::fprintf(o,
               "%12llu %10zu %12s %11.1f %11.1f %11.1f %7.3f %7.3f %7s %12.0f %12.0f %7.1f %7s "
               "%10.3g %9.3f %6lld %7.4f%s %4s\n",
               static_cast<unsigned long long>(r.bytes), r.count, r.method.c_str(), r.time_us,
               r.time_us_min, r.time_us_max, r.algbw_gbps, r.busbw_gbps,
               r.speedup ? absl::StrFormat("%.2fx", *r.speedup).c_str() : "-", r.transport_bytes,
               r.payload_bytes, r.payload_ratio,
               r.wire_ratio ? absl::StrFormat("%.1f", *r.wire_ratio).c_str() : "-", r.check.max_err, r.check.max_err_over_bound,
               static_cast<long long>(r.check.out_of_bound), r.check.gain,
               r.check.biased ? "!" : " ", r.identical ? "yes" : "NO");
  std::fflush(o);
}

// Wrong results of a run: elements out of bound (codec and all-reduce) and disagreeing ranks.
int64_t CountWrong(const Outcome& out) {
  int64_t wrong = 0;
  for (const CodecRow& r : out.codec.rows) wrong += r.out_of_bound;
  for (const ReduceRow& r : out.rows) {
    wrong += r.check.out_of_bound + (r.identical ? 0 : 1) + (r.check.biased ? 1 : 0);
  }
  return wrong;
}

void PrintFooter(std::FILE* o, const Outcome& out, const absl::Status& error) {
  int64_t codec = 0, reduce = 0, differ = 0, biased = 0;
  for (const CodecRow& r : out.codec.rows) codec += r.out_of_bound;
  for (const ReduceRow& r : out.rows) {
    reduce += r.check.out_of_bound;
    differ += r.identical ? 0 : 1;
    biased += r.check.biased ? 1 : 0;
  }
  std::fprintf(o, "# out of bound: %lld (codec %lld, all-reduce %lld); rows with ranks "
               "disagreeing: %lld; biased rows: %lld\n",
               static_cast<long long>(codec + reduce), static_cast<long long>(codec),
               static_cast<long long>(reduce), static_cast<long long>(differ),
               static_cast<long long>(biased));
  if (!error.ok()) std::fprintf(o, "# ERROR: %s\n", error.ToString().c_str());
  std::fflush(o);
}

class MethodRunner {
 public:
  MethodRunner(const Method& m, transport::Communicator* comm) : m_(m), comm_(comm) {}

  absl::Status Init() {
    if (m_.kind == Kind::kNone) return absl::OkStatus();
    BRAID_ASSIGN_OR_RETURN(compressor_, compression::CreateCompressor(m_.spec));
    return absl::OkStatus();
  }

  // One all-reduce (average) of data[0..count) in place.
  absl::Status Call(float* data, size_t count) {
    if (!compressor_) {
      payload_ = count * sizeof(float);
      return comm_->AllReduce(data, data, count, DataType::kFloat32, ReduceOp::kAverage);
    }
    shape_[0] = static_cast<int64_t>(count);
    compression::TensorView tv{"bench", absl::MakeConstSpan(shape_), data, count};
    uint64_t payload[1] = {0};
    compression::StepContext ctx;
    ctx.op = ReduceOp::kAverage;
    ctx.seed = 0;
    ctx.steps = absl::MakeConstSpan(steps_);
    ctx.payload_bytes = absl::MakeSpan(payload);
    absl::Status s = compressor_->Reduce(absl::MakeConstSpan(&tv, 1), *comm_, ctx);
    ++steps_[0];
    payload_ = payload[0];
    return s;
  }

  // Forgets per-tensor state (error-feedback residuals) so the checked call sees raw input.
  void Reset() {
    if (compressor_) compressor_->Reset("bench");
  }
  uint64_t last_payload() const { return payload_; }

 private:
  const Method& m_;
  transport::Communicator* comm_;
  std::unique_ptr<compression::Compressor> compressor_;
  int64_t shape_[1] = {0};
  int64_t steps_[1] = {0};
  uint64_t payload_ = 0;
};

// The run on one rank; rank 0 prints and writes the JSON (also after a failure, with the rows
// it has). Returns 0, 1 (wrong results) or 2 (error).
int RunRank(const Config& cfg, int rank, const std::string& store_dir, Outcome out) {
  int64_t local_wrong = 0;
  bool header = false;
  auto body = [&]() -> absl::Status {
    FileStore store(store_dir);
    transport::UcxOptions opts = cfg.ucx_base;
    opts.rank = rank;
    opts.size = cfg.ranks;
    opts.store = &store;
    opts.store_prefix = "compress-bench";
    opts.timeout = cfg.timeout;
    opts.connect_timeout = cfg.timeout;
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<transport::Communicator> comm,
                           transport::CreateUcxCommunicator(opts));
    out.transports = comm->Describe();
    if (rank == 0) {
      PrintReduceHeader(stdout, cfg, out.transports);
      header = true;
    }
    std::vector<std::unique_ptr<MethodRunner>> runners;
    for (const Method& m : cfg.methods) {
      runners.push_back(std::make_unique<MethodRunner>(m, comm.get()));
      BRAID_RETURN_IF_ERROR(runners.back()->Init());
    }
    size_t max_count = 1;
    for (uint64_t s : cfg.sizes) max_count = std::max<size_t>(max_count, s / sizeof(float));
    Buffer buf(max_count * sizeof(float));
    float* data = buf.floats();
    const size_t nm = cfg.methods.size();

    for (uint64_t size : cfg.sizes) {
      const size_t count = std::max<size_t>(1, size / sizeof(float));
      std::vector<std::vector<double>> times(nm);
      std::vector<double> transport_bytes(nm, 0), payload_bytes(nm, 0);
      for (int rep = 0; rep < cfg.repeat; ++rep) {
        for (size_t i = 0; i < nm; ++i) {
          const size_t k = (i + static_cast<size_t>(rep)) % nm;
          MethodRunner& run = *runners[k];
          FillInput(data, count, rank);
          for (int w = 0; w < cfg.warmup; ++w) BRAID_RETURN_IF_ERROR(run.Call(data, count));
          BRAID_RETURN_IF_ERROR(comm->Barrier());
          const uint64_t sent0 = comm->stats().bytes_sent;
          const auto t0 = Clock::now();
          for (int it = 0; it < cfg.iters; ++it) BRAID_RETURN_IF_ERROR(run.Call(data, count));
          const double us =
              std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / cfg.iters;
          const double sent = static_cast<double>(comm->stats().bytes_sent - sent0) / cfg.iters;
          // Max over ranks (the Barrier's bytes are outside the bracket; this all-reduce's too).
          double agree[2] = {us, sent};
          BRAID_RETURN_IF_ERROR(
              comm->AllReduce(agree, agree, 2, DataType::kFloat64, ReduceOp::kMax));
          times[k].push_back(agree[0]);
          transport_bytes[k] = agree[1];
          payload_bytes[k] = static_cast<double>(run.last_payload());
        }
      }
      // The check: one call per method on fresh inputs.
      std::vector<ReduceRow> rows(nm);
      for (size_t k = 0; k < nm; ++k) {
        MethodRunner& run = *runners[k];
        run.Reset();
        FillInput(data, count, rank);
        BRAID_RETURN_IF_ERROR(run.Call(data, count));
        if (cfg.corrupt != 1) {
          for (size_t i = 0; i < count; ++i) data[i] *= static_cast<float>(cfg.corrupt);
        }
        const ReduceCheck c = CheckReduced(cfg.methods[k], data, count, cfg.ranks);
        double agree_max[4] = {c.max_err, c.max_err_over_bound, static_cast<double>(c.hash),
                               -static_cast<double>(c.hash)};
        double agree_sum[1] = {static_cast<double>(c.out_of_bound)};
        BRAID_RETURN_IF_ERROR(
            comm->AllReduce(agree_max, agree_max, 4, DataType::kFloat64, ReduceOp::kMax));
        BRAID_RETURN_IF_ERROR(
            comm->AllReduce(agree_sum, agree_sum, 1, DataType::kFloat64, ReduceOp::kSum));
        local_wrong += c.out_of_bound;
        ReduceRow& r = rows[k];
        r.method = cfg.methods[k].name;
        r.spec = cfg.methods[k].spec.canonical;
        r.bytes = count * sizeof(float);
        r.count = count;
        r.time_us = Median(times[k]);
        r.time_us_min = *std::min_element(times[k].begin(), times[k].end());
        r.time_us_max = *std::max_element(times[k].begin(), times[k].end());
        r.algbw_gbps = GigabytesPerSecond(r.bytes, r.time_us * 1e-6);
        r.busbw_gbps = r.algbw_gbps * BusBwFactor(Collective::kAllReduce, cfg.ranks);
        r.transport_bytes = transport_bytes[k];
        r.payload_bytes = payload_bytes[k];
        if (r.payload_bytes > 0) r.payload_ratio = static_cast<double>(r.bytes) / r.payload_bytes;
        r.check.max_err = agree_max[0];
        r.check.max_err_over_bound = agree_max[1];
        r.check.out_of_bound = static_cast<int64_t>(agree_sum[0]);
        r.check.hash = c.hash;
        r.identical = agree_max[2] == -agree_max[3];
        r.check.gain = c.gain;
        r.check.biased = c.biased;
        if (!r.identical) ++local_wrong;
        if (c.biased) ++local_wrong;
      }
      for (size_t k = 0; k < nm; ++k) {
        if (cfg.methods[k].kind != Kind::kNone) continue;
        for (ReduceRow& r : rows) {
          if (r.time_us > 0) r.speedup = rows[k].time_us / r.time_us;
        if (r.transport_bytes > 0) r.wire_ratio = rows[k].transport_bytes / r.transport_bytes;
        }
        break;
      }
      for (ReduceRow& r : rows) {
        if (rank == 0) PrintReduceRow(stdout, r);
        out.rows.push_back(r);
      }
      if (rank == 0) {
        // Rewritten after every size, so a run killed later still leaves its rows behind.
        WriteJsonFile(cfg, out, absl::AbortedError("run did not finish (killed or still running)"))
            .IgnoreError();
      }
    }
    // Nobody closes endpoints while a peer still reads the last result.
    return comm->Barrier();
  };
  absl::Status status = body();
  if (!status.ok()) std::fprintf(stderr, "%s: rank %d: %s\n", kProg, rank, status.ToString().c_str());
  if (rank == 0) {
    if (!header) PrintReduceHeader(stdout, cfg, out.transports);
    PrintFooter(stdout, out, status);
    absl::Status written = WriteJsonFile(cfg, out, status);
    if (!written.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, written.ToString().c_str());
      if (status.ok()) status = written;
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  if (!status.ok()) return 2;
  return local_wrong > 0 ? 1 : 0;
}

// Forks the ranks and waits for them, as braid-bench does (tools/bench/bench_ranks.h).
int RunRanks(const Config& cfg, const Outcome& outcome) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "braid-compress-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "%s: mkdtemp(%s): %s\n", kProg, tmpl.c_str(), std::strerror(errno));
    return 2;
  }
  const std::string store_dir = tmpl;

  RanksOptions opts;
  opts.ranks = cfg.ranks;
  opts.deadline = cfg.deadline;
  opts.prog = kProg;
  const RanksRun run =
      bench::RunRanks(opts, [&](int r) { return RunRank(cfg, r, store_dir, outcome); });

  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  return ReportRanks(run, opts.prog, " (results out of bound)");
}

int RunParent(const Config& cfg) {
  Outcome outcome;
  {
    std::ifstream f("/proc/loadavg");
    std::getline(f, outcome.load_at_start);
  }
  std::printf("# %s: %ld cores, /proc/loadavg at start: %s (timings are noisy unless idle)\n",
              kProg, sysconf(_SC_NPROCESSORS_ONLN), outcome.load_at_start.c_str());
  if (cfg.run_codec) {
    absl::StatusOr<CodecResult> codec = RunCodec(cfg);
    if (!codec.ok()) {
      std::fprintf(stderr, "%s: codec: %s\n", kProg, codec.status().ToString().c_str());
      return 2;
    }
    outcome.codec = *std::move(codec);
    PrintCodec(stdout, outcome.codec);
  }
  if (!cfg.run_allreduce) {
    PrintFooter(stdout, outcome, absl::OkStatus());
    absl::Status written = WriteJsonFile(cfg, outcome, absl::OkStatus());
    if (!written.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProg, written.ToString().c_str());
      return 2;
    }
    return CountWrong(outcome) > 0 ? 1 : 0;
  }
  // The codec's rows travel to rank 0 through fork; it prints the footer and the JSON.
  const int ranks_result = RunRanks(cfg, outcome);
  int64_t codec_wrong = 0;
  for (const CodecRow& r : outcome.codec.rows) codec_wrong += r.out_of_bound;
  if (ranks_result == 2) return 2;
  return (ranks_result == 1 || codec_wrong > 0) ? 1 : 0;
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  using namespace braid;
  using namespace braid::bench;
  CLI::App app{"codec throughput and compressed all-reduce time of braid's compression stage"};
  Config cfg;
  std::string parts = "codec,allreduce", methods = "none,fp4,int4,fp16,bf16";
  std::string codec_bytes_s = "64M", min_s = "64M", max_s = "64M", factor_s = "2";
  int chunk = 128;
  double timeout_s = 60, deadline_s = 1200;
  int peer_error_handling = 0;
  app.add_option("--parts", parts, "codec, allreduce (comma-separated)")->capture_default_str();
  app.add_option("--methods", methods,
                 "compression specs, comma-separated: none fp4 int4 fp16 bf16 (a spec may carry "
                 "one option: fp4:chunk=64)")
      ->capture_default_str();
  app.add_option("--codec-bytes", codec_bytes_s, "float32 bytes the codec part quantizes")
      ->capture_default_str();
  app.add_option("--chunk", chunk, "codec part: elements per 4-bit scale")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("-b,--minbytes", min_s, "all-reduce: smallest size (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "all-reduce: largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor_s, "all-reduce: multiply the size by this")
      ->capture_default_str();
  app.add_option("-n,--iters", cfg.iters, "all-reduce: timed calls per repeat")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", cfg.warmup, "all-reduce: untimed calls per repeat")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeat", cfg.repeat, "repeats (the tables show medians over them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ranks", cfg.ranks, "local ranks to start")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--tls", cfg.tls, "UCX_TLS for the ranks: tcp | sm (UCX_NET_DEVICES=lo)")
      ->capture_default_str();
  app.add_option("--json", cfg.json_path, "write both tables as JSON here");
  app.add_option("--timeout", timeout_s,
                 "seconds without progress before a collective fails (UcxOptions::timeout)")
      ->envname("BRAID_TIMEOUT_S")
      ->capture_default_str();
  app.add_option("--deadline", deadline_s, "seconds for the ranks before they are killed")
      ->capture_default_str();
  app.add_option("--corrupt", cfg.corrupt,
                 "testing the checks: multiply every checked result by this (the run must then "
                 "fail with exit code 1)")
      ->capture_default_str();
  app.add_option("--peer-error-handling", peer_error_handling,
                 "UcxOptions::peer_error_handling for local peers: 0 or 1")
      ->envname("BRAID_UCX_PEER_ERROR_HANDLING")
      ->capture_default_str();
  BRAID_CLI_PARSE(app, argc, argv);

  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "%s: %s\n", kProg, s.ToString().c_str());
    return 2;
  };
  cfg.run_codec = cfg.run_allreduce = false;
  for (absl::string_view p : absl::StrSplit(parts, ',', absl::SkipEmpty())) {
    if (p == "codec") {
      cfg.run_codec = true;
    } else if (p == "allreduce") {
      cfg.run_allreduce = true;
    } else {
      return fail(absl::InvalidArgumentError(absl::StrCat("unknown --parts entry '", p,
                                                          "' (codec, allreduce)")));
    }
  }
  for (absl::string_view text : absl::StrSplit(methods, ',', absl::SkipEmpty())) {
    absl::StatusOr<Method> m = ParseMethod(std::string(text));
    if (!m.ok()) return fail(m.status());
    cfg.methods.push_back(*std::move(m));
  }
  if (cfg.methods.empty()) return fail(absl::InvalidArgumentError("--methods is empty"));
  absl::StatusOr<uint64_t> codec_b = ParseSize(codec_bytes_s), min_b = ParseSize(min_s),
                           max_b = ParseSize(max_s), factor = ParseSize(factor_s);
  for (const auto* s : {&codec_b, &min_b, &max_b, &factor}) {
    if (!s->ok()) return fail(s->status());
  }
  cfg.codec_bytes = *codec_b;
  cfg.codec_chunk = static_cast<size_t>(chunk);
  absl::StatusOr<std::vector<uint64_t>> sizes = SizeList(*min_b, *max_b, *factor);
  if (!sizes.ok()) return fail(sizes.status());
  cfg.sizes = *sizes;
  if (timeout_s <= 0 || deadline_s <= 0) {
    return fail(absl::InvalidArgumentError("--timeout and --deadline must be positive"));
  }
  cfg.timeout = absl::Seconds(timeout_s);
  cfg.deadline = absl::Seconds(deadline_s);
  if (peer_error_handling != 0 && peer_error_handling != 1) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--peer-error-handling (or BRAID_UCX_PEER_ERROR_HANDLING) must be 0 or 1, got ",
        peer_error_handling)));
  }
  cfg.ucx_base.peer_error_handling = peer_error_handling != 0;

  // Before fork and before anything touches UCX (UCX_NET_DEVICES=lo only, or tcp also picks eth0).
  setenv("UCX_TLS", cfg.tls.c_str(), 1);
  setenv("UCX_NET_DEVICES", "lo", 1);

  if (!google::IsGoogleLoggingInitialized()) google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return RunParent(cfg);
}
