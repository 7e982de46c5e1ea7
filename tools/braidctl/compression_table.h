// braidctl status's compression table: one row per group of tensors (Note [Compression
// groups] in control/compression_groups.h), the method and the plan pattern that gave it.
#ifndef BRAID_TOOLS_BRAIDCTL_COMPRESSION_TABLE_H_
#define BRAID_TOOLS_BRAIDCTL_COMPRESSION_TABLE_H_

#include <string>

#include "proto/braid.pb.h"

namespace braid::tools {

// The table of `status`'s compression rows, with its header and a closing note: COMPRESSION,
// PATTERN ("-" when no plan gave the method), TENSORS (negotiated), then the bytes the ranks
// measured, summed over the RANKS that reported ("-" until one has), and the RATIO. Rows by
// method, then pattern (stable: the coordinator's order among equal ones). "" when there are
// no rows.
std::string CompressionTable(const proto::StatusResponse& status);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_BRAIDCTL_COMPRESSION_TABLE_H_
