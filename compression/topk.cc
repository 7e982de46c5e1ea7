#include "compression/topk.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/multiversion.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BRAID_HAVE_AVX2_SCAN 1
#endif

// Compiled with -O3 -fno-trapping-math (compression/CMakeLists.txt). No contraction: the
// x86-64-v3 clone must not fuse AddFilterAndClear's multiply and add into an FMA, which the
// baseline clone and ErrorFeedback (whose recurrence it reproduces bit for bit) lack.
#pragma GCC optimize("fp-contract=off")

namespace braid::compression {
namespace {

constexpr size_t kSamples = 4096;
constexpr size_t kMinSampledCount = 32768;
constexpr size_t kBlock = 16;

// splitmix64's finaliser: fixed sample positions, the same on every machine and run.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of a segment: x[i] + a[i], or x[i] (kAdd false).
template <bool kAdd>
inline float At(const float* x, const float* a, size_t i) {
  return kAdd ? x[i] + a[i] : x[i];
}
inline float At(const FloatSegment& s, size_t i) {
  return s.addend != nullptr ? s.data[i] + s.addend[i] : s.data[i];
}
inline int32_t Key(float v) { return static_cast<int32_t>(MagnitudeKey(v)); }

// Appends base + i to out[] and key(i) to keys[] for every i < n with key(i) >= t (> 0), in
// index order, up to `room` entries, and raises *max_key to the largest key seen. Returns how
// many it appended, or room + 1 when there were more (*max_key then covers only a prefix).
// Keys are below 2^31, so a signed compare orders them (AVX2 has no unsigned one).
// Candidates are rare (about 1.5% at k/N = 1%) and scattered: a block of kBlock elements is
// tested as a whole, and a block with candidates is compacted without a branch per element,
// which would mispredict on every candidate.
template <bool kAdd>
size_t CollectPortable(const float* __restrict x, const float* __restrict a, size_t n,
                       int32_t t, uint64_t base, uint64_t* __restrict out,
                       uint32_t* __restrict keys, size_t room, int32_t* max_key) {
  size_t found = 0;
  int32_t seen = *max_key;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int32_t mx = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      const int32_t k = Key(At<kAdd>(x, a, i + j));
      mx = k > mx ? k : mx;
    }
    seen = mx > seen ? mx : seen;
    if (mx < t) continue;
    if (found + kBlock > room) return room + 1;
    for (size_t j = 0; j < kBlock; ++j) {  // every element written, kept when it qualifies
      const int32_t k = Key(At<kAdd>(x, a, i + j));
      out[found] = base + i + j;
      keys[found] = static_cast<uint32_t>(k);
      found += k >= t ? 1 : 0;
    }
  }
  for (; i < n; ++i) {
    const int32_t k = Key(At<kAdd>(x, a, i));
    seen = k > seen ? k : seen;
    if (k >= t) {
      if (found == room) return room + 1;
      out[found] = base + i;
      keys[found++] = static_cast<uint32_t>(k);
    }
  }
  *max_key = seen;
  return found;
}

#ifdef BRAID_HAVE_AVX2_SCAN
// The same with AVX2 intrinsics (GCC unrolls the portable block test completely and then
// does not vectorize it): per 16 elements two adds (kAdd), two compares, two maxes, an OR and
// a ptest; movemask + tzcnt walk a block's candidates. Same candidates, same order, same keys:
// vector float adds round as scalar ones do.
template <bool kAdd>
__attribute__((target("avx2,bmi"))) size_t CollectAvx2(
    const float* __restrict x, const float* __restrict a, size_t n, int32_t t, uint64_t base,
    uint64_t* __restrict out, uint32_t* __restrict keys, size_t room, int32_t* max_key) {
  static_assert(kBlock == 16, "two 8-lane vectors per block");
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(t - 1);  // key > t - 1  <=>  key >= t
  __m256i seen = _mm256_setzero_si256();
  size_t found = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    __m256 va = _mm256_loadu_ps(x + i), vb = _mm256_loadu_ps(x + i + 8);
    if (kAdd) {
      va = _mm256_add_ps(va, _mm256_loadu_ps(a + i));
      vb = _mm256_add_ps(vb, _mm256_loadu_ps(a + i + 8));
    }
    const __m256i ka = _mm256_and_si256(_mm256_castps_si256(va), abs_mask);
    const __m256i kb = _mm256_and_si256(_mm256_castps_si256(vb), abs_mask);
    seen = _mm256_max_epi32(seen, _mm256_max_epi32(ka, kb));
    const __m256i ca = _mm256_cmpgt_epi32(ka, below), cb = _mm256_cmpgt_epi32(kb, below);
    const __m256i any = _mm256_or_si256(ca, cb);
    if (_mm256_testz_si256(any, any)) continue;
    if (found + kBlock > room) return room + 1;
    uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(ca))) |
                    (static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(cb))) << 8);
    while (bits != 0) {
      const uint32_t j = static_cast<uint32_t>(__builtin_ctz(bits));
      out[found] = base + i + j;
      keys[found++] = MagnitudeKey(At<kAdd>(x, a, i + j));
      bits &= bits - 1;
    }
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), seen);
  for (int32_t v : lanes) *max_key = v > *max_key ? v : *max_key;
  const size_t tail = CollectPortable<kAdd>(x + i, kAdd ? a + i : a, n - i, t, base + i,
                                            out + found, keys + found, room - found, max_key);
  return tail > room - found ? room + 1 : found + tail;
}
#endif

