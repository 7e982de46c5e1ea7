// The GPU check of the data planes of GPU tensors (Note [GPU data planes],
// runtime/device_planes.h), through braid's runtime with ranks as threads of this process
// (tests/testing/runtime_world.h: the in-process coordinator and host transport; the real
// CUDA device and the real NCCL, opened at run time):
//   - a one-rank NCCL all-reduce of every dtype (BRAID_GPU_DATA_PLANE=nccl, so a rank that
//     cannot run NCCL fails the check), a lone tensor and a fused bucket; the same at 2-4
//     ranks, one GPU each, where the machine has several GPUs;
//   - 2 and 4 ranks on the one GPU over the host-staged plane (`auto` must choose it: the
//     ranks share the GPU) for every compressed method, equal across ranks and to the same
//     job on host memory (PowerSGD within 1e-5 relative, the rest bit for bit);
//   - the one-rank NCCL all-reduce's algorithm bandwidth against a device-to-device copy
//     timed in the same run, and the host-staged all-reduce's time per MiB for fp4 and
//     PowerSGD at 2 and 4 ranks against none over the same plane.
// Its own binary, run by scripts/gpu_check.sh after braid-gpu-check: it links the runtime,
// whose libraries (gRPC, protobuf, UCX, Abseil, glog) the pack carries. Exit status: 0
// passed, 1 a check failed, 77 no GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/device.h"
#include "device/nccl.h"
#include "runtime/runtime.h"
#include "tests/gpu/gpu_check.h"
#include "tests/testing/runtime_world.h"
#include "transport/nccl_communicator.h"

namespace braid {
namespace {

using testing::RuntimeWorld;
using testing::RuntimeWorldOptions;

// Every rank's devices: the GPUs of this process (rank r uses cuda:0, or cuda:r for NCCL at
// several ranks).
std::shared_ptr<const device::DeviceRegistry> Gpus(int) {
  return device::MakeDefaultDevices(/*allow_unverified_cuda=*/true);
}

// `f` (small integers, exact in every dtype) as bytes of `dtype`.
std::vector<char> Encode(DataType dtype, const std::vector<float>& f) {
  const size_t n = f.size();
  std::vector<char> out(n * DataTypeSize(dtype));
  if (dtype == DataType::kFloat32) {
    std::memcpy(out.data(), f.data(), out.size());
  } else if (dtype == DataType::kInt32 || dtype == DataType::kInt64 ||
             dtype == DataType::kUInt8) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(f[i]);  // little-endian: the low bytes
      std::memcpy(out.data() + i * DataTypeSize(dtype), &v, DataTypeSize(dtype));
    }
  } else {
    device::HostDevice().Convert(out.data(), dtype, f.data(), DataType::kFloat32, n, nullptr)
        .IgnoreError();
  }
  return out;
}

// `n` small integers (0..30) of seed `seed`.
std::vector<float> SmallIntegers(size_t n, int seed) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>((i * 7 + seed * 13) % 31);
  return f;
}

void* DeviceCopy(const std::vector<char>& host) {
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, host.size() + 1));
  CUDA_OK(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
  return d;
}
std::vector<char> HostCopy(const void* d, size_t bytes) {
  std::vector<char> host(bytes);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost));
  return host;
}

// `size` ranks, rank r on cuda:r, BRAID_GPU_DATA_PLANE=nccl (a rank that cannot run NCCL
// fails the check): every dtype's sum, alone and as a fused bucket of three. One GPU runs
// one rank; a machine with several GPUs runs up to 4.
void CheckNccl(int size) {
  RuntimeWorldOptions o;
  o.size = size;
  o.devices = Gpus;
  o.settings.set_gpu_data_plane(1);
  RuntimeWorld world(o);
  const std::string job = absl::StrCat("nccl at ", size, size == 1 ? " rank" : " ranks");
  if (!world.InitOk()) {
    Report(false, absl::StrCat(job, ": init"));
    return;
  }
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                             DataType::kBFloat16, DataType::kInt32, DataType::kInt64,
                             DataType::kUInt8};
  world.Run([&](int rank, Runtime& rt) {
    CUDA_OK(cudaSetDevice(rank));
    for (DataType dtype : dtypes) {
      for (int tensors : {1, 3}) {
        std::vector<std::vector<char>> expected;
        std::vector<void*> dev_in, dev_out;
        std::vector<std::shared_ptr<Handle>> handles;
        rt.BeginGroup();
        for (int t = 0; t < tensors; ++t) {
          const size_t n = 1000 + 17 * t;
          std::vector<float> sum(n, 0.0f);  // at most 4 * 30: exact in every dtype
          for (int p = 0; p < size; ++p) {
            const std::vector<float> x = SmallIntegers(n, t + 5 * p);
            for (size_t i = 0; i < n; ++i) sum[i] += x[i];
          }
          expected.push_back(Encode(dtype, sum));
          const std::vector<char> in = Encode(dtype, SmallIntegers(n, t + 5 * rank));
          dev_in.push_back(DeviceCopy(in));
          dev_out.push_back(DeviceCopy(std::vector<char>(in.size(), 0)));
          CollectiveRequest r;
          r.name = absl::StrCat("nccl.", DataTypeName(dtype), ".", tensors, ".", t);
          r.dtype = dtype;
          r.shape = {static_cast<int64_t>(n)};
          r.input = dev_in.back();
          r.output = dev_out.back();
          r.op = ReduceOp::kSum;
          r.device = DeviceRef{DeviceType::kCUDA, rank};
          auto h = rt.Enqueue(r);
          if (!h.ok()) {
            Report(false, r.name, std::string(h.status().message()));
            continue;
          }
          handles.push_back(*h);
        }
        (void)rt.EndGroup();
        std::string detail;
        bool ok = true;
        for (size_t t = 0; t < handles.size(); ++t) {
          absl::Status s = handles[t]->Wait(absl::Seconds(60));
          if (!s.ok()) {
            ok = false;
            detail = std::string(s.message());
            continue;
          }
          if (HostCopy(dev_out[t], expected[t].size()) != expected[t]) {
            ok = false;
            detail = absl::StrCat("tensor ", t, " differs from the ranks' sum");
          }
        }
        Report(ok && handles.size() == static_cast<size_t>(tensors),
               absl::StrCat(job, ", rank ", rank, ": ", DataTypeName(dtype),
                            tensors == 1 ? " alone" : " fused"),
               detail);
        for (void* p : dev_in) cudaFree(p);
        for (void* p : dev_out) cudaFree(p);
      }
    }
  });
  world.Shutdown();
}

