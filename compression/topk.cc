#include "compression/topk.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/multiversion.h"

// Compiled with -O3 -fno-trapping-math (compression/CMakeLists.txt). No contraction: the
// x86-64-v3 clone must not fuse FilterMemoryAndClear's multiply and add into an FMA, which
// the baseline clone and ErrorFeedback (whose recurrence it reproduces bit for bit) lack.
#pragma GCC optimize("fp-contract=off")

namespace braid::compression {
namespace {

constexpr size_t kSamples = 4096;
constexpr size_t kMinSampledCount = 32768;
constexpr size_t kBlock = 32;

// splitmix64's finaliser: fixed sample positions, the same on every machine and run.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline int32_t Key(float x) { return static_cast<int32_t>(MagnitudeKey(x)); }

// Appends base + i for every i < n with key(x[i]) >= t to out[0..), up to `room` entries.
// Returns how many it appended, or room + 1 when there were more. Keys are below 2^31, so a
// signed compare orders them (AVX2 has no unsigned one); a block of kBlock elements without a
// candidate costs a vectorized max and one compare.
BRAID_MULTIVERSION
size_t CollectAtLeast(const float* __restrict x, size_t n, int32_t t, uint64_t base,
                      uint64_t* __restrict out, size_t room) {
  size_t found = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int32_t mx = 0;  // a max reduction, which GCC vectorizes (an OR of compares it does not)
    for (size_t j = 0; j < kBlock; ++j) {
      const int32_t k = Key(x[i + j]);
      mx = k > mx ? k : mx;
    }
    if (mx < t) continue;
    for (size_t j = 0; j < kBlock; ++j) {
      if (Key(x[i + j]) >= t) {
        if (found == room) return room + 1;
        out[found++] = base + i + j;
      }
    }
  }
  for (; i < n; ++i) {
    if (Key(x[i]) >= t) {
      if (found == room) return room + 1;
      out[found++] = base + i;
    }
  }
  return found;
}

BRAID_MULTIVERSION
void CopyKeys(const float* __restrict x, size_t n, uint32_t* __restrict keys) {
  for (size_t i = 0; i < n; ++i) keys[i] = MagnitudeKey(x[i]);
}

// The segment holding global index g and g's index in it; `offsets` are the segments' starts.
inline float ValueAt(absl::Span<const FloatSegment> segments, const std::vector<uint64_t>& offsets,
                     uint64_t g) {
  const size_t s = std::upper_bound(offsets.begin(), offsets.end(), g) - offsets.begin() - 1;
  return segments[s].data[g - offsets[s]];
}

}  // namespace

BRAID_MULTIVERSION
uint32_t AddAndMaxKey(float* __restrict p, const float* __restrict m, size_t n) {
  int32_t mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = p[i] + m[i];
    p[i] = v;
    const int32_t k = Key(v);
    mx = k > mx ? k : mx;
  }
  return static_cast<uint32_t>(mx);
}

BRAID_MULTIVERSION
uint32_t MaxKey(const float* __restrict x, size_t n) {
  int32_t mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t k = Key(x[i]);
    mx = k > mx ? k : mx;
  }
  return static_cast<uint32_t>(mx);
}

BRAID_MULTIVERSION
void FilterMemoryAndClear(float* __restrict m, float* __restrict p, size_t n, float beta) {
  if (beta == 1.0f) {
    std::memcpy(m, p, n * sizeof(float));
  } else {
    // ErrorFeedback::Update's expression with sent = 0: keep·e + beta·(p - 0).
    const float keep = 1.0f - beta;
    for (size_t i = 0; i < n; ++i) m[i] = keep * m[i] + beta * (p[i] - 0.0f);
  }
  std::memset(p, 0, n * sizeof(float));
}

void TopKSelector::Select(absl::Span<const FloatSegment> segments, size_t k,
                          std::vector<uint64_t>* out, TopKAlgorithm algorithm) {
  size_t total = 0;
  for (const FloatSegment& s : segments) total += s.count;
  k = std::min(k, total);
  out->clear();
  if (k == 0) {
    last_ = TopKAlgorithm::kNthElement;
    return;
  }
  if (k == total) {  // everything: no selection needed
    out->resize(total);
    for (size_t i = 0; i < total; ++i) (*out)[i] = i;
    last_ = TopKAlgorithm::kNthElement;
    return;
  }
  if (algorithm == TopKAlgorithm::kAuto) {
    algorithm = total >= kMinSampledCount && k <= total / 16 ? TopKAlgorithm::kSampledThreshold
                                                             : TopKAlgorithm::kNthElement;
  }
  if (algorithm == TopKAlgorithm::kSampledThreshold && SelectBySample(segments, total, k, out)) {
    last_ = TopKAlgorithm::kSampledThreshold;
    return;
  }
  SelectByNthElement(segments, total, k, out);
  last_ = TopKAlgorithm::kNthElement;
}

