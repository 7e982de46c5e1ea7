// braid's GPU check (scripts/gpu_check.sh runs it on a GPU machine): every CUDA kernel
// against its CPU implementation on random inputs with the values at each format's edges
// (bit-identical where the arithmetic is shared), the CUDA device interface's operations,
// and the kernels' throughputs as a fraction of a device-to-device cudaMemcpy timed in the
// same run. Self-contained: the CUDA runtime is linked statically, so it needs the driver and
// the libraries carried beside it (scripts/gpu_check.sh --pack). Without a GPU it exits 77
// (CTest: skipped), saying why.
// The helpers: gpu_check.h.
#include "tests/gpu/gpu_check.h"

#include <dlfcn.h>

#include "common/half.h"
#include "compression/cuda/codec_kernels.h"
#include "compression/half_convert.h"
#include "compression/quantize.h"
#include "compression/state_array.h"
#include "device/cuda/cuda_device.h"
#include "device/device.h"

namespace braid {
namespace {

void CheckCasts() {
  for (bool bf16 : {false, true}) {
    for (float divisor : {1.0f, 3.0f}) {
      const std::vector<float> x = Values(100003, 7, /*finite=*/false);
      std::vector<uint16_t> cpu(x.size());
      compression::ToHalf(x.data(), x.size(), divisor, bf16, cpu.data());
      float* dx = ToDevice(x);
      uint16_t* dh = nullptr;
      CUDA_OK(cudaMalloc(&dh, x.size() * 2));
      compression::cuda::LaunchToHalf(dx, x.size(), divisor, bf16, dh, nullptr);
      std::string where;
      const std::string name = std::string(bf16 ? "bf16" : "fp16") + " cast, divisor " +
                               std::to_string(static_cast<int>(divisor));
      // x / divisor is GPU arithmetic: a NaN comes out canonical.
      const DataType half = bf16 ? DataType::kBFloat16 : DataType::kFloat16;
      Report(SameOrNaN(half, ToHost(dh, x.size()).data(), cpu.data(), x.size(), &where), name,
             where);
      std::vector<float> back(x.size());
      compression::FromHalf(cpu.data(), cpu.size(), bf16, back.data());
      compression::cuda::LaunchFromHalf(dh, x.size(), bf16, dx, nullptr);
      Report(SameBits(ToHost(dx, x.size()), back, &where), name + ", back to float32", where);
      cudaFree(dx);
      cudaFree(dh);
    }
  }
}

// One 4-bit format over a tensor whose chunks include a zero one, a non-finite one and a tiny
// one (a scale below 2^-100), with a short last chunk.
void CheckFourBit(bool int4, size_t chunk) {
  const compression::FourBitFormat format =
      int4 ? compression::FourBitFormat::kInt4 : compression::FourBitFormat::kFp4;
  const size_t n = chunk * 700 + 77, chunks = (n + chunk - 1) / chunk;
  const size_t chunk_bytes = compression::PackedBytes(chunk);
  std::vector<float> x = Values(n, 11, /*finite=*/true);
  for (size_t i = 0; i < chunk; ++i) x[chunk + i] = 0.0f;
  x[2 * chunk + 5] = std::nanf("");
  for (size_t i = 0; i < chunk; ++i) x[3 * chunk + i] *= 1e-35f;
  const uint32_t seed = 0x5eed;
  const uint64_t index0 = 4000000000ull;  // wraps past 2^32 inside the tensor, as on the CPU
  std::vector<float> scales(chunks), decoded(n), summed(n, 0.5f);
  std::vector<uint8_t> packed(chunks * chunk_bytes);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t len = std::min(chunk, n - c * chunk);
    scales[c] = compression::ChunkScale(format, x.data() + c * chunk, len);
    compression::Encode(format, x.data() + c * chunk, len, scales[c], seed, index0 + c * chunk,
                        packed.data() + c * chunk_bytes);
    compression::Decode(format, packed.data() + c * chunk_bytes, len, scales[c],
                        decoded.data() + c * chunk);
    compression::DecodeAdd(format, packed.data() + c * chunk_bytes, len, scales[c],
                           summed.data() + c * chunk);
  }
  float* dx = ToDevice(x);
  float* ds = ToDevice(scales);
  uint8_t* dp = ToDevice(packed);
  float* dout = ToDevice(std::vector<float>(n, 0.5f));
  namespace k = compression::cuda;
  const std::string name = std::string(int4 ? "int4" : "fp4") + ", chunk " + std::to_string(chunk);
  std::string where;
  k::LaunchChunkScales(int4, dx, n, chunk, ds, nullptr);
  Report(SameBits(ToHost(ds, chunks), scales, &where), name + " chunk scales", where);
  k::LaunchEncode4(int4, dx, n, chunk, ds, seed, index0, dp, nullptr);
  Report(SameBits(ToHost(dp, packed.size()), packed, &where), name + " encode", where);
  k::LaunchDecode4(int4, dp, n, chunk, ds, /*add=*/true, dout, nullptr);
  Report(SameOrNaN(ToHost(dout, n), summed, &where), name + " decode-add", where);
  k::LaunchDecode4(int4, dp, n, chunk, ds, /*add=*/false, dout, nullptr);
  Report(SameOrNaN(ToHost(dout, n), decoded, &where), name + " decode", where);
  cudaFree(dx);
  cudaFree(ds);
  cudaFree(dp);
  cudaFree(dout);
}

// float32 -> `to` and back on the GPU against the host device, bit for bit (NaN payloads
// included). a and b: device scratch of n·8 bytes.
void CheckConversions(device::Device& gpu, const std::vector<float>& x, DataType to, void* a,
                      void* b) {
  device::Device& host = device::HostDevice();
  const size_t n = x.size();
  std::vector<char> narrow(n * DataTypeSize(to)), have(narrow.size());
  std::vector<float> wide(n), wide_have(n);
  host.Convert(narrow.data(), to, x.data(), DataType::kFloat32, n, nullptr).IgnoreError();
  host.Convert(wide.data(), DataType::kFloat32, narrow.data(), to, n, nullptr).IgnoreError();
  bool ok = gpu.CopyFromHost(a, x.data(), n * 4, nullptr).ok() &&
            gpu.Convert(b, to, a, DataType::kFloat32, n, nullptr).ok() &&
            gpu.CopyToHost(have.data(), b, have.size(), nullptr).ok() &&
            gpu.Convert(a, DataType::kFloat32, b, to, n, nullptr).ok() &&
            gpu.CopyToHost(wide_have.data(), a, n * 4, nullptr).ok() &&
            gpu.Synchronize(nullptr, absl::Seconds(10)).ok();
  std::string where;
  const std::string name(DataTypeName(to));
  // float64: the GPU's conversion of a NaN gives the canonical NaN.
  Report(ok && SameOrNaN(to, have.data(), narrow.data(), n, &where), "convert float32 to " + name,
         where);
  Report(ok && SameOrNaN(wide_have, wide, &where), "convert " + name + " to float32", where);
}

// x and y as `dtype` (through the host's conversion for floats, a cast of their integer part
// for integers), reduced with `op` on the GPU against the host device; then the identity of
// `op` in `dtype`.
void CheckReduceAndIdentity(device::Device& gpu, const std::vector<float>& x,
                            const std::vector<float>& y, DataType dtype, ReduceOp op, void* a,
                            void* b) {
  device::Device& host = device::HostDevice();
  const size_t n = x.size(), bytes = n * DataTypeSize(dtype);
  auto as = [&](const std::vector<float>& v) {
    std::vector<char> out(bytes);
    if (IsFloatingPoint(dtype)) {
      host.Convert(out.data(), dtype, v.data(), DataType::kFloat32, n, nullptr).IgnoreError();
      return out;
    }
    for (size_t i = 0; i < n; ++i) {
      const int64_t w = std::isfinite(v[i]) ? static_cast<int64_t>(std::fmod(v[i], 1e9f)) : 3;
      std::memcpy(out.data() + i * DataTypeSize(dtype), &w, DataTypeSize(dtype));  // low bytes
    }
    return out;
  };
  std::vector<char> want = as(x), other = as(y), have(bytes), id(bytes), want_id(bytes);
  bool ok = gpu.CopyFromHost(a, want.data(), bytes, nullptr).ok() &&
            gpu.CopyFromHost(b, other.data(), bytes, nullptr).ok();
  host.Reduce(want.data(), other.data(), n, dtype, op, nullptr).IgnoreError();
  ok = ok && gpu.Reduce(a, b, n, dtype, op, nullptr).ok() &&
       gpu.CopyToHost(have.data(), a, bytes, nullptr).ok() &&
       gpu.Synchronize(nullptr, absl::Seconds(10)).ok();
  std::string where;
  const std::string name = std::string(DataTypeName(dtype)) + " " + std::string(ReduceOpName(op));
  Report(ok && SameOrNaN(dtype, have.data(), want.data(), n, &where), "reduce " + name, where);
  host.FillIdentity(want_id.data(), n, dtype, op, nullptr).IgnoreError();
  ok = gpu.FillIdentity(a, n, dtype, op, nullptr).ok() &&
       gpu.CopyToHost(id.data(), a, bytes, nullptr).ok() &&
       gpu.Synchronize(nullptr, absl::Seconds(10)).ok();
  Report(ok && SameBits(id, want_id, &where), "identity of " + name, where);
}

// The device interface on GPU 0: copies both ways and within, the join identity, the
// conversions and the reduction against the host device's, an event and a synchronization.
void CheckDeviceInterface() {
  auto got = device::CudaDevice(0, /*allow_unverified=*/true);
  if (!got.ok()) return Report(false, "cuda device 0", std::string(got.status().message()));
  device::Device& gpu = **got;
  const size_t n = 10007;
  const std::vector<float> x = Values(n, 3, /*finite=*/false), y = Values(n, 4, false);
  auto a = gpu.Allocate(n * 8, 64), b = gpu.Allocate(n * 8, 64);
  if (!a.ok() || !b.ok()) return Report(false, "allocate");
  std::vector<float> back(n);
  bool ok = gpu.CopyFromHost(a->data(), x.data(), n * 4, nullptr).ok() &&
            gpu.Copy(b->data(), a->data(), n * 4, nullptr).ok() &&
            gpu.CopyToHost(back.data(), b->data(), n * 4, nullptr).ok() &&
            gpu.Synchronize(nullptr, absl::Seconds(10)).ok();
  std::string where;
  Report(ok && SameBits(back, x, &where), "copy from, within and to the host", where);
  for (DataType to : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    CheckConversions(gpu, x, to, a->data(), b->data());
  }
  const DataType all[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                          DataType::kBFloat16, DataType::kInt32,  DataType::kInt64,
                          DataType::kUInt8};
  for (DataType dtype : all) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      CheckReduceAndIdentity(gpu, x, y, dtype, op, a->data(), b->data());
    }
  }
  auto event = gpu.RecordEvent(nullptr);
  Report(event.ok() && gpu.WaitEvent(nullptr, **event).ok() &&
             (*event)->Wait(absl::Seconds(10)).ok(),
         "event recorded, waited on by a stream and by the host");
}

