// Checking what the ranks asked for: each request as it arrives (ValidateRequest), then a
// tensor every rank has submitted against the others' requests and the world
// (ValidateTensor), with errors that name the tensor, the field and each rank's value. Pure
// functions over the wire messages; the negotiation table (negotiation.h) calls them.
#ifndef BRAID_COORDINATOR_VALIDATION_H_
#define BRAID_COORDINATOR_VALIDATION_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "control/bucket.h"  // CollectiveName
#include "proto/braid.pb.h"

namespace braid::coordinator {

using RequestPtr = std::shared_ptr<const proto::Request>;

// Checks one request as it arrives from `rank`, before anything is computed from it: the
// name, enum values, the shape (dimensions, product, bytes: overflow-checked against
// common/limits.h) and the compression spec's length. InvalidArgument names the field.
absl::Status ValidateRequest(int rank, const proto::Request& req);

// The response for tensor `name` once every rank of its process set submitted it or joined:
// `by_rank` holds each rank's request (null for a rank that joined, Note [Join] in
// negotiation.h, and for ranks outside the set; its size is the world size), `first` the
// first non-null one, `members` the set's ranks (null: the whole world; Note [Process sets]
// in control/process_sets.h). An ERROR response (InvalidArgument) when the ranks' requests
// differ, naming the first field that does and each rank's value, or when the agreed request
// cannot run (a gathering collective of a scalar, a broadcast root outside the set, a reduce
// op the dtype does not take, an all-gather whose result overflows); else the OK response,
// whose first_dims (all-gather) list the set's ranks in order.
proto::Response ValidateTensor(const std::string& name, const proto::Request& first,
                               absl::Span<const RequestPtr> by_rank,
                               const std::vector<int>* members = nullptr);

// "rank 2" / "ranks 0, 3", as the coordinator's messages name ranks.
std::string Ranks(const std::vector<int>& ranks);

// Text of the validation errors, exposed for tests: "tensor 'NAME': FIELD differs across
// ranks: VALUE on ranks A, B; VALUE on rank C".
std::string MismatchMessage(const std::string& name, const std::string& field,
                            const std::map<int, std::string>& value_by_rank);

// "[2, 3]" for a shape.
std::string ShapeString(const proto::Request& r);

// An ERROR response for tensor `name`.
proto::Response ErrorResponse(const std::string& name, absl::StatusCode code,
                              std::string message);

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_VALIDATION_H_
