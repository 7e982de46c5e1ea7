#include "transport/gather.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace braid::transport {

GatherMap::GatherMap(absl::Span<const GatheredPiece> pieces) : pieces_(pieces) {
  starts_.reserve(pieces.size());
  for (const GatheredPiece& p : pieces) {
    starts_.push_back(bytes_);
    bytes_ += p.bytes;
  }
}

size_t GatherMap::First(size_t begin) const {
  return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                             starts_.begin()) - 1;
}

template <typename Visit>
void GatherMap::ForRange(size_t begin, size_t n, Visit visit) const {
  if (n == 0) return;
  // Empty pieces after the first hold nothing: skipped below.
  size_t i = First(begin);
  const size_t end = begin + n;
  for (size_t at = begin; at < end; ++i) {
    const size_t start = starts_[i], stop = start + pieces_[i].bytes;
    if (stop <= at) continue;  // an empty piece
    const size_t len = std::min(stop, end) - at;
    visit(pieces_[i], at - start, at, len);
    at += len;
  }
}

const GatheredPiece* GatherMap::Within(size_t begin, size_t n, size_t* offset) const {
  if (n == 0 || starts_.empty()) return nullptr;
  const size_t i = First(begin);
  if (begin + n > starts_[i] + pieces_[i].bytes) return nullptr;
  *offset = begin - starts_[i];
  return &pieces_[i];
}

void GatherMap::CopyIn(char* buffer, size_t begin, size_t n, const Kernels& kernels) const {
  ForRange(begin, n, [&](const GatheredPiece& p, size_t in_piece, size_t at, size_t len) {
    kernels.Copy(buffer + at, static_cast<const char*>(p.input) + in_piece, len);
  });
}

void GatherMap::CopyOut(const char* buffer, size_t begin, size_t n,
                        const Kernels& kernels) const {
  ForRange(begin, n, [&](const GatheredPiece& p, size_t in_piece, size_t at, size_t len) {
    kernels.Copy(static_cast<char*>(p.output) + in_piece, buffer + at, len);
  });
}

absl::Status CheckGathered(absl::Span<const GatheredPiece> pieces, size_t count,
                           DataType dtype) {
  size_t total = 0;
  for (const GatheredPiece& p : pieces) {
    if (__builtin_add_overflow(total, p.bytes, &total)) total = SIZE_MAX;
  }
  size_t want = 0;
  if (__builtin_mul_overflow(count, DataTypeSize(dtype), &want) || total != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gathered all-reduce: ", pieces.size(), " pieces hold ", total, " bytes, not ", count,
        " elements of ", DataTypeName(dtype)));
  }
  return absl::OkStatus();
}

absl::Status ReduceInThreePasses(const GatherMap& map, char* buffer, const Kernels& kernels,
                                 absl::FunctionRef<absl::Status()> reduce) {
  map.CopyIn(buffer, 0, map.bytes(), kernels);
  BRAID_RETURN_IF_ERROR(reduce());
  map.CopyOut(buffer, 0, map.bytes(), kernels);
  return absl::OkStatus();
}

// The three-pass form (Note [Gathered all-reduce]), for every communicator that does not
// overlap the copies: host memory.
absl::Status Communicator::AllReduceGathered(absl::Span<const GatheredPiece> pieces,
                                             void* scratch, size_t count, DataType dtype,
                                             ReduceOp op) {
  BRAID_RETURN_IF_ERROR(CheckGathered(pieces, count, dtype));
  return ReduceInThreePasses(GatherMap(pieces), static_cast<char*>(scratch), HostKernels(),
                             [&] { return AllReduce(scratch, scratch, count, dtype, op); });
}

}  // namespace braid::transport
