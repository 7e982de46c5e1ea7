// The limits braid states for what crosses its boundaries (Python, the C API, gRPC, the
// coordinator's validation), and the overflow-checked arithmetic every boundary uses on
// sizes, counts, shape products, split sums and byte offsets. A value beyond a limit, or one
// whose arithmetic overflows, is an InvalidArgument naming the field, refused where it
// enters: never a wrapped size, never a message the transport refuses by closing the
// connection. docs/failures.md: Limits.
#ifndef BRAID_COMMON_LIMITS_H_
#define BRAID_COMMON_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace braid {

// Ranks in one job (BRAID_SIZE); the coordinator refuses a registration that asks for more.
inline constexpr int kMaxWorldSize = 65536;
// A tensor name, in bytes (PyTorch parameter names are a few dozen).
inline constexpr size_t kMaxNameBytes = 1024;
// Dimensions of a tensor (NumPy's own limit is 32, or 64 since NumPy 2).
inline constexpr int kMaxDims = 64;
// Bytes of one tensor: 2^48 (256 TiB), so that every size, offset and sum of a few of them
// stays far from overflowing int64_t and size_t.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;
// A compression spec ("fp4:chunk=64,ef=1").
inline constexpr size_t kMaxCompressionSpecBytes = 256;
// A compression plan (compression/compression_plan.h), resolved on its rank into one spec per
// tensor: only the spec (and, for the statistics, the pattern that matched) travels.
inline constexpr size_t kMaxCompressionPlanBytes = 64 * 1024;
// The plan pattern a tensor's compression came from, as it travels with its request for the
// statistics (Request.compression_pattern, Note [Compression groups] in
// control/compression_groups.h): a longer one (a plan's key may be as long as the plan) is
// cut to this on its rank (Truncated), and refused by the coordinator.
inline constexpr size_t kMaxCompressionPatternBytes = 256;
// BRAID_RING_CHUNK_BYTES (0: by topology) and BRAID_RING_WINDOW: a window of pieces has a
// slot of scratch each, so their product bounds a collective's scratch per peer.
inline constexpr int64_t kMinRingChunkBytes = 1024;
inline constexpr int64_t kMaxRingChunkBytes = int64_t{64} << 20;
inline constexpr int kMaxRingWindow = 64;
// The pipeline piece a job's data channel uses when BRAID_RING_CHUNK_BYTES is 0: one piece
// size on one host, the smaller one when the ranks span hosts (Note [Pieces across hosts] in
// transport/ucx_communicator.cc). The transport's defaults and the coordinator's view of a
// job's settings both read these.
inline constexpr int64_t kDefaultRingChunkBytes = 256 * 1024;
inline constexpr int64_t kDefaultRingChunkBytesAcrossHosts = 16 * 1024;
// BRAID_FUSION_THRESHOLD.
inline constexpr int64_t kMaxFusionThresholdBytes = int64_t{1} << 40;
// The message of a failure report (FailureReport.message): longer ones are cut to this.
inline constexpr size_t kMaxErrorMessageBytes = 4096;
// Largest gRPC message either side accepts. A RequestList is split well below it (a request
// is at most a few KiB with the limits above), so no list is ever refused.
inline constexpr int kMaxMessageBytes = 64 << 20;

// The number of elements of `shape`: InvalidArgument naming `field` for more than kMaxDims
// dimensions, a negative dimension, or a product beyond kMaxTensorBytes.
absl::StatusOr<int64_t> ShapeElements(absl::string_view field, absl::Span<const int64_t> shape);

// elements * element_bytes: InvalidArgument naming `field` when it overflows or exceeds
// kMaxTensorBytes (elements must be >= 0).
absl::StatusOr<int64_t> TensorBytes(absl::string_view field, int64_t elements,
                                    size_t element_bytes);

// The sum of `values` (alltoall splits, all-gather first dimensions): InvalidArgument naming
// `field` for a negative entry or a sum beyond `max`.
absl::StatusOr<int64_t> CheckedSum(absl::string_view field, absl::Span<const int64_t> values,
                                   int64_t max);

// A tensor name: InvalidArgument naming `field` when empty, longer than kMaxNameBytes, or not
// valid UTF-8 (names travel in the wire's proto3 strings, which must be UTF-8: a peer would
// refuse the whole message holding one that is not).
absl::Status CheckName(absl::string_view field, absl::string_view name);

// The offset of the first byte of `text` that is not part of valid UTF-8 (a stray
// continuation byte, a truncated or overlong sequence, a surrogate U+D800..U+DFFF, a code
// point past U+10FFFF), or text.size() when it is all valid.
size_t InvalidUtf8Offset(absl::string_view text);

// `name` as an error message may quote it: as is when it is valid UTF-8, else with C escapes
// ("g\x80"), so that the message itself stays valid text.
std::string Printable(absl::string_view name);

// `text` cut to at most `max` bytes on a UTF-8 character boundary, with "..." appended when
// cut.
std::string Truncated(absl::string_view text, size_t max);

}  // namespace braid

#endif  // BRAID_COMMON_LIMITS_H_
