#include "runtime/fast_path.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/limits.h"
#include "control/bucket.h"
#include "control/fusion.h"

namespace braid {
namespace {

// splitmix64's finalizer: spreads an id over 64 bits so that XOR-ing ids makes a digest.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr size_t kHeaderWords = 5;

}  // namespace

void FastPathCache::Insert(int32_t id, const std::string& name, const std::string& bytes,
                           const proto::Response& r) {
  proto::Request request;
  request.ParseFromString(bytes);
  InsertSlot(id, name, bytes, std::move(request), r);
}

void FastPathCache::InsertOutside(int32_t id, const proto::Response& r, int i) {
  proto::Request request;
  request.set_name(r.names(i));
  request.set_collective(r.collective());
  request.set_dtype(r.dtype());
  request.set_reduce_op(r.reduce_op());
  request.set_root_rank(r.root_rank());
  request.set_process_set_id(r.process_set_id());
  request.set_compression(r.compression());
  request.set_device(r.device());
  if (i < r.tensor_sizes_size()) request.add_shape(r.tensor_sizes(i));
  InsertSlot(id, r.names(i), "", std::move(request), r);  // "": no request of this rank matches
}

void FastPathCache::InsertSlot(int32_t id, const std::string& name, const std::string& bytes,
                               proto::Request request, const proto::Response& r) {
  if (int32_t old = IdOf(name); old != 0 && old != id) Evict(old);
  Slot slot;
  slot.name = name;
  slot.bytes = bytes;
  slot.request = std::move(request);
  slot.devices = FusionDeviceKey(r);
  auto [it, inserted] = slots_.insert_or_assign(id, std::move(slot));
  by_name_[name] = id;
  if (inserted) {
    digest_ ^= Mix(static_cast<uint64_t>(id));
    ids_.insert(std::lower_bound(ids_.begin(), ids_.end(), id), id);
  }
}

std::string FastPathCache::Evict(int32_t id) {
  auto it = slots_.find(id);
  if (it == slots_.end()) return "";
  std::string name = std::move(it->second.name);
  slots_.erase(it);
  if (auto n = by_name_.find(name); n != by_name_.end() && n->second == id) by_name_.erase(n);
  digest_ ^= Mix(static_cast<uint64_t>(id));
  ids_.erase(std::lower_bound(ids_.begin(), ids_.end(), id));
  return name;
}

int32_t FastPathCache::IdOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? 0 : it->second;
}

int32_t FastPathCache::Lookup(const std::string& name, const std::string& bytes) const {
  const int32_t id = IdOf(name);
  if (id == 0) return 0;
  return slots_.at(id).bytes == bytes ? id : 0;
}

const FastPathCache::Slot* FastPathCache::Find(int32_t id) const {
  auto it = slots_.find(id);
  return it == slots_.end() ? nullptr : &it->second;
}

int FastPathCache::Position(int32_t id) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (it == ids_.end() || *it != id) return -1;
  return static_cast<int>(it - ids_.begin());
}

void FastPathCache::Clear() {
  slots_.clear();
  by_name_.clear();
  ids_.clear();
  digest_ = 0;
}

size_t VoteWords(size_t cache_size) { return (cache_size + 63) / 64; }

void SetBit(std::vector<uint64_t>* bits, int position) {
  (*bits)[position / 64] |= uint64_t{1} << (position % 64);
}

std::vector<uint64_t> EncodeVote(const Vote& v) {
  const size_t w = VoteWords(v.cache_size);
  std::vector<uint64_t> out(kHeaderWords + 2 * w, 0);
  out[0] = v.applied;
  out[1] = v.received;
  out[2] = v.cache_size;
  out[3] = v.digest;
  out[4] = v.joined ? 1 : 0;
  std::copy_n(v.ready.begin(), std::min(w, v.ready.size()), out.begin() + kHeaderWords);
  std::copy_n(v.invalidate.begin(), std::min(w, v.invalidate.size()),
              out.begin() + kHeaderWords + w);
  return out;
}

