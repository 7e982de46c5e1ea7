// Note [Devices] (device/device.h): the host device's memory work, the registry, and the
// device path through braid::Runtime with several ranks as threads, driven by a host-backed
// test device that reports itself as a GPU and counts what it is asked to do
// (tests/testing/test_device.h): a device-type mismatch across ranks, CPU and device
// tensors of one step in different buckets, every byte moved through the device, a device
// the runtime lacks refused on every rank.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/half.h"
#include "device/device.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/fake_nccl.h"
#include "tests/testing/runtime_world.h"
#include "tests/testing/test_device.h"

namespace braid {
namespace {

using testing::RuntimeWorld;
using testing::RuntimeWorldOptions;
using testing::TestDevice;

TEST(HostDeviceTest, ConvertsToAndFromFloat32) {
  device::Device& host = device::HostDevice();
  const std::vector<float> values = {0.0f, -1.5f, 3.140625f, 65504.0f, 1e-3f};
  std::vector<uint16_t> half(values.size()), bf16(values.size());
  std::vector<double> wide(values.size());
  std::vector<float> back(values.size());
  ASSERT_TRUE(host.Convert(half.data(), DataType::kFloat16, values.data(), DataType::kFloat32,
                           values.size(), nullptr).ok());
  ASSERT_TRUE(host.Convert(bf16.data(), DataType::kBFloat16, values.data(),
                           DataType::kFloat32, values.size(), nullptr).ok());
  ASSERT_TRUE(host.Convert(wide.data(), DataType::kFloat64, values.data(), DataType::kFloat32,
                           values.size(), nullptr).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(half[i], FloatToFloat16(values[i])) << i;
    EXPECT_EQ(bf16[i], FloatToBFloat16(values[i])) << i;
    EXPECT_EQ(wide[i], static_cast<double>(values[i])) << i;
  }
  ASSERT_TRUE(host.Convert(back.data(), DataType::kFloat32, half.data(), DataType::kFloat16,
                           half.size(), nullptr).ok());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(back[i], Float16ToFloat(half[i])) << i;
  absl::Status s = host.Convert(back.data(), DataType::kInt32, values.data(),
                                DataType::kFloat32, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "no conversion from float32 to int32");
}

TEST(HostDeviceTest, FillsTheIdentityOfEachOp) {
  device::Device& host = device::HostDevice();
  std::vector<int32_t> ints(3, 7);
  ASSERT_TRUE(host.FillIdentity(ints.data(), 3, DataType::kInt32, ReduceOp::kMin, nullptr).ok());
  EXPECT_EQ(ints, std::vector<int32_t>(3, std::numeric_limits<int32_t>::max()));
  ASSERT_TRUE(host.FillIdentity(ints.data(), 3, DataType::kInt32, ReduceOp::kProduct, nullptr).ok());
  EXPECT_EQ(ints, std::vector<int32_t>(3, 1));
  std::vector<float> floats(2, 7.0f);
  ASSERT_TRUE(host.FillIdentity(floats.data(), 2, DataType::kFloat32, ReduceOp::kMax, nullptr).ok());
  EXPECT_EQ(floats[1], -std::numeric_limits<float>::infinity());
  ASSERT_TRUE(host.FillIdentity(floats.data(), 2, DataType::kFloat32, ReduceOp::kAverage, nullptr).ok());
  EXPECT_EQ(floats, std::vector<float>(2, 0.0f));
}

TEST(DeviceRegistryTest, HasTheHostAndRefusesATypeWithoutADevice) {
  device::DeviceRegistry registry;
  EXPECT_EQ(*registry.Get(DeviceRef{}), &device::HostDevice());
  EXPECT_EQ(registry.Get(DeviceRef{DeviceType::kCPU, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = registry.Get(DeviceRef{DeviceType::kCUDA, 1}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), "cuda:1 tensors: this braid has no cuda device"))
      << s;
  TestDevice gpu;
  EXPECT_EQ(*testing::RegistryWith(&gpu)->Get(DeviceRef{DeviceType::kCUDA, 1}), &gpu);
}

// A CUDA build on a machine without the NVIDIA driver (CI's) says there is no driver, not
// that the driver's version is insufficient (what the CUDA runtime reports then).
TEST(DeviceRegistryTest, ACudaBuildWithoutADriverSaysSo) {
  auto registry = device::MakeDefaultDevices(/*allow_unverified_cuda=*/true);
  if (!registry->Has(DeviceType::kCUDA)) GTEST_SKIP() << "built without CUDA";
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(driver);
    GTEST_SKIP() << "an NVIDIA driver is here";
  }
  absl::Status s = registry->Get(DeviceRef{DeviceType::kCUDA, 0}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "cuda:0 tensors: no NVIDIA driver here (libcuda.so.1 cannot be loaded)");
}

// One test device per rank, registered as that rank's GPUs.
struct Devices {
  explicit Devices(int n) {
    for (int r = 0; r < n; ++r) gpus.push_back(std::make_unique<TestDevice>());
  }
  RuntimeWorldOptions World(int64_t fusion_threshold = int64_t{64} << 20) {
    RuntimeWorldOptions o;
    o.size = static_cast<int>(gpus.size());
    o.settings.set_fusion_threshold_bytes(fusion_threshold);
    o.devices = [this](int rank) { return testing::RegistryWith(gpus[rank].get()); };
    return o;
  }
  std::vector<std::unique_ptr<TestDevice>> gpus;
};

CollectiveRequest AllReduce(const std::string& name, std::vector<float>& in,
                            std::vector<float>& out, DeviceRef device) {
  CollectiveRequest r;
  r.name = name;
  r.dtype = DataType::kFloat32;
  r.shape = {static_cast<int64_t>(in.size())};
  r.input = in.data();
  r.output = out.data();
  r.op = ReduceOp::kSum;
  r.device = device;
  return r;
}

constexpr DeviceRef kCpu{};
DeviceRef Cuda(int rank) { return DeviceRef{DeviceType::kCUDA, rank}; }

// Rank r on cuda:r is normal; a CPU tensor on one rank and a GPU one on another is
// InvalidArgument on every rank, naming both, well within 2 s.
TEST(DevicePathTest, ATypeMismatchAcrossRanksFailsOnEveryRankNamingBoth) {
  Devices devices(3);
  RuntimeWorld world(devices.World());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> in(4, 1.0f), out(4);
    const absl::Time start = absl::Now();
    auto h = rt.Enqueue(AllReduce("w", in, out, rank == 1 ? kCpu : Cuda(rank)));
    ASSERT_TRUE(h.ok()) << h.status();
    absl::Status s = (*h)->Wait(absl::Seconds(2));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "rank " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << rank << ": " << s;
    EXPECT_EQ(s.message(),
              "tensor 'w': device differs across ranks: cuda on ranks 0, 2; cpu on rank 1")
        << "rank " << rank;
    // The job goes on: the same name, placed alike, works.
    auto again = rt.Enqueue(AllReduce("w", in, out, rank == 1 ? Cuda(1) : Cuda(rank)));
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE((*again)->Wait(absl::Seconds(30)).ok()) << "rank " << rank;
    EXPECT_EQ(out, std::vector<float>(4, 3.0f));
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// Four tensors of one step, in one group so they are ready together: two in host memory,
// two on the rank's GPU. They fuse by device: two buckets; the device's bucket is packed
// (its tensors lie apart) in its own fusion buffer, so the device copies exactly its two
// tensors' bytes in and out, and waits once for each tensor's ready event.
TEST(DevicePathTest, CpuAndDeviceTensorsOfOneStepLandInDifferentBuckets) {
  Devices devices(2);
  RuntimeWorld world(devices.World());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<std::vector<float>> in, out;
    for (int t = 0; t < 4; ++t) {
      in.emplace_back(5 + t, static_cast<float>(rank + 10 * t));
      out.emplace_back(5 + t, -1.0f);
    }
    const uint64_t before = rt.compression_report().value().fusion.buckets;
    rt.BeginGroup();
    std::vector<std::shared_ptr<Handle>> handles;
    for (int t = 0; t < 4; ++t) {
      auto h = rt.Enqueue(AllReduce(absl::StrCat("t", t), in[t], out[t],
                                    t % 2 == 0 ? kCpu : Cuda(rank)));
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    ASSERT_TRUE(rt.EndGroup().ok());
    for (auto& h : handles) ASSERT_TRUE(h->Wait(absl::Seconds(30)).ok()) << "rank " << rank;
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(out[t], std::vector<float>(5 + t, 1.0f + 20 * t)) << "t" << t;
    }
    EXPECT_EQ(rt.compression_report().value().fusion.buckets - before, 2u) << "rank " << rank;
    const TestDevice& gpu = *devices.gpus[rank];
    EXPECT_EQ(gpu.moved_bytes(), 2 * (6 + 8) * 4) << "rank " << rank;
    EXPECT_EQ(gpu.events_recorded, 2);
    EXPECT_EQ(gpu.events_waited, 2);
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// A device bucket that lies contiguously is reduced where it lies: nothing moves.
TEST(DevicePathTest, AContiguousDeviceBucketMovesNoBytes) {
  Devices devices(2);
  RuntimeWorld world(devices.World());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> flat(12, 1.0f + rank);
    rt.BeginGroup();
    std::vector<std::shared_ptr<Handle>> handles;
    for (int t = 0; t < 3; ++t) {
      CollectiveRequest r;
      r.name = absl::StrCat("g", t);
      r.shape = {4};
      r.input = r.output = flat.data() + 4 * t;
      r.op = ReduceOp::kSum;
      r.device = Cuda(rank);
      auto h = rt.Enqueue(r);
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    ASSERT_TRUE(rt.EndGroup().ok());
    for (auto& h : handles) ASSERT_TRUE(h->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(flat, std::vector<float>(12, 3.0f));
    EXPECT_EQ(devices.gpus[rank]->moved_bytes(), 0) << "rank " << rank;
    EXPECT_EQ(devices.gpus[rank]->allocations, 0) << "no fusion buffer on the device";
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// A runtime without a device of the type (this build's default on a machine without CUDA)
// refuses the tensor at enqueue, and the other ranks' same collective fails with the reason.
TEST(DevicePathTest, ADeviceTheRuntimeLacksIsRefusedOnEveryRank) {
  RuntimeWorldOptions o;
  o.size = 2;
  o.devices = [](int) { return std::make_shared<device::DeviceRegistry>(); };
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> in(4, 1.0f), out(4);
    auto h = rt.Enqueue(AllReduce("x", in, out, rank == 0 ? Cuda(0) : kCpu));
    absl::Status s = h.ok() ? (*h)->Wait(absl::Seconds(10)) : h.status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "rank " << rank << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "cuda:0 tensors: this braid has no cuda device"))
        << "rank " << rank << ": " << s;
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// Note [Host staging] (runtime/allreduce_pipeline.h): tensors on a device whose memory the
// host cannot read. The test device scrambles its memory, so any host code that read or
// wrote it directly, rather than through the device's copies, would leave wrong values.

// Device memory of `values`, through the device's own copy.
device::DeviceMemory OnDevice(TestDevice& gpu, const void* values, size_t bytes) {
  auto memory = gpu.Allocate(std::max<size_t>(bytes, 1), 64);
  EXPECT_TRUE(memory.ok()) << memory.status();
  EXPECT_TRUE(gpu.CopyFromHost(memory->data(), values, bytes, nullptr).ok());
  return *std::move(memory);
}
std::vector<char> FromDevice(TestDevice& gpu, const void* data, size_t bytes) {
  std::vector<char> host(bytes);
  EXPECT_TRUE(gpu.CopyToHost(host.data(), data, bytes, nullptr).ok());
  return host;
}

// One step's tensors, the same on both sides of a comparison: a matrix (PowerSGD compresses
// it), a vector, a short one (under every method's minimum size) and a float16 one (its own
// bucket, converted to float32 and back by the device for the methods that take float32).
struct StagedTensor {
  std::string name;
  std::vector<int64_t> shape;
  DataType dtype;
};
const std::vector<StagedTensor>& StagedTensors() {
  static const auto* const kTensors = new std::vector<StagedTensor>{
      {"layer.weight", {48, 32}, DataType::kFloat32},
      {"layer.bias", {1000}, DataType::kFloat32},
      {"scale", {5}, DataType::kFloat32},
      {"half", {96}, DataType::kFloat16}};
  return *kTensors;
}

// The bytes of tensor `t` on `rank` at `step`: values that differ by rank, step and place.
std::vector<char> StagedInput(const StagedTensor& t, int rank, int step) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::vector<char> bytes(n * DataTypeSize(t.dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::sin(0.37f * static_cast<float>(i + 1) * static_cast<float>(rank + 2) +
                             static_cast<float>(step)) *
                    (1.0f + 0.25f * static_cast<float>(rank));
    if (t.dtype == DataType::kFloat16) {
      const uint16_t h = FloatToFloat16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  return bytes;
}

// Runs `steps` steps of StagedTensors() under `method` (average) at `size` ranks, on the host
// or on a scrambled test device, and returns every rank's outputs of every step back to back.
std::vector<std::vector<char>> RunStaged(const std::string& method, int size, bool on_device,
                                         int steps = 3) {
  Devices devices(size);
  for (auto& gpu : devices.gpus) gpu->scrambled = true;
  RuntimeWorldOptions o = devices.World();
  if (!on_device) o.devices = nullptr;
  // Staged whatever the method: uncompressed buckets too (under `auto` they would go to
  // NCCL, Note [GPU data planes]).
  o.settings.set_gpu_data_plane(2);
  RuntimeWorld world(o);
  EXPECT_TRUE(world.InitOk());
  std::vector<std::vector<char>> results(size);
  world.Run([&](int rank, Runtime& rt) {
    TestDevice& gpu = *devices.gpus[rank];
    for (int step = 0; step < steps; ++step) {
      std::vector<std::vector<char>> in, out;
      std::vector<device::DeviceMemory> dev_in, dev_out;
      rt.BeginGroup();
      std::vector<std::shared_ptr<Handle>> handles;
      for (const StagedTensor& t : StagedTensors()) {
        in.push_back(StagedInput(t, rank, step));
        out.emplace_back(in.back().size(), 0);
        CollectiveRequest r;
        r.name = t.name;
        r.dtype = t.dtype;
        r.shape = t.shape;
        r.op = ReduceOp::kAverage;
        r.compression = method;
        if (on_device) {
          dev_in.push_back(OnDevice(gpu, in.back().data(), in.back().size()));
          dev_out.push_back(OnDevice(gpu, out.back().data(), out.back().size()));
          r.input = dev_in.back().data();
          r.output = dev_out.back().data();
          r.device = Cuda(rank);
        } else {
          r.input = in.back().data();
          r.output = out.back().data();
        }
        auto h = rt.Enqueue(r);
        ASSERT_TRUE(h.ok()) << h.status();
        handles.push_back(*h);
      }
      ASSERT_TRUE(rt.EndGroup().ok());
      for (auto& h : handles) {
        const absl::Status s = h->Wait(absl::Seconds(60));
        ASSERT_TRUE(s.ok()) << method << ", rank " << rank << ", step " << step << ": " << s;
      }
      for (size_t i = 0; i < out.size(); ++i) {
        const std::vector<char> bytes =
            on_device ? FromDevice(gpu, dev_out[i].data(), out[i].size()) : out[i];
        results[rank].insert(results[rank].end(), bytes.begin(), bytes.end());
      }
    }
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
  return results;
}

// Every compressed method, at 2 and 4 ranks, over three steps (error feedback and PowerSGD's
// warm start carry state between them): the tensors on a device the host cannot read give
// the same bits as the same tensors in host memory, on every rank.
class HostStagingTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(HostStagingTest, GivesTheBitsOfTheHostPipeline) {
  const auto& [method, size] = GetParam();
  const std::vector<std::vector<char>> host = RunStaged(method, size, /*on_device=*/false);
  const std::vector<std::vector<char>> staged = RunStaged(method, size, /*on_device=*/true);
  ASSERT_EQ(host.size(), staged.size());
  for (int rank = 0; rank < size; ++rank) {
    ASSERT_EQ(host[rank].size(), staged[rank].size()) << "rank " << rank;
    EXPECT_TRUE(host[rank] == staged[rank]) << method << ": rank " << rank << " differs";
    EXPECT_TRUE(staged[rank] == staged[0]) << method << ": rank " << rank << " differs from 0";
  }
  // Not a comparison of zeros, nor of untouched inputs: the all-reduce did something (a
  // sparsifier with ratio 10 leaves about 90% of the elements zero).
  std::vector<char> inputs;
  for (int step = 0; step < 3; ++step) {
    for (const StagedTensor& t : StagedTensors()) {
      const std::vector<char> in = StagedInput(t, 0, step);
      inputs.insert(inputs.end(), in.begin(), in.end());
    }
  }
  EXPECT_TRUE(inputs != staged[0]) << method;
  int nonzero = 0;
  for (char c : staged[0]) nonzero += c != 0;
  EXPECT_GT(nonzero, static_cast<int>(staged[0].size() / 20)) << method;
}

INSTANTIATE_TEST_SUITE_P(
    EveryMethod, HostStagingTest,
    ::testing::Combine(::testing::Values("none", "fp16", "bf16", "fp4:ef=1", "int4",
                                         "powersgd:rank=2", "scalecomp:ratio=10",
                                         "topk:ratio=10", "randomk:ratio=10"),
                       ::testing::Values(2, 4)),
    [](const auto& info) {
      std::string name = absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param),
                                      "ranks");
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// A staged bucket crosses to the host and back once: a lone tensor of 4 floats is packed on
// the device (16 bytes), copied out (16) and back (16) and unpacked (16); its compression
// state, if any, stays on the host (the device allocates only its fusion buffer).
TEST(DevicePathTest, AStagedBucketCrossesToTheHostOnceEachWay) {
  Devices devices(2);
  for (auto& gpu : devices.gpus) gpu->scrambled = true;
  RuntimeWorld world(devices.World());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    TestDevice& gpu = *devices.gpus[rank];
    const std::vector<float> in(4, rank == 0 ? 2.0f : 0.0f);
    device::DeviceMemory din = OnDevice(gpu, in.data(), 16), dout = OnDevice(gpu, in.data(), 16);
    const int64_t before = gpu.moved_bytes(), allocations = gpu.allocations;
    std::vector<float> unused(4);
    CollectiveRequest r = AllReduce("w", unused, unused, Cuda(rank));
    r.input = din.data();
    r.output = dout.data();
    r.compression = "fp4:ef=1";
    r.op = ReduceOp::kAverage;
    auto h = rt.Enqueue(r);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << "rank " << rank;
    EXPECT_EQ(gpu.moved_bytes() - before, 4 * 16) << "rank " << rank;
    EXPECT_EQ(gpu.allocations - allocations, 1) << "rank " << rank << ": the fusion buffer";
    std::vector<char> bytes = FromDevice(gpu, dout.data(), 16);
    std::vector<float> got(4);
    std::memcpy(got.data(), bytes.data(), 16);
    // Exact under fp4 (powers of 4 times a power-of-two scale): the average of 2 and 0.
    EXPECT_EQ(got, std::vector<float>(4, 1.0f)) << "rank " << rank;
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// Note [GPU data planes] (runtime/device_planes.h), through the NCCL test double: GPU
// tensors (a test device the host data plane may not carry, its memory plain host memory
// for the double to reduce, as a GPU's is NCCL's).
struct NcclWorldSetup {
  explicit NcclWorldSetup(int n, int64_t setting = 0) : devices(n) {
    for (auto& gpu : devices.gpus) gpu->readable_from_host = false;
    options = devices.World();
    options.settings.set_gpu_data_plane(setting);
    options.nccl = [this](int rank) -> NcclProvider {
      return [this, rank]() -> absl::StatusOr<transport::NcclApi*> {
        if (lacking_rank == rank) return absl::FailedPreconditionError("no libnccl.so.2 here");
        return &fake;
      };
    };
  }
  Devices devices;
  testing::FakeNccl fake;
  int lacking_rank = -1;
  RuntimeWorldOptions options;
};

// One step: three tensors of cuda:<rank> under `method` (average), fused into one bucket,
// and one CPU tensor; returns the status of each handle (all must succeed for the values).
std::vector<absl::Status> GpuStep(Runtime& rt, int rank, int size, const std::string& method,
                                  float scale = 1.0f) {
  std::vector<std::vector<float>> in, out;
  for (int t = 0; t < 4; ++t) {
    in.emplace_back(10 + t, scale * static_cast<float>(rank + 10 * t));
    out.emplace_back(10 + t, -1.0f);
  }
  rt.BeginGroup();
  std::vector<std::shared_ptr<Handle>> handles;
  for (int t = 0; t < 4; ++t) {
    CollectiveRequest r = AllReduce(absl::StrCat("g", t), in[t], out[t], t == 3 ? kCpu : Cuda(rank));
    r.op = ReduceOp::kAverage;
    r.compression = method;
    auto h = rt.Enqueue(r);
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) handles.push_back(*h);
  }
  EXPECT_TRUE(rt.EndGroup().ok());
  std::vector<absl::Status> statuses;
  for (auto& h : handles) statuses.push_back(h->Wait(absl::Seconds(30)));
  bool all_ok = true;
  for (const absl::Status& s : statuses) all_ok = all_ok && s.ok();
  if (all_ok) {
    const float mean_rank = static_cast<float>(size - 1) / 2;
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(out[t], std::vector<float>(10 + t, scale * (mean_rank + 10 * t)))
          << method << ", tensor " << t << ", rank " << rank;
    }
  }
  return statuses;
}

// Under `auto` with a GPU each: an uncompressed GPU bucket goes over NCCL (one NCCL
// all-reduce per rank: the bucket is fused), a compressed one through the host, the CPU
// tensor over the host plane; the NCCL communicator is made once, at the first bucket.
TEST(GpuDataPlaneTest, UncompressedGpuBucketsTravelNccl) {
  NcclWorldSetup w(3);
  RuntimeWorld world(w.options);
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    for (const absl::Status& s : GpuStep(rt, rank, 3, "none")) EXPECT_TRUE(s.ok()) << s;
    for (const absl::Status& s : GpuStep(rt, rank, 3, "none", 2.0f)) EXPECT_TRUE(s.ok()) << s;
  });
  EXPECT_EQ(w.fake.calls("AllReduce"), 2 * 3);
  const int64_t nccl_calls = w.fake.calls("AllReduce");
  world.Run([&](int rank, Runtime& rt) {
    for (const absl::Status& s : GpuStep(rt, rank, 3, "fp16")) EXPECT_TRUE(s.ok()) << s;
  });
  EXPECT_EQ(w.fake.calls("AllReduce"), nccl_calls) << "fp16 is staged through the host";
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// NCCL cannot run two ranks on one GPU: under `auto` their GPU buckets are staged through
// the host instead (every rank alike, NCCL never started); under `nccl` the bucket fails on
// every rank, naming the ranks, and the job goes on (CPU tensors still reduce).
TEST(GpuDataPlaneTest, RanksSharingAGpuAreStagedUnderAutoAndRefusedUnderNccl) {
  for (int64_t setting : {0, 1}) {
    NcclWorldSetup w(3, setting);
    w.devices.gpus[0]->shared_identity = "GPU-same";
    w.devices.gpus[2]->shared_identity = "GPU-same";
    RuntimeWorld world(w.options);
    ASSERT_TRUE(world.InitOk());
    world.Run([&](int rank, Runtime& rt) {
      std::vector<absl::Status> statuses = GpuStep(rt, rank, 3, "none");
      for (int t = 0; t < 4; ++t) {
        if (setting == 0 || t == 3) {
          EXPECT_TRUE(statuses[t].ok()) << statuses[t];
          continue;
        }
        EXPECT_EQ(statuses[t].code(), absl::StatusCode::kFailedPrecondition) << statuses[t];
        EXPECT_TRUE(absl::StartsWith(statuses[t].message(),
                                     "allreduce of tensors 'g0', 'g1', 'g2' (bucket "))
            << statuses[t];
        EXPECT_TRUE(absl::EndsWith(statuses[t].message(),
                                   "): cuda:0 tensors: BRAID_GPU_DATA_PLANE=nccl, but ranks 0, 2 "
                                   "share one GPU (GPU-same), which NCCL cannot run"))
            << "rank " << rank << ": " << statuses[t];
      }
    });
    EXPECT_EQ(w.fake.calls("AllReduce"), 0) << setting;
    for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
  }
}

// A rank whose NCCL does not load: `auto` stages, `nccl` fails naming the rank and why.
TEST(GpuDataPlaneTest, ARankWithoutNcclIsNamed) {
  for (int64_t setting : {0, 1}) {
    NcclWorldSetup w(2, setting);
    w.lacking_rank = 1;
    RuntimeWorld world(w.options);
    ASSERT_TRUE(world.InitOk());
    world.Run([&](int rank, Runtime& rt) {
      std::vector<absl::Status> statuses = GpuStep(rt, rank, 2, "none");
      if (setting == 0) {
        for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
      } else {
        EXPECT_TRUE(absl::EndsWith(statuses[0].message(),
                                   "): cuda:0 tensors: BRAID_GPU_DATA_PLANE=nccl, but rank 1 "
                                   "cannot run NCCL (rank 1: no libnccl.so.2 here)"))
            << statuses[0];
      }
    });
    EXPECT_EQ(w.fake.calls("AllReduce"), 0);
    for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
  }
}

// `host` stages every GPU bucket; NCCL is never asked.
TEST(GpuDataPlaneTest, HostStagesEveryGpuBucket) {
  NcclWorldSetup w(2, /*setting=*/2);
  RuntimeWorld world(w.options);
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    for (const absl::Status& s : GpuStep(rt, rank, 2, "none")) EXPECT_TRUE(s.ok()) << s;
  });
  EXPECT_EQ(w.fake.calls("AllReduce"), 0);
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// An asynchronous NCCL error on one rank (after the communicator is made) fails that GPU
// bucket on every rank within the bounds: that rank with the error, the others with NCCL's
// remote error once its abort closed its connections; every later GPU bucket fails at once
// with the same error, and CPU tensors still reduce.
TEST(GpuDataPlaneTest, AnNcclErrorReachesEveryRank) {
  NcclWorldSetup w(3);
  RuntimeWorld world(w.options);
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    for (const absl::Status& s : GpuStep(rt, rank, 3, "none")) EXPECT_TRUE(s.ok()) << s;
  });
  w.fake.InjectAsyncError(1, absl::InternalError("unhandled system error (injected)"));
  const absl::Time start = absl::Now();
  std::vector<absl::Status> first(3);
  world.Run([&](int rank, Runtime& rt) {
    std::vector<absl::Status> statuses = GpuStep(rt, rank, 3, "none");
    EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "rank " << rank;
    first[rank] = statuses[0];
    for (int t = 0; t < 3; ++t) EXPECT_FALSE(statuses[t].ok()) << "rank " << rank;
    EXPECT_TRUE(statuses[3].ok()) << statuses[3];
    EXPECT_TRUE(absl::StartsWith(statuses[0].message(), "allreduce of tensors 'g0', 'g1', 'g2'"))
        << "the bucket's tensors are named: " << statuses[0];
    if (rank == 1) {
      EXPECT_EQ(statuses[0].code(), absl::StatusCode::kInternal) << statuses[0];
      EXPECT_TRUE(absl::StrContains(statuses[0].message(), "(injected)")) << statuses[0];
    } else {
      EXPECT_EQ(statuses[0].code(), absl::StatusCode::kUnavailable) << statuses[0];
    }
    // Later GPU buckets repeat the first error at once (naming their own bucket); CPU
    // tensors reduce.
    std::vector<absl::Status> again = GpuStep(rt, rank, 3, "none");
    const auto reason = [](const absl::Status& s) {
      const size_t at = s.message().find("): ");
      return at == absl::string_view::npos ? s.message() : s.message().substr(at);
    };
    EXPECT_EQ(again[0].code(), statuses[0].code()) << "rank " << rank;
    EXPECT_EQ(reason(again[0]), reason(statuses[0])) << "rank " << rank;
    EXPECT_NE(reason(again[0]), again[0].message()) << again[0];
    EXPECT_TRUE(again[3].ok()) << again[3];
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(w.fake.aborts(r), 1) << r;
  world.Shutdown();
}

// NCCL runs one GPU per rank: rank 1's communicator is made on its cuda:0 at the first
// bucket; its next uncompressed bucket on cuda:1 cannot join its peers' NCCL call, so the
// job ends on every rank well within the timeout (rank 1 naming both GPUs, rank 0 with
// NCCL's remote error once rank 1's communicator is aborted), never a hang or a shifted
// result.
TEST(GpuDataPlaneTest, ABucketOnAnotherGpuOfARankEndsTheJob) {
  NcclWorldSetup w(2);
  TestDevice second(DeviceRef{DeviceType::kCUDA, 1});
  second.readable_from_host = false;
  w.options.devices = [&](int rank) {
    auto registry = std::make_shared<device::DeviceRegistry>();
    TestDevice* first = w.devices.gpus[rank].get();
    registry->Add(DeviceType::kCUDA, [first, &second, rank](int32_t id)
                                          -> absl::StatusOr<device::Device*> {
      if (rank == 1 && id == 1) return &second;
      return first;
    });
    return std::shared_ptr<const device::DeviceRegistry>(registry);
  };
  RuntimeWorld world(w.options);
  ASSERT_TRUE(world.InitOk());
  const absl::Time start = absl::Now();
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> in(8, 1.0f), out(8);
    auto first = rt.Enqueue(AllReduce("a", in, out, Cuda(0)));
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->Wait(absl::Seconds(30)).ok()) << "rank " << rank;
    auto h = rt.Enqueue(AllReduce("b", in, out, Cuda(rank)));  // rank 1: its cuda:1
    const absl::Status s = h.ok() ? (*h)->Wait(absl::Seconds(30)) : h.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "rank " << rank;
    if (rank == 1) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_TRUE(absl::StrContains(
          s.message(), "cuda:1 tensors: this rank's NCCL communicator is on cuda:0"))
          << s;
    } else {
      EXPECT_FALSE(s.ok()) << "rank 0 must not complete 'b' without rank 1";
    }
  });
  EXPECT_EQ(w.fake.calls("AllReduce"), 2 + 1);
  world.Shutdown();
}

// A rank whose communicator fails to be created (its own error: the others made theirs and
// wait for it) fails the bucket with that error and ends the job; the peers' creation ends
// at the timeout. Every rank's bucket fails within the timeout and a margin, none hangs.
TEST(GpuDataPlaneTest, ACreationThatFailsOnOneRankFailsEveryRankWithinTheTimeout) {
  NcclWorldSetup w(3);
  w.options.timeout = absl::Seconds(2);
  w.fake.FailNextCall("CommInitRank",
                      absl::InternalError("ncclCommInitRankConfig: unhandled cuda error (injected)"));
  RuntimeWorld world(w.options);
  ASSERT_TRUE(world.InitOk());
  const absl::Time start = absl::Now();
  std::vector<absl::Status> first(3);
  world.Run([&](int rank, Runtime& rt) {
    first[rank] = GpuStep(rt, rank, 3, "none")[0];
    EXPECT_LT(absl::Now() - start, absl::Seconds(2 + 8)) << "rank " << rank;
  });
  int failed_here = 0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(first[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::StartsWith(first[r].message(), "allreduce of tensors 'g0', 'g1', 'g2'"))
        << first[r];
    if (absl::StrContains(first[r].message(), "(injected)")) {
      ++failed_here;
      EXPECT_EQ(first[r].code(), absl::StatusCode::kInternal) << first[r];
    }
  }
  EXPECT_EQ(failed_here, 1) << "one rank's creation failed; the others' timed out";
  // The job has ended on every rank, the failed one too: the next step fails at once, never
  // a wait for peers that stopped.
  world.Run([&](int rank, Runtime& rt) {
    const absl::Time again = absl::Now();
    for (const absl::Status& s : GpuStep(rt, rank, 3, "none")) {
      EXPECT_FALSE(s.ok()) << "rank " << rank;
    }
    EXPECT_LT(absl::Now() - again, absl::Seconds(1)) << "rank " << rank;
  });
  world.Shutdown();
}

CollectiveRequest Compressed(const std::string& name, std::vector<float>& in,
                             std::vector<float>& out, int rank) {
  CollectiveRequest r = AllReduce(name, in, out, Cuda(rank));
  r.op = ReduceOp::kAverage;
  r.compression = "fp4:ef=1";
  return r;
}

// A compressor keeps its state on the tensor's device (Note [Compression state on the
// device], compression/state_array.h): the error-feedback residual of a lone device tensor
// (reduced where it lies: no fusion buffer) is the device's one allocation, and a
// checkpoint copies exactly its bytes from the device to the host.
TEST(DevicePathTest, CompressionStateLivesOnTheDeviceAndCheckpointsCopyIt) {
  Devices devices(2);
  RuntimeWorld world(devices.World());
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> in(64), out(64);
    for (int i = 0; i < 64; ++i) in[i] = 0.01f * static_cast<float>(i * (rank + 1));
    auto h = rt.Enqueue(Compressed("w", in, out, rank));
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << "rank " << rank;
    TestDevice& gpu = *devices.gpus[rank];
    EXPECT_EQ(gpu.allocations, 1) << "rank " << rank << ": the residual, on the device";
    const int64_t before = gpu.copied_bytes;
    absl::StatusOr<std::string> state = rt.compression_state();
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(gpu.copied_bytes - before, 64 * 4) << "rank " << rank;
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// A rank whose device cannot hold a tensor's compression state fails that bucket naming the
// tensor and aborts its data plane, as for a fusion buffer that cannot be allocated (Note
// [Allocation failure], runtime/allreduce_pipeline.h); its peer, already in the bucket's
// collectives, fails at the data plane's timeout (2 s here): no rank hangs.
TEST(DevicePathTest, AStateTheDeviceCannotHoldEndsTheJobOnEveryRank) {
  Devices devices(2);
  devices.gpus[1]->fail_allocations = true;
  RuntimeWorldOptions o = devices.World();
  o.timeout = absl::Seconds(2);
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> in(64, 1.0f), out(64);
    auto h = rt.Enqueue(Compressed("w", in, out, rank));
    ASSERT_TRUE(h.ok()) << h.status();
    const absl::Time start = absl::Now();
    const absl::Status s = (*h)->Wait(absl::Seconds(20));
    EXPECT_FALSE(s.ok()) << "rank " << rank;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
    if (rank == 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    }
    if (rank == 1) {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_TRUE(absl::StrContains(
          s.message(), "tensor 'w': its error-feedback residual: test device: no 256 bytes"))
          << s;
    }
  });
  world.Shutdown();
}

// An all-gather's result, whose size only the collective knows, goes where the caller's
// allocator puts it (a framework's tensor on its device), never into a host vector of the
// handle's: the allocator sees the result's bytes and shape.
TEST(OutputAllocatorTest, AnAllGatherWritesWhereTheCallersAllocatorSays) {
  RuntimeWorld world(testing::WorldOf(2));
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<int32_t> in(2 * (rank + 1), 10 * (rank + 1)), out;
    std::vector<int64_t> asked_shape;
    size_t asked_bytes = 0;
    CollectiveRequest r;
    r.name = "gathered";
    r.collective = Collective::kAllGather;
    r.dtype = DataType::kInt32;
    r.shape = {rank + 1, 2};
    r.input = in.data();
    r.allocate_output = [&](size_t bytes, const std::vector<int64_t>& shape) {
      asked_bytes = bytes;
      asked_shape = shape;
      out.assign(bytes / 4, -1);
      return absl::StatusOr<void*>(out.data());
    };
    auto h = rt.Enqueue(r);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE((*h)->Wait(absl::Seconds(30)).ok()) << "rank " << rank;
    EXPECT_EQ(asked_bytes, 6u * 4);
    EXPECT_EQ(asked_shape, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(out, (std::vector<int32_t>{10, 10, 20, 20, 20, 20}));
    EXPECT_TRUE((*h)->output().empty());
    EXPECT_EQ((*h)->output_shape(), (std::vector<int64_t>{3, 2}));
  });
  for (const absl::Status& s : world.Shutdown()) EXPECT_TRUE(s.ok()) << s;
}

// An allocator that fails on one rank: that rank's collective fails naming the tensor and
// the reason; its peer, already in the all-gather, fails too (the job ends, never pairing
// the all-gather with a later collective).
TEST(OutputAllocatorTest, AFailedAllocatorEndsTheJobOnEveryRank) {
  RuntimeWorldOptions o = testing::WorldOf(2);
  o.timeout = absl::Seconds(2);
  RuntimeWorld world(o);
  ASSERT_TRUE(world.InitOk());
  world.Run([&](int rank, Runtime& rt) {
    std::vector<float> in(3, 1.0f), out(6);
    CollectiveRequest r;
    r.name = "g";
    r.collective = Collective::kAllGather;
    r.shape = {3};
    r.input = in.data();
    r.allocate_output = [&](size_t, const std::vector<int64_t>&) -> absl::StatusOr<void*> {
      if (rank == 0) return absl::ResourceExhaustedError("out of device memory");
      return out.data();
    };
    auto h = rt.Enqueue(r);
    ASSERT_TRUE(h.ok()) << h.status();
    const absl::Status s = (*h)->Wait(absl::Seconds(20));
    EXPECT_FALSE(s.ok()) << "rank " << rank;
    if (rank == 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_EQ(s.message(),
                "allgather 'g' on rank 0: its output allocator failed for 24 bytes: out of "
                "device memory");
    }
  });
  world.Shutdown();
}

}  // namespace
}  // namespace braid
