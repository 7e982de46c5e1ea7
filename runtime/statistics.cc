#include "runtime/statistics.h"

#include <algorithm>

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

uint64_t ReferenceTransportBytes(uint64_t bytes, int world_size) {
  const uint64_t n = world_size <= 1 ? 1 : static_cast<uint64_t>(world_size);
  return 2 * bytes * (n - 1) / n;
}

StatisticsLedger::StatisticsLedger(size_t max_tensors)
    : max_tensors_(std::max<size_t>(1, max_tensors)) {}

void StatisticsLedger::Record(absl::string_view name, absl::string_view method,
                              const ByteStats& b) {
  absl::MutexLock lock(&mu_);
  auto by_name = tensors_.find(name);
  if (by_name == tensors_.end()) {
    // Note [Bounded per-tensor statistics]: the least recently booked name makes room.
    if (tensors_.size() >= max_tensors_) {
      tensors_.erase(recency_.back());
      recency_.pop_back();
    }
    by_name = tensors_.emplace(std::string(name), Entry{}).first;
    recency_.push_front(by_name);
    by_name->second.recency = recency_.begin();
  } else {
    recency_.splice(recency_.begin(), recency_, by_name->second.recency);
  }
  Methods& methods = by_name->second.methods;
  auto it = methods.find(method);
  const bool inserted = it == methods.end();
  if (inserted) it = methods.emplace(std::string(method), ByteStats{}).first;
  it->second.Add(b);
  auto total = totals_.find(method);
  if (total == totals_.end()) {
    total = totals_.emplace(std::string(method), MethodCompressionStats{}).first;
    total->second.method = std::string(method);
  }
  if (inserted) ++total->second.tensors;
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
    for (const auto& [method, b] : entry.methods) r.tensors.push_back({name, method, b});
  }
  for (const auto& [method, m] : totals_) r.methods.push_back(m);
  return r;
}

std::vector<MethodCompressionStats> StatisticsLedger::MethodTotals() const {
  std::vector<MethodCompressionStats> out;
  absl::MutexLock lock(&mu_);
  out.reserve(totals_.size());
  for (const auto& [method, m] : totals_) out.push_back(m);
  return out;
}

}  // namespace braid
