#include "transport/context.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/reduce.h"

namespace braid::transport {
namespace {

class HostKernelsImpl final : public Kernels {
 public:
  void Reduce(void* out, const void* a, const void* b, size_t count, DataType dtype,
              ReduceOp op) const override {
    Reduce3(out, a, b, count, dtype, op);
  }
  void Divide(void* buf, size_t count, DataType dtype, int divisor) const override {
    DivideInPlace(buf, count, dtype, divisor);
  }
  void Widen(float* dst, const void* src, size_t count, DataType dtype,
             int divisor) const override {
    WidenToFloat32(dst, src, count, dtype, divisor);
  }
  void Narrow(void* dst, const float* src, size_t count, DataType dtype) const override {
    NarrowFromFloat32(dst, src, count, dtype);
  }
  void Copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void* Allocate(size_t bytes) const override {
    // Rounded up to the alignment, as aligned_alloc requires; zeroed so the pages are
    // touched here, once, and not inside a timed collective.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p != nullptr) std::memset(p, 0, rounded);
    return p;
  }
  void Free(void* p) const override { std::free(p); }
};

}  // namespace

const Kernels& HostKernels() {
  static const HostKernelsImpl kernels;
  return kernels;
}

char* Context::Buffer::Get(const Kernels& k, size_t want) {
  if (want <= bytes && data != nullptr) return data;
  if (data != nullptr) k.Free(data);
  data = static_cast<char*>(k.Allocate(want == 0 ? 1 : want));
  CHECK(data != nullptr) << "out of memory: " << want << " bytes of collective scratch";
  bytes = want;
  return data;
}

Context::Context(std::unique_ptr<PointToPoint> p2p, CollectiveOptions options,
                 const Kernels* kernels)
    : p2p_(std::move(p2p)),
      options_(std::move(options)),
      kernels_(kernels != nullptr ? kernels : &HostKernels()),
      rank_(p2p_->rank()),
      size_(p2p_->size()),
      pending_recvs_(size_, 0),
      pending_sends_(size_, 0) {}

Context::~Context() {
  // The backend goes first: it may still hold requests pointing into the scratch buffers.
  p2p_.reset();
  if (scratch_.data != nullptr) kernels_->Free(scratch_.data);
  if (work_.data != nullptr) kernels_->Free(work_.data);
  if (wide_.data != nullptr) kernels_->Free(wide_.data);
}

void Context::Count(const Request& r) {
  ++completions_;
  if (r.is_recv) {
    completed_.bytes_received += r.bytes;
    ++completed_.messages_received;
  } else {
    completed_.bytes_sent += r.bytes;
    ++completed_.messages_sent;
  }
}

void Context::Track(const Request& r, int delta) {
  if (r.peer < 0 || r.peer >= size_) return;
  (r.is_recv ? pending_recvs_ : pending_sends_)[r.peer] += delta;
}

absl::Status Context::Send(int peer, Tag tag, const void* buf, size_t bytes, Request* req) {
  BRAID_RETURN_IF_ERROR(p2p_->PostSend(peer, tag, buf, bytes, req));
  if (req->pending) Track(*req, +1);
  else Count(*req);
  return absl::OkStatus();
}

absl::Status Context::Recv(int peer, Tag tag, void* buf, size_t bytes, Request* req) {
  BRAID_RETURN_IF_ERROR(p2p_->PostRecv(peer, tag, buf, bytes, req));
  if (req->pending) Track(*req, +1);
  else Count(*req);
  return absl::OkStatus();
}

absl::StatusOr<bool> Context::Test(Request* req) {
  if (!req->pending) return true;
  const Request posted = *req;
  absl::StatusOr<bool> done = p2p_->Test(req);
  if (!req->pending) Track(posted, -1);  // completed or failed: released either way
  if (!done.ok()) return done.status();
  if (*done) Count(*req);
  return done;
}

void Context::Cancel(absl::Span<Request> reqs) {
  for (const Request& r : reqs) {
    if (r.pending) Track(r, -1);
  }
  p2p_->Cancel(reqs);
}

std::string Context::WaitingOn() const {
  std::vector<int> recv_from, send_to;
  for (int p = 0; p < size_; ++p) {  // named by their ranks in the job
    if (pending_recvs_[p] > 0) recv_from.push_back(p2p_->JobRank(p));
    if (pending_sends_[p] > 0) send_to.push_back(p2p_->JobRank(p));
  }
  auto ranks = [](const std::vector<int>& v) {
    return absl::StrCat(v.size() == 1 ? "rank " : "ranks ", absl::StrJoin(v, ", "));
  };
  std::vector<std::string> parts;
  if (!recv_from.empty()) parts.push_back(absl::StrCat("a message from ", ranks(recv_from)));
  if (!send_to.empty()) {
    parts.push_back(absl::StrCat("the delivery of a message to ", ranks(send_to)));
  }
  if (parts.empty()) return "";
  return absl::StrCat("; waiting for ", absl::StrJoin(parts, " and "));
}

absl::StatusOr<bool> Context::TestAll(absl::Span<Request> reqs) {
  bool all = true;
  for (Request& r : reqs) {
    BRAID_ASSIGN_OR_RETURN(bool done, Test(&r));
    all = all && done;
  }
  return all;
}

absl::Status Context::WaitAll(absl::Span<Request> reqs) {
  absl::Status s = Drive([&]() { return TestAll(reqs); });
  if (!s.ok()) Cancel(reqs);
  return s;
}

absl::Status Context::Drive(absl::FunctionRef<absl::StatusOr<bool>()> step) {
  absl::Time last_progress = absl::Now();
  uint64_t seen = completions_;
  while (true) {
    BRAID_ASSIGN_OR_RETURN(bool done, step());
    if (done) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (completions_ != seen) {  // progress: step again before blocking
      seen = completions_;
      last_progress = now;
      continue;
    }
    if (now - last_progress >= options_.timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", p2p_->JobRank(rank_), ": collective #", seq_ - 1, " made no progress for ",
          absl::FormatDuration(options_.timeout), " (BRAID_TIMEOUT_S)", WaitingOn()));
    }
    BRAID_RETURN_IF_ERROR(p2p_->Wait(last_progress, last_progress + options_.timeout));
  }
}

}  // namespace braid::transport
