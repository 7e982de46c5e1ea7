// Warm-up messages over shared memory at connection (Note [Warm shared memory]).
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "transport/tag.h"
#include "transport/ucx_internal.h"

namespace braid::transport::ucx {
namespace {

// Note [Warm shared memory]
// Over shared memory, UCX sends a message of up to one segment (8 KiB) by copying it into a
// receive descriptor of the peer's: one of those its FIFO (64 elements) holds, in memory
// shared between the processes. The first time each descriptor is written, both processes
// take page faults on it (the kernel allocates and zeroes the page, then maps it into each),
// a few microseconds per message: a 2-rank all-reduce of 256 B to 4 KiB took 4-7 us for its
// first 25 calls and 0.8-1.5 us from about the 60th on, and the transient grew and shrank
// with UCX_SYSV_FIFO_SIZE (BENCHMARKS.md). Every process pays it once, at the start of a job,
// where it looked like a cliff in short benchmarks. So at connection each rank sends
// kWarmMessages messages of kWarmBytes to every peer on its host (twice the FIFO: every
// element's descriptor, and those that replace the ones handed up), and posts receives for
// theirs (all into one 8000-byte buffer per peer: nobody reads them), under sequence number
// 0xFFFF, which collectives reach only after tens of thousands of calls (Note [Tag layout]),
// long after every rank's warm-up was received (a rank posts its receives before its first
// collective, and no collective completes without every rank's part). Nothing waits
// for it: the sends complete on their own, the receives are released by Wait as they
// complete, and cancelled at the end if a peer never sent them (it failed or never
// connected: the collectives report that, not the warm-up). Peers on other hosts are not
// warmed (tcp has no such descriptors). Why not a UCX setting: UCX 1.13 has none that
// touches these pages in advance.

constexpr int kWarmMessages = 128;
constexpr size_t kWarmBytes = 8000;  // under one segment with UCX's headers (8256 B)
constexpr uint32_t kWarmSeq = 0xFFFF;
// What the sends read: static storage, so a send UCX still holds at shutdown reads valid
// memory.
const char kZeros[kWarmBytes] = {};

}  // namespace

void SharedMemoryWarmup::Start(ucp_worker_h worker, const std::vector<ucp_ep_h>& eps,
                               const std::vector<int>& local,
                               const std::vector<uint32_t>& send_pair,
                               const std::vector<uint32_t>& recv_pair) {
  if (local.empty()) return;
  buf_.resize(local.size() * kWarmBytes);  // a peer's receives all land in its slot
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  prm.datatype = ucp_dt_make_contig(1);
  for (size_t i = 0; i < local.size(); ++i) {
    for (int m = 0; m < kWarmMessages; ++m) {
      const Tag tag{kWarmSeq, static_cast<uint32_t>(m)};
      void* r = ucp_tag_recv_nbx(worker, buf_.data() + i * kWarmBytes, kWarmBytes,
                                 EncodeUcxTag(recv_pair[local[i]], tag), ~uint64_t{0}, &prm);
      if (UCS_PTR_IS_ERR(r)) break;  // the collectives meet whatever this was
      if (r != nullptr) recvs_.push_back(r);
    }
  }
  for (int p : local) {
    for (int m = 0; m < kWarmMessages; ++m) {
      const Tag tag{kWarmSeq, static_cast<uint32_t>(m)};
      void* r = ucp_tag_send_nbx(eps[p], kZeros, kWarmBytes,
                                 EncodeUcxTag(send_pair[p], tag), &prm);
      if (UCS_PTR_IS_ERR(r)) break;
      if (r != nullptr) ucp_request_free(r);  // UCX releases it when done
    }
  }
}

void SharedMemoryWarmup::Release(ucp_worker_h worker, bool cancel) {
  while (done_ < recvs_.size()) {
    void* r = recvs_[done_];
    if (ucp_request_check_status(r) == UCS_INPROGRESS) {
      if (!cancel) return;
      ucp_request_cancel(worker, r);
      const absl::Time deadline = absl::Now() + absl::Milliseconds(100);
      while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < deadline) {
        ucp_worker_progress(worker);
      }
      if (ucp_request_check_status(r) == UCS_INPROGRESS) {
        // UCX may still write into the buffer: leave it (and the requests) to the process.
        new std::vector<char>(std::move(buf_));
        recvs_.clear();
        done_ = 0;
        return;
      }
    }
    ucp_request_free(r);
    ++done_;
  }
  recvs_.clear();
  recvs_.shrink_to_fit();
  done_ = 0;
  std::vector<char>().swap(buf_);
}

}  // namespace braid::transport::ucx
