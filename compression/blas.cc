#include "compression/blas.h"

#include <cblas.h>  // types and enums only: the functions come from dlsym
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace braid::compression::blas {
namespace {

constexpr const char* kLibrary = "libopenblas.so.0";

struct Functions {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_sgemv) sgemv = nullptr;
};
Functions g_blas;  // written once under std::call_once, read-only afterwards

absl::Status Open() {
  // RTLD_GLOBAL-free and never closed: a framework in this process may hold the same library.
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "PowerSGD needs OpenBLAS (Debian package libopenblas0): cannot open ", kLibrary, ": ",
        err ? err : "unknown error"));
  }
  g_blas.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
  g_blas.sgemv = reinterpret_cast<decltype(&cblas_sgemv)>(dlsym(lib, "cblas_sgemv"));
  if (g_blas.sgemm == nullptr || g_blas.sgemv == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kLibrary, " has no cblas_sgemm / cblas_sgemv: not an OpenBLAS with CBLAS"));
  }
  // Absent from the serial build, which has no threads to pin.
  auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
  if (set_threads != nullptr) set_threads(1);
  return absl::OkStatus();
}

}  // namespace

absl::Status Load() {
  static std::once_flag once;
  static absl::Status* status = nullptr;
  std::call_once(once, [] { status = new absl::Status(Open()); });
  return *status;
}

void Sgemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, float* c) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  g_blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, i(m), i(n),
               i(k), 1.0f, a, i(lda), b, i(n), 0.0f, c, i(n));
}

void Sgemv(bool trans_a, int64_t rows, int64_t cols, const float* a, int64_t lda, const float* x,
           int64_t incx, float* y, int64_t incy) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  g_blas.sgemv(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, i(rows), i(cols), 1.0f, a,
               i(lda), x, i(incx), 0.0f, y, i(incy));
}

}  // namespace braid::compression::blas
