// What a rank tells the coordinator in each heartbeat, besides being alive: its compression
// totals per method and per group (method and plan pattern: Note [Compression groups] in
// control/compression_groups.h), which the coordinator sums over ranks for `braidctl status`.
#ifndef BRAID_RUNTIME_HEARTBEAT_REPORT_H_
#define BRAID_RUNTIME_HEARTBEAT_REPORT_H_

#include "runtime/statistics.h"
#include "proto/braid.pb.h"

namespace braid {

// Appends one MethodBytes per method of `ledger` (cumulative since Init) to
// `hb`'s compression, and one per group, with its pattern, to its compression_groups.
// O(groups), not O(tensors): it runs on every heartbeat. Thread-safe.
void AddCompressionTotals(const StatisticsLedger& ledger,
                          proto::HeartbeatRequest* hb);

}  // namespace braid

#endif  // BRAID_RUNTIME_HEARTBEAT_REPORT_H_
