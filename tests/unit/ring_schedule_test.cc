// The data plane's planning functions, checked by simulating every rank of a ring (and of
// recursive doubling) in one process with plain vectors.
#include "transport/ring_schedule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "transport/pipeline.h"
#include "transport/tag.h"

namespace braid::transport {
namespace {

constexpr size_t kCounts[] = {0, 1, 2, 7, 13, 1000003};

// Rank r's input: distinct per rank and element, so a segment reduced twice or missed shows.
int64_t Input(int rank, size_t i) { return (int64_t{rank} + 1) * 1000003 + int64_t(i) * 7 - 5; }

// Runs RingSchedule for all `size` ranks in lock step: at each step every rank sends its
// send_segment to rank+1, which reduces (reduce-scatter) or copies (all-gather) it into its
// recv_segment. Checks the pairing of sends and receives, the owned segment after the
// reduce-scatter phase, and the final sums.
void SimulateRing(int size, size_t count, int owned_shift) {
  SCOPED_TRACE(testing::Message() << "size " << size << " count " << count << " shift "
                                  << owned_shift);
  const std::vector<Span1D> seg = PartitionEven(count, size);
  std::vector<std::vector<int64_t>> buf(size, std::vector<int64_t>(count));
  std::vector<int64_t> total(count, 0);
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < count; ++i) {
      buf[r][i] = Input(r, i);
      total[i] += buf[r][i];
    }
  }
  std::vector<std::vector<RingStep>> plan(size);
  for (int r = 0; r < size; ++r) {
    plan[r] = RingSchedule(r, size, owned_shift);
    ASSERT_EQ(plan[r].size(), static_cast<size_t>(2 * (size - 1)));
  }
  for (size_t k = 0; k < plan[0].size(); ++k) {
    const bool reduce = k < static_cast<size_t>(size - 1);
    // What every rank sends, taken before anyone applies this step.
    std::vector<std::vector<int64_t>> sent(size);
    for (int r = 0; r < size; ++r) {
      const RingStep& st = plan[r][k];
      EXPECT_EQ(st.phase, reduce ? RingStep::kReduceScatter : RingStep::kAllGather);
      EXPECT_EQ(st.step, static_cast<int>(reduce ? k : k - (size - 1)));
      const Span1D s = seg[st.send_segment];
      sent[r].assign(buf[r].begin() + s.offset, buf[r].begin() + s.offset + s.count);
    }
    for (int r = 0; r < size; ++r) {
      const int from = (r + size - 1) % size;
      ASSERT_EQ(plan[from][k].send_segment, plan[r][k].recv_segment)
          << "step " << k << ": rank " << from << " sends a segment rank " << r
          << " does not expect";
      const Span1D s = seg[plan[r][k].recv_segment];
      ASSERT_EQ(sent[from].size(), s.count);
      for (size_t j = 0; j < s.count; ++j) {
        if (reduce) {
          buf[r][s.offset + j] += sent[from][j];
        } else {
          buf[r][s.offset + j] = sent[from][j];
        }
      }
    }
    if (k + 1 == static_cast<size_t>(size - 1)) {  // end of reduce-scatter
      for (int r = 0; r < size; ++r) {
        const int owned = RingOwnedSegment(r, size, owned_shift);
        const Span1D s = seg[owned];
        for (size_t j = 0; j < s.count; ++j) {
          ASSERT_EQ(buf[r][s.offset + j], total[s.offset + j])
              << "rank " << r << " does not own segment " << owned << " after reduce-scatter";
        }
      }
    }
  }
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(buf[r], total) << "rank " << r;
  }
}

