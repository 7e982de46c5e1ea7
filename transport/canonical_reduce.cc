#include "transport/canonical_reduce.h"

#include <algorithm>
#include <cstring>

#include "glog/logging.h"
#include "transport/ring_schedule.h"

namespace braid::transport {

void CanonicalReduce(const Kernels& kernels, void* out, std::vector<const char*> v,
                     std::vector<bool> writable, size_t count, DataType dtype, ReduceOp op) {
  const int n = static_cast<int>(v.size());
  CHECK_GE(n, 1);
  CHECK_EQ(writable.size(), v.size());
  if (n == 1) {
    kernels.Copy(out, v[0], count * DataTypeSize(dtype));
    return;
  }
  const int p2 = RecursiveDoublingRoleFor(0, n).p2;
  const int rem = n - p2;
  int combines_left = n - 1;
  // Combines lo (lower ranks) with hi into `out` for the last combination, else into
  // whichever operand is writable (at most one of the two is not).
  auto combine = [&](int lo, int hi) {
    char* dst = --combines_left == 0 ? static_cast<char*>(out)
                                     : const_cast<char*>(writable[lo] ? v[lo] : v[hi]);
    CHECK(combines_left == 0 || writable[lo] || writable[hi])
        << "canonical reduce: two read-only operands (" << lo << ", " << hi << ")";
    kernels.Reduce(dst, v[lo], v[hi], count, dtype, op);
    v[lo] = dst;
    writable[lo] = dst != out;
  };
  // The pairs (2i, 2i+1), i < rem; then the p2 values t[i] live at index idx(i).
  for (int i = 0; i < rem; ++i) combine(2 * i, 2 * i + 1);
  auto idx = [&](int i) { return i < rem ? 2 * i : i + rem; };
  for (int width = 1; width < p2; width *= 2) {
    for (int i = 0; i + width < p2; i += 2 * width) combine(idx(i), idx(i + width));
  }
}

void CanonicalReduceWide(const Kernels& kernels, void* out,
                         const std::vector<const char*>& operands, size_t count, DataType dtype,
                         ReduceOp op, int divisor, float* scratch) {
  const size_t n = operands.size();
  const size_t elem = DataTypeSize(dtype);
  std::vector<const char*> wide(n);
  for (size_t r = 0; r < n; ++r) wide[r] = reinterpret_cast<const char*>(scratch + r * kWideBlock);
  for (size_t b = 0; b < count; b += kWideBlock) {
    const size_t m = std::min(kWideBlock, count - b);
    for (size_t r = 0; r < n; ++r) {
      kernels.Widen(scratch + r * kWideBlock, operands[r] + b * elem, m, dtype, divisor);
    }
    // Every widened operand is scratch, so the tree may keep its values anywhere; its result
    // lands in block 0.
    CanonicalReduce(kernels, scratch, wide, std::vector<bool>(n, true), m, DataType::kFloat32,
                    op);
    kernels.Narrow(static_cast<char*>(out) + b * elem, scratch, m, dtype);
  }
}

}  // namespace braid::transport
