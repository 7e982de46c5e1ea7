// cuBLAS for PowerSGD on a GPU (lowrank_kernels.h: MultiplyMQ, MultiplyMtP), opened on first
// use rather than linked, for the reason braid opens OpenBLAS (compression/blas.h) and one
// more: a braid built with CUDA must load where no CUDA toolkit is installed, and only a rank
// that runs PowerSGD on a GPU needs cuBLAS. The types come from the toolkit's header; no
// symbol of it is linked.
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/shared_library.h"
#include "compression/cuda/lowrank_kernels.h"

namespace braid::compression::cuda {
namespace {

// The CUDA 13 toolkit's (and the nvidia-cublas wheel's) soname, then the development link.
constexpr const char* kLibraries[] = {"libcublas.so.13", "libcublas.so"};

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  std::mutex mu;  // one handle per device, shared: its stream is set per call
  std::map<int, cublasHandle_t> handles;
};

// The library and its functions, opened once (every later call gets the first's result).
absl::StatusOr<Cublas*> Open() {
  static absl::StatusOr<Cublas*>* const opened = [] {
    auto* c = new Cublas;
    std::string errors;
    const void* lib = OpenFirstLibrary(
        kLibraries,
        [c](void* lib) {
          const bool bound = BindSymbol(lib, "cublasCreate_v2", &c->create) &&
                             BindSymbol(lib, "cublasSetStream_v2", &c->set_stream) &&
                             BindSymbol(lib, "cublasSetMathMode", &c->set_math_mode) &&
                             BindSymbol(lib, "cublasSgemm_v2", &c->sgemm);
          return bound ? absl::OkStatus() : absl::NotFoundError("lacks a cuBLAS function");
        },
        &errors);
    if (lib != nullptr) return new absl::StatusOr<Cublas*>(c);
    delete c;
    return new absl::StatusOr<Cublas*>(absl::FailedPreconditionError(absl::StrCat(
        "PowerSGD on a GPU needs cuBLAS (", kLibraries[0], ", from the CUDA toolkit or the "
        "nvidia-cublas Python package, on the library path): ", errors)));
  }();
  return *opened;
}

absl::Status Check(cublasStatus_t s, const char* what) {
  return s == CUBLAS_STATUS_SUCCESS
             ? absl::OkStatus()
             : absl::InternalError(absl::StrCat("cuBLAS ", what, " failed with status ",
                                                static_cast<int>(s)));
}

// C (m × n, column-major, ldc m) = op(A)·op(B) in FP32 on `stream`.
absl::Status Sgemm(bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, void* stream) {
  absl::StatusOr<Cublas*> lib = Open();
  if (!lib.ok()) return lib.status();
  Cublas& cb = **lib;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(cb.mu);
  cublasHandle_t& handle = cb.handles[device];
  if (handle == nullptr) {
    absl::Status s = Check(cb.create(&handle), "create");
    if (s.ok()) s = Check(cb.set_math_mode(handle, CUBLAS_PEDANTIC_MATH), "set math mode");
    if (!s.ok()) {
      handle = nullptr;
      return s;
    }
  }
  absl::Status s = Check(cb.set_stream(handle, static_cast<cudaStream_t>(stream)), "set stream");
  if (!s.ok()) return s;
  const float one = 1.0f, zero = 0.0f;
  return Check(cb.sgemm(handle, CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                        static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one,
                        a, static_cast<int>(lda), b, static_cast<int>(ldb), &zero, c,
                        static_cast<int>(m)),
               "sgemm");
}

}  // namespace

// Row-major X is column-major Xᵀ: P = M·Q is Pᵀ (rank × rows) = Qᵀ·Mᵀ, and Q = Mᵀ·P is
// Qᵀ (rank × cols) = Pᵀ·M, with M read transposed.
absl::Status MultiplyMQ(const float* m, const float* q, int64_t rows, int64_t cols, int rank,
                        float* p, void* stream) {
  return Sgemm(false, rank, rows, cols, q, rank, m, cols, p, stream);
}

absl::Status MultiplyMtP(const float* m, const float* p, int64_t rows, int64_t cols, int rank,
                         float* q, void* stream) {
  return Sgemm(true, rank, cols, rows, p, rank, m, cols, q, stream);
}

}  // namespace braid::compression::cuda
