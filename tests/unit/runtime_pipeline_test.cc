// The all-reduce pipeline (runtime/allreduce_pipeline.h, Note [One pipeline]) through
// braid::Runtime, with several ranks as threads of one process (tests/testing/
// runtime_world.h): none over every dtype and op; every compression method fused and
// unfused, bit for bit, and against its Compressor run alone; the byte ledger; the fusion
// buffer's reuse.
#include <cmath>
#include <cstring>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "compression/registry.h"
#include "compression/stage.h"
#include "gtest/gtest.h"
#include "runtime/allreduce_pipeline.h"
#include "runtime/runtime.h"
#include "runtime/statistics.h"
#include "runtime/step_settings.h"
#include "tests/testing/delegating_communicator.h"
#include "tests/testing/local_world.h"
#include "tests/testing/runtime_world.h"
#include "tests/testing/typed_values.h"

namespace braid {
namespace {

using testing::ReadValue;
using testing::RuntimeWorld;
using testing::RuntimeWorldOptions;
using testing::WriteValue;

absl::Status WaitFor(const absl::StatusOr<std::shared_ptr<Handle>>& h) {
  if (!h.ok()) return h.status();
  return (*h)->Wait(absl::Seconds(30));
}

RuntimeWorldOptions World(int size, int64_t fusion_threshold) {
  RuntimeWorldOptions o;
  o.size = size;
  o.settings.set_fusion_threshold_bytes(fusion_threshold);
  return o;
}

// none reduces every dtype with every op it allows, exactly, fused with others or alone.
// Rank r holds (i % 5) + r, so every result is a small integer: exact in every dtype.
TEST(RuntimePipelineTest, NoneReducesEveryDtypeAndOpExactly) {
  const std::vector<DataType> dtypes = {DataType::kFloat32, DataType::kFloat64,
                                        DataType::kFloat16, DataType::kBFloat16,
                                        DataType::kInt32,   DataType::kInt64,
                                        DataType::kUInt8};
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                     ReduceOp::kMax, ReduceOp::kProduct};
  for (int64_t fusion : {int64_t{64} << 20, int64_t{0}}) {
    RuntimeWorld world(World(3, fusion));
    ASSERT_TRUE(world.InitOk());
    world.Run([&](int rank, Runtime& rt) {
      constexpr int64_t kN = 37;
      std::vector<std::vector<char>> in, out;
      std::vector<std::pair<std::string, std::shared_ptr<Handle>>> handles;
      std::vector<std::pair<DataType, ReduceOp>> cases;
      for (DataType dt : dtypes) {
        for (ReduceOp op : ops) {
          if (!CheckReduceOp(dt, op).ok()) continue;
          in.emplace_back(kN * DataTypeSize(dt));
          out.emplace_back(kN * DataTypeSize(dt));
          for (int64_t i = 0; i < kN; ++i) WriteValue(in.back().data(), i, dt, i % 5 + rank);
          CollectiveRequest r;
          r.name = absl::StrCat(DataTypeName(dt), "/", ReduceOpName(op));
          r.dtype = dt;
          r.shape = {kN};
          r.input = in.back().data();
          r.output = out.back().data();
          r.op = op;
          auto h = rt.Enqueue(r);
          ASSERT_TRUE(h.ok()) << h.status();
          handles.emplace_back(r.name, *h);
          cases.emplace_back(dt, op);
        }
      }
      for (size_t c = 0; c < cases.size(); ++c) {
        ASSERT_TRUE(handles[c].second->Wait(absl::Seconds(30)).ok()) << handles[c].first;
        const auto [dt, op] = cases[c];
        for (int64_t i = 0; i < kN; ++i) {
          const double v = i % 5;
          const double want = op == ReduceOp::kSum       ? 3 * v + 3
                              : op == ReduceOp::kAverage ? v + 1
                              : op == ReduceOp::kMin     ? v
                              : op == ReduceOp::kMax     ? v + 2
                                                         : v * (v + 1) * (v + 2);
          ASSERT_EQ(ReadValue(out[c].data(), i, dt), want)
              << handles[c].first << "[" << i << "] fusion " << fusion;
        }
      }
    });
  }
}

// A tensor set like a small network's: matrices, a conv kernel, biases.
struct Layer {
  std::string name;
  std::vector<int64_t> shape;
};
const std::vector<Layer>& Layers() {
  static const auto* layers = new std::vector<Layer>{
      {"conv.w", {6, 3, 3, 3}}, {"conv.b", {6}}, {"fc1.w", {64, 32}}, {"fc1.b", {64}},
      {"fc2.w", {24, 18}},      {"big", {4000}}};
  return *layers;
}

size_t Count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// Deterministic inputs that differ per rank, step and tensor.
double Input(int rank, int step, size_t layer, size_t i) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * rank + 0.7 * step + 2.1 * layer) *
         (1.0 + 0.01 * static_cast<double>(i % 17));
}

// Results[step][rank][layer]: the bytes of each output after `steps` steps of `spec` on every
// layer in `dtype`, all enqueued at once each step.
using Results = std::vector<std::vector<std::vector<std::vector<char>>>>;

// Where each step's inputs and outputs lie (Note [In place], runtime/allreduce_pipeline.h).
enum class Layout {
  kScattered,           // one allocation per input and per output
  kContiguousInPlace,   // one span, in layer order; input == output
  kContiguousOutOfPlace,  // inputs in one span, outputs in another
  kMixed,               // rank 0 contiguous in place, the others scattered
};

