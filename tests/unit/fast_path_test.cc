// The fast path's pure parts (runtime/fast_path.h): the rank's cache copy, the vote's
// encoding, the agreement every rank computes from the gathered votes, and its buckets.
#include "runtime/fast_path.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace braid {
namespace {

proto::Request AllReduce(const std::string& name, int64_t n, proto::DataType dtype = proto::FLOAT32,
                         const std::string& compression = "") {
  proto::Request r;
  r.set_name(name);
  r.set_collective(proto::ALLREDUCE);
  r.set_dtype(dtype);
  r.add_shape(n);
  r.set_compression(compression);
  return r;
}

// `device_ids`: the response's (empty: a CPU tensor).
void Put(FastPathCache* cache, int32_t id, const proto::Request& r,
         std::vector<int32_t> device_ids = {}) {
  proto::Response response;
  response.add_names(r.name());
  if (!device_ids.empty()) response.set_device(proto::CUDA);
  for (int32_t d : device_ids) response.add_device_ids(d);
  cache->Insert(id, r.name(), r.SerializeAsString(), response);
}

TEST(FastPathCacheTest, SlotsAreOrderedByIdAndANameHasOneSlot) {
  FastPathCache cache;
  Put(&cache, 7, AllReduce("b", 3));
  Put(&cache, 2, AllReduce("a", 3));
  Put(&cache, 9, AllReduce("c", 3));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Position(2), 0);
  EXPECT_EQ(cache.Position(7), 1);
  EXPECT_EQ(cache.Position(9), 2);
  EXPECT_EQ(cache.Position(5), -1);
  EXPECT_EQ(cache.Lookup("a", AllReduce("a", 3).SerializeAsString()), 2);
  EXPECT_EQ(cache.Lookup("a", AllReduce("a", 4).SerializeAsString()), 0);  // changed shape
  // A new id under a cached name replaces the old slot.
  Put(&cache, 11, AllReduce("a", 4));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.IdOf("a"), 11);
  EXPECT_EQ(cache.Find(2), nullptr);
  EXPECT_EQ(cache.Evict(7), "b");
  EXPECT_EQ(cache.Evict(7), "");
  EXPECT_EQ(cache.IdOf("b"), 0);
}

TEST(FastPathCacheTest, DigestDependsOnTheIdsOnlyNotOnTheOrderOfChanges) {
  FastPathCache x, y;
  Put(&x, 1, AllReduce("a", 1));
  Put(&x, 2, AllReduce("b", 1));
  Put(&y, 2, AllReduce("b", 1));
  Put(&y, 3, AllReduce("c", 1));
  Put(&y, 1, AllReduce("a", 1));
  EXPECT_NE(x.digest(), y.digest());
  y.Evict(3);
  EXPECT_EQ(x.digest(), y.digest());
}

// Three ranks, 70 slots (two words of bits): AND of ready, OR of invalidate, the smallest
// received count, ids in increasing order.
TEST(FastPathAgreeTest, AndOfReadyOrOfInvalidateMinOfReceived) {
  FastPathCache cache;
  for (int32_t id = 1; id <= 70; ++id) Put(&cache, id * 10, AllReduce("t" + std::to_string(id), 1));
  std::vector<uint64_t> gathered;
  for (int rank = 0; rank < 3; ++rank) {
    Vote v;
    v.applied = 4;
    v.received = 6 - rank;
    v.cache_size = cache.size();
    v.digest = cache.digest();
    v.ready.assign(VoteWords(cache.size()), 0);
    v.invalidate = v.ready;
    for (int p : {0, 5, 64, 69}) SetBit(&v.ready, p);  // ready everywhere
    SetBit(&v.ready, 3 + rank);                         // ready on one rank only
    if (rank == 2) SetBit(&v.invalidate, 69);           // one rank invalidates
    auto words = EncodeVote(v);
    EXPECT_EQ(words.size(), 5u + 2 * 2);
    gathered.insert(gathered.end(), words.begin(), words.end());
  }
  auto a = Agree(gathered, 3, cache, 4);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->received, 4u);
  EXPECT_EQ(a->ready, (std::vector<int32_t>{10, 60, 650}));
  EXPECT_EQ(a->invalidate, (std::vector<int32_t>{700}));
}

