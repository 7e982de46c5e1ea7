#include "transport/collective_communicator.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "transport/collectives.h"
#include "transport/gather.h"
#include "transport/ring_schedule.h"

namespace braid::transport {
namespace {

// Bounds the time one collective spends dropping stray messages when a sender floods them.
constexpr uint64_t kMaxStrayDropsPerSeq = 4096;

absl::Status CheckCounts(absl::Span<const size_t> counts, int size, const char* what) {
  if (counts.size() == static_cast<size_t>(size)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " needs one count per rank: got ",
                                                 counts.size(), " for ", size));
}

// The byte size of `counts` elements of `elem` bytes in all, overflow-checked against the
// limit of a tensor (common/limits.h), so no offset or buffer size computed from them wraps.
absl::Status CheckTotal(absl::Span<const size_t> counts, size_t elem, const char* what) {
  size_t total = 0, bytes = 0;
  for (size_t c : counts) {
    if (__builtin_add_overflow(total, c, &total)) total = SIZE_MAX;
  }
  if (__builtin_mul_overflow(total, elem, &bytes) ||
      bytes > static_cast<size_t>(kMaxTensorBytes)) {
    if (total == SIZE_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the sizes sum beyond 2^64"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", total, " elements of ", elem,
        " bytes exceed the limit of a tensor, 2^48 bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

CollectiveCommunicator::CollectiveCommunicator(std::unique_ptr<PointToPoint> p2p,
                                               CollectiveOptions options,
                                               const Kernels* kernels)
    : ctx_(std::move(p2p), std::move(options), kernels) {}

absl::Status CollectiveCommunicator::Run(absl::FunctionRef<absl::Status()> body) {
  if (!sticky_.ok()) return sticky_;
  absl::Status s = ctx_.p2p().Health();
  const TransportStats before = ctx_.completed();
  const uint32_t first_seq = ctx_.next_seq();
  if (s.ok()) s = body();
  if (!s.ok()) {
    sticky_ = s;
    return s;
  }
  const TransportStats& after = ctx_.completed();
  stats_.bytes_sent += after.bytes_sent - before.bytes_sent;
  stats_.bytes_received += after.bytes_received - before.bytes_received;
  stats_.messages_sent += after.messages_sent - before.messages_sent;
  stats_.messages_received += after.messages_received - before.messages_received;
  ++stats_.collectives;
  // Note [Who may join]: what is still queued under these sequence numbers is not the group's.
  for (uint32_t seq = first_seq; seq != ctx_.next_seq(); ++seq) {
    stats_.stray_messages_dropped += ctx_.p2p().DropStray(seq, kMaxStrayDropsPerSeq);
  }
  return absl::OkStatus();
}

absl::Status CollectiveCommunicator::AllReduce(const void* send, void* recv, size_t count,
                                               DataType dtype, ReduceOp op) {
  if (!sticky_.ok()) return sticky_;
  BRAID_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  BRAID_RETURN_IF_ERROR(CheckTotal({count}, DataTypeSize(dtype), "all-reduce"));
  const CollectiveOptions& o = ctx_.options();
  const size_t bytes = count * DataTypeSize(dtype);
  return Run([&]() {
    if (ChooseAllReduceAlgorithm(bytes, count, size(), o.ring_threshold_bytes) ==
        AllReduceAlgorithm::kRecursiveDoubling) {
      return AllReduceRecursiveDoubling(ctx_, send, recv, count, dtype, op);
    }
    if (ChooseReduceScatterAlgorithm(size(), o.direct_max_ranks) ==
        ReduceScatterAlgorithm::kDirect) {
      return AllReduceDirect(ctx_, send, recv, count, dtype, op);
    }
    return AllReduceRing(ctx_, send, recv, count, dtype, op);
  });
}

absl::Status CollectiveCommunicator::AllReduceGathered(absl::Span<const GatheredPiece> pieces,
                                                       void* scratch, size_t count,
                                                       DataType dtype, ReduceOp op) {
  if (!sticky_.ok()) return sticky_;
  BRAID_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  BRAID_RETURN_IF_ERROR(CheckTotal({count}, DataTypeSize(dtype), "all-reduce"));
  BRAID_RETURN_IF_ERROR(CheckGathered(pieces, count, dtype));
  const CollectiveOptions& o = ctx_.options();
  const GatherMap gather(pieces);
  return Run([&]() {
    if (ChooseAllReduceAlgorithm(gather.bytes(), count, size(), o.ring_threshold_bytes) ==
        AllReduceAlgorithm::kRecursiveDoubling) {
      char* buf = static_cast<char*>(scratch);
      return ReduceInThreePasses(gather, buf, ctx_.kernels(), [&] {
        return AllReduceRecursiveDoubling(ctx_, buf, buf, count, dtype, op);
      });
    }
    return transport::AllReduceGathered(ctx_, gather, scratch, count, dtype, op,
                             ChooseReduceScatterAlgorithm(size(), o.direct_max_ranks));
  });
}

absl::Status CollectiveCommunicator::ReduceScatter(const void* send, void* recv,
                                                   absl::Span<const size_t> recv_counts,
                                                   DataType dtype, ReduceOp op) {
  if (!sticky_.ok()) return sticky_;
  BRAID_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  BRAID_RETURN_IF_ERROR(CheckCounts(recv_counts, size(), "reduce-scatter"));
  BRAID_RETURN_IF_ERROR(CheckTotal(recv_counts, DataTypeSize(dtype), "reduce-scatter"));
  return Run([&]() {
    if (ChooseReduceScatterAlgorithm(size(), ctx_.options().direct_max_ranks) ==
        ReduceScatterAlgorithm::kDirect) {
      return ReduceScatterDirect(ctx_, send, recv, recv_counts, dtype, op);
    }
    return ReduceScatterRing(ctx_, send, recv, recv_counts, dtype, op);
  });
}

absl::Status CollectiveCommunicator::AllGather(const void* send, size_t send_bytes, void* recv,
                                               absl::Span<const size_t> recv_bytes) {
  if (!sticky_.ok()) return sticky_;
  if (recv_bytes.size() != static_cast<size_t>(size()) || recv_bytes[rank()] != send_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all-gather needs one size per rank with recv_bytes[rank] == send_bytes: got ",
        recv_bytes.size(), " sizes for ", size(), " ranks"));
  }
  BRAID_RETURN_IF_ERROR(CheckTotal(recv_bytes, 1, "all-gather"));
  return Run([&]() { return AllGatherRing(ctx_, send, send_bytes, recv, recv_bytes); });
}

absl::Status CollectiveCommunicator::AllToAll(const void* send,
                                              absl::Span<const size_t> send_bytes, void* recv,
                                              absl::Span<const size_t> recv_bytes) {
  if (!sticky_.ok()) return sticky_;
  const size_t n = static_cast<size_t>(size());
  if (send_bytes.size() != n || recv_bytes.size() != n ||
      send_bytes[rank()] != recv_bytes[rank()]) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-to-all needs one send and one receive size per rank (", size(),
                     ") with send_bytes[rank] == recv_bytes[rank]"));
  }
  BRAID_RETURN_IF_ERROR(CheckTotal(send_bytes, 1, "all-to-all (sent)"));
  BRAID_RETURN_IF_ERROR(CheckTotal(recv_bytes, 1, "all-to-all (received)"));
  return Run([&]() { return AllToAllDirect(ctx_, send, send_bytes, recv, recv_bytes); });
}

absl::Status CollectiveCommunicator::Broadcast(void* buf, size_t bytes, int root) {
  if (!sticky_.ok()) return sticky_;
  BRAID_RETURN_IF_ERROR(CheckTotal({bytes}, 1, "broadcast"));
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank of a world of size ", size()));
  }
  return Run([&]() { return BroadcastBinomial(ctx_, buf, bytes, root); });
}

absl::Status CollectiveCommunicator::Barrier() {
  return Run([&]() { return BarrierDissemination(ctx_); });
}

absl::Status CollectiveCommunicator::RunCollective(
    const std::function<absl::Status(Context&)>& body) {
  return Run([&]() { return body(ctx_); });
}

}  // namespace braid::transport
