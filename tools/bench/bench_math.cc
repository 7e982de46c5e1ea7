#include "tools/bench/bench_math.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace braid::bench {

absl::string_view CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kAllGather: return "allgather";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllToAll: return "alltoall";
    case Collective::kBroadcast: return "broadcast";
  }
  return "unknown";
}

absl::StatusOr<Collective> ParseCollective(absl::string_view name) {
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                       Collective::kAllToAll, Collective::kBroadcast}) {
    if (name == CollectiveName(c)) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective '", name,
                   "' (want allreduce, allgather, reducescatter, alltoall or broadcast)"));
}

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  std::string s = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  // "64MiB" / "64MB" / "64B" -> "64M" / "64M" / "64".
  if (absl::EndsWith(s, "IB")) {
    s.resize(s.size() - 2);
  } else if (absl::EndsWith(s, "B")) {
    s.pop_back();
  }
  uint64_t multiplier = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': multiplier = uint64_t{1} << 10; break;
      case 'M': multiplier = uint64_t{1} << 20; break;
      case 'G': multiplier = uint64_t{1} << 30; break;
      case 'T': multiplier = uint64_t{1} << 40; break;
      default: break;
    }
    if (multiplier != 1) s.pop_back();
  }
  uint64_t value = 0;
  if (s.empty() || !absl::SimpleAtoi(s, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad size '", text, "' (want e.g. 8, 1K, 64M, 1G; powers of 1024)"));
  }
  if (value != 0 && multiplier > UINT64_MAX / value) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' overflows 64 bits"));
  }
  return value * multiplier;
}

absl::StatusOr<std::vector<uint64_t>> SizeList(uint64_t min_bytes, uint64_t max_bytes,
                                               uint64_t factor) {
  if (min_bytes == 0 || max_bytes < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("bad size range: min ", min_bytes, " max ",
                                                   max_bytes, " (want 0 < min <= max)"));
  }
  if (min_bytes == max_bytes) return std::vector<uint64_t>{min_bytes};
  if (factor < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step factor ", factor, " must be >= 2 when min ", min_bytes, " < max ", max_bytes));
  }
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes; s <= max_bytes; s *= factor) {
    sizes.push_back(s);
    if (s > max_bytes / factor) break;  // next step would pass max (or overflow)
  }
  return sizes;
}

CollectiveShape ShapeFor(Collective c, uint64_t requested_bytes, size_t elem_size, int ranks) {
  CollectiveShape shape;
  const size_t n = static_cast<size_t>(std::max(ranks, 1));
  const size_t elems = static_cast<size_t>(requested_bytes / std::max<size_t>(elem_size, 1));
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
      shape.count = std::max<size_t>(elems, 1);
      shape.block_count = shape.count;
      break;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      shape.block_count = std::max<size_t>(elems / n, 1);
      shape.count = shape.block_count * n;
      break;
  }
  shape.bytes = static_cast<uint64_t>(shape.count) * elem_size;
  return shape;
}

double BusBwFactor(Collective c, int ranks) {
  const double n = ranks;
  if (ranks <= 1) return c == Collective::kBroadcast ? 1.0 : 0.0;
  switch (c) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll: return (n - 1) / n;
    case Collective::kBroadcast: return 1.0;
  }
  return 0.0;
}

double GigabytesPerSecond(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  double hi = values[mid];
  if (values.size() % 2 == 1) return hi;
  double lo = *std::max_element(values.begin(), values.begin() + mid);
  return (lo + hi) / 2;
}

}  // namespace braid::bench