bool use_vector_selection = true;

size_t Collect(const FloatSegment& s, int32_t t, uint64_t base, uint64_t* out, uint32_t* keys,
               size_t room, int32_t* max_key) {
  const bool add = s.addend != nullptr;
#ifdef BRAID_HAVE_AVX2_SCAN
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
  if (avx2 && use_vector_selection) {
    return add ? CollectAvx2<true>(s.data, s.addend, s.count, t, base, out, keys, room, max_key)
               : CollectAvx2<false>(s.data, s.addend, s.count, t, base, out, keys, room,
                                    max_key);
  }
#endif
  return add ? CollectPortable<true>(s.data, s.addend, s.count, t, base, out, keys, room, max_key)
             : CollectPortable<false>(s.data, s.addend, s.count, t, base, out, keys, room,
                                      max_key);
}

// keys[i] = key(x[i] (+ a[i])); returns the largest.
template <bool kAdd>
BRAID_MULTIVERSION uint32_t CopyKeys(const float* __restrict x, const float* __restrict a,
                                     size_t n, uint32_t* __restrict keys) {
  uint32_t mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = MagnitudeKey(At<kAdd>(x, a, i));
    keys[i] = k;
    mx = k > mx ? k : mx;
  }
  return mx;
}

template <bool kAdd>
BRAID_MULTIVERSION uint32_t MaxKeyOf(const float* __restrict x, const float* __restrict a,
                                     size_t n) {
  int32_t mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t k = Key(At<kAdd>(x, a, i));
    mx = k > mx ? k : mx;
  }
  return static_cast<uint32_t>(mx);
}

// The element at global index g; `offsets` are the segments' starts.
inline float ValueAt(absl::Span<const FloatSegment> segments, const std::vector<uint64_t>& offsets,
                     uint64_t g) {
  const size_t s = std::upper_bound(offsets.begin(), offsets.end(), g) - offsets.begin() - 1;
  return At(segments[s], g - offsets[s]);
}

// How many of keys[0..k) exceed keys[k-1] after an nth_element for the k-th largest, so how
// many of the elements equal to it the top k takes.
size_t TiesToTake(const std::vector<uint32_t>& keys, size_t k) {
  const uint32_t kth = keys[k - 1];
  return k - static_cast<size_t>(std::count_if(keys.begin(), keys.begin() + (k - 1),
                                               [kth](uint32_t v) { return v > kth; }));
}

}  // namespace

void UseVectorSelection(bool enabled) { use_vector_selection = enabled; }

uint32_t MaxKeyOfSum(const float* x, const float* a, size_t n) {
  return a != nullptr ? MaxKeyOf<true>(x, a, n) : MaxKeyOf<false>(x, a, n);
}

BRAID_MULTIVERSION
void AddFilterAndClear(float* __restrict m, float* __restrict g, size_t n, float beta) {
  if (beta == 1.0f) {
    for (size_t i = 0; i < n; ++i) {
      m[i] = g[i] + m[i];
      g[i] = 0.0f;
    }
    return;
  }
  // ErrorFeedback: p = g + e (Apply), then keep·e + beta·(p - sent) with sent = 0 (Update).
  const float keep = 1.0f - beta;
  for (size_t i = 0; i < n; ++i) {
    const float p = g[i] + m[i];
    m[i] = keep * m[i] + beta * (p - 0.0f);
    g[i] = 0.0f;
  }
}

