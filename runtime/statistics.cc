#include "runtime/statistics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace braid {

void ByteStats::Add(const ByteStats& o) {
  reductions += o.reductions;
  uncompressed_bytes += o.uncompressed_bytes;
  payload_bytes += o.payload_bytes;
  transport_bytes += o.transport_bytes;
  reference_transport_bytes += o.reference_transport_bytes;
}

double ByteStats::compression_ratio() const {
  return payload_bytes == 0 ? 0.0
                            : static_cast<double>(uncompressed_bytes) /
                                  static_cast<double>(payload_bytes);
}

std::string AutoCompressionPattern(absl::string_view pattern) {
  return pattern.empty() ? std::string("(auto)") : absl::StrCat(pattern, " (auto)");
}

uint64_t ReferenceTransportBytes(uint64_t bytes, int world_size) {
  const uint64_t n = world_size <= 1 ? 1 : static_cast<uint64_t>(world_size);
  return 2 * bytes * (n - 1) / n;
}

StatisticsLedger::StatisticsLedger(size_t max_tensors)
    : max_tensors_(std::max<size_t>(1, max_tensors)) {}

StatisticsLedger::Entry& StatisticsLedger::Touch(absl::string_view name) {
  auto by_name = tensors_.find(name);
  if (by_name != tensors_.end()) {
    recency_.splice(recency_.begin(), recency_, by_name->second.recency);
    return by_name->second;
  }
  // Note [Bounded per-tensor statistics]: the least recently booked name makes room.
  if (tensors_.size() >= max_tensors_) {
    tensors_.erase(recency_.back());
    recency_.pop_back();
  }
  by_name = tensors_.emplace(std::string(name), Entry{}).first;
  recency_.push_front(by_name);
  by_name->second.recency = recency_.begin();
  return by_name->second;
}

void StatisticsLedger::Record(absl::string_view name, absl::string_view method,
                              absl::string_view pattern, const ByteStats& b) {
  absl::MutexLock lock(&mu_);
  Entry& entry = Touch(name);
  // Note [Compression groups]: the name books under its group's pattern (a folded one's is
  // kOtherPatterns), so `tensors` counts it once per group.
  auto& [group_pattern, group] = groups_.At(method, pattern);
  auto by_method = entry.methods.find(method);
  const bool new_for_method = by_method == entry.methods.end();
  if (new_for_method) by_method = entry.methods.emplace(std::string(method), Patterns{}).first;
  auto [by_pattern, new_for_group] = by_method->second.try_emplace(group_pattern);
  by_pattern->second.Add(b);
  if (new_for_group) ++group.tensors;
  group.bytes.Add(b);
  auto total = totals_.find(method);
  if (total == totals_.end()) {
    total = totals_.emplace(std::string(method), MethodCompressionStats{}).first;
    total->second.method = std::string(method);
  }
  if (new_for_method) ++total->second.tensors;
  total->second.bytes.Add(b);
}

void StatisticsLedger::RecordBucket(bool packed, uint64_t packed_bytes, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ++fusion_.buckets;
  if (packed) {
    ++fusion_.packed_buckets;
    fusion_.packed_bytes += packed_bytes;
  } else {
    fusion_.in_place_bytes += bytes;
  }
}

CompressionReport StatisticsLedger::Report() const {
  CompressionReport r;
  absl::MutexLock lock(&mu_);
  r.fusion = fusion_;
  for (const auto& [name, entry] : tensors_) {
    for (const auto& [method, patterns] : entry.methods) {
      for (const auto& [pattern, b] : patterns) r.tensors.push_back({name, method, pattern, b});
    }
  }
  for (const auto& [method, m] : totals_) r.methods.push_back(m);
  r.groups = GroupsLocked();
  return r;
}

std::vector<MethodCompressionStats> StatisticsLedger::MethodTotals() const {
  std::vector<MethodCompressionStats> out;
  absl::MutexLock lock(&mu_);
  out.reserve(totals_.size());
  for (const auto& [method, m] : totals_) out.push_back(m);
  return out;
}

std::vector<CompressionGroupStats> StatisticsLedger::GroupTotals() const {
  absl::MutexLock lock(&mu_);
  return GroupsLocked();
}

std::vector<CompressionGroupStats> StatisticsLedger::GroupsLocked() const {
  std::vector<CompressionGroupStats> out;
  out.reserve(groups_.size());
  groups_.ForEach([&](const std::string& method, const std::string& pattern,
                      const GroupCounts& g) {
    out.push_back({method, pattern, g.tensors, g.bytes});
  });
  return out;
}

}  // namespace braid