Results RunSteps(RuntimeWorld& world, const std::string& spec, DataType dtype, int steps,
                 Layout layout = Layout::kScattered) {
  Results results(steps, Results::value_type(world.size()));
  world.Run([&](int rank, Runtime& rt) {
    const Layout mine = layout != Layout::kMixed ? layout
                        : rank == 0            ? Layout::kContiguousInPlace
                                               : Layout::kScattered;
    const size_t element = DataTypeSize(dtype);
    size_t total = 0;
    for (const Layer& layer : Layers()) total += Count(layer.shape) * element;
    for (int step = 0; step < steps; ++step) {
      std::vector<std::vector<char>> in, out;
      // The spans start one element past an allocation, so not where a fusion buffer would
      // (64-byte aligned): the bits must not depend on the address.
      std::vector<char> flat_in(total + element), flat_out(total + element);
      std::vector<char*> ins, outs;
      std::vector<std::shared_ptr<Handle>> handles;
      size_t offset = element;
      for (size_t l = 0; l < Layers().size(); ++l) {
        const size_t n = Count(Layers()[l].shape);
        if (mine == Layout::kScattered) {
          in.emplace_back(n * element);
          out.emplace_back(n * element);
          ins.push_back(in.back().data());
          outs.push_back(out.back().data());
        } else {
          ins.push_back(flat_in.data() + offset);
          outs.push_back(mine == Layout::kContiguousInPlace ? ins.back()
                                                               : flat_out.data() + offset);
        }
        offset += n * element;
        for (size_t i = 0; i < n; ++i) WriteValue(ins[l], i, dtype, Input(rank, step, l, i));
      }
      // One group per step: every layer reaches the coordinator in one request list, so the
      // fused run fuses however the threads are scheduled (a coordinator tick between two
      // enqueues would otherwise split the bucket on a loaded machine).
      rt.BeginGroup();
      for (size_t l = 0; l < Layers().size(); ++l) {
        CollectiveRequest r;
        r.name = Layers()[l].name;
        r.dtype = dtype;
        r.shape = Layers()[l].shape;
        r.input = ins[l];
        r.output = outs[l];
        r.op = ReduceOp::kAverage;
        r.compression = spec;
        auto h = rt.Enqueue(r);
        ASSERT_TRUE(h.ok()) << h.status();
        handles.push_back(*h);
      }
      ASSERT_TRUE(rt.EndGroup().ok());
      for (auto& h : handles) ASSERT_TRUE(h->Wait(absl::Seconds(30)).ok()) << spec << " " << h->status();
      for (size_t l = 0; l < Layers().size(); ++l) {
        results[step][rank].emplace_back(outs[l], outs[l] + Count(Layers()[l].shape) * element);
      }
    }
  });
  return results;
}

struct MethodCase {
  std::string spec;
  DataType dtype;
};
std::vector<MethodCase> MethodCases() {
  std::vector<MethodCase> out;
  for (const char* spec :
       {"none", "fp16", "bf16", "fp4", "int4", "fp4:ef=1", "int4:beta=0.5,ef=1",
        "powersgd:rank=2", "powersgd:start_step=1", "scalecomp:granularity=tensor",
        "topk:granularity=tensor", "randomk:granularity=tensor", "fp16:start_step=1"}) {
    out.push_back({spec, DataType::kFloat32});
  }
  // The native 16-bit path, the conversions to float32 and back, and float64.
  for (const char* spec : {"none", "fp16", "bf16", "fp4", "powersgd:rank=2"}) {
    out.push_back({spec, DataType::kFloat16});
  }
  out.push_back({"fp16", DataType::kBFloat16});
  out.push_back({"int4", DataType::kFloat64});
  return out;
}

// Every method through the one pipeline, fused and unfused: the same bits on every rank and
// in both runs, three steps long (state: error feedback, PowerSGD's Q, warm-ups).
TEST(RuntimePipelineTest, EveryMethodGivesTheSameBitsFusedAndUnfused) {
  for (const MethodCase& mc : MethodCases()) {
    SCOPED_TRACE(absl::StrCat(mc.spec, " on ", DataTypeName(mc.dtype)));
    RuntimeWorld fused_world(World(3, int64_t{64} << 20));
    ASSERT_TRUE(fused_world.InitOk());
    const Results fused = RunSteps(fused_world, mc.spec, mc.dtype, 3);
    auto status = fused_world.coordinator().Status();
    ASSERT_TRUE(status.ok());
    EXPECT_LT(status->responses_sent(), status->tensors_negotiated()) << "some buckets fused";
    RuntimeWorld unfused_world(World(3, 0));
    ASSERT_TRUE(unfused_world.InitOk());
    const Results unfused = RunSteps(unfused_world, mc.spec, mc.dtype, 3);
    status = unfused_world.coordinator().Status();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status->responses_sent(), status->tensors_negotiated()) << "no bucket fused";
    for (int step = 0; step < 3; ++step) {
      for (int rank = 0; rank < 3; ++rank) {
        for (size_t l = 0; l < Layers().size(); ++l) {
          EXPECT_EQ(fused[step][rank][l], unfused[step][rank][l])
              << Layers()[l].name << " step " << step << " rank " << rank;
          EXPECT_EQ(fused[step][rank][l], fused[step][0][l]) << "ranks differ";
        }
      }
    }
  }
}

