// The sparsifiers (compression/sparse.h) written out plainly for tests: full-sort top-k and
// dense loops over a flat bucket, from the documented equations, sharing no code with
// compression/. Used by the unit tests (ranks as threads) and the multi-process tests.
//
// Inputs are multiples of 2^-8 in [-4, 4] (Dyadic) and β is 1 or 1/2, so every sum the
// compressors and the reference form is exact in float32 whatever the order of addition:
// the reference sums in double and results must match bit for bit.
#ifndef BRAID_TESTS_TESTING_SPARSE_REFERENCE_H_
#define BRAID_TESTS_TESTING_SPARSE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

namespace braid::testing {

// Element i of tensor t on `rank` at `step`: a multiple of 2^-8 in [-4, 4].
inline float Dyadic(int rank, int step, size_t t, size_t i) {
  uint64_t h = (static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(step)) * 7919u +
               t * 104729u + i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<float>(static_cast<int>(h % 2049) - 1024) / 256.0f;
}

using InputFn = std::function<float(int rank, int step, size_t tensor, size_t i)>;

// ceil(n / ratio), at least 1 for n > 0, at most n.
inline size_t RefK(size_t n, double ratio) {
  if (n == 0) return 0;
  const size_t k = static_cast<size_t>(std::ceil(static_cast<double>(n) / ratio));
  return std::min(n, std::max<size_t>(1, k));
}

// Top-k of |x| by a full stable sort (ties: lower index), ascending.
inline std::vector<size_t> RefTopK(const std::vector<float>& x, size_t k) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(std::min(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// scalecomp (or, with topk = true, the topk baseline) on `ranks` ranks over `steps` steps of
// one bucket of tensors `sizes`: the result of each step (the same on every rank), flat.
struct SparseReference {
  double ratio = 100;
  float beta = 1.0f;
  bool per_tensor = false;  // granularity=tensor
  int fixed_leader = -1;    // leader=R; -1: cyclic
  bool topk = false;        // every rank its own indices, all-gathered
  bool average = true;

  std::vector<std::vector<float>> Run(int ranks, int steps, const std::vector<size_t>& sizes,
                                      const InputFn& input) const {
    const int n = ranks;
    std::vector<size_t> off = {0};
    for (size_t s : sizes) off.push_back(off.back() + s);
    const size_t total = off.back();
    std::vector<std::vector<float>> m(n, std::vector<float>(total, 0.0f));
    std::vector<std::vector<float>> outs;
    auto select = [&](const std::vector<float>& x) {
      if (!per_tensor) return RefTopK(x, RefK(total, ratio));
      std::vector<size_t> I;
      for (size_t t = 0; t < sizes.size(); ++t) {
        std::vector<float> part(x.begin() + off[t], x.begin() + off[t + 1]);
        for (size_t i : RefTopK(part, RefK(part.size(), ratio))) I.push_back(off[t] + i);
      }
      return I;
    };
    for (int step = 0; step < steps; ++step) {
      std::vector<std::vector<float>> p(n, std::vector<float>(total));
      for (int r = 0; r < n; ++r) {  // p = g + m
        for (size_t t = 0; t < sizes.size(); ++t) {
          for (size_t i = 0; i < sizes[t]; ++i) {
            p[r][off[t] + i] = input(r, step, t, i) + m[r][off[t] + i];
          }
        }
      }
      const int leader = fixed_leader >= 0 ? fixed_leader : step % n;  // l = t mod n
      const float divisor = average ? static_cast<float>(n) : 1.0f;
      std::vector<double> sum(total, 0.0);
      std::vector<float> out(total, 0.0f);
      std::vector<std::vector<size_t>> sent(n);
      const std::vector<size_t> shared = topk ? std::vector<size_t>{} : select(p[leader]);
      for (int r = 0; r < n; ++r) {
        sent[r] = topk ? select(p[r]) : shared;
        for (size_t i : sent[r]) {
          sum[i] += p[r][i];
          if (topk) out[i] += p[r][i] / divisor;  // documented: divided first, rank order
        }
      }
      for (size_t i = 0; i < total && !topk; ++i) out[i] = static_cast<float>(sum[i]) / divisor;
      outs.push_back(out);
      for (int r = 0; r < n; ++r) {  // m <- (1 - beta) m + beta (p - p restricted to sent)
        std::vector<float> d = p[r];
        for (size_t i : sent[r]) d[i] = 0.0f;
        for (size_t i = 0; i < total; ++i) m[r][i] = (1.0f - beta) * m[r][i] + beta * d[i];
      }
    }
    return outs;
  }
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_SPARSE_REFERENCE_H_
