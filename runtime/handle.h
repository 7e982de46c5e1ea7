// The handle of one asynchronous collective: completed exactly once, with OK or an error.
#ifndef BRAID_RUNTIME_HANDLE_H_
#define BRAID_RUNTIME_HANDLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid {

class Handle {
 public:
  // True once the operation has completed (successfully or not). Never blocks.
  bool Poll() const;
  // Waits up to `timeout` for completion and returns the operation's status;
  // DeadlineExceeded if it is still running then (the handle stays valid). An operation
  // that itself failed with DeadlineExceeded returns that too: Poll() tells them apart.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  // The final status; Unknown("pending") before completion.
  absl::Status status() const;

  // For collectives whose output size the runtime decides (all-gather, all-to-all, and
  // any call made without an output buffer): the result's bytes and shape, valid after
  // successful completion.
  const std::vector<char>& output() const { return output_; }
  const std::vector<int64_t>& output_shape() const { return output_shape_; }

  // Runtime side. Complete() may be called once; later calls are ignored.
  void Complete(absl::Status status);
  std::vector<char>& mutable_output() { return output_; }
  void set_output_shape(std::vector<int64_t> shape) { output_shape_ = std::move(shape); }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("pending");
  std::vector<char> output_;  // written by the runtime before Complete(), read after
  std::vector<int64_t> output_shape_;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_HANDLE_H_