// Note [In place]: a bucket whose tensors lie back to back is reduced there, with the same
// bits as the packed path; the fusion buffer is used only where a tensor is converted. Ranks
// whose layouts differ (one in place, the others packed) run the same collectives.
TEST(RuntimePipelineTest, EveryMethodGivesTheSameBitsInPlaceAndPacked) {
  for (const MethodCase& mc : MethodCases()) {
    SCOPED_TRACE(absl::StrCat(mc.spec, " on ", DataTypeName(mc.dtype)));
    const auto spec = compression::ParseCompressionSpec(mc.spec).value();
    const bool converted = !compression::CreateCompressor(spec).value()->TakesNatively(mc.dtype);
    std::vector<Layout> layouts = {Layout::kScattered, Layout::kContiguousInPlace,
                                   Layout::kMixed};
    // Out of place, only compressors that read their input there skip the buffer.
    if (mc.spec == "none" || mc.spec == "fp16") layouts.push_back(Layout::kContiguousOutOfPlace);
    std::vector<Results> results;
    for (Layout layout : layouts) {
      RuntimeWorld world(World(3, int64_t{64} << 20));
      ASSERT_TRUE(world.InitOk());
      results.push_back(RunSteps(world, mc.spec, mc.dtype, 3, layout));
      world.Run([&](int rank, Runtime& rt) {
        const FusionStats f = rt.compression_report().value().fusion;
        EXPECT_GT(f.buckets, 0u);
        if (layout == Layout::kScattered || converted || (layout == Layout::kMixed && rank > 0)) {
          EXPECT_GT(f.packed_buckets, 0u) << "rank " << rank;
          EXPECT_GT(f.packed_bytes, 0u);
        } else {
          EXPECT_EQ(f.packed_buckets, 0u) << "rank " << rank << " layout " << int(layout);
          EXPECT_EQ(f.packed_bytes, 0u);
        }
      });
    }
    for (size_t k = 1; k < results.size(); ++k) {
      for (int step = 0; step < 3; ++step) {
        for (int rank = 0; rank < 3; ++rank) {
          for (size_t l = 0; l < Layers().size(); ++l) {
            EXPECT_TRUE(results[k][step][rank][l] == results[0][step][rank][l])
                << Layers()[l].name << " step " << step << " rank " << rank << " layout "
                << int(layouts[k]);
          }
        }
      }
    }
  }
}

// The pipeline adds nothing to a compressor: with fusion off, each tensor's result equals
// the method's Compressor run alone on it (over the same in-process world), its input
// converted to float32 and back where the compressor does not take the dtype.
TEST(RuntimePipelineTest, EveryMethodEqualsItsCompressorRunAlone) {
  for (const MethodCase& mc : MethodCases()) {
    if (absl::StrContains(mc.spec, "start_step")) continue;  // warm-ups are the stage's
    SCOPED_TRACE(absl::StrCat(mc.spec, " on ", DataTypeName(mc.dtype)));
    RuntimeWorld world(World(3, 0));
    ASSERT_TRUE(world.InitOk());
    const Results got = RunSteps(world, mc.spec, mc.dtype, 2);
    const auto spec = compression::ParseCompressionSpec(mc.spec).value();
    testing::RunLocalWorld(3, {}, [&](int rank, transport::Communicator& comm) {
      auto compressor = compression::CreateCompressor(spec).value();
      const bool native = compressor->TakesNatively(mc.dtype);
      for (int step = 0; step < 2; ++step) {
        for (size_t l = 0; l < Layers().size(); ++l) {
          const size_t n = Count(Layers()[l].shape);
          const DataType work = native ? mc.dtype : DataType::kFloat32;
          std::vector<char> in(n * DataTypeSize(mc.dtype)), buf(n * DataTypeSize(work));
          for (size_t i = 0; i < n; ++i) WriteValue(in.data(), i, mc.dtype, Input(rank, step, l, i));
          for (size_t i = 0; i < n; ++i) WriteValue(buf.data(), i, work, ReadValue(in.data(), i, mc.dtype));
          compression::TensorView v{Layers()[l].name, Layers()[l].shape, buf.data(), n, work};
          std::vector<int64_t> steps = {step};
          std::vector<uint64_t> payload(1);
          compression::StepContext ctx;
          ctx.op = ReduceOp::kAverage;
          ctx.steps = steps;
          ctx.payload_bytes = absl::MakeSpan(payload);
          ASSERT_TRUE(compressor->Reduce({v}, comm, ctx).ok());
          std::vector<char> want(in.size());
          for (size_t i = 0; i < n; ++i) WriteValue(want.data(), i, mc.dtype, ReadValue(buf.data(), i, work));
          EXPECT_EQ(got[step][rank][l], want) << Layers()[l].name << " step " << step;
        }
      }
    });
  }
}

