// Status propagation helpers (Abseil has no public RETURN_IF_ERROR macro).
#ifndef BRAID_COMMON_STATUS_MACROS_H_
#define BRAID_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define BRAID_CONCAT_INNER_(a, b) a##b
#define BRAID_CONCAT_(a, b) BRAID_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` yields a non-OK absl::Status.
#define BRAID_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::absl::Status braid_status_ = (expr);          \
    if (!braid_status_.ok()) return braid_status_;  \
  } while (0)

// `lhs = value of expr`, or returns its error status.
#define BRAID_ASSIGN_OR_RETURN(lhs, expr) \
  BRAID_ASSIGN_OR_RETURN_IMPL_(BRAID_CONCAT_(braid_statusor_, __LINE__), lhs, expr)
#define BRAID_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#endif  // BRAID_COMMON_STATUS_MACROS_H_
