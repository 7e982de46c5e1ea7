// Message tags of the point-to-point layer (transport/p2p.h).
//
// Note [Tag layout]
// A message is named by its ordered pair of ranks (source, destination) and a Tag that the
// algorithm chooses: `seq`, the collective's sequence number (the same on every rank, since
// every rank calls the same collectives in the same order), and `slot`, which message of that
// collective between this pair it is (a round, or a pipeline stage and piece). A receive
// matches exactly the message with the same pair, seq and slot, so no two messages in flight
// between one pair may share a Tag.
//
// UCX carries 64 tag bits, matched with a full mask:
//
//     | pair: 32 | seq: 16 | slot: 16 |
//
//   pair  says who sent the message. By default the source rank; the runtime puts a keyed
//         value there instead (UcxOptions::pair_tag = KeyedDataPlaneTags in
//         runtime/registration.h): 32 bits derived from the job secret and the (source,
//         destination) pair by a keyed permutation (KeyedPairTag, common/secret.h). A
//         receiver posts the value it expects from that source, so a process that does not
//         know the secret matches no receive even if it learned a worker address (UCX's tag
//         API cannot tell who sent a message, and a worker address needs no consent to
//         connect to). Two sources must not share a value at one destination.
//   seq   the collective's sequence number modulo 2^16. A rank runs ahead of a peer only
//         through collectives that need nothing from that peer (a broadcast root's sends), so
//         two collectives 65536 apart never have messages in flight at once. Communicators
//         that share one point-to-point layer as channels (transport/channels.h) give the
//         field's top bit to the channel and the next kTagSetBits to the process set (0: the
//         whole world; Note [Process sets] in control/process_sets.h): 2^10 numbers each,
//         still far beyond that window (and a receive matches the oldest message of a tag
//         first: UCX and the in-process backend deliver one pair's messages in order).
//   slot  below kMaxTagSlots; pipelined algorithms size their pieces to stay below it.
//
// The in-process backend matches (source, seq, slot) directly; a later backend maps the Tag
// to whatever its wire offers, as long as a receive matches exactly one message.
#ifndef BRAID_TRANSPORT_TAG_H_
#define BRAID_TRANSPORT_TAG_H_

#include <cstdint>

namespace braid::transport {

struct Tag {
  uint32_t seq = 0;   // collective sequence number (backends may keep its low bits only)
  uint32_t slot = 0;  // message of the collective between one ordered pair, < kMaxTagSlots
  bool operator==(const Tag& o) const { return seq == o.seq && slot == o.slot; }
};

inline constexpr int kTagPairBits = 32;
inline constexpr int kTagSeqBits = 16;
inline constexpr int kTagSlotBits = 16;
inline constexpr uint32_t kMaxTagSlots = uint32_t{1} << kTagSlotBits;
// Bits of the sequence field that name a process set's channels (transport/channels.h).
inline constexpr int kTagSetBits = 5;

// The 64-bit UCX tag of `tag` on a message whose pair field is `pair` (Note [Tag layout]).
constexpr uint64_t EncodeUcxTag(uint32_t pair, Tag tag) {
  constexpr uint64_t kSeqMask = (uint64_t{1} << kTagSeqBits) - 1;
  constexpr uint64_t kSlotMask = (uint64_t{1} << kTagSlotBits) - 1;
  return (uint64_t{pair} << (kTagSeqBits + kTagSlotBits)) |
         ((uint64_t{tag.seq} & kSeqMask) << kTagSlotBits) | (uint64_t{tag.slot} & kSlotMask);
}

}  // namespace braid::transport

#endif  // BRAID_TRANSPORT_TAG_H_
