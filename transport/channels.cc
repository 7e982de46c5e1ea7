#include "transport/channels.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/mutex.h"

#include "transport/collective_communicator.h"
#include "transport/local_communicator.h"
#include "transport/tag.h"

namespace braid::transport {
namespace {

constexpr int kChannelShift = kTagSeqBits - 1;
constexpr int kSetShift = kChannelShift - kTagSetBits;
constexpr uint32_t kSetSeqMask = (uint32_t{1} << kSetShift) - 1;

// One channel's view of a shared point-to-point layer, for the whole world or for one
// process set: its tags carry the channel in the sequence field's top bit and the set's slot
// below it (Note [Channels], Note [Tag layout]); a set's view numbers its members 0..n-1.
// Everything else is the layer's.
class ChannelPointToPoint final : public PointToPoint {
 public:
  ChannelPointToPoint(std::shared_ptr<PointToPoint> base, uint32_t channel, uint32_t slot = 0,
                      std::vector<int> ranks = {})
      : base_(std::move(base)), channel_(channel), slot_(slot), ranks_(std::move(ranks)) {
    if (!ranks_.empty()) {
      rank_ = static_cast<int>(std::find(ranks_.begin(), ranks_.end(), base_->rank()) -
                               ranks_.begin());
    }
  }

  int rank() const override { return ranks_.empty() ? base_->rank() : rank_; }
  int size() const override {
    return ranks_.empty() ? base_->size() : static_cast<int>(ranks_.size());
  }
  absl::Status PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                        Request* req) override {
    absl::Status s = base_->PostSend(Peer(peer), Map(tag), buf, bytes, req);
    ToLocal(req);
    return s;
  }
  absl::Status PostRecv(int peer, Tag tag, void* buf, size_t bytes, Request* req) override {
    absl::Status s = base_->PostRecv(Peer(peer), Map(tag), buf, bytes, req);
    ToLocal(req);
    return s;
  }
  // A set's requests name its ranks; the layer's, the job's (Request::peer).
  absl::StatusOr<bool> Test(Request* req) override {
    ToGlobal(req);
    absl::StatusOr<bool> done = base_->Test(req);
    ToLocal(req);
    return done;
  }
  void Cancel(absl::Span<Request> reqs) override {
    for (Request& r : reqs) ToGlobal(&r);
    base_->Cancel(reqs);
    for (Request& r : reqs) ToLocal(&r);
  }
  absl::Status Wait(absl::Time idle_since, absl::Time until) override {
    if (absl::Status s = Interrupted(); !s.ok()) return s;
    absl::Status s = base_->Wait(idle_since, until);
    if (absl::Status i = Interrupted(); !i.ok()) return i;
    return s;
  }
  absl::Status Health() override {
    if (absl::Status s = Interrupted(); !s.ok()) return s;
    return base_->Health();
  }
  void Abort(absl::Status reason) override { base_->Abort(std::move(reason)); }
  // This view alone: the layer's other channels (and process sets') go on.
  void Interrupt(absl::Status reason) override {
    {
      absl::MutexLock lock(&mu_);
      if (interrupted_.ok()) interrupted_ = std::move(reason);
    }
    base_->Wake();
  }
  void Wake() override { base_->Wake(); }
  int JobRank(int r) const override { return base_->JobRank(Peer(r)); }
  std::string Describe() const override { return base_->Describe(); }
  uint64_t DropStray(uint32_t seq, uint64_t limit) override {
    return base_->DropStray(MapSeq(seq), limit);
  }

 private:
  uint32_t MapSeq(uint32_t seq) const {
    return (seq & kSetSeqMask) | slot_ << kSetShift | channel_ << kChannelShift;
  }
  Tag Map(Tag tag) const { return Tag{MapSeq(tag.seq), tag.slot}; }
  int Peer(int peer) const { return ranks_.empty() ? peer : ranks_[peer]; }
  void ToGlobal(Request* r) const {
    if (!ranks_.empty() && r->peer >= 0 && r->peer < size()) r->peer = ranks_[r->peer];
  }
  void ToLocal(Request* r) const {
    if (ranks_.empty() || r->peer < 0) return;
    auto it = std::lower_bound(ranks_.begin(), ranks_.end(), r->peer);
    if (it != ranks_.end() && *it == r->peer) r->peer = static_cast<int>(it - ranks_.begin());
  }

  const std::shared_ptr<PointToPoint> base_;
  const uint32_t channel_;
  const uint32_t slot_;
  absl::Status Interrupted() {
    absl::MutexLock lock(&mu_);
    return interrupted_;
  }

  const std::vector<int> ranks_;  // empty: the whole world
  int rank_ = 0;
  absl::Mutex mu_;  // a leaf
  absl::Status interrupted_ ABSL_GUARDED_BY(mu_);
};

Channels MakeChannels(const std::shared_ptr<PointToPoint>& base, const CollectiveOptions& options,
                      uint32_t slot, const std::vector<int>& ranks) {
  Channels c;
  c.data = std::make_unique<CollectiveCommunicator>(
      std::make_unique<ChannelPointToPoint>(base, 0, slot, ranks), options);
  c.control = std::make_unique<CollectiveCommunicator>(
      std::make_unique<ChannelPointToPoint>(base, 1, slot, ranks), options);
  if (slot == 0) {
    c.subset = [base, options](uint32_t set_slot, const std::vector<int>& set_ranks) {
      return MakeChannels(base, options, set_slot, set_ranks);
    };
  }
  return c;
}

}  // namespace

PointToPointChannels SplitPointToPoint(std::unique_ptr<PointToPoint> p2p) {
  std::shared_ptr<PointToPoint> base(std::move(p2p));
  PointToPointChannels views;
  views.data = std::make_unique<ChannelPointToPoint>(base, 0);
  views.control = std::make_unique<ChannelPointToPoint>(base, 1);
  return views;
}

Channels SplitChannels(std::unique_ptr<PointToPoint> p2p, const CollectiveOptions& options) {
  return MakeChannels(std::shared_ptr<PointToPoint>(std::move(p2p)), options, 0, {});
}

std::vector<Channels> CreateLocalChannels(int size, const CollectiveOptions& options) {
  std::vector<Channels> out;
  for (auto& p2p : CreateLocalPointToPoints(size)) {
    out.push_back(SplitChannels(std::move(p2p), options));
  }
  return out;
}

}  // namespace braid::transport
