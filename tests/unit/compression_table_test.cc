// braidctl status's compression table (tools/braidctl/compression_table.h): one row per group
// of tensors, method and plan pattern (Note [Compression groups]), "-" for no pattern.
#include "tools/braidctl/compression_table.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace braid::tools {
namespace {

proto::CompressionStat* Row(proto::StatusResponse* s, const std::string& method,
                            const std::string& pattern, int64_t tensors, int ranks) {
  proto::CompressionStat* c = s->add_compression();
  c->set_method(method);
  c->set_pattern(pattern);
  c->set_tensors(tensors);
  c->set_ranks_reporting(ranks);
  if (ranks > 0) {
    c->set_uncompressed_bytes(4000);
    c->set_payload_bytes(method == "none" ? 4000 : 1000);
    c->set_transport_bytes(3000);
    c->set_ratio(method == "none" ? 1.0 : 4.0);
  }
  return c;
}

std::vector<std::vector<std::string>> Cells(const std::string& table) {
  std::vector<std::vector<std::string>> out;
  for (absl::string_view line : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "(")) continue;  // the closing note
    out.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
  }
  return out;
}

TEST(CompressionTableTest, OneRowPerMethodAndPatternSortedWithADashForNoPattern) {
  proto::StatusResponse s;
  EXPECT_EQ(CompressionTable(s), "") << "no rows, no table";
  // Out of order, as an older coordinator might list them.
  Row(&s, "powersgd:rank=4", "*", 6, 2);
  Row(&s, "none", "*.bias", 4, 2);
  Row(&s, "fp4:ef=1", "(auto)", 0, 2);
  Row(&s, "none", "", 3, 0);
  Row(&s, "fp16", "emb.*", 2, 2);
  const std::string table = CompressionTable(s);
  const auto cells = Cells(table);
  ASSERT_EQ(cells.size(), 6u) << table;
  EXPECT_EQ(cells[0], (std::vector<std::string>{"COMPRESSION", "PATTERN", "TENSORS",
                                                "UNCOMPRESSED", "PAYLOAD", "TRANSPORT",
                                                "RATIO", "RANKS"}));
  EXPECT_EQ(cells[1], (std::vector<std::string>{"fp16", "emb.*", "2", "4000", "1000", "3000",
                                                "4.00", "2"}));
  EXPECT_EQ(cells[2], (std::vector<std::string>{"fp4:ef=1", "(auto)", "0", "4000", "1000",
                                                "3000", "4.00", "2"}));
  // No rank reported yet: its bytes are "-".
  EXPECT_EQ(cells[3], (std::vector<std::string>{"none", "-", "3", "-", "-", "-", "-", "0"}));
  EXPECT_EQ(cells[4], (std::vector<std::string>{"none", "*.bias", "4", "4000", "4000", "3000",
                                                "1.00", "2"}));
  EXPECT_EQ(cells[5], (std::vector<std::string>{"powersgd:rank=4", "*", "6", "4000", "1000",
                                                "3000", "4.00", "2"}));
  // The columns line up: every row's TENSORS starts where the header's does.
  std::vector<std::string> lines = absl::StrSplit(table, '\n');
  const size_t tensors_at = lines[0].find("TENSORS");
  EXPECT_EQ(lines[1].find(" 2 "), tensors_at - 1) << table;
}

TEST(CompressionTableTest, ALongPatternWidensThePatternColumnUpToForty) {
  proto::StatusResponse s;
  Row(&s, "fp16", "encoder.layers.*.attention.weight", 1, 1);
  std::vector<std::string> lines = absl::StrSplit(CompressionTable(s), '\n');
  const size_t tensors_at = lines[0].find("TENSORS");
  EXPECT_EQ(tensors_at, 25u + 33u + 1u) << lines[0];
  EXPECT_EQ(lines[1].substr(tensors_at, 2), "1 ") << lines[1];
  proto::StatusResponse wide;
  Row(&wide, "fp16", std::string(100, 'p'), 1, 1);
  lines = absl::StrSplit(CompressionTable(wide), '\n');
  EXPECT_EQ(lines[0].find("TENSORS"), 25u + 40u + 1u) << lines[0];
  EXPECT_NE(lines[1].find(std::string(100, 'p')), std::string::npos) << "shown in full";
}

}  // namespace
}  // namespace braid::tools