// `steps` steps of two float32 tensors (a 512x256 matrix and a 10000-vector) under `method`
// (average) at `size` ranks, on cuda:0 (every rank: one GPU, so the host-staged plane) or on
// the host; every rank's outputs back to back.
std::vector<std::vector<float>> RunStaged(const std::string& method, int size, bool on_gpu,
                                          int steps = 3) {
  RuntimeWorldOptions o;
  o.size = size;
  if (on_gpu) o.devices = Gpus;
  RuntimeWorld world(o);
  std::vector<std::vector<float>> results(size);
  if (!world.InitOk()) {
    Report(false, absl::StrCat("staged ", method, " at ", size, ": init"));
    return results;
  }
  world.Run([&](int rank, Runtime& rt) {
    for (int step = 0; step < steps; ++step) {
      const std::vector<std::vector<int64_t>> shapes = {{512, 256}, {10000}};
      std::vector<std::vector<float>> in, out;
      std::vector<void*> dev;
      std::vector<std::shared_ptr<Handle>> handles;
      rt.BeginGroup();
      for (size_t t = 0; t < shapes.size(); ++t) {
        const size_t n = shapes[t].size() == 2 ? 512 * 256 : 10000;
        in.push_back(Values(n, 1000 * rank + 10 * step + static_cast<uint32_t>(t), true));
        out.emplace_back(n, 0.0f);
        CollectiveRequest r;
        r.name = absl::StrCat("staged.", t);
        r.shape = shapes[t];
        r.op = ReduceOp::kAverage;
        r.compression = method;
        if (on_gpu) {
          dev.push_back(DeviceCopy(std::vector<char>(
              reinterpret_cast<const char*>(in.back().data()),
              reinterpret_cast<const char*>(in.back().data() + n))));
          r.input = r.output = dev.back();
          r.device = DeviceRef{DeviceType::kCUDA, 0};
        } else {
          r.input = in.back().data();
          r.output = out.back().data();
        }
        auto h = rt.Enqueue(r);
        if (h.ok()) handles.push_back(*h);
      }
      (void)rt.EndGroup();
      for (auto& h : handles) {
        absl::Status s = h->Wait(absl::Seconds(120));
        if (!s.ok()) Report(false, absl::StrCat("staged ", method, " at ", size), std::string(s.message()));
      }
      for (size_t t = 0; t < out.size(); ++t) {
        if (on_gpu) {
          std::vector<char> bytes = HostCopy(dev[t], out[t].size() * 4);
          std::memcpy(out[t].data(), bytes.data(), bytes.size());
          cudaFree(dev[t]);
        }
        results[rank].insert(results[rank].end(), out[t].begin(), out[t].end());
      }
    }
  });
  world.Shutdown();
  return results;
}

void CheckStaged() {
  for (int size : {2, 4}) {
    for (const char* method : {"none", "fp16", "bf16", "fp4:ef=1", "int4", "powersgd:rank=2",
                               "scalecomp:ratio=10", "topk:ratio=10", "randomk:ratio=10"}) {
      const auto host = RunStaged(method, size, /*on_gpu=*/false);
      const auto gpu = RunStaged(method, size, /*on_gpu=*/true);
      const bool powersgd = std::string(method).rfind("powersgd", 0) == 0;
      bool ok = true;
      std::string detail;
      for (int r = 0; r < size && ok; ++r) {
        if (gpu[r].size() != host[r].size() || gpu[r] .empty()) {
          ok = false;
          detail = absl::StrCat("rank ", r, " has ", gpu[r].size(), " values, not ", host[r].size());
          break;
        }
        if (!SameOrNaN(gpu[r], gpu[0], &detail)) {
          ok = false;
          detail = absl::StrCat("rank ", r, " differs from rank 0: ", detail);
          break;
        }
        if (powersgd) {
          for (size_t i = 0; i < host[r].size(); ++i) {
            const float a = gpu[r][i], b = host[r][i];
            if (std::isfinite(b) && std::fabs(a - b) > 1e-5f * std::max(1.0f, std::fabs(b))) {
              ok = false;
              detail = absl::StrCat("element ", i, ": ", a, " vs the host's ", b);
              break;
            }
          }
        } else if (!SameOrNaN(gpu[r], host[r], &detail)) {
          ok = false;
          detail = absl::StrCat("rank ", r, " differs from the host pipeline: ", detail);
        }
      }
      Report(ok, absl::StrCat("host-staged ", method, " at ", size, " ranks on one GPU"), detail);
    }
  }
}

