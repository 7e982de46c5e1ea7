#include "runtime/heartbeat_report.h"

#include <cstdint>

namespace braid {
namespace {

// The wire uses int64 like the rest of StatusResponse; a uint64 counter past 2^63 bytes
// (8 EiB) is not a concern, but never let it wrap negative.
int64_t Wire(uint64_t v) {
  return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
}

}  // namespace

void AddCompressionTotals(const StatisticsLedger& ledger,
                          proto::HeartbeatRequest* hb) {
  for (const MethodCompressionStats& m : ledger.MethodTotals()) {
    proto::MethodBytes* out = hb->add_compression();
    out->set_method(m.method);
    out->set_reductions(Wire(m.bytes.reductions));
    out->set_uncompressed_bytes(Wire(m.bytes.uncompressed_bytes));
    out->set_payload_bytes(Wire(m.bytes.payload_bytes));
    out->set_transport_bytes(Wire(m.bytes.transport_bytes));
    out->set_reference_transport_bytes(Wire(m.bytes.reference_transport_bytes));
  }
}

}  // namespace braid