// Compression state on GPU 0 (Note [Compression state on the device],
// compression/state_array.h): zeros there, a copy from the host and back, and a move to the
// host and back to the GPU, each the same bits.
void CheckStateOnDevice() {
  auto got = device::CudaDevice(0, /*allow_unverified=*/true);
  if (!got.ok()) return Report(false, "cuda device 0", std::string(got.status().message()));
  device::Device& gpu = **got;
  const size_t n = 4099;
  const std::vector<float> x = Values(n, 5, /*finite=*/false), zero(n, 0.0f);
  std::string where;
  auto zeros = compression::StateArray::Zeros(gpu, n);
  absl::StatusOr<std::vector<float>> z =
      zeros.ok() ? zeros->ToHost() : absl::StatusOr<std::vector<float>>(zeros.status());
  Report(z.ok() && z->size() == n && zeros->device() == &gpu && SameBits(*z, zero, &where),
         "compression state: zeros on the GPU", z.ok() ? where : z.status().ToString());
  auto state = compression::StateArray::FromHost(gpu, x);
  absl::StatusOr<std::vector<float>> back =
      state.ok() ? state->ToHost() : absl::StatusOr<std::vector<float>>(state.status());
  Report(back.ok() && back->size() == n && SameBits(*back, x, &where),
         "compression state: from the host to the GPU and back",
         back.ok() ? where : back.status().ToString());
  if (!state.ok()) return;
  absl::Status moved = state->MoveTo(device::HostDevice());
  const bool on_host = moved.ok() && state->device() == &device::HostDevice() &&
                       SameBits(std::vector<float>(state->data(), state->data() + n), x, &where);
  if (moved.ok()) moved = state->MoveTo(gpu);
  back = moved.ok() ? state->ToHost() : absl::StatusOr<std::vector<float>>(moved);
  Report(on_host && back.ok() && state->device() == &gpu && SameBits(*back, x, &where),
         "compression state: moved to the host and back to the GPU",
         back.ok() ? where : back.status().ToString());
}

