#include "runtime/handle.h"

namespace braid {

bool Handle::Poll() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status Handle::Wait(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError("operation still running after the wait's timeout");
  }
  return status_;
}

absl::Status Handle::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void Handle::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
}

}  // namespace braid