// runtime/statistics.h: per tensor and per method, payload as the compressor counts it (a
// 1-D tensor PowerSGD sends as it is counts under powersgd; a warm-up step at the tensor's
// size), every all-reduce booked (an int32 one under none), and the per-method rows the
// heartbeats carry to the coordinator (braidctl status), summed over ranks.
TEST(RuntimePipelineTest, TheLedgerCountsEveryTensorUnderItsMethod) {
  RuntimeWorldOptions o = World(2, int64_t{64} << 20);
  o.configure = [](int, RuntimeConfig* c) { c->compression = "fp16"; };  // the job's default
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  world.Run([](int rank, Runtime& rt) {
    std::vector<float> w(64 * 32, 0.5f), b(32, 0.25f);
    CollectiveRequest rw, rb;
    for (auto [r, name, shape, data] :
         {std::make_tuple(&rw, "w", std::vector<int64_t>{64, 32}, &w),
          std::make_tuple(&rb, "b", std::vector<int64_t>{32}, &b)}) {
      r->name = name;
      r->shape = shape;
      r->input = r->output = data->data();
      r->compression = "powersgd";
    }
    auto hw = rt.Enqueue(rw);
    auto hb = rt.Enqueue(rb);
    ASSERT_TRUE(WaitFor(hw).ok() && WaitFor(hb).ok());
    std::vector<uint16_t> h(1000, FloatToFloat16(1.0f));
    CollectiveRequest rh;
    rh.name = "h";
    rh.dtype = DataType::kFloat16;
    rh.shape = {1000};
    rh.input = rh.output = h.data();
    rh.compression = "fp16:start_step=1";
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(WaitFor(rt.Enqueue(rh)).ok());
    std::vector<int32_t> ints(100, 1);
    CollectiveRequest ri;
    ri.name = "i";
    ri.dtype = DataType::kInt32;
    ri.shape = {100};
    ri.input = ri.output = ints.data();
    ri.op = ReduceOp::kSum;
    ASSERT_TRUE(WaitFor(rt.Enqueue(ri)).ok());
    // A broadcast compresses nothing: in the job's bytes negotiated, in no method's row.
    std::vector<float> params(250, rank == 0 ? 1.0f : 0.0f);
    CollectiveRequest rp;
    rp.name = "params";
    rp.collective = Collective::kBroadcast;
    rp.shape = {250};
    rp.input = rp.output = params.data();
    ASSERT_TRUE(WaitFor(rt.Enqueue(rp)).ok());
    const CompressionReport r = rt.compression_report().value();
    std::map<std::string, ByteStats> by;
    for (const auto& t : r.tensors) by[t.name + "/" + t.method] = t.bytes;
    ASSERT_EQ(by.size(), 4u);
    EXPECT_EQ(by["w/powersgd"].payload_bytes, (64u + 32u) * 4);
    EXPECT_EQ(by["b/powersgd"].payload_bytes, 32u * 4) << "sent as it is, counted under powersgd";
    EXPECT_EQ(by["b/powersgd"].uncompressed_bytes, 32u * 4);
    EXPECT_EQ(by["h/fp16:start_step=1"].reductions, 2u);
    EXPECT_EQ(by["h/fp16:start_step=1"].payload_bytes, 2000u + 2000u) << "warm-up at its size";
    EXPECT_EQ(by["h/fp16:start_step=1"].uncompressed_bytes, 4000u);
    EXPECT_EQ(by["i/none"].payload_bytes, 400u) << "the default skips integers";
    EXPECT_EQ(by["i/none"].reference_transport_bytes, 400u) << "2(n-1)/n of 400 bytes";
    ASSERT_EQ(r.methods.size(), 3u);
    for (const MethodCompressionStats& m : r.methods) {
      uint64_t transport = 0;
      for (const auto& t : r.tensors) transport += t.method == m.method ? t.bytes.transport_bytes : 0;
      EXPECT_EQ(m.bytes.transport_bytes, transport) << m.method;
      EXPECT_GT(m.bytes.transport_bytes, 0u) << m.method;
    }
    EXPECT_EQ(r.methods[2].method, "powersgd");  // sorted by method
    EXPECT_EQ(r.methods[2].tensors, 2u);
    EXPECT_EQ(r.methods[2].bytes.payload_bytes, (64u + 32u) * 4 + 32u * 4);
  });
  world.Shutdown();  // each rank's final report reaches the coordinator as it leaves
  auto status = world.coordinator().Status();
  ASSERT_TRUE(status.ok());
  std::map<std::string, proto::CompressionStat> rows;
  for (const auto& c : status->compression()) rows[c.method()] = c;
  EXPECT_EQ(rows["powersgd"].payload_bytes(), 2 * ((64 + 32) * 4 + 32 * 4));
  EXPECT_EQ(rows["powersgd"].ranks_reporting(), 2);
  EXPECT_EQ(rows["none"].payload_bytes(), 2 * 400);
  // "none" counts the same tensor before (negotiated) and after (reported): the int32
  // all-reduce, one rank's share; not the 1000-byte broadcast.
  EXPECT_EQ(rows["none"].tensors(), 1);
  EXPECT_EQ(rows["none"].bytes_before(), 400);
  EXPECT_EQ(rows["none"].bytes_after(), 400);
  EXPECT_EQ(rows["none"].ratio(), 1.0);
  EXPECT_EQ(status->bytes_negotiated(), (64 * 32 + 32) * 4 + 2 * 2000 + 400 + 1000);
}

// Note [Compression plans]: a plan as the job's default (BRAID_COMPRESSION) and one named by
// a request give each tensor the method of its first matching pattern, or none where the
// rule says it would not pay; the ledger books each under the method it got, on every rank.
TEST(RuntimePipelineTest, APlanGivesEachTensorTheMethodOfItsPattern) {
  RuntimeWorldOptions o = World(2, int64_t{64} << 20);
  o.configure = [](int, RuntimeConfig* c) {
    c->compression = R"({"*.bias": "none", "emb.*": "fp16", "*": "fp4"})";
  };
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  world.Run([](int rank, Runtime& rt) {
    struct T {
      const char* name;
      std::vector<int64_t> shape;
      std::string compression;
    };
    const std::vector<T> tensors = {{"fc.weight", {64, 64}, ""},
                                    {"fc.bias", {2048}, ""},       // "*" would give fp4
                                    {"emb.weight", {2048}, ""},
                                    {"small.weight", {8, 8}, ""},  // 64 elements: too small
                                    {"w", {16, 256}, R"({"y": "fp16", "*": "powersgd:rank=4"})"},
                                    {"v", {8, 512}, R"({"y": "fp16", "*": "powersgd:rank=4"})"}};
    std::vector<std::vector<float>> data;
    for (const T& t : tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      data.emplace_back(n, 1.0f + rank);
      CollectiveRequest r;
      r.name = t.name;
      r.shape = t.shape;
      r.input = r.output = data.back().data();
      r.op = ReduceOp::kAverage;
      r.compression = t.compression;
      ASSERT_TRUE(WaitFor(rt.Enqueue(r)).ok()) << t.name;
    }
    EXPECT_EQ(data[1][7], 1.5f) << "fc.bias: uncompressed, the exact average";
    const CompressionReport report = rt.compression_report().value();
    std::map<std::string, std::string> method;
    for (const auto& t : report.tensors) method[t.name] = t.method;
    // v: 8 x 512 at rank 4 is rate 1.97, below 2.
    EXPECT_EQ(method, (std::map<std::string, std::string>{{"emb.weight", "fp16"},
                                                          {"fc.bias", "none"},
                                                          {"fc.weight", "fp4"},
                                                          {"small.weight", "none"},
                                                          {"v", "none"},
                                                          {"w", "powersgd:rank=4"}}));
    // Note [Compression groups]: each under the pattern that gave its method ("*" for v and
    // small.weight too, which the rule sent uncompressed).
    std::map<std::string, std::string> pattern;
    for (const auto& t : report.tensors) pattern[t.name] = t.pattern;
    EXPECT_EQ(pattern, (std::map<std::string, std::string>{{"emb.weight", "emb.*"},
                                                           {"fc.bias", "*.bias"},
                                                           {"fc.weight", "*"},
                                                           {"small.weight", "*"},
                                                           {"v", "*"},
                                                           {"w", "*"}}));
    std::vector<std::string> groups;
    for (const auto& g : report.groups) {
      groups.push_back(absl::StrCat(g.method, " ", g.pattern, " ", g.tensors));
    }
    EXPECT_EQ(groups, (std::vector<std::string>{"fp16 emb.* 1", "fp4 * 1", "none * 2",
                                                "none *.bias 1", "powersgd:rank=4 * 1"}));
    // A bad plan is refused at the call, naming the tensor and the key.
    CollectiveRequest bad;
    bad.name = "bad";
    bad.shape = {4};
    bad.input = bad.output = data[0].data();
    bad.compression = R"({"*": "fp5"})";
    auto h = rt.Enqueue(bad);
    const absl::Status s = h.ok() ? WaitFor(h) : h.status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "allreduce 'bad' on rank ")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "compression plan, key '*'")) << s;
    // A caller that resolved a plan itself names its pattern with the spec.
    CollectiveRequest given;
    given.name = "given";
    given.shape = {4};
    given.input = given.output = data[0].data();
    given.compression = "none";
    given.compression_pattern = "given.*";
    ASSERT_TRUE(WaitFor(rt.Enqueue(given)).ok());
    given.name = "bad.pattern";
    given.compression_pattern = "\xff";
    EXPECT_EQ(rt.Enqueue(given).status().code(), absl::StatusCode::kInvalidArgument);
  });
  world.Shutdown();  // each rank's final report reaches the coordinator as it leaves
  // braidctl status: a row per group, tensors negotiated and bytes of both ranks.
  auto status = world.coordinator().Status();
  ASSERT_TRUE(status.ok());
  std::vector<std::string> rows;
  for (const auto& c : status->compression()) {
    rows.push_back(absl::StrCat(c.method(), " ", c.pattern(), " ", c.tensors(), " ",
                                c.ranks_reporting()));
  }
  EXPECT_EQ(rows, (std::vector<std::string>{"fp16 emb.* 1 2", "fp4 * 1 2", "none * 2 2",
                                            "none *.bias 1 2", "none given.* 1 2",
                                            "powersgd:rank=4 * 1 2"}));
}

