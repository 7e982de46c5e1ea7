#include "control/fusion.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace braid::control {
namespace {

using Buckets = std::vector<std::vector<int>>;

TEST(PlanBucketsTest, SameKeyFillsUpToTheThresholdInOrder) {
  EXPECT_EQ(PlanBuckets({{"f32", 10}, {"f32", 20}, {"f32", 30}, {"f32", 50}}, 60),
            (Buckets{{0, 1, 2}, {3}}));
}

TEST(PlanBucketsTest, ThresholdExactlyHitStillFuses) {
  EXPECT_EQ(PlanBuckets({{"k", 40}, {"k", 24}, {"k", 1}}, 64), (Buckets{{0, 1}, {2}}));
}

TEST(PlanBucketsTest, MixedDtypesLookAheadPastAMismatch) {
  // f32, i32, f32, i32, f32: the two keys interleave and each bucket looks past the other.
  EXPECT_EQ(PlanBuckets({{"f32", 4}, {"i32", 4}, {"f32", 4}, {"i32", 4}, {"f32", 4}}, 1024),
            (Buckets{{0, 2, 4}, {1, 3}}));
}

TEST(PlanBucketsTest, OversizeTensorTravelsAlone) {
  EXPECT_EQ(PlanBuckets({{"k", 10}, {"k", 100}, {"k", 10}}, 64), (Buckets{{0, 2}, {1}}));
}

TEST(PlanBucketsTest, ThresholdZeroDisablesFusion) {
  EXPECT_EQ(PlanBuckets({{"k", 1}, {"k", 1}, {"k", 1}}, 0), (Buckets{{0}, {1}, {2}}));
}

TEST(PlanBucketsTest, EmptyKeyNeverFuses) {
  EXPECT_EQ(PlanBuckets({{"", 1}, {"", 1}}, 100), (Buckets{{0}, {1}}));
}

TEST(PlanBucketsTest, ATensorThatDoesNotFitClosesTheBucket) {
  // Note [Consecutive buckets]: 50 + 30 > 64 closes the first bucket, although 50 + 10
  // would fit: the buckets stay runs of consecutive tensors.
  EXPECT_EQ(PlanBuckets({{"k", 50}, {"k", 30}, {"k", 10}}, 64), (Buckets{{0}, {1, 2}}));
  // Items of another key, and oversize ones, are looked past without closing it.
  EXPECT_EQ(PlanBuckets({{"k", 20}, {"j", 60}, {"k", 100}, {"k", 20}, {"k", 30}}, 64),
            (Buckets{{0, 3}, {1}, {2}, {4}}));
}

TEST(PlanBucketsTest, EveryItemPlacedOnceAndBucketsOrderedByFirstItem) {
  std::vector<FusionItem> items;
  for (int i = 0; i < 200; ++i) items.push_back({i % 3 ? "a" : "b", 1 + (i * 7919) % 97});
  Buckets b = PlanBuckets(items, 150);
  std::vector<int> seen(items.size(), 0);
  int last_first = -1;
  for (const auto& bucket : b) {
    EXPECT_GT(bucket.front(), last_first);
    last_first = bucket.front();
    int64_t bytes = 0;
    for (size_t k = 0; k < bucket.size(); ++k) {
      ++seen[bucket[k]];
      bytes += items[bucket[k]].bytes;
      if (k) {
        EXPECT_LT(bucket[k - 1], bucket[k]);
        EXPECT_EQ(items[bucket[k]].key, items[bucket[0]].key);
      }
    }
    if (bucket.size() > 1) {
      EXPECT_LE(bytes, 150);
    }
    // Consecutive: no item of the key between the bucket's first and last is elsewhere,
    // unless it travels alone.
    for (int j = bucket.front() + 1; j < bucket.back(); ++j) {
      if (items[j].key != items[bucket[0]].key || items[j].bytes > 150) continue;
      EXPECT_NE(std::find(bucket.begin(), bucket.end(), j), bucket.end()) << j;
    }
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

}  // namespace
}  // namespace braid::control
