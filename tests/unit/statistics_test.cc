// The statistics ledger (runtime/statistics.h): per-method totals stay exact while the
// per-tensor table keeps a bounded number of names, the least recently reduced dropped first
// (Note [Bounded per-tensor statistics]).
#include <string>

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

}  // namespace
}  // namespace braid
