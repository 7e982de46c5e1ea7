// The statistics ledger (runtime/statistics.h): per-method totals stay exact while the
// per-tensor table keeps a bounded number of names, the least recently reduced dropped first
// (Note [Bounded per-tensor statistics]); the totals per method and plan pattern are bounded
// too (Note [Compression groups]).
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/statistics.h"

namespace braid {
namespace {

ByteStats OneReduction(uint64_t bytes) {
  ByteStats b;
  b.reductions = 1;
  b.uncompressed_bytes = bytes;
  b.payload_bytes = bytes / 2;
  b.transport_bytes = bytes;
  b.reference_transport_bytes = bytes;
  return b;
}

// A job that all-reduces a new name every step (20,000 steps grew the table to 20,000
// entries and 5 MB) next to one gradient reduced every step.
TEST(StatisticsLedgerTest, NewNamesEveryStepKeepTheTableBoundedAndTheTotalsExact) {
  StatisticsLedger ledger;
  for (int step = 0; step < 20000; ++step) {
    ledger.Record("grad", "fp16", OneReduction(400));
    ledger.Record(absl::StrCat("step.", step), "none", OneReduction(8));
  }
  CompressionReport r = ledger.Report();
  ASSERT_EQ(r.tensors.size(), kMaxTensorStats);
  EXPECT_EQ(kMaxTensorStats, 4096u);
  // The names reduced most recently: "grad" and the last 4095 steps'.
  EXPECT_EQ(r.tensors.front().name, "grad");
  EXPECT_EQ(r.tensors.front().bytes.reductions, 20000u);
  EXPECT_EQ(r.tensors.front().bytes.uncompressed_bytes, 20000u * 400);
  EXPECT_EQ(r.tensors[1].name, "step.15905");
  EXPECT_EQ(r.tensors.back().name, "step.19999");
  // The per-method totals count every reduction, dropped names' included.
  ASSERT_EQ(r.methods.size(), 2u);
  EXPECT_EQ(r.methods[0].method, "fp16");
  EXPECT_EQ(r.methods[0].tensors, 1u);
  EXPECT_EQ(r.methods[0].bytes.reductions, 20000u);
  EXPECT_EQ(r.methods[0].bytes.payload_bytes, 20000u * 200);
  EXPECT_EQ(r.methods[1].method, "none");
  EXPECT_EQ(r.methods[1].tensors, 20000u);
  EXPECT_EQ(r.methods[1].bytes.reductions, 20000u);
  EXPECT_EQ(r.methods[1].bytes.uncompressed_bytes, 20000u * 8);
  EXPECT_EQ(r.methods[1].bytes.transport_bytes, 20000u * 8);
  // A dropped name that comes back starts again (and counts again among the method's names).
  ledger.Record("step.0", "none", OneReduction(8));
  r = ledger.Report();
  EXPECT_EQ(r.tensors.size(), kMaxTensorStats);
  EXPECT_EQ(r.tensors[1].name, "step.0");
  EXPECT_EQ(r.tensors[1].bytes.reductions, 1u);
  EXPECT_EQ(r.methods[1].tensors, 20001u);
  EXPECT_EQ(r.methods[1].bytes.reductions, 20001u);
}

TEST(StatisticsLedgerTest, TheLeastRecentlyReducedNameIsDroppedFirst) {
  StatisticsLedger ledger(3);
  for (const char* name : {"a", "b", "c", "a", "d"}) ledger.Record(name, "none", OneReduction(4));
  CompressionReport r = ledger.Report();
  ASSERT_EQ(r.tensors.size(), 3u);
  EXPECT_EQ(r.tensors[0].name, "a");  // reduced again before "d" came: kept, with both
  EXPECT_EQ(r.tensors[0].bytes.reductions, 2u);
  EXPECT_EQ(r.tensors[1].name, "c");
  EXPECT_EQ(r.tensors[2].name, "d");
  // A name under two methods is one entry of the table.
  ledger.Record("d", "fp16", OneReduction(4));
  r = ledger.Report();
  ASSERT_EQ(r.tensors.size(), 4u);
  EXPECT_EQ(r.tensors[2].name, "d");
  EXPECT_EQ(r.tensors[3].name, "d");
  EXPECT_EQ(r.tensors[3].method, "none");
  EXPECT_EQ(r.methods[1].bytes.reductions, 5u);
}

// Note [Compression groups]: the totals per method and plan pattern; a name counts once per
// group, and a method's totals are the sums of its groups.
TEST(StatisticsLedgerTest, GroupsCountEachMethodPerPlanPattern) {
  StatisticsLedger ledger;
  for (int step = 0; step < 3; ++step) {
    ledger.Record("fc.bias", "none", "*.bias", OneReduction(40));
    ledger.Record("emb.weight", "fp16", "emb.*", OneReduction(400));
    ledger.Record("fc.weight", "fp16", "*", OneReduction(800));
    ledger.Record("conv.weight", "fp16", "*", OneReduction(800));
    ledger.Record("loss", "none", OneReduction(4));  // no plan
  }
  const CompressionReport r = ledger.Report();
  ASSERT_EQ(r.groups.size(), 4u);
  auto expect = [&](size_t i, const char* method, const char* pattern, uint64_t tensors,
                    uint64_t bytes) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r.groups[i].method, method);
    EXPECT_EQ(r.groups[i].pattern, pattern);
    EXPECT_EQ(r.groups[i].tensors, tensors);
    EXPECT_EQ(r.groups[i].bytes.reductions, 3 * tensors);
    EXPECT_EQ(r.groups[i].bytes.uncompressed_bytes, 3 * bytes);
    EXPECT_EQ(r.groups[i].bytes.payload_bytes, 3 * bytes / 2);
  };
  // Sorted by (method, pattern).
  expect(0, "fp16", "*", 2, 1600);
  expect(1, "fp16", "emb.*", 1, 400);
  expect(2, "none", "", 1, 4);
  expect(3, "none", "*.bias", 1, 40);
  ASSERT_EQ(r.methods.size(), 2u);
  EXPECT_EQ(r.methods[0].tensors, 3u);
  EXPECT_EQ(r.methods[0].bytes.uncompressed_bytes, 3u * 2000);
  EXPECT_EQ(r.methods[1].tensors, 2u);
  // Each tensor under its group's pattern; the heartbeat's totals are the report's groups.
  std::map<std::string, std::string> pattern;
  for (const auto& t : r.tensors) pattern[t.name] = t.pattern;
  EXPECT_EQ(pattern, (std::map<std::string, std::string>{{"conv.weight", "*"},
                                                         {"emb.weight", "emb.*"},
                                                         {"fc.bias", "*.bias"},
                                                         {"fc.weight", "*"},
                                                         {"loss", ""}}));
  const std::vector<CompressionGroupStats> totals = ledger.GroupTotals();
  ASSERT_EQ(totals.size(), r.groups.size());
  for (size_t i = 0; i < totals.size(); ++i) {
    EXPECT_EQ(totals[i].pattern, r.groups[i].pattern);
    EXPECT_EQ(totals[i].bytes.payload_bytes, r.groups[i].bytes.payload_bytes);
  }
  // A name whose pattern changes (a new plan) counts in both groups, once among its method's.
  ledger.Record("fc.weight", "fp16", "fc.*", OneReduction(800));
  const CompressionReport again = ledger.Report();
  ASSERT_EQ(again.groups.size(), 5u);
  EXPECT_EQ(again.groups[2].pattern, "fc.*");  // after "*" and "emb.*"
  EXPECT_EQ(again.groups[2].tensors, 1u);
  EXPECT_EQ(again.groups[0].tensors, 2u);
  EXPECT_EQ(again.methods[0].tensors, 3u);
}