void TopKSelector::SelectByNthElement(absl::Span<const FloatSegment> segments, size_t total,
                                      size_t k, std::vector<uint64_t>* out) {
  keys_.resize(total);
  size_t off = 0;
  for (const FloatSegment& s : segments) {
    CopyKeys(s.data, s.count, keys_.data() + off);
    off += s.count;
  }
  std::nth_element(keys_.begin(), keys_.begin() + (k - 1), keys_.end(), std::greater<uint32_t>());
  const uint32_t kth = keys_[k - 1];
  // Everything before position k-1 is >= kth and everything after it <= kth: the keys above
  // kth all sit in front, so the ties to take are k minus those.
  size_t ties = k - static_cast<size_t>(std::count_if(keys_.begin(), keys_.begin() + (k - 1),
                                                      [kth](uint32_t v) { return v > kth; }));
  out->reserve(k);
  off = 0;
  for (const FloatSegment& s : segments) {
    for (size_t i = 0; i < s.count; ++i) {
      const uint32_t key = MagnitudeKey(s.data[i]);
      if (key > kth) {
        out->push_back(off + i);
      } else if (key == kth && ties > 0) {
        out->push_back(off + i);
        --ties;
      }
    }
    off += s.count;
  }
}

bool TopKSelector::SelectBySample(absl::Span<const FloatSegment> segments, size_t total,
                                  size_t k, std::vector<uint64_t>* out) {
  std::vector<uint64_t> offsets;
  offsets.reserve(segments.size());
  uint64_t off = 0;
  for (const FloatSegment& s : segments) {
    offsets.push_back(off);
    off += s.count;
  }
  sample_.resize(kSamples);
  for (size_t j = 0; j < kSamples; ++j) {
    sample_[j] = MagnitudeKey(ValueAt(segments, offsets, Mix(j) % total));
  }
  // The sample's count above the true k-th key is Binomial(S, k/N): take the sample key of
  // rank expected + 3 sd + 3, so the threshold is at or below the k-th key unless that count
  // is 3 sd above its mean (the fallback then covers it).
  const double expected = static_cast<double>(k) * kSamples / static_cast<double>(total);
  const size_t rank = static_cast<size_t>(expected + 3.0 * std::sqrt(expected) + 3.0);
  if (rank >= kSamples) return false;
  std::nth_element(sample_.begin(), sample_.begin() + rank, sample_.end(),
                   std::greater<uint32_t>());
  const uint32_t t = sample_[rank];
  if (t == 0) return false;  // mostly zeros: a scan would take them all
  // About N·(rank+1)/S candidates are expected; far more means a pile of ties at t.
  const size_t room = std::max(2 * k, 2 * static_cast<size_t>(static_cast<double>(total) *
                                                              (rank + 1) / kSamples)) + 1024;
  candidates_.resize(room);
  size_t found = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const size_t got = CollectAtLeast(segments[s].data, segments[s].count,
                                      static_cast<int32_t>(t), offsets[s],
                                      candidates_.data() + found, room - found);
    if (got > room - found) return false;
    found += got;
  }
  if (found < k) return false;  // the threshold was above the k-th key
  keys_.resize(found);
  for (size_t i = 0; i < found; ++i) {
    keys_[i] = MagnitudeKey(ValueAt(segments, offsets, candidates_[i]));
  }
  std::vector<uint32_t>& work = sample_;  // the sample is spent: reuse it for the selection
  work.assign(keys_.begin(), keys_.end());
  std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<uint32_t>());
  const uint32_t kth = work[k - 1];
  size_t ties = k - static_cast<size_t>(std::count_if(work.begin(), work.begin() + (k - 1),
                                                      [kth](uint32_t v) { return v > kth; }));
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
  return true;
}

}  // namespace braid::compression