// In a process set (Note [Process sets]) a plan matches the name as the caller gave it, not
// the set's qualified name.
TEST(RuntimePipelineTest, APlanMatchesTheNameGivenInAProcessSet) {
  RuntimeWorldOptions o = World(3, int64_t{64} << 20);
  o.configure = [](int, RuntimeConfig* c) { c->compression = R"({"emb.*": "fp16"})"; };
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  world.Run([](int rank, Runtime& rt) {
    absl::StatusOr<int32_t> set = rt.AddProcessSet({0, 1});
    ASSERT_TRUE(set.ok()) << set.status();
    if (rank == 2) return;
    std::vector<float> e(2048, 1.0f);
    CollectiveRequest r;
    r.name = "emb.weight";
    r.shape = {2048};
    r.input = r.output = e.data();
    r.process_set_id = *set;
    ASSERT_TRUE(WaitFor(rt.Enqueue(r)).ok());
    const CompressionReport report = rt.compression_report().value();
    ASSERT_EQ(report.tensors.size(), 1u);
    EXPECT_NE(report.tensors[0].name, "emb.weight") << "qualified by its set";
    EXPECT_EQ(report.tensors[0].method, "fp16") << report.tensors[0].name;
  });
  world.Shutdown();
}

// ---- Note [Settings changes] (runtime/step_settings.h) ----

// The world's data channel, recording each pipeline change with the collectives run before
// it (the same count on every rank when every rank changes at the same step).
struct PipelineChange {
  uint64_t collectives;
  size_t chunk;
  int window;
  bool operator==(const PipelineChange& o) const {
    return collectives == o.collectives && chunk == o.chunk && window == o.window;
  }
};
class PipelineRecorder final : public testing::DelegatingCommunicator {
 public:
  PipelineRecorder(std::unique_ptr<transport::Communicator> inner,
                   std::vector<PipelineChange>* changes)
      : DelegatingCommunicator(std::move(inner)), changes_(changes) {}
  void SetPipeline(size_t chunk, int window) override {
    inner().SetPipeline(chunk, window);
    changes_->push_back(
        {inner().stats().collectives, inner().pipeline().first, inner().pipeline().second});
  }

 private:
  std::vector<PipelineChange>* changes_;
};

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;

// Autotuning with a score forced to peak at fusion 4 MiB, ring chunk 64 KiB and window 8
// (each step away on a knob's grid costs 10%; the cycle time does not matter), so the
// search's path is known; one pass, one warm-up and two measured steps per candidate.
RuntimeWorldOptions Tuned(int size) {
  RuntimeWorldOptions o = World(size, 64 * kMiB);
  o.settings.set_autotune(1);
  o.autotune.warmup_steps = 1;
  o.autotune.first_warmup_steps = 1;
  o.autotune.measured_steps = 2;
  o.autotune.max_passes = 1;
  o.autotune.forced_score = [](const proto::TunedSettings& s) {
    // Steps on the grids: fusion and chunk by 4x, the window by 2x (coordinator/autotune.cc).
    auto steps = [](double v, double best, double factor) {
      return v <= 0 ? 10.0 : std::abs(std::log(v / best) / std::log(factor));
    };
    return std::pow(0.9, steps(s.fusion_threshold_bytes(), 4 * kMiB, 4) +
                             steps(s.ring_chunk_bytes(), 64 * kKiB, 4) +
                             steps(s.ring_window(), 8, 2));
  };
  return o;
}

