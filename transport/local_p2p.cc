// The in-process backend (transport/local_communicator.h): ranks as threads, messages matched
// and copied under one mutex. Simplicity over speed: it exists to test the algorithms.
#include <cstring>
#include <list>
#include <memory>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "transport/collective_communicator.h"
#include "transport/local_communicator.h"

namespace braid::transport {
namespace {

// One posted send or receive.
struct Op {
  int owner = -1;  // the rank that posted it
  int peer = -1;
  Tag tag;
  bool is_recv = false;
  const char* send_buf = nullptr;
  char* recv_buf = nullptr;
  size_t bytes = 0;
  bool done = false;  // an op sits in a queue exactly while it is not done
  absl::Status status;
};

// What the endpoints of one world share. Every field is guarded by `mu`.
struct Fabric {
  struct Rank {
    std::list<Op*> unexpected;      // sends to this rank that no receive matched yet
    std::list<Op*> posted;          // receives of this rank that no send matched yet
    std::unordered_set<Op*> live;   // every op this rank posted and has not released
    absl::CondVar cv;
    uint64_t events = 0;            // completions of this rank's ops, and aborts
    bool closed = false;
    absl::Status abort;
  };
  explicit Fabric(int size) : size(size), ranks(new Rank[size]) {}
  const int size;
  absl::Mutex mu;
  std::unique_ptr<Rank[]> ranks;
};

class LocalPointToPoint final : public PointToPoint {
 public:
  LocalPointToPoint(std::shared_ptr<Fabric> f, int rank) : f_(std::move(f)), rank_(rank) {}
  ~LocalPointToPoint() override;

  int rank() const override { return rank_; }
  int size() const override { return f_->size; }
  absl::Status PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                        Request* req) override;
  absl::Status PostRecv(int peer, Tag tag, void* buf, size_t bytes, Request* req) override;
  absl::StatusOr<bool> Test(Request* req) override;
  void Cancel(absl::Span<Request> reqs) override;
  absl::Status Wait(absl::Time idle_since, absl::Time until) override;
  absl::Status Health() override;
  void Abort(absl::Status reason) override;
  void Wake() override;
  std::string Describe() const override {
    return absl::StrCat("in-process (", f_->size, " ranks)");
  }

 private:
  void Complete(Op* op, absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu);
  void Deliver(Op* send, Op* recv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu);
  // Removes and returns the first op of `q` from `peer` with `tag`, or nullptr.
  static Op* Take(std::list<Op*>& q, int peer, Tag tag, bool by_owner);
  // What rank `observer` is told about rank `lost`, whose endpoint was closed.
  static absl::Status Left(int observer, int lost) {
    return absl::UnavailableError(absl::StrCat("rank ", observer, ": rank ", lost,
                                               " has left (its endpoint was closed)"));
  }
  // Fills `req` for `op`, releasing an op that completed at once without error.
  void Hand(Op* op, Request* req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu);

  std::shared_ptr<Fabric> f_;
  const int rank_;
  uint64_t seen_ = 0;  // events already reported by Wait
};

Op* LocalPointToPoint::Take(std::list<Op*>& q, int peer, Tag tag, bool by_owner) {
  for (auto it = q.begin(); it != q.end(); ++it) {
    if ((by_owner ? (*it)->owner : (*it)->peer) == peer && (*it)->tag == tag) {
      Op* op = *it;
      q.erase(it);
      return op;
    }
  }
  return nullptr;
}

void LocalPointToPoint::Complete(Op* op, absl::Status s) {
  op->done = true;
  op->status = std::move(s);
  Fabric::Rank& owner = f_->ranks[op->owner];
  ++owner.events;
  owner.cv.SignalAll();
}

void LocalPointToPoint::Deliver(Op* send, Op* recv) {
  if (send->bytes != recv->bytes) {
    Complete(recv, absl::InternalError(absl::StrCat(
                       "rank ", recv->owner, ": received ", send->bytes, " bytes from rank ",
                       send->owner, ", expected ", recv->bytes,
                       " (ranks called different collectives or sizes)")));
  } else {
    if (send->bytes > 0) std::memcpy(recv->recv_buf, send->send_buf, send->bytes);
    Complete(recv, absl::OkStatus());
  }
  Complete(send, absl::OkStatus());
}

void LocalPointToPoint::Hand(Op* op, Request* req) {
  if (op->done && op->status.ok()) {
    f_->ranks[rank_].live.erase(op);
    *req = Request{nullptr, false, op->is_recv, op->peer, op->bytes};
    delete op;
    return;
  }
  *req = Request{op, true, op->is_recv, op->peer, op->bytes};
}

absl::Status LocalPointToPoint::PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                                         Request* req) {
  absl::MutexLock lock(&f_->mu);
  if (f_->ranks[peer].closed) return Left(rank_, peer);
  Op* op = new Op;
  *op = Op{rank_, peer, tag, false, static_cast<const char*>(buf), nullptr, bytes, false, {}};
  f_->ranks[rank_].live.insert(op);
  if (Op* recv = Take(f_->ranks[peer].posted, rank_, tag, /*by_owner=*/false)) {
    Deliver(op, recv);
  } else {
    f_->ranks[peer].unexpected.push_back(op);
  }
  Hand(op, req);
  return absl::OkStatus();
}