// Throughput of each kernel in bytes read + written per second, as a fraction of the same
// measure for a device-to-device cudaMemcpy of the same float32 tensor.
void Throughputs() {
  const size_t n = size_t{64} << 20;  // 256 MiB of float32
  float *x = nullptr, *y = nullptr, *scales = nullptr;
  uint8_t* packed = nullptr;
  CUDA_OK(cudaMalloc(&x, n * 4));
  CUDA_OK(cudaMalloc(&y, n * 4));
  CUDA_OK(cudaMalloc(&scales, n / 128 * 4));
  CUDA_OK(cudaMalloc(&packed, n / 2));
  CUDA_OK(cudaMemset(x, 0x3c, n * 4));
  namespace k = compression::cuda;
  const double copy = 2.0 * n * 4 / Time([&] { cudaMemcpy(y, x, n * 4, cudaMemcpyDeviceToDevice); });
  std::printf("THROUGHPUT memcpy_d2d %.1f GB/s\n", copy / 1e9);
  struct Case {
    const char* name;
    double bytes;
    std::function<void()> run;
  };
  const Case cases[] = {
      {"fp16_cast", n * 6.0, [&] { k::LaunchToHalf(x, n, 1.0f, false, reinterpret_cast<uint16_t*>(y), nullptr); }},
      {"fp4_scales", n * 4.0, [&] { k::LaunchChunkScales(false, x, n, 128, scales, nullptr); }},
      {"fp4_encode", n * 4.5, [&] { k::LaunchEncode4(false, x, n, 128, scales, 1, 0, packed, nullptr); }},
      {"fp4_decode", n * 4.5, [&] { k::LaunchDecode4(false, packed, n, 128, scales, false, y, nullptr); }},
  };
  const double topk = n * 4.0 / TopKSeconds(x, n, n / 100);  // k = 1%: the keys read once
  std::printf("THROUGHPUT topk_select_1pct %.1f GB/s %.2f of memcpy_d2d\n", topk / 1e9,
              topk / copy);
  for (const Case& c : cases) {
    const double rate = c.bytes / Time(c.run);
    std::printf("THROUGHPUT %s %.1f GB/s %.2f of memcpy_d2d\n", c.name, rate / 1e9, rate / copy);
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(scales);
  cudaFree(packed);
}

}  // namespace
}  // namespace braid

