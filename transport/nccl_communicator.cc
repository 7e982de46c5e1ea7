#include "transport/nccl_communicator.h"

#include <atomic>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace braid::transport {
namespace {

// Prefixes a status's message with what failed, keeping its code.
absl::Status Named(absl::string_view what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// Polls until `poll` says done (true) or fails, `reason` says stop, or `deadline` passes.
// Note [NCCL watchdog].
absl::Status Watch(absl::string_view what, absl::Time deadline, absl::Duration timeout,
                   absl::Duration interval, absl::FunctionRef<absl::StatusOr<bool>()> poll,
                   absl::FunctionRef<absl::Status()> reason) {
  for (;;) {
    absl::StatusOr<bool> done = poll();
    if (!done.ok()) return Named(what, done.status());
    if (*done) return absl::OkStatus();
    BRAID_RETURN_IF_ERROR(reason());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": not done after ", absl::FormatDuration(timeout),
          " (a peer lost or stalled, or slower than the timeout: BRAID_TIMEOUT_S); the NCCL "
          "communicator is aborted"));
    }
    absl::SleepFor(interval);
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclApi& api, NcclApi::Comm comm, int rank, int size, NcclApi::Stream stream,
                   device::Device& device, NcclOptions options)
      : api_(api),
        comm_(comm),
        rank_(rank),
        size_(size),
        stream_(stream),
        device_(device),
        options_(options) {}

  ~NcclCommunicator() override {
    absl::MutexLock lock(&mu_);
    if (comm_ != nullptr) api_.CommAbort(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    BRAID_RETURN_IF_ERROR(CheckOp(dtype, op));
    const uint64_t bytes = count * DataTypeSize(dtype);
    const uint64_t moved = size_ == 1 ? 0 : 2 * (size_ - 1) * bytes / size_;
    return Run(Describe("all-reduce", bytes, dtype),
               [&] { return api_.AllReduce(send, recv, count, dtype, op, comm_, stream_); },
               moved, moved, size_ == 1 ? 0 : 2 * (size_ - 1));
  }

  absl::Status AllReduceGathered(absl::Span<const GatheredPiece> pieces, void* scratch,
                                 size_t count, DataType dtype, ReduceOp op) override {
    BRAID_RETURN_IF_ERROR(CheckOp(dtype, op));
    size_t total = 0;
    for (const GatheredPiece& p : pieces) total += p.bytes;
    if (total != count * DataTypeSize(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL gathered all-reduce: the pieces hold ",
                                                     total, " bytes, not ", count, " x ",
                                                     DataTypeName(dtype)));
    }
    if (!sticky_.ok()) return sticky_;
    char* buf = static_cast<char*>(scratch);
    size_t offset = 0;
    for (const GatheredPiece& p : pieces) {
      if (p.bytes > 0 && p.input != buf + offset) {
        absl::Status s = device_.Copy(buf + offset, p.input, p.bytes, stream_);
        if (!s.ok()) return Fail(Named("NCCL gathered all-reduce: a copy in", s));
      }
      offset += p.bytes;
    }
    BRAID_RETURN_IF_ERROR(AllReduce(scratch, scratch, count, dtype, op));
    offset = 0;
    for (const GatheredPiece& p : pieces) {
      if (p.bytes > 0 && p.output != buf + offset) {
        absl::Status s = device_.Copy(p.output, buf + offset, p.bytes, stream_);
        if (!s.ok()) return Fail(Named("NCCL gathered all-reduce: a copy out", s));
      }
      offset += p.bytes;
    }
    absl::Status s = device_.Synchronize(stream_, options_.timeout);
    return s.ok() ? s : Fail(Named("NCCL gathered all-reduce: the copies out", s));
  }

  absl::Status ReduceScatter(const void* send, void* recv, absl::Span<const size_t> recv_counts,
                             DataType dtype, ReduceOp op) override {
    BRAID_RETURN_IF_ERROR(CheckOp(dtype, op));
    BRAID_RETURN_IF_ERROR(CheckBlocks("reduce-scatter", recv_counts.size()));
    const size_t element = DataTypeSize(dtype);
    uint64_t total = 0;
    bool equal = true;
    for (size_t c : recv_counts) {
      total += c * element;
      equal = equal && c == recv_counts[0];
    }
    const uint64_t sent = total - recv_counts[(rank_ + 1) % size_] * element;
    const uint64_t received = total - recv_counts[rank_] * element;
    const std::string what = Describe("reduce-scatter", total, dtype);
    if (equal) {
      return Run(what, [&] {
        return api_.ReduceScatter(send, recv, recv_counts[0], dtype, op, comm_, stream_);
      }, sent, received, size_ - 1);
    }
    // Unequal blocks: one reduce to each block's owner, grouped (what NCCL offers).
    return Run(what, [&] {
      return Grouped([&](int p, const char* in) {
        return api_.Reduce(in, recv, recv_counts[p], dtype, op, p, comm_, stream_);
      }, static_cast<const char*>(send), [&](int p) { return recv_counts[p] * element; });
    }, sent, received, size_ - 1);
  }

  absl::Status AllGather(const void* send, size_t send_bytes, void* recv,
                         absl::Span<const size_t> recv_bytes) override {
    BRAID_RETURN_IF_ERROR(CheckBlocks("all-gather", recv_bytes.size()));
    if (recv_bytes[rank_] != send_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL all-gather on rank ", rank_, ": sends ", send_bytes, " bytes but its block is ",
          recv_bytes[rank_]));
    }
    uint64_t total = 0;
    bool equal = true;
    for (size_t b : recv_bytes) {
      total += b;
      equal = equal && b == recv_bytes[0];
    }
    const uint64_t sent = total - recv_bytes[(rank_ + 1) % size_];
    const uint64_t received = total - recv_bytes[rank_];
    const std::string what = Describe("all-gather", total, std::nullopt);
    if (equal) {
      return Run(what, [&] {
        return api_.AllGather(send, recv, send_bytes, comm_, stream_);
      }, sent, received, size_ - 1);
    }
    // Unequal blocks: one broadcast from each rank, grouped.
    return Run(what, [&] {
      return Grouped([&](int p, const char* out) {
        char* block = const_cast<char*>(out);
        return api_.Broadcast(p == rank_ ? send : block, block, recv_bytes[p], p, comm_,
                              stream_);
      }, static_cast<const char*>(recv), [&](int p) { return recv_bytes[p]; });
    }, sent, received, size_ - 1);
  }

  absl::Status AllToAll(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                        absl::Span<const size_t> recv_bytes) override {
    BRAID_RETURN_IF_ERROR(CheckBlocks("all-to-all", send_bytes.size()));
    BRAID_RETURN_IF_ERROR(CheckBlocks("all-to-all", recv_bytes.size()));
    uint64_t sent = 0, received = 0, messages = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      sent += send_bytes[p];
      received += recv_bytes[p];
      messages += send_bytes[p] > 0;
    }
    uint64_t total = 0;
    for (size_t b : send_bytes) total += b;
    return Run(Describe("all-to-all", total, std::nullopt), [&] {
      char* out = static_cast<char*>(recv);
      return Grouped([&](int p, const char* in) -> absl::StatusOr<NcclProgress> {
        // Zero-byte messages are not sent: both sides know the sizes (the caller's contract).
        if (send_bytes[p] > 0) {
          absl::StatusOr<NcclProgress> q = api_.Send(in, send_bytes[p], p, comm_, stream_);
          if (!q.ok()) return q;
        }
        char* block = out;
        out += recv_bytes[p];
        if (recv_bytes[p] == 0) return NcclProgress::kDone;
        return api_.Recv(block, recv_bytes[p], p, comm_, stream_);
      }, static_cast<const char*>(send), [&](int p) { return send_bytes[p]; });
    }, sent, received, messages);
  }

  absl::Status Broadcast(void* buf, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL broadcast: root ", root,
                                                     " is not a rank of ", size_));
    }
    // As a ring from the root: every rank but the root receives, every rank but the root's
    // predecessor sends.
    const uint64_t received = rank_ == root || size_ == 1 ? 0 : bytes;
    const uint64_t sent = rank_ == (root + size_ - 1) % size_ ? 0 : bytes;
    return Run(Describe("broadcast", bytes, std::nullopt), [&] {
      return api_.Broadcast(buf, buf, bytes, root, comm_, stream_);
    }, sent, received, size_ == 1 ? 0 : 1);
  }

  absl::Status Barrier() override {
    // NCCL has no barrier: an all-reduce of one word, as ProcessGroupNCCL's.
    if (barrier_word_.data() == nullptr) {
      absl::StatusOr<device::DeviceMemory> word = device_.Allocate(sizeof(int32_t), 4);
      if (!word.ok()) return Named("NCCL barrier: its one word", word.status());
      barrier_word_ = *std::move(word);
    }
    return AllReduce(barrier_word_.data(), barrier_word_.data(), 1, DataType::kInt32,
                     ReduceOp::kSum);
  }

  void Abort(absl::Status reason) override {
    if (reason.ok()) reason = absl::CancelledError("NCCL communicator aborted");
    absl::MutexLock lock(&mu_);
    if (abort_reason_.ok()) abort_reason_ = std::move(reason);
    aborted_.store(true, std::memory_order_release);
    // Idle (no call of the owner's in flight, which would see the reason and abort): abort
    // now, so the peers' calls waiting for this rank fail at once (NCCL's remote error)
    // rather than at their timeout.
    if (!in_call_ && comm_ != nullptr) {
      api_.CommAbort(comm_);
      comm_ = nullptr;
    }
  }

  TransportStats stats() const override { return stats_; }

  std::string Describe() const override {
    return absl::StrCat(api_.Version(), " (rank ", rank_, " of ", size_, ")");
  }

 private:
  std::string Describe(absl::string_view collective, uint64_t bytes,
                       std::optional<DataType> dtype) const {
    return absl::StrCat("NCCL ", collective, " of ", bytes, " bytes",
                        dtype.has_value() ? absl::StrCat(" (", DataTypeName(*dtype), ")") : "",
                        " on rank ", rank_, " of ", size_);
  }

  absl::Status CheckOp(DataType dtype, ReduceOp op) const {
    if (op == ReduceOp::kAverage && !IsFloatingPoint(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL: average of ", DataTypeName(dtype),
                                                     " (floating-point dtypes only)"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckBlocks(absl::string_view collective, size_t blocks) const {
    if (blocks == static_cast<size_t>(size_)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("NCCL ", collective, ": ", blocks,
                                                   " blocks for ", size_, " ranks"));
  }

  // One NCCL group: call(p, at) for every rank p in order, `at` advancing by step(p) bytes
  // from `base`. GroupEnd follows a successful GroupStart whatever the calls return (NCCL's
  // group depth is the thread's: a group left open would defer every later NCCL call of
  // this thread, ncclCommAbort included); the first error wins.
  template <typename Call, typename Step>
  absl::StatusOr<NcclProgress> Grouped(Call call, const char* base, Step step) {
    BRAID_RETURN_IF_ERROR(api_.GroupStart());
    absl::Status first;
    for (int p = 0; p < size_ && first.ok(); ++p) {
      absl::StatusOr<NcclProgress> q = call(p, base);
      if (!q.ok()) first = q.status();
      base += step(p);
    }
    absl::StatusOr<NcclProgress> ended = api_.GroupEnd();
    if (!first.ok()) return first;
    return ended;
  }

  // Abort's reason, once another thread gave one.
  absl::Status Reason() const {
    if (!aborted_.load(std::memory_order_acquire)) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    return abort_reason_;
  }

  // Poisons the communicator with `s` and aborts it (Note [NCCL watchdog]).
  absl::Status Fail(absl::Status s) {
    if (sticky_.ok()) sticky_ = std::move(s);
    absl::MutexLock lock(&mu_);
    in_call_ = false;
    if (comm_ != nullptr) {
      api_.CommAbort(comm_);
      comm_ = nullptr;
    }
    return sticky_;
  }

  // Marks the owner's call in flight (Abort then leaves the communicator to it); false, and
  // the communicator failed with Abort's reason, when Abort came first.
  bool Enter() {
    absl::MutexLock lock(&mu_);
    if (comm_ == nullptr) return false;
    in_call_ = true;
    return true;
  }
  // An Abort that came as the call ended, after its last poll, aborts now (as for an idle
  // communicator), so the peers do not wait for this rank's next call.
  void Leave() {
    absl::MutexLock lock(&mu_);
    in_call_ = false;
    if (!abort_reason_.ok() && comm_ != nullptr) {
      api_.CommAbort(comm_);
      comm_ = nullptr;
    }
  }

  // Whether the communicator reports an asynchronous error (Note [Nonblocking NCCL]).
  absl::StatusOr<bool> Settled() {
    absl::StatusOr<NcclProgress> state = api_.CommState(comm_);
    if (!state.ok()) return state.status();
    return *state == NcclProgress::kDone;
  }

  // Queues one collective through `queue`, then watches it to its end (Note [NCCL watchdog]);
  // on success counts it and the bytes a ring would move.
  absl::Status Run(const std::string& what, absl::FunctionRef<absl::StatusOr<NcclProgress>()> queue,
                   uint64_t sent, uint64_t received, uint64_t messages) {
    if (!sticky_.ok()) return sticky_;
    if (absl::Status r = Reason(); !r.ok() || !Enter()) {
      // Not entered: Abort came first (perhaps after the check), its reason set before.
      r = Reason();
      return Fail(r.ok() ? absl::InternalError("NCCL communicator gone") : r);
    }
    const absl::Time deadline = absl::Now() + options_.timeout;
    auto watch = [&](absl::FunctionRef<absl::StatusOr<bool>()> poll) {
      return Watch(what, deadline, options_.timeout, options_.poll_interval, poll,
                   [&] { return Reason(); });
    };
    absl::StatusOr<NcclProgress> queued = queue();
    if (!queued.ok()) return Fail(Named(what, queued.status()));
    if (*queued == NcclProgress::kInProgress) {
      if (absl::Status s = watch([&] { return Settled(); }); !s.ok()) return Fail(s);
    }
    absl::StatusOr<NcclApi::Event> event = api_.RecordEvent(stream_);
    if (!event.ok()) return Fail(Named(what, event.status()));
    const absl::Status s = watch([&]() -> absl::StatusOr<bool> {
      absl::StatusOr<bool> done = api_.EventDone(*event);
      if (!done.ok()) return done;
      // Done or not, has the communicator failed (a peer gone: ncclRemoteError)? A kernel
      // may end on a failed connection with its output unfinished: only the communicator's
      // state says that its result can be used.
      absl::StatusOr<NcclProgress> state = api_.CommState(comm_);
      if (!state.ok()) return state.status();
      return *done;
    });
    api_.DestroyEvent(*event);
    if (!s.ok()) return Fail(s);
    Leave();
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    stats_.messages_sent += messages;
    stats_.messages_received += messages;
    ++stats_.collectives;
    return absl::OkStatus();
  }

  NcclApi& api_;
  // Null once aborted. Used by the owner's call without the lock while in_call_; changed
  // only under mu_.
  NcclApi::Comm comm_;
  const int rank_;
  const int size_;
  const NcclApi::Stream stream_;
  device::Device& device_;
  const NcclOptions options_;
  device::DeviceMemory barrier_word_;
  TransportStats stats_;
  absl::Status sticky_;  // the first failure
  std::atomic<bool> aborted_{false};
  mutable absl::Mutex mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
  bool in_call_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(NcclApi& api, const NcclUniqueId& id,
                                                          int rank, int size,
                                                          NcclApi::Stream stream,
                                                          device::Device& device,
                                                          NcclOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: rank ", rank, " is not a rank of ", size));
  }
  const std::string what =
      absl::StrCat("creating the NCCL communicator of ", size, " ranks on rank ", rank);
  NcclApi::Comm comm = nullptr;
  absl::StatusOr<NcclProgress> started = api.CommInitRank(&comm, size, id, rank, device.ref().id);
  if (!started.ok()) {
    if (comm != nullptr) api.CommAbort(comm);
    return Named(what, started.status());
  }
  if (*started == NcclProgress::kInProgress) {
    const absl::Status s = Watch(
        what, absl::Now() + options.timeout, options.timeout, options.poll_interval,
        [&]() -> absl::StatusOr<bool> {
          absl::StatusOr<NcclProgress> state = api.CommState(comm);
          if (!state.ok()) return state.status();
          return *state == NcclProgress::kDone;
        },
        [&] { return options.abort_reason ? options.abort_reason() : absl::OkStatus(); });
    if (!s.ok()) {
      api.CommAbort(comm);
      return s;
    }
  }
  return std::make_unique<NcclCommunicator>(api, comm, rank, size, stream, device, options);
}

}  // namespace braid::transport