TEST(RingSchedule, AllReduceSimulationGivesExactSums) {
  for (int size = 2; size <= 8; ++size) {
    for (size_t count : kCounts) {
      if (count > 1000 && size != 3 && size != 8) continue;  // keep the big case cheap
      SimulateRing(size, count, 0);
      SimulateRing(size, count, size - 1);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(RingSchedule, EveryShiftWorks) {
  for (int size = 2; size <= 8; ++size) {
    for (int shift = 0; shift < size; ++shift) {
      SimulateRing(size, 37, shift);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(RingSchedule, OwnedSegments) {
  for (int size = 2; size <= 8; ++size) {
    std::set<int> owned, owned_own;
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(RingOwnedSegment(r, size), (r + 1) % size);
      EXPECT_EQ(RingOwnedSegment(r, size, size - 1), r);  // reduce-scatter: rank r owns r
      owned.insert(RingOwnedSegment(r, size));
      // The last reduce-scatter receive completes the owned segment, and the all-gather
      // starts by passing it on.
      const std::vector<RingStep> plan = RingSchedule(r, size);
      EXPECT_EQ(plan[size - 2].recv_segment, RingOwnedSegment(r, size));
      EXPECT_EQ(plan[size - 1].send_segment, RingOwnedSegment(r, size));
    }
    EXPECT_EQ(owned.size(), static_cast<size_t>(size));
  }
}

TEST(RingSchedule, SizeOneHasNoSteps) {
  EXPECT_TRUE(RingSchedule(0, 1).empty());
}

TEST(PartitionEven, SumsAndOffsets) {
  for (int parts = 1; parts <= 9; ++parts) {
    for (size_t count : kCounts) {
      const std::vector<Span1D> p = PartitionEven(count, parts);
      ASSERT_EQ(p.size(), static_cast<size_t>(parts));
      size_t offset = 0;
      for (int i = 0; i < parts; ++i) {
        EXPECT_EQ(p[i].offset, offset);
        const size_t want = count / parts + (static_cast<size_t>(i) < count % parts ? 1 : 0);
        EXPECT_EQ(p[i].count, want) << "part " << i << " of " << parts << ", count " << count;
        offset += p[i].count;
      }
      EXPECT_EQ(offset, count);
    }
  }
  EXPECT_TRUE(PartitionEven(10, 0).empty());
  EXPECT_EQ(PartitionEven(7, 3), (std::vector<Span1D>{{0, 3}, {3, 2}, {5, 2}}));
}

TEST(PartitionByCounts, BackToBack) {
  EXPECT_EQ(PartitionByCounts({3, 0, 5, 1}),
            (std::vector<Span1D>{{0, 3}, {3, 0}, {3, 5}, {8, 1}}));
  EXPECT_TRUE(PartitionByCounts({}).empty());
}

TEST(SplitSpan, PiecesKeepAbsoluteOffsets) {
  EXPECT_EQ(SplitSpan({100, 7}, 3), (std::vector<Span1D>{{100, 3}, {103, 2}, {105, 2}}));
  EXPECT_EQ(SplitSpan({5, 2}, 4), (std::vector<Span1D>{{5, 1}, {6, 1}, {7, 0}, {7, 0}}));
  EXPECT_EQ(SplitSpan({9, 0}, 1), (std::vector<Span1D>{{9, 0}}));
  for (int pieces = 1; pieces <= 6; ++pieces) {
    const std::vector<Span1D> p = SplitSpan({1000, 1000003}, pieces);
    size_t end = 1000;
    for (const Span1D& s : p) {
      EXPECT_EQ(s.offset, end);
      end += s.count;
    }
    EXPECT_EQ(end, 1000u + 1000003u);
  }
}

TEST(RingPieces, Bounds) {
  EXPECT_EQ(RingPieces(0, 1024, 8), 1);
  EXPECT_EQ(RingPieces(1, 1024, 8), 1);
  EXPECT_EQ(RingPieces(1024, 1024, 8), 1);
  EXPECT_EQ(RingPieces(1025, 1024, 8), 2);
  EXPECT_EQ(RingPieces(3 * 1024, 1024, 8), 3);
  EXPECT_EQ(RingPieces(size_t{1} << 30, 1024, 8), 8);  // capped
  EXPECT_EQ(RingPieces(size_t{1} << 30, 0, 8), 1);     // no chunking
  EXPECT_EQ(RingPieces(size_t{1} << 30, 1024, 0), 1);  // cap below 1 means 1
}

TEST(ChooseAllReduceAlgorithm, Thresholds) {
  constexpr size_t kThreshold = 64 * 1024;
  const auto kRing = AllReduceAlgorithm::kRing;
  const auto kRd = AllReduceAlgorithm::kRecursiveDoubling;
  EXPECT_EQ(ChooseAllReduceAlgorithm(kThreshold - 1, kThreshold / 4, 4, kThreshold), kRd);
  EXPECT_EQ(ChooseAllReduceAlgorithm(kThreshold, kThreshold / 4, 4, kThreshold), kRing);
  EXPECT_EQ(ChooseAllReduceAlgorithm(kThreshold + 1, kThreshold, 4, kThreshold), kRing);
  // Fewer elements than ranks: recursive doubling even for huge elements.
  EXPECT_EQ(ChooseAllReduceAlgorithm(size_t{1} << 30, 3, 4, kThreshold), kRd);
  EXPECT_EQ(ChooseAllReduceAlgorithm(size_t{1} << 30, 4, 4, kThreshold), kRing);
  // One rank needs neither and reports recursive doubling.
  EXPECT_EQ(ChooseAllReduceAlgorithm(size_t{1} << 30, size_t{1} << 28, 1, kThreshold), kRd);
  EXPECT_EQ(ChooseAllReduceAlgorithm(0, 0, 2, 0), kRd);  // 0 elements < 2 ranks
}

TEST(ChooseReduceScatterAlgorithm, DirectUpToTheThresholdRingAbove) {
  EXPECT_EQ(ChooseReduceScatterAlgorithm(2, 16), ReduceScatterAlgorithm::kDirect);
  EXPECT_EQ(ChooseReduceScatterAlgorithm(16, 16), ReduceScatterAlgorithm::kDirect);
  EXPECT_EQ(ChooseReduceScatterAlgorithm(17, 16), ReduceScatterAlgorithm::kRing);
  EXPECT_EQ(ChooseReduceScatterAlgorithm(3, 2), ReduceScatterAlgorithm::kRing);
  EXPECT_EQ(ChooseReduceScatterAlgorithm(1, 0), ReduceScatterAlgorithm::kRing);
}

TEST(PipelinePieces, ChunksCappedBy4096AndByTheTagSlots) {
  EXPECT_EQ(PipelinePieces(0, 1024, 3), 1);
  EXPECT_EQ(PipelinePieces(4096, 1024, 3), 4);
  EXPECT_EQ(PipelinePieces(4097, 1024, 3), 5);
  EXPECT_EQ(PipelinePieces(size_t{1} << 40, 1024, 3), 4096);
  // stages * pieces must stay below 2^16 tag slots: 2(n-1) stages for 64 ranks = 126.
  EXPECT_EQ(PipelinePieces(size_t{1} << 40, 1024, 126), 65536 / 126);
  EXPECT_LT(126u * static_cast<uint32_t>(PipelinePieces(size_t{1} << 40, 1, 126)),
            kMaxTagSlots + 1);
  EXPECT_EQ(PipelinePieces(size_t{1} << 40, 1024, 65535), 1);
}

TEST(EncodeUcxTag, PairSeqSlotLayout) {
  EXPECT_EQ(EncodeUcxTag(0, Tag{0, 0}), 0u);
  EXPECT_EQ(EncodeUcxTag(3, Tag{2, 1}), (uint64_t{3} << 32) | (uint64_t{2} << 16) | 1u);
  // A full 32-bit pair field (a keyed value) survives; seq and slot keep their low 16 bits.
  EXPECT_EQ(EncodeUcxTag(0xdeadbeefu, Tag{0x12345, 0xfffff}),
            (uint64_t{0xdeadbeef} << 32) | (uint64_t{0x2345} << 16) | 0xffffu);
  EXPECT_NE(EncodeUcxTag(1, Tag{7, 9}), EncodeUcxTag(2, Tag{7, 9}));
  EXPECT_NE(EncodeUcxTag(1, Tag{7, 9}), EncodeUcxTag(1, Tag{8, 9}));
  EXPECT_NE(EncodeUcxTag(1, Tag{7, 9}), EncodeUcxTag(1, Tag{7, 10}));
}

TEST(RecursiveDoubling, RolesForSizesOneToNine) {
  for (int size = 1; size <= 9; ++size) {
    SCOPED_TRACE(testing::Message() << "size " << size);
    int p2 = 1;
    while (p2 * 2 <= size) p2 *= 2;
    std::set<int> new_ranks;
    int extras = 0;
    for (int r = 0; r < size; ++r) {
      const RecursiveDoublingRole role = RecursiveDoublingRoleFor(r, size);
      EXPECT_EQ(role.p2, p2);
      if (role.new_rank < 0) {
        ++extras;
        ASSERT_GE(role.partner, 0);
        ASSERT_LT(role.partner, size);
        const RecursiveDoublingRole other = RecursiveDoublingRoleFor(role.partner, size);
        EXPECT_EQ(other.partner, r) << "partners do not pair up";
        EXPECT_GE(other.new_rank, 0) << "two extras paired";
      } else {
        EXPECT_LT(role.new_rank, p2);
        EXPECT_TRUE(new_ranks.insert(role.new_rank).second) << "duplicate " << role.new_rank;
        EXPECT_EQ(RecursiveDoublingRealRank(role.new_rank, size), r);
        if (role.partner >= 0) {
          EXPECT_EQ(RecursiveDoublingRoleFor(role.partner, size).partner, r);
          EXPECT_LT(RecursiveDoublingRoleFor(role.partner, size).new_rank, 0);
        }
      }
    }
    EXPECT_EQ(extras, size - p2);
    EXPECT_EQ(new_ranks.size(), static_cast<size_t>(p2));
  }
}

// Full recursive doubling with the roles: extras fold into partners, log2(p2) exchange
// rounds between participants new_rank and new_rank ^ mask, then results go back to extras.
TEST(RecursiveDoubling, SimulationGivesExactSums) {
  for (int size = 1; size <= 9; ++size) {
    std::vector<int64_t> v(size);
    for (int r = 0; r < size; ++r) v[r] = int64_t{1} << r;
    const int64_t total = (int64_t{1} << size) - 1;
    for (int r = 0; r < size; ++r) {
      const RecursiveDoublingRole role = RecursiveDoublingRoleFor(r, size);
      if (role.new_rank < 0) v[role.partner] += v[r];
    }
    const int p2 = RecursiveDoublingRoleFor(0, size).p2;
    for (int mask = 1; mask < p2; mask <<= 1) {
      std::vector<int64_t> next = v;
      for (int nr = 0; nr < p2; ++nr) {
        next[RecursiveDoublingRealRank(nr, size)] += v[RecursiveDoublingRealRank(nr ^ mask, size)];
      }
      v = next;
    }
    for (int r = 0; r < size; ++r) {
      const RecursiveDoublingRole role = RecursiveDoublingRoleFor(r, size);
      if (role.new_rank < 0) v[r] = v[role.partner];
    }
    for (int r = 0; r < size; ++r) EXPECT_EQ(v[r], total) << "size " << size << " rank " << r;
  }
}

}  // namespace
}  // namespace braid::transport
