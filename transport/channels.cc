#include "transport/channels.h"

#include <utility>

#include "transport/collective_communicator.h"
#include "transport/local_communicator.h"
#include "transport/tag.h"

namespace braid::transport {
namespace {

constexpr int kChannelShift = kTagSeqBits - 1;
constexpr uint32_t kChannelSeqMask = (uint32_t{1} << kChannelShift) - 1;

// One channel's view of a shared point-to-point layer: its tags carry the channel in the
// sequence field's top bit (Note [Channels]); everything else is the layer's.
class ChannelPointToPoint final : public PointToPoint {
 public:
  ChannelPointToPoint(std::shared_ptr<PointToPoint> base, uint32_t channel)
      : base_(std::move(base)), channel_(channel) {}

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  absl::Status PostSend(int peer, Tag tag, const void* buf, size_t bytes,
                        Request* req) override {
    return base_->PostSend(peer, Map(tag), buf, bytes, req);
  }
  absl::Status PostRecv(int peer, Tag tag, void* buf, size_t bytes, Request* req) override {
    return base_->PostRecv(peer, Map(tag), buf, bytes, req);
  }
  absl::StatusOr<bool> Test(Request* req) override { return base_->Test(req); }
  void Cancel(absl::Span<Request> reqs) override { base_->Cancel(reqs); }
  absl::Status Wait(absl::Time idle_since, absl::Time until) override {
    return base_->Wait(idle_since, until);
  }
  absl::Status Health() override { return base_->Health(); }
  void Abort(absl::Status reason) override { base_->Abort(std::move(reason)); }
  std::string Describe() const override { return base_->Describe(); }
  uint64_t DropStray(uint32_t seq, uint64_t limit) override {
    return base_->DropStray(MapSeq(seq), limit);
  }

 private:
  uint32_t MapSeq(uint32_t seq) const {
    return (seq & kChannelSeqMask) | channel_ << kChannelShift;
  }
  Tag Map(Tag tag) const { return Tag{MapSeq(tag.seq), tag.slot}; }

  const std::shared_ptr<PointToPoint> base_;
  const uint32_t channel_;
};

}  // namespace

PointToPointChannels SplitPointToPoint(std::unique_ptr<PointToPoint> p2p) {
  std::shared_ptr<PointToPoint> base(std::move(p2p));
  PointToPointChannels views;
  views.data = std::make_unique<ChannelPointToPoint>(base, 0);
  views.control = std::make_unique<ChannelPointToPoint>(base, 1);
  return views;
}

Channels SplitChannels(std::unique_ptr<PointToPoint> p2p, const CollectiveOptions& options) {
  PointToPointChannels views = SplitPointToPoint(std::move(p2p));
  Channels c;
  c.data = std::make_unique<CollectiveCommunicator>(std::move(views.data), options);
  c.control = std::make_unique<CollectiveCommunicator>(std::move(views.control), options);
  return c;
}

std::vector<Channels> CreateLocalChannels(int size, const CollectiveOptions& options) {
  std::vector<Channels> out;
  for (auto& p2p : CreateLocalPointToPoints(size)) {
    out.push_back(SplitChannels(std::move(p2p), options));
  }
  return out;
}

}  // namespace braid::transport
