#include "tools/braidctl/compression_table.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid::tools {

std::string CompressionTable(const proto::StatusResponse& status) {
  if (status.compression_size() == 0) return "";
  std::vector<const proto::CompressionStat*> rows;
  for (const proto::CompressionStat& c : status.compression()) rows.push_back(&c);
  std::stable_sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) {
    return std::tie(a->method(), a->pattern()) < std::tie(b->method(), b->pattern());
  });
  int width = 7;  // "PATTERN"; a longer pattern widens the column, up to 40 characters
  for (const proto::CompressionStat* c : rows) {
    width = std::max(width, std::min(40, static_cast<int>(c->pattern().size())));
  }
  // TENSORS as negotiated; the byte columns are what the ranks measured, summed over the
  // RANKS that reported (proto CompressionStat); "-" until a rank has reported.
  std::string out = absl::StrFormat("%-24s %-*s %-10s %-16s %-16s %-16s %-8s %s\n",
                                    "COMPRESSION", width, "PATTERN", "TENSORS", "UNCOMPRESSED",
                                    "PAYLOAD", "TRANSPORT", "RATIO", "RANKS");
  for (const proto::CompressionStat* c : rows) {
    const bool reported = c->ranks_reporting() > 0;
    auto bytes = [reported](int64_t v) { return reported ? absl::StrCat(v) : std::string("-"); };
    absl::StrAppendFormat(&out, "%-24s %-*s %-10d %-16s %-16s %-16s %-8s %d\n", c->method(),
                          width, c->pattern().empty() ? "-" : c->pattern(), c->tensors(),
                          bytes(c->uncompressed_bytes()), bytes(c->payload_bytes()),
                          bytes(c->transport_bytes()),
                          c->ratio() > 0 ? absl::StrFormat("%.2f", c->ratio()) : "-",
                          c->ranks_reporting());
  }
  absl::StrAppend(&out, "(bytes summed over the RANKS that reported; RATIO = uncompressed / ",
                  "payload; PATTERN: the plan's, \"(auto)\" where auto chose the method)\n");
  return out;
}

}  // namespace braid::tools