std::string Describe(const SettingsApplied& a) {
  return absl::StrCat("epoch ", a.epoch, " step ", a.step, ": ", a.fusion_threshold_bytes, "/",
                      a.cycle_time_us, "/", a.ring_chunk_bytes, "/", a.ring_window,
                      a.tuning_done ? " done" : "");
}

// Every rank applies every change at the same step, the data channel's pipeline changes at
// the same collective on every rank, the search ends at the forced peak, the coordinator's
// status and rank 0's autotuning log say so; through the coordinator and the fast path.
TEST(SettingsChangeTest, EveryRankAppliesEachChangeAtTheSameStep) {
  const std::string log = ::testing::TempDir() + "/braid_autotune_log.csv";
  for (int fast_path : {0, 1}) {
    SCOPED_TRACE(fast_path ? "fast path" : "through the coordinator");
    std::remove(log.c_str());
    RuntimeWorldOptions o = Tuned(3);
    o.settings.set_fast_path(fast_path);
    std::vector<std::vector<PipelineChange>> changes(3);
    o.wrap_communicator = [&](int rank, std::unique_ptr<transport::Communicator> comm)
        -> std::unique_ptr<transport::Communicator> {
      return std::make_unique<PipelineRecorder>(std::move(comm), &changes[rank]);
    };
    o.configure = [&](int rank, RuntimeConfig* c) {
      c->autotune_log_path = log;  // rank 0 alone writes it
    };
    RuntimeWorld world(o);
    ASSERT_TRUE(world.InitOk());
    RunSteps(world, "none", DataType::kFloat32, 90);
    std::vector<std::vector<SettingsApplied>> history(3);
    for (int r = 0; r < 3; ++r) {
      auto h = world[r].SettingsHistory();
      ASSERT_TRUE(h.ok()) << h.status();
      history[r] = *h;
    }
    ASSERT_GE(history[0].size(), 5u);
    for (int r = 1; r < 3; ++r) {
      ASSERT_EQ(history[r].size(), history[0].size()) << "rank " << r;
      for (size_t i = 0; i < history[0].size(); ++i) {
        EXPECT_EQ(Describe(history[r][i]), Describe(history[0][i])) << "rank " << r;
      }
    }
    for (size_t i = 1; i < history[0].size(); ++i) {
      EXPECT_GT(history[0][i].step, history[0][i - 1].step) << "one change per step at most";
    }
    const SettingsApplied& last = history[0].back();
    EXPECT_TRUE(last.tuning_done) << Describe(last);
    EXPECT_EQ(last.fusion_threshold_bytes, 4 * kMiB);
    EXPECT_EQ(last.ring_chunk_bytes, 64 * kKiB);
    EXPECT_EQ(last.ring_window, 8);
    // The data plane's pipeline: the job's own at the start, then each change's, at the same
    // collective on every rank.
    ASSERT_EQ(changes[0].size(), history[0].size() + 1);
    EXPECT_EQ(changes[0].back().chunk, 64u * 1024);
    EXPECT_EQ(changes[0].back().window, 8);
    for (int r = 1; r < 3; ++r) EXPECT_TRUE(changes[r] == changes[0]) << "rank " << r;
    auto status = world.coordinator().Status();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status->autotune(), "done");
    EXPECT_EQ(status->settings_change().epoch(), last.epoch);
    EXPECT_EQ(status->settings_since_step(), last.step);
    EXPECT_TRUE(status->settings_change().tuning_done());
    // One row per measured candidate: every change carried the measurement before it.
    std::ifstream in(log);
    std::vector<std::string> rows;
    for (std::string line; std::getline(in, line);) rows.push_back(line);
    ASSERT_EQ(rows.size(), history[0].size() + 1) << "a header and a row per sample";
    EXPECT_TRUE(absl::StartsWith(rows[0], "epoch,step,fusion_threshold_bytes")) << rows[0];
    EXPECT_TRUE(absl::StartsWith(rows[1], "0,")) << "the job's own settings first: " << rows[1];
    world.Shutdown();
  }
}

// With the same final settings, autotuning on and off give the same bits at every step, for
// uncompressed and per-tensor methods: the settings decide how tensors are batched and
// pipelined, never how an element is reduced.
TEST(SettingsChangeTest, AutotuningChangesNoBitOfAnyResult) {
  for (const char* spec : {"none", "fp4:ef=1", "powersgd:rank=2"}) {
    SCOPED_TRACE(spec);
    RuntimeWorld tuned(Tuned(3));
    ASSERT_TRUE(tuned.InitOk());
    const Results a = RunSteps(tuned, spec, DataType::kFloat32, 45);
    auto h = tuned[0].SettingsHistory();
    ASSERT_TRUE(h.ok());
    ASSERT_FALSE(h->empty());
    RuntimeWorldOptions fixed_options = World(3, h->back().fusion_threshold_bytes);
    fixed_options.settings.set_ring_chunk_bytes(h->back().ring_chunk_bytes);
    fixed_options.settings.set_ring_window(h->back().ring_window);
    RuntimeWorld fixed(fixed_options);
    ASSERT_TRUE(fixed.InitOk());
    const Results b = RunSteps(fixed, spec, DataType::kFloat32, 45);
    for (size_t step = 0; step < a.size(); ++step) {
      for (int rank = 0; rank < 3; ++rank) {
        for (size_t l = 0; l < Layers().size(); ++l) {
          ASSERT_EQ(a[step][rank][l], b[step][rank][l])
              << Layers()[l].name << " step " << step << " rank " << rank;
        }
      }
    }
    tuned.Shutdown();
    fixed.Shutdown();
  }
}