TEST(FastPathAgreeTest, RanksWhoseCachesDifferAreAnInternalErrorNamingThem) {
  FastPathCache cache;
  Put(&cache, 1, AllReduce("a", 1));
  std::vector<uint64_t> gathered;
  for (int rank = 0; rank < 3; ++rank) {
    Vote v;
    v.applied = rank == 1 ? 3 : 2;
    v.cache_size = 1;
    v.digest = cache.digest();
    auto words = EncodeVote(v);
    gathered.insert(gathered.end(), words.begin(), words.end());
  }
  auto a = Agree(gathered, 3, cache, 2);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a.status().message(),
            "fast path: the response caches of ranks 1 differ from this rank's (1 entries after "
            "2 coordinator messages)");
}

// Fused as the coordinator fuses: by kind up to the threshold, other collectives alone.
TEST(FastPathBucketsTest, FusesAllReducesOfOneKindUpToTheThreshold) {
  FastPathCache cache;
  Put(&cache, 1, AllReduce("a", 10));                 // 40 bytes
  Put(&cache, 2, AllReduce("b", 10, proto::FLOAT64));  // 80 bytes, another kind
  Put(&cache, 3, AllReduce("c", 10));
  Put(&cache, 4, AllReduce("d", 10, proto::FLOAT32, "fp16"));
  proto::Request bcast = AllReduce("e", 10);
  bcast.set_collective(proto::BROADCAST);
  Put(&cache, 5, bcast);
  Put(&cache, 6, AllReduce("f", 10));
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(PlanFastBuckets(ids, cache, 80),
            (std::vector<std::vector<int32_t>>{{1, 3}, {2}, {4}, {5}, {6}}));
  EXPECT_EQ(PlanFastBuckets(ids, cache, 0),
            (std::vector<std::vector<int32_t>>{{1}, {2}, {3}, {4}, {5}, {6}}));
  EXPECT_EQ(RequestBytes(cache.Find(2)->request), 80);
}

// Tensors on different devices never share a bucket, on any rank: the key holds every
// rank's device (from the coordinator's response), so it is the same on every rank even
// where this rank's own devices agree.
TEST(FastPathBucketsTest, TensorsOnDifferentDevicesOnAnyRankDoNotFuse) {
  FastPathCache cache;
  Put(&cache, 1, AllReduce("a", 10), {0, 1});  // cuda:0 on rank 0, cuda:1 on rank 1
  Put(&cache, 2, AllReduce("b", 10), {0, 1});
  Put(&cache, 3, AllReduce("c", 10), {0, 0});  // the same here (rank 0), not on rank 1
  Put(&cache, 4, AllReduce("d", 10));          // host memory
  Put(&cache, 5, AllReduce("e", 10), {0, 1});
  EXPECT_EQ(PlanFastBuckets({1, 2, 3, 4, 5}, cache, 1 << 20),
            (std::vector<std::vector<int32_t>>{{1, 2, 5}, {3}, {4}}));
}

// The element count is common/limits.h's checked one: a shape whose product overflows, or a
// negative dimension (neither passes the coordinator's validation, so neither is cached),
// counts no bytes instead of a wrapped or negative size.
TEST(FastPathBucketsTest, RequestBytesNeverWraps) {
  proto::Request r = AllReduce("huge", (int64_t{1} << 40) + 1);
  r.add_shape(int64_t{1} << 30);
  EXPECT_EQ(RequestBytes(r), 0);
  EXPECT_EQ(RequestBytes(AllReduce("negative", -10)), 0);
  EXPECT_EQ(RequestBytes(AllReduce("empty", 0)), 0);
  proto::Request scalar = AllReduce("scalar", 1, proto::FLOAT64);
  scalar.clear_shape();
  EXPECT_EQ(RequestBytes(scalar), 8);
}

}  // namespace
}  // namespace braid