int main() {
  // Skipped only where there is no GPU: no driver at all, or a driver that sees no device. A
  // driver that is there but too old for this CUDA runtime is a failure of the GPU machine
  // (it has a GPU braid cannot use), never a skip.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::printf("SKIP: no GPU here (no NVIDIA driver: libcuda.so.1 cannot be loaded)\n");
    return 77;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
    std::printf("SKIP: no GPU here (the NVIDIA driver sees no device)\n");
    return 77;
  }
  if (e != cudaSuccess) {
    std::printf("FAIL: the NVIDIA driver is here but cannot run this check: %s (%s)\n",
                cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU 0: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
  braid::CheckCasts();
  for (size_t chunk : {128, 127}) {  // an odd chunk ends on a lone low nibble
    braid::CheckFourBit(/*int4=*/false, chunk);
    braid::CheckFourBit(/*int4=*/true, chunk);
  }
  braid::CheckDeviceInterface();
  braid::CheckStateOnDevice();
  braid::CheckPowerSgd();
  braid::CheckTopK();
  braid::Throughputs();
  braid::TimePowerSgd();
  std::printf("%s: %d check(s) failed\n", braid::g_failures ? "FAILED" : "PASSED",
              braid::g_failures);
  return braid::g_failures ? 1 : 0;
}
