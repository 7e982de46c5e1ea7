// Single-precision BLAS for PowerSGD (powersgd.h): Debian's OpenBLAS through its CBLAS
// interface, opened when the first PowerSGD compressor is created instead of linked.
//
// Why not linked: OpenBLAS's threaded builds start their worker threads from the library's
// constructor, before main() runs, and those threads block no signals. A process that takes
// its signals from a signalfd or sigwait with the signals blocked in its own threads
// (braidrun, the benchmarks' rank supervision) would lose SIGINT or SIGCHLD to them. Opened on
// first use, OpenBLAS is only ever loaded into processes that run PowerSGD (the ranks).
#ifndef BRAID_COMPRESSION_BLAS_H_
#define BRAID_COMPRESSION_BLAS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace braid::compression::blas {

// Opens libopenblas.so.0 once (every call after the first returns the first's result) and
// pins it to one thread per process: ranks share the host's few cores (here two ranks on two
// cores) with each other and with the data plane's progress, and OpenBLAS's default of one
// thread per core in every rank would oversubscribe them; PowerSGD's products are skinny and
// memory-bound anyway. The setting is process-wide: other users of the same library in the
// process (e.g. Debian's PyTorch) get one thread too. FailedPrecondition, naming the library
// and the loader's error, when it cannot be opened. Thread-safe.
absl::Status Load();

// c (m × n) = a·b, row-major, a m × k (or k × m when `trans_a`, lda its row length), b k × n
// (ldb = n), c m × n (ldc = n): cblas_sgemm. Load() must have succeeded.
void Sgemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, float* c);
// y = op(a)·x, row-major a rows × cols (lda its row length), op = transpose when `trans_a`;
// x and y strided by incx / incy: cblas_sgemv. Load() must have succeeded.
void Sgemv(bool trans_a, int64_t rows, int64_t cols, const float* a, int64_t lda, const float* x,
           int64_t incx, float* y, int64_t incy);

}  // namespace braid::compression::blas

#endif  // BRAID_COMPRESSION_BLAS_H_