// A step ends where a bucket of the whole world names a tensor already reduced since the
// last boundary; a change applies there, not where it arrived; samples go out per step with
// the epoch in force, until one step after the search ends.
TEST(SettingsChangeTest, StepBoundariesAreWhereANameComesBack) {
  absl::Time now = absl::UnixEpoch();
  std::vector<proto::TunedSettings> applied;
  std::vector<proto::TuningSample> samples;
  StepSettings::Hooks h;
  h.sample = true;
  h.apply = [&](const proto::TunedSettings& s) { applied.push_back(s); };
  h.report = [&](const proto::TuningSample& s) { samples.push_back(s); };
  h.all_reduce_bytes = [](const std::string& name) { return name == "a" ? 100 : 10; };
  h.clock = [&] { return now; };
  StepSettings steps(h);
  auto bucket = [](std::vector<std::string> names, int set = 0) {
    Bucket b;
    b.names = std::move(names);
    b.process_set_id = set;
    return b;
  };
  auto change = [](int64_t epoch, int window, bool done) {
    proto::ResponseList msg;
    msg.mutable_settings_change()->set_epoch(epoch);
    msg.mutable_settings_change()->mutable_settings()->set_ring_window(window);
    msg.mutable_settings_change()->set_tuning_done(done);
    return SettingsBucket(msg);
  };
  EXPECT_TRUE(steps.Before(bucket({"a", "b"})));
  EXPECT_EQ(steps.step(), 1);
  EXPECT_FALSE(steps.Before(change(1, 8, false))) << "a change is not run";
  now += absl::Milliseconds(5);
  EXPECT_TRUE(steps.Before(bucket({"c"})));
  EXPECT_TRUE(steps.Before(bucket({"a"}, /*set=*/3))) << "a process set's bucket: no boundary";
  Bucket refused = bucket({"a"});
  refused.error = absl::InvalidArgumentError("refused here alone");
  EXPECT_TRUE(steps.Before(refused)) << "an error bucket (perhaps this rank's alone): none";
  EXPECT_TRUE(applied.empty()) << "not inside a step";
  now += absl::Milliseconds(5);
  EXPECT_TRUE(steps.Before(bucket({"b"})));  // b again: step 2 begins
  EXPECT_EQ(steps.step(), 2);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_EQ(applied[0].ring_window(), 8);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].epoch(), 0);
  EXPECT_EQ(samples[0].step(), 1);
  EXPECT_EQ(samples[0].bytes(), 100 + 10 + 10) << "a, b and c, not the process set's";
  EXPECT_EQ(samples[0].micros(), 10000);
  // The search ends: one more sample (its first step), then none.
  EXPECT_FALSE(steps.Before(change(2, 4, true)));
  EXPECT_TRUE(steps.Before(bucket({"b"})));  // step 3, under epoch 2
  EXPECT_TRUE(steps.Before(bucket({"b"})));  // step 4
  EXPECT_TRUE(steps.Before(bucket({"b"})));  // step 5
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[1].epoch(), 1);
  EXPECT_EQ(samples[2].epoch(), 2);
  EXPECT_EQ(samples[2].step(), 3);
  const std::vector<SettingsApplied> history = steps.history();
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].step, 2);
  EXPECT_EQ(history[1].step, 3);
  EXPECT_TRUE(history[1].tuning_done);
}

TEST(StatisticsLedgerTest, TotalsAreTheSumsOfTheTensorRows) {
  EXPECT_EQ(ReferenceTransportBytes(1000, 4), 1500u);
  EXPECT_EQ(ReferenceTransportBytes(1000, 1), 0u);
  StatisticsLedger ledger;
  ledger.Record("b", "fp16", {1, 8, 4, 3, 8});
  ledger.Record("a", "fp16", {1, 80, 40, 30, 80});
  ledger.Record("a", "none", {1, 8, 8, 6, 8});
  ledger.Record("a", "fp16", {1, 80, 40, 31, 80});
  const CompressionReport r = ledger.Report();
  ASSERT_EQ(r.tensors.size(), 3u);
  EXPECT_EQ(r.tensors[0].name + "/" + r.tensors[0].method, "a/fp16");
  EXPECT_EQ(r.tensors[0].bytes.transport_bytes, 61u);
  EXPECT_EQ(r.tensors[1].name + "/" + r.tensors[1].method, "a/none");
  EXPECT_EQ(r.tensors[2].name + "/" + r.tensors[2].method, "b/fp16");
  const std::vector<MethodCompressionStats> totals = ledger.MethodTotals();
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[0].method, "fp16");
  EXPECT_EQ(totals[0].tensors, 2u);
  EXPECT_EQ(totals[0].bytes.reductions, 3u);
  EXPECT_EQ(totals[0].bytes.payload_bytes, 84u);
  EXPECT_EQ(totals[0].bytes.compression_ratio(), 168.0 / 84.0);
  EXPECT_EQ(totals[1].bytes.payload_bytes, 8u);
}

// A bucket's tensors for AllReducePipeline::Run, owning the names they view
// (AllReduceTensor::name is a view, so a temporary name would dangle during the run).
class TestBucket {
 public:
  // Tensor `name` of *count elements at input, its result to output.
  void Add(std::string name, const int64_t* count, const void* input, void* output) {
    names_.push_back(std::move(name));
    tensors_.push_back({names_.back(), absl::MakeConstSpan(count, 1), input, output});
  }
  absl::Span<const AllReduceTensor> tensors() const { return tensors_; }

 private:
  std::deque<std::string> names_;  // a deque: growing it leaves the viewed names in place
  std::vector<AllReduceTensor> tensors_;
};