absl::Status LocalPointToPoint::PostRecv(int peer, Tag tag, void* buf, size_t bytes,
                                         Request* req) {
  absl::MutexLock lock(&f_->mu);
  Op* op = new Op;
  *op = Op{rank_, peer, tag, true, nullptr, static_cast<char*>(buf), bytes, false, {}};
  Fabric::Rank& me = f_->ranks[rank_];
  me.live.insert(op);
  if (Op* send = Take(me.unexpected, peer, tag, /*by_owner=*/true)) {
    Deliver(send, op);
  } else if (f_->ranks[peer].closed) {
    Complete(op, Left(rank_, peer));
  } else {
    me.posted.push_back(op);
  }
  Hand(op, req);
  return absl::OkStatus();
}

absl::StatusOr<bool> LocalPointToPoint::Test(Request* req) {
  if (!req->pending) return true;
  absl::MutexLock lock(&f_->mu);
  Op* op = static_cast<Op*>(req->handle);
  if (!op->done) return false;
  absl::Status s = std::move(op->status);
  f_->ranks[rank_].live.erase(op);
  delete op;
  req->handle = nullptr;
  req->pending = false;
  if (!s.ok()) return s;
  return true;
}

void LocalPointToPoint::Cancel(absl::Span<Request> reqs) {
  absl::MutexLock lock(&f_->mu);
  for (Request& r : reqs) {
    if (!r.pending) continue;
    Op* op = static_cast<Op*>(r.handle);
    if (!op->done) {
      auto& q = op->is_recv ? f_->ranks[rank_].posted : f_->ranks[op->peer].unexpected;
      q.remove(op);
    }
    f_->ranks[rank_].live.erase(op);
    delete op;
    r.handle = nullptr;
    r.pending = false;
  }
}

absl::Status LocalPointToPoint::Wait(absl::Time idle_since, absl::Time until) {
  absl::MutexLock lock(&f_->mu);
  Fabric::Rank& me = f_->ranks[rank_];
  while (true) {
    if (!me.abort.ok()) return me.abort;
    if (me.events != seen_) {
      seen_ = me.events;
      return absl::OkStatus();
    }
    if (absl::Now() >= until) return absl::OkStatus();
    me.cv.WaitWithDeadline(&f_->mu, until);
  }
}

absl::Status LocalPointToPoint::Health() {
  absl::MutexLock lock(&f_->mu);
  return f_->ranks[rank_].abort;
}

void LocalPointToPoint::Abort(absl::Status reason) {
  absl::MutexLock lock(&f_->mu);
  Fabric::Rank& me = f_->ranks[rank_];
  if (me.abort.ok()) me.abort = std::move(reason);
  ++me.events;
  me.cv.SignalAll();
}

void LocalPointToPoint::Wake() {
  absl::MutexLock lock(&f_->mu);
  ++f_->ranks[rank_].events;
  f_->ranks[rank_].cv.SignalAll();
}

LocalPointToPoint::~LocalPointToPoint() {
  absl::MutexLock lock(&f_->mu);
  Fabric::Rank& me = f_->ranks[rank_];
  me.closed = true;
  // This rank's sends still queued at peers point into buffers about to go away.
  for (int p = 0; p < f_->size; ++p) {
    f_->ranks[p].unexpected.remove_if([&](Op* op) { return op->owner == rank_; });
  }
  // Peers' pending requests that involve this rank fail as over a lost connection.
  for (Op* op : me.unexpected) Complete(op, Left(op->owner, rank_));  // sends to this rank
  me.unexpected.clear();
  for (int p = 0; p < f_->size; ++p) {
    f_->ranks[p].posted.remove_if([&](Op* op) {
      if (op->peer != rank_) return false;
      Complete(op, Left(p, rank_));
      return true;
    });
  }
  me.posted.clear();
  for (Op* op : me.live) delete op;
  me.live.clear();
}

}  // namespace

std::vector<std::unique_ptr<PointToPoint>> CreateLocalPointToPoints(int size) {
  auto fabric = std::make_shared<Fabric>(size);
  std::vector<std::unique_ptr<PointToPoint>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<LocalPointToPoint>(fabric, r));
  return out;
}

std::vector<std::unique_ptr<Communicator>> CreateLocalCommunicators(
    int size, const CollectiveOptions& options) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& p2p : CreateLocalPointToPoints(size)) {
    out.push_back(std::make_unique<CollectiveCommunicator>(std::move(p2p), options));
  }
  return out;
}

}  // namespace braid::transport
