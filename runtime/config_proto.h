// The wire form of the job's settings, apart from config.h so the public API (runtime.h)
// shows no proto types.
#ifndef BRAID_RUNTIME_CONFIG_PROTO_H_
#define BRAID_RUNTIME_CONFIG_PROTO_H_

#include "proto/braid.pb.h"
#include "runtime/config.h"

namespace braid {

// The fields of `settings` that are set, durations in milliseconds.
proto::JobSettings ToProto(const JobSettings& settings);

}  // namespace braid

#endif  // BRAID_RUNTIME_CONFIG_PROTO_H_
