// The one place where absl::Status and grpc::Status are converted into each other.
#ifndef BRAID_COORDINATOR_GRPC_STATUS_H_
#define BRAID_COORDINATOR_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace braid::coordinator {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // Both use the canonical google.rpc.Code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& context = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg = context.empty() ? s.error_message() : context + ": " + s.error_message();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_GRPC_STATUS_H_