// A plan of many patterns: the first kMaxCompressionGroups groups keep their rows, every
// later pattern of a method counts in its "(other patterns)" group; the totals stay exact.
TEST(StatisticsLedgerTest, PatternsBeyondTheBoundFoldIntoOneGroupPerMethod) {
  EXPECT_EQ(control::kMaxCompressionGroups, 64u);
  StatisticsLedger ledger;
  for (int i = 0; i < 200; ++i) {
    const std::string name = absl::StrCat("layer", i, ".weight");
    ledger.Record(name, i % 2 == 0 ? "fp16" : "fp4", absl::StrCat("layer", i, ".*"),
                  OneReduction(100));
  }
  ledger.Record("layer0.weight", "fp16", "layer0.*", OneReduction(100));  // a kept group
  ledger.Record("bias", "fp16", "*.bias", OneReduction(100));  // a new one: folded
  ledger.Record("loss", "none", OneReduction(100));  // no pattern: its own row, never folded
  const CompressionReport r = ledger.Report();
  // 64 groups of a pattern, one "(other patterns)" per method, none's of no pattern.
  ASSERT_EQ(r.groups.size(), 64u + 2u + 1u);
  std::map<std::string, uint64_t> other_tensors, all_reductions;
  size_t own = 0;
  for (const CompressionGroupStats& g : r.groups) {
    all_reductions[g.method] += g.bytes.reductions;
    if (g.pattern == control::kOtherPatterns) {
      other_tensors[g.method] = g.tensors;
    } else {
      ++own;
    }
  }
  EXPECT_EQ(own, 64u + 1u);
  EXPECT_EQ(other_tensors, (std::map<std::string, uint64_t>{{"fp16", 69}, {"fp4", 68}}));
  EXPECT_EQ(all_reductions,
            (std::map<std::string, uint64_t>{{"fp16", 102}, {"fp4", 100}, {"none", 1}}));
  EXPECT_EQ(r.groups.back().method, "none");
  EXPECT_EQ(r.groups.back().pattern, "");
  for (const CompressionGroupStats& g : r.groups) {
    if (g.pattern == "layer0.*") {
      EXPECT_EQ(g.bytes.reductions, 2u);
    }
  }
  // Every method's totals count every reduction, folded or not.
  ASSERT_EQ(r.methods.size(), 3u);
  EXPECT_EQ(r.methods[0].bytes.reductions, 102u);
  EXPECT_EQ(r.methods[0].tensors, 101u);
  EXPECT_EQ(AutoCompressionPattern(""), "(auto)");
  EXPECT_EQ(AutoCompressionPattern("emb.*"), "emb.* (auto)");
}

}  // namespace
}  // namespace braid