absl::StatusOr<Agreement> Agree(absl::Span<const uint64_t> gathered, int world_size,
                                const FastPathCache& cache, uint64_t applied,
                                const ProcessSetRanks& set_ranks) {
  const size_t w = VoteWords(cache.size());
  const size_t per_rank = kHeaderWords + 2 * w;
  if (gathered.size() != per_rank * world_size) {
    return absl::InternalError(absl::StrCat("fast path: ", gathered.size(), " vote words from ",
                                            world_size, " ranks, expected ", per_rank, " each"));
  }
  Agreement a;
  a.received = UINT64_MAX;
  std::vector<uint64_t> all(w, ~uint64_t{0}), any(w, 0);
  std::vector<int> differ;
  for (int r = 0; r < world_size; ++r) {
    const uint64_t* v = gathered.data() + r * per_rank;
    if (v[0] != applied || v[2] != cache.size() || v[3] != cache.digest()) differ.push_back(r);
    a.received = std::min(a.received, v[1]);
    a.joined = a.joined || v[4] != 0;
    for (size_t k = 0; k < w; ++k) {
      all[k] &= v[kHeaderWords + k];
      any[k] |= v[kHeaderWords + w + k];
    }
  }
  if (!differ.empty()) {
    return absl::InternalError(absl::StrCat(
        "fast path: the response caches of ranks ", absl::StrJoin(differ, ", "),
        " differ from this rank's (", cache.size(), " entries after ", applied,
        " coordinator messages)"));
  }
  for (size_t p = 0; p < cache.size(); ++p) {
    const uint64_t bit = uint64_t{1} << (p % 64);
    const int32_t id = cache.IdAt(static_cast<int>(p));
    if (any[p / 64] & bit) {
      a.invalidate.push_back(id);
      continue;
    }
    if (a.joined) continue;
    const int32_t set = cache.Find(id)->request.process_set_id();
    if (set == 0) {
      if (all[p / 64] & bit) a.ready.push_back(id);
      continue;
    }
    // A process set's slot: ready on every member of the set (the others never mark it; a
    // set removed meanwhile has none). Every rank applied the same changes of the sets by
    // this round, so every rank reads the same members.
    std::optional<std::vector<int>> ranks;
    if (set_ranks) ranks = set_ranks(set);
    bool ready = ranks.has_value() && !ranks->empty();
    for (size_t i = 0; ready && i < ranks->size(); ++i) {
      const int r = (*ranks)[i];
      ready = r >= 0 && r < world_size &&
              (gathered[r * per_rank + kHeaderWords + p / 64] & bit) != 0;
    }
    if (ready) a.ready.push_back(id);
  }
  return a;
}

int64_t RequestBytes(const proto::Request& r) {
  // The coordinator validated the request before it was cached (ValidateRequest), so
  // neither check fails here and the product stays within the limit of a tensor.
  const absl::StatusOr<int64_t> n = ShapeElements("shape", r.shape());
  const int v = static_cast<int>(r.dtype());
  if (!n.ok() || !IsValidDataType(v)) return 0;
  return *n * static_cast<int64_t>(DataTypeSize(static_cast<DataType>(v)));
}

std::vector<std::vector<int32_t>> PlanFastBuckets(const std::vector<int32_t>& ids,
                                                  const FastPathCache& cache,
                                                  int64_t fusion_threshold_bytes) {
  std::vector<control::FusionItem> items;
  items.reserve(ids.size());
  for (int32_t id : ids) {
    const FastPathCache::Slot& slot = *cache.Find(id);
    const proto::Request& r = slot.request;
    control::FusionItem item;
    if (r.collective() == proto::ALLREDUCE) {
      // The coordinator's key (NegotiationTable::Fuse, no rank joined), so a step fuses
      // alike both ways.
      item.key = absl::StrCat(r.collective(), "/", r.dtype(), "/", r.reduce_op(), "/",
                              r.process_set_id(), "/", r.compression(), "//", slot.devices);
      item.bytes = RequestBytes(r);
    }
    items.push_back(std::move(item));
  }
  std::vector<std::vector<int32_t>> out;
  for (const std::vector<int>& bucket : control::PlanBuckets(items, fusion_threshold_bytes)) {
    std::vector<int32_t> group;
    group.reserve(bucket.size());
    for (int k : bucket) group.push_back(ids[k]);
    out.push_back(std::move(group));
  }
  return out;
}

}  // namespace braid
