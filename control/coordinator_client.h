// The runtime's view of the coordinator: proto messages in and out, no gRPC types. The
// gRPC implementation lives in coordinator/client.h; tests can substitute their own.
#ifndef BRAID_CONTROL_COORDINATOR_CLIENT_H_
#define BRAID_CONTROL_COORDINATOR_CLIENT_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/braid.pb.h"
#include "common/store.h"

namespace braid {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  // Blocks until the whole world registered; `timeout` bounds the wait. The response holds
  // this rank's place, the job's settings and every rank's data-plane address: one round
  // trip per rank.
  virtual absl::StatusOr<proto::RegisterResponse> Register(const proto::RegisterRequest& req,
                                                           absl::Duration timeout) = 0;
  // Makes a Register in progress on another thread, and any later one, return Cancelled
  // promptly (Ctrl-C while waiting for the other ranks). Thread-safe. The default does
  // nothing: Register then runs to its timeout.
  virtual void CancelRegister() {}
  // The coordinator's key-value store (for tools; peers come with registration).
  virtual Store* store() = 0;

  // Opens this rank's negotiation stream. `on_message` is called for every ResponseList in
  // order, and `on_closed` once when the stream ends (OK after Close(), Unavailable when the
  // coordinator is lost), both from the client's reader thread.
  virtual absl::Status StartNegotiation(
      int rank, std::function<void(const proto::ResponseList&)> on_message,
      std::function<void(const absl::Status&)> on_closed) = 0;
  // Sends requests on the stream. Called by one thread at a time.
  virtual absl::Status Send(const proto::RequestList& list) = 0;
  // Says a clean goodbye and ends the stream; cancels it after `grace`.
  virtual void Close(absl::Duration grace) = 0;
};

}  // namespace braid

#endif  // BRAID_CONTROL_COORDINATOR_CLIENT_H_
