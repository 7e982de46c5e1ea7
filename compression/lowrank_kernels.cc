#include "compression/lowrank_kernels.h"

#include <cstdint>
#include <cstring>

#include "common/multiversion.h"

namespace braid::compression {
namespace {

// Integer test of the exponent bits, so the loops vectorize without reassociating float sums.
inline uint32_t NonFinite(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return (b & 0x7f800000u) == 0x7f800000u;
}

}  // namespace

BRAID_MULTIVERSION bool AddResidual(float* m, const float* e, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = m[i] + e[i];
    m[i] = v;
    bad |= NonFinite(v);
  }
  return bad == 0;
}

BRAID_MULTIVERSION bool AllFinite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= NonFinite(x[i]);
  return bad == 0;
}

BRAID_MULTIVERSION void Reconstruct(const float* p, const float* qt, size_t rows, size_t cols,
                                    int rank, float scale, float* m, float* residual,
                                    float* row) {
  for (size_t i = 0; i < rows; ++i) {
    const float* pi = p + i * rank;
    const float p0 = pi[0];
    for (size_t j = 0; j < cols; ++j) row[j] = p0 * qt[j];
    for (int c = 1; c < rank; ++c) {
      const float pc = pi[c];
      const float* q = qt + static_cast<size_t>(c) * cols;
      for (size_t j = 0; j < cols; ++j) row[j] += pc * q[j];
    }
    float* mi = m + i * cols;
    if (residual != nullptr) {
      float* ei = residual + i * cols;
      for (size_t j = 0; j < cols; ++j) {
        ei[j] = mi[j] - row[j];
        mi[j] = scale * row[j];
      }
    } else {
      for (size_t j = 0; j < cols; ++j) mi[j] = scale * row[j];
    }
  }
}

}  // namespace braid::compression