bool TopKSelector::Select(absl::Span<const FloatSegment> segments, size_t k,
                          std::vector<uint64_t>* out, TopKAlgorithm algorithm) {
  size_t total = 0;
  for (const FloatSegment& s : segments) total += s.count;
  k = std::min(k, total);
  out->clear();
  last_ = TopKAlgorithm::kNthElement;
  if (k == total) {  // everything (or nothing): no selection, only the check
    for (const FloatSegment& s : segments) {
      if (MaxKeyOfSum(s.data, s.addend, s.count) >= kNonFiniteKey) return false;
    }
    out->resize(total);
    for (size_t i = 0; i < total; ++i) (*out)[i] = i;
    return true;
  }
  if (algorithm == TopKAlgorithm::kAuto) {
    algorithm = total >= kMinSampledCount && k <= total / 16 ? TopKAlgorithm::kSampledThreshold
                                                             : TopKAlgorithm::kNthElement;
  }
  if (algorithm == TopKAlgorithm::kSampledThreshold) {
    const int done = SelectBySample(segments, total, k, out);
    if (done < 0) return false;
    if (done > 0) {
      last_ = TopKAlgorithm::kSampledThreshold;
      return true;
    }
  }
  return SelectByNthElement(segments, total, k, out);
}

bool TopKSelector::SelectByNthElement(absl::Span<const FloatSegment> segments, size_t total,
                                      size_t k, std::vector<uint64_t>* out) {
  keys_.resize(total);
  size_t off = 0;
  uint32_t max_key = 0;
  for (const FloatSegment& s : segments) {
    const uint32_t m = s.addend != nullptr ? CopyKeys<true>(s.data, s.addend, s.count, &keys_[off])
                                           : CopyKeys<false>(s.data, nullptr, s.count, &keys_[off]);
    max_key = std::max(max_key, m);
    off += s.count;
  }
  if (max_key >= kNonFiniteKey) return false;
  std::nth_element(keys_.begin(), keys_.begin() + (k - 1), keys_.end(), std::greater<uint32_t>());
  const uint32_t kth = keys_[k - 1];
  size_t ties = TiesToTake(keys_, k);
  out->reserve(k);
  off = 0;
  for (const FloatSegment& s : segments) {
    for (size_t i = 0; i < s.count; ++i) {
      const uint32_t key = MagnitudeKey(At(s, i));
      if (key > kth) {
        out->push_back(off + i);
      } else if (key == kth && ties > 0) {
        out->push_back(off + i);
        --ties;
      }
    }
    off += s.count;
  }
  return true;
}

int TopKSelector::SelectBySample(absl::Span<const FloatSegment> segments, size_t total,
                                 size_t k, std::vector<uint64_t>* out) {
  offsets_.clear();
  uint64_t off = 0;
  for (const FloatSegment& s : segments) {
    offsets_.push_back(off);
    off += s.count;
  }
  sample_.resize(kSamples);
  for (size_t j = 0; j < kSamples; ++j) {
    sample_[j] = MagnitudeKey(ValueAt(segments, offsets_, Mix(j) % total));
    if (sample_[j] >= kNonFiniteKey) return -1;  // no need to look further
  }
  // The sample's count above the true k-th key is Binomial(S, k/N): take the sample key of
  // rank expected + 3 sd + 3, so the threshold is at or below the k-th key unless that count
  // is 3 sd above its mean (the fallback then covers it).
  const double expected = static_cast<double>(k) * kSamples / static_cast<double>(total);
  const size_t rank = static_cast<size_t>(expected + 3.0 * std::sqrt(expected) + 3.0);
  if (rank >= kSamples) return 0;
  std::nth_element(sample_.begin(), sample_.begin() + rank, sample_.end(),
                   std::greater<uint32_t>());
  const uint32_t t = sample_[rank];
  if (t == 0) return 0;  // mostly zeros: a scan would take them all
  // About N·(rank+1)/S candidates are expected; far more means a pile of ties at t.
  const size_t room = std::max(2 * k, 2 * static_cast<size_t>(static_cast<double>(total) *
                                                              (rank + 1) / kSamples)) +
                      1024 + kBlock;
  candidates_.resize(room);
  keys_.resize(room);
  size_t found = 0;
  int32_t max_key = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const size_t got = Collect(segments[s], static_cast<int32_t>(t), offsets_[s],
                               candidates_.data() + found, keys_.data() + found, room - found,
                               &max_key);
    if (got > room - found) return 0;
    found += got;
  }
  if (static_cast<uint32_t>(max_key) >= kNonFiniteKey) return -1;
  if (found < k) return 0;  // the threshold was above the k-th key
  keys_.resize(found);
  std::vector<uint32_t>& work = sample_;  // the sample is spent: reuse it for the selection
  work.assign(keys_.begin(), keys_.end());
  std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<uint32_t>());
  const uint32_t kth = work[k - 1];
  size_t ties = TiesToTake(work, k);
  // Every key >= kth (>= t) is a candidate, and candidates are in index order.
  out->reserve(k);
  for (size_t i = 0; i < found; ++i) {
    const uint32_t key = keys_[i];
    if (key > kth) {
      out->push_back(candidates_[i]);
    } else if (key == kth && ties > 0) {
      out->push_back(candidates_[i]);
      --ties;
    }
  }
  return 1;
}

}  // namespace braid::compression