// The one-rank NCCL all-reduce's algorithm bandwidth (bytes / time) against a device copy.
void TimeNccl() {
  absl::StatusOr<transport::NcclApi*> nccl = device::DefaultNccl();
  absl::StatusOr<device::Device*> gpu = Gpus(0)->Get(DeviceRef{DeviceType::kCUDA, 0});
  if (!nccl.ok() || !gpu.ok()) {
    Report(false, "nccl timing", std::string((!nccl.ok() ? nccl.status() : gpu.status()).message()));
    return;
  }
  absl::StatusOr<transport::NcclUniqueId> id = (*nccl)->GetUniqueId();
  if (!id.ok()) {
    Report(false, "nccl timing: unique id", std::string(id.status().message()));
    return;
  }
  auto comm = transport::ConnectNccl(**nccl, *id, 0, 1, (*gpu)->work_stream(), **gpu);
  if (!comm.ok()) {
    Report(false, "nccl timing: communicator", std::string(comm.status().message()));
    return;
  }
  std::printf("NCCL: %s\n", (*comm)->Describe().c_str());
  const size_t n = size_t{64} << 20;  // 256 MiB of float32
  float *x = nullptr, *y = nullptr;
  CUDA_OK(cudaMalloc(&x, n * 4));
  CUDA_OK(cudaMalloc(&y, n * 4));
  CUDA_OK(cudaMemset(x, 0, n * 4));
  const double copy = n * 4.0 / Time([&] { cudaMemcpy(y, x, n * 4, cudaMemcpyDeviceToDevice); });
  absl::Status s;
  const double allreduce = n * 4.0 / Time([&] {
    s.Update((*comm)->AllReduce(x, y, n, DataType::kFloat32, ReduceOp::kSum));
  });
  Report(s.ok(), "nccl one-rank all-reduce of 256 MiB", std::string(s.message()));
  std::printf("THROUGHPUT nccl_allreduce_1rank_algbw %.1f GB/s %.2f of memcpy_d2d (%.1f GB/s)\n",
              allreduce / 1e9, allreduce / copy, copy / 1e9);
  cudaFree(x);
  cudaFree(y);
}

// The host-staged all-reduce of a 64 MiB float32 tensor: milliseconds per MiB, per method.
void TimeStaged() {
  const size_t n = size_t{16} << 20;
  for (int size : {2, 4}) {
    for (const char* method : {"none", "fp4", "powersgd:rank=4"}) {
      RuntimeWorldOptions o;
      o.size = size;
      o.devices = Gpus;
      RuntimeWorld world(o);
      if (!world.InitOk()) continue;
      std::vector<double> seconds(size);
      world.Run([&](int rank, Runtime& rt) {
        void* d = DeviceCopy(std::vector<char>(n * 4, 0));
        std::vector<double> t;
        for (int i = 0; i < 6; ++i) {
          CollectiveRequest r;
          r.name = "timed";
          r.shape = {4096, static_cast<int64_t>(n / 4096)};
          r.input = r.output = d;
          r.op = ReduceOp::kAverage;
          r.compression = method;
          r.device = DeviceRef{DeviceType::kCUDA, 0};
          const auto start = std::chrono::steady_clock::now();
          auto h = rt.Enqueue(r);
          if (!h.ok() || !(*h)->Wait(absl::Seconds(120)).ok()) return;
          t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        std::sort(t.begin() + 1, t.end());
        seconds[rank] = t[1 + (t.size() - 1) / 2];
        cudaFree(d);
      });
      world.Shutdown();
      std::printf("THROUGHPUT host_staged_%s_%dranks %.3f ms/MiB\n", method, size,
                  seconds[0] * 1e3 / (n * 4.0 / (1 << 20)));
    }
  }
}

}  // namespace
}  // namespace braid

int main() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int count = 0;
  if (driver == nullptr || cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no GPU here\n");
    return 77;
  }
  braid::CheckNccl(1);
  if (count >= 2) braid::CheckNccl(std::min(count, 4));
  braid::CheckStaged();
  braid::TimeNccl();
  braid::TimeStaged();
  std::printf("%s: %d check(s) failed\n", braid::g_failures ? "FAILED" : "PASSED",
              braid::g_failures);
  return braid::g_failures ? 1 : 0;
}
