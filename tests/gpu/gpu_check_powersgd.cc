// The GPU check's PowerSGD part: the element-wise kernels against the CPU's bit for bit, the
// orthogonalization and the cuBLAS products within 1e-5 relative of a reference and the same
// bits run after run, and the compression time of ResNet-50-shaped gradients.
#include "compression/cuda/lowrank_kernels.h"
#include "compression/lowrank_kernels.h"
#include "compression/powersgd.h"
#include "tests/gpu/gpu_check.h"

namespace braid {
namespace {

namespace k = compression::cuda;

// max |a - b| / max |b|: the relative error of a against the reference b.
double RelativeError(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

std::string Relative(double e) { return "relative error " + std::to_string(e); }

void CheckElementwise() {
  const size_t rows = 300, cols = 257;
  const int rank = 3;
  const std::vector<float> p = Values(rows * rank, 21, true), qt = Values(rank * cols, 22, true);
  std::vector<float> m = Values(rows * cols, 23, true), e = Values(rows * cols, 24, true);
  std::vector<float> m_gpu_in = m, residual(rows * cols), row(cols);
  std::vector<float> sum = m;
  compression::AddResidual(sum.data(), e.data(), sum.size());
  compression::Reconstruct(p.data(), qt.data(), rows, cols, rank, 0.25f, m.data(),
                           residual.data(), row.data());
  float *dp = ToDevice(p), *dqt = ToDevice(qt), *dm = ToDevice(m_gpu_in), *de = ToDevice(e);
  uint32_t* flag = ToDevice(std::vector<uint32_t>{0});
  k::LaunchAddResidual(dm, de, rows * cols, flag, nullptr);
  std::string where;
  Report(SameBits(ToHost(dm, rows * cols), sum, &where) && ToHost(flag, 1)[0] == 0,
         "powersgd add residual", where);
  CUDA_OK(cudaMemcpy(dm, m_gpu_in.data(), m.size() * 4, cudaMemcpyHostToDevice));
  k::LaunchReconstruct(dp, dqt, rows, cols, rank, 0.25f, dm, de, nullptr);
  Report(SameBits(ToHost(dm, rows * cols), m, &where) &&
             SameBits(ToHost(de, rows * cols), residual, &where),
         "powersgd reconstruct and residual", where);
  std::vector<float> inf_e(rows * cols, 0.0f);
  inf_e[7] = INFINITY;
  CUDA_OK(cudaMemcpy(de, inf_e.data(), inf_e.size() * 4, cudaMemcpyHostToDevice));
  k::LaunchAddResidual(dm, de, rows * cols, flag, nullptr);
  Report(ToHost(flag, 1)[0] == 1, "powersgd add residual flags a non-finite sum");
  for (void* d : {static_cast<void*>(dp), static_cast<void*>(dqt), static_cast<void*>(dm),
                  static_cast<void*>(de), static_cast<void*>(flag)}) {
    cudaFree(d);
  }
}

void CheckOrthogonalize() {
  const size_t rows = 4099, cols = 4;
  std::vector<float> p = Values(rows * cols, 31, true);
  for (size_t i = 0; i < rows; ++i) p[i * cols + 3] = 0.0f;  // a zero column stays zero
  std::vector<float> cpu = p;
  compression::Orthogonalize(cpu.data(), rows, cols, 1e-8);
  const std::vector<double> reference(cpu.begin(), cpu.end());
  float* d = ToDevice(p);
  k::LaunchOrthogonalize(d, rows, cols, 1e-8, nullptr);
  const std::vector<float> first = ToHost(d, p.size());
  CUDA_OK(cudaMemcpy(d, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
  k::LaunchOrthogonalize(d, rows, cols, 1e-8, nullptr);
  std::string where;
  const double err = RelativeError(first, reference);
  Report(err <= 1e-5, "powersgd orthogonalize against the CPU's", Relative(err));
  Report(SameBits(ToHost(d, p.size()), first, &where), "powersgd orthogonalize, run to run",
         where);
  cudaFree(d);
}

// P = M·Q and Q = Mᵀ·P against products accumulated in double on the host.
void CheckProducts() {
  const int64_t rows = 513, cols = 300;
  const int rank = 4;
  std::vector<float> m = Values(rows * cols, 41, true), q = Values(cols * rank, 42, true);
  for (float& v : m) v = std::fmod(v, 1e3f);  // gradient-like magnitudes
  std::vector<double> p_ref(rows * rank, 0.0), q_ref(cols * rank, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int c = 0; c < rank; ++c) p_ref[i * rank + c] += double{m[i * cols + j]} * q[j * rank + c];
  float *dm = ToDevice(m), *dq = ToDevice(q), *dp = ToDevice(std::vector<float>(rows * rank));
  absl::Status s = k::MultiplyMQ(dm, dq, rows, cols, rank, dp, nullptr);
  const std::vector<float> p = ToHost(dp, rows * rank);
  Report(s.ok() && RelativeError(p, p_ref) <= 1e-5, "powersgd P = M·Q (cuBLAS)",
         s.ok() ? Relative(RelativeError(p, p_ref)) : std::string(s.message()));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int c = 0; c < rank; ++c) q_ref[j * rank + c] += double{m[i * cols + j]} * p[i * rank + c];
  s = k::MultiplyMtP(dm, dp, rows, cols, rank, dq, nullptr);
  const std::vector<float> q2 = ToHost(dq, cols * rank);
  Report(s.ok() && RelativeError(q2, q_ref) <= 1e-5, "powersgd Q = Mᵀ·P (cuBLAS)",
         s.ok() ? Relative(RelativeError(q2, q_ref)) : std::string(s.message()));
  s = k::MultiplyMtP(dm, dp, rows, cols, rank, dq, nullptr);
  std::string where;
  Report(s.ok() && SameBits(ToHost(dq, cols * rank), q2, &where), "powersgd Q, run to run",
         where);
  cudaFree(dm);
  cudaFree(dq);
  cudaFree(dp);
}

// ResNet-50's weight gradients as PowerSGD sees them (out × in·kh·kw; the fc layer 1000 ×
// 2048), the bottleneck stages of He et al. 2016 (3, 4, 6, 3 blocks).
std::vector<std::pair<int64_t, int64_t>> ResNet50Shapes() {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{64, 3 * 7 * 7}};
  int64_t in = 64;
  const int64_t widths[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t mid = widths[stage], out = 4 * mid;
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      shapes.push_back({mid, in});
      shapes.push_back({mid, mid * 9});
      shapes.push_back({out, mid});
      if (b == 0) shapes.push_back({out, in});  // the projection shortcut
      in = out;
    }
  }
  shapes.push_back({1000, 2048});
  return shapes;
}

}  // namespace

void CheckPowerSgd() {
  CheckElementwise();
  CheckOrthogonalize();
  CheckProducts();
}

// One compression of every ResNet-50 gradient (P = M·Q, orthogonalize, Q = Mᵀ·P,
// reconstruct with the residual), per rank, on one stream: the median time of 5.
void TimePowerSgd() {
  const auto shapes = ResNet50Shapes();
  int64_t elements = 0, widest = 0;
  for (const auto& [r, c] : shapes) {
    elements += r * c;
    widest = std::max(widest, std::max(r, c));
  }
  for (int rank : {1, 2, 4}) {
    float *m = nullptr, *e = nullptr, *p = nullptr, *q = nullptr, *qt = nullptr;
    CUDA_OK(cudaMalloc(&m, elements * 4));
    CUDA_OK(cudaMalloc(&e, elements * 4));
    CUDA_OK(cudaMalloc(&p, widest * rank * 4));
    CUDA_OK(cudaMalloc(&q, widest * rank * 4));
    CUDA_OK(cudaMalloc(&qt, widest * rank * 4));
    CUDA_OK(cudaMemset(m, 0x3c, elements * 4));
    CUDA_OK(cudaMemset(q, 0x3c, widest * rank * 4));
    const double t = Time([&] {
      int64_t at = 0;
      for (const auto& [rows, cols] : shapes) {
        k::MultiplyMQ(m + at, q, rows, cols, rank, p, nullptr).IgnoreError();
        k::LaunchOrthogonalize(p, rows, rank, 1e-8, nullptr);
        k::MultiplyMtP(m + at, p, rows, cols, rank, q, nullptr).IgnoreError();
        k::LaunchTranspose(q, cols, rank, qt, nullptr);
        k::LaunchReconstruct(p, qt, rows, cols, rank, 1.0f, m + at, e + at, nullptr);
        at += rows * cols;
      }
    });
    std::printf("TIME powersgd_resnet50_rank%d %.2f ms (%zu tensors, %.1f M elements)\n", rank,
                t * 1e3, shapes.size(), elements / 1e6);
    for (float* d : {m, e, p, q, qt}) cudaFree(d);
  }
}

}  // namespace braid
