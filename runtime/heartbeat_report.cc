#include "runtime/heartbeat_report.h"

#include <cstdint>

namespace braid {
namespace {

// The wire uses int64 like the rest of StatusResponse; a uint64 counter past 2^63 bytes
// (8 EiB) is not a concern, but never let it wrap negative.
int64_t Wire(uint64_t v) {
  return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
}

void SetBytes(const ByteStats& b, proto::MethodBytes* out) {
  out->set_reductions(Wire(b.reductions));
  out->set_uncompressed_bytes(Wire(b.uncompressed_bytes));
  out->set_payload_bytes(Wire(b.payload_bytes));
  out->set_transport_bytes(Wire(b.transport_bytes));
  out->set_reference_transport_bytes(Wire(b.reference_transport_bytes));
}

}  // namespace

void AddCompressionTotals(const StatisticsLedger& ledger,
                          proto::HeartbeatRequest* hb) {
  for (const MethodCompressionStats& m : ledger.MethodTotals()) {
    proto::MethodBytes* out = hb->add_compression();
    out->set_method(m.method);
    SetBytes(m.bytes, out);
  }
  for (const CompressionGroupStats& g : ledger.GroupTotals()) {
    proto::MethodBytes* out = hb->add_compression_groups();
    out->set_method(g.method);
    out->set_pattern(g.pattern);
    SetBytes(g.bytes, out);
  }
}

}  // namespace braid