// One fusion buffer for every bucket: grown when a bucket needs more, reused otherwise; a
// lone tensor whose dtype the compressor takes is reduced in its output, without it.
TEST(AllReducePipelineTest, OneGrowOnlyBufferServesEveryBucket) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger);
    const compression::CompressionMethod& none = stage.none();
    auto run = [&](const compression::CompressionMethod& m, DataType dt,
                   std::vector<std::vector<char>>& data, const std::vector<int64_t>& counts) {
      TestBucket bucket;
      for (size_t t = 0; t < data.size(); ++t) {
        bucket.Add("t" + std::to_string(t), &counts[t], data[t].data(), data[t].data());
      }
      return pipeline.Run(0, m, dt, ReduceOp::kSum, bucket.tensors(), comm);
    };
    std::vector<int64_t> lone = {1000};
    std::vector<std::vector<char>> one(1, std::vector<char>(4000));
    ASSERT_TRUE(run(none, DataType::kFloat32, one, lone).ok());
    EXPECT_EQ(pipeline.buffer().capacity(), 0u) << "a lone float32 tensor stays in place";
    std::vector<int64_t> two = {1000, 3000};
    std::vector<std::vector<char>> pair = {std::vector<char>(4000), std::vector<char>(12000)};
    ASSERT_TRUE(run(none, DataType::kFloat32, pair, two).ok());
    const size_t capacity = pipeline.buffer().capacity();
    const char* where = pipeline.buffer().data();
    EXPECT_GE(capacity, 16000u);
    std::vector<int64_t> small = {10, 20, 30};
    std::vector<std::vector<char>> three = {std::vector<char>(40), std::vector<char>(80),
                                            std::vector<char>(120)};
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(run(none, DataType::kFloat32, three, small).ok());
    EXPECT_EQ(pipeline.buffer().capacity(), capacity);
    EXPECT_EQ(pipeline.buffer().data(), where) << "reused, not reallocated";
    // A lone float16 tensor under fp4 is converted into the buffer (float32: 4 bytes each).
    std::vector<int64_t> big = {static_cast<int64_t>(capacity / 2)};
    std::vector<std::vector<char>> halves(1, std::vector<char>(capacity));
    ASSERT_TRUE(run(*stage.Resolve("fp4").value(), DataType::kFloat16, halves, big).ok());
    EXPECT_GE(pipeline.buffer().capacity(), 2 * capacity) << "grown";
  });
}

// Note [In place], directly: a bucket that lies back to back (in place, or read out of
// place from inputs that do) never touches the fusion buffer; one tensor out of line, or
// inputs overlapping the outputs, and it is packed. Every layout gives the same sums.
TEST(AllReducePipelineTest, OnlyABucketThatLiesBackToBackSkipsTheBuffer) {
  testing::RunLocalWorld(2, {}, [](int rank, transport::Communicator& comm) {
    compression::CompressionStage stage(compression::StageOptions{});
    StatisticsLedger ledger;
    AllReducePipeline pipeline(&stage, &ledger);
    const std::vector<int64_t> counts = {3, 5, 0, 8};
    constexpr size_t kTotal = 16;
    // Runs one bucket over float32 tensors at in + offsets[t] (results to out + offsets[t]),
    // each holding rank + t + i / 8; returns the fusion counters it added.
    auto run = [&](float* in, float* out, const std::vector<size_t>& offsets) {
      const FusionStats before = ledger.Report().fusion;
      TestBucket bucket;
      for (size_t t = 0; t < counts.size(); ++t) {
        for (int64_t i = 0; i < counts[t]; ++i) in[offsets[t] + i] = rank + t + i / 8.0f;
        bucket.Add("t" + std::to_string(t), &counts[t], in + offsets[t], out + offsets[t]);
      }
      EXPECT_TRUE(pipeline.Run(0, stage.none(), DataType::kFloat32, ReduceOp::kSum,
                               bucket.tensors(), comm).ok());
      for (size_t t = 0; t < counts.size(); ++t) {
        for (int64_t i = 0; i < counts[t]; ++i) {
          EXPECT_EQ(out[offsets[t] + i], 1 + 2 * (t + i / 8.0f)) << "t" << t << "[" << i << "]";
        }
      }
      FusionStats after = ledger.Report().fusion;
      after.buckets -= before.buckets;
      after.packed_buckets -= before.packed_buckets;
      after.packed_bytes -= before.packed_bytes;
      after.in_place_bytes -= before.in_place_bytes;
      return after;
    };
    const std::vector<size_t> back_to_back = {0, 3, 8, 8};
    std::vector<float> a(2 * kTotal), b(2 * kTotal);
    FusionStats f = run(a.data(), a.data(), back_to_back);
    EXPECT_EQ(f.buckets, 1u);
    EXPECT_EQ(f.packed_buckets, 0u);
    EXPECT_EQ(f.in_place_bytes, kTotal * 4);
    f = run(a.data(), b.data(), back_to_back);  // none reads out of place
    EXPECT_EQ(f.packed_buckets, 0u);
    EXPECT_EQ(pipeline.buffer().capacity(), 0u) << "the fusion buffer was never needed";
    // The last tensor one element out of line: packed.
    f = run(a.data(), a.data(), {0, 3, 8, 9});
    EXPECT_EQ(f.packed_buckets, 1u);
    EXPECT_EQ(f.packed_bytes, kTotal * 4);
    EXPECT_GT(pipeline.buffer().capacity(), 0u);
    // Out of place over inputs that overlap the outputs (shifted by one element): packed,
    // so every input is read before any output is written.
    f = run(a.data(), a.data() + 1, back_to_back);
    EXPECT_EQ(f.packed_buckets, 1u);
    // Out of place where the compressor reads in place only (fp4 takes its input in the
    // view): packed, nothing converted either way.
    TestBucket bucket;
    for (size_t t = 0; t < counts.size(); ++t) {
      bucket.Add("q" + std::to_string(t), &counts[t], a.data() + back_to_back[t],
                 b.data() + back_to_back[t]);
    }
    const FusionStats before = ledger.Report().fusion;
    ASSERT_TRUE(pipeline.Run(1, *stage.Resolve("fp4").value(), DataType::kFloat32,
                             ReduceOp::kSum, bucket.tensors(), comm).ok());
    EXPECT_EQ(ledger.Report().fusion.packed_buckets, before.packed_buckets + 1);
  });
}

}  // namespace
}  // namespace braid
