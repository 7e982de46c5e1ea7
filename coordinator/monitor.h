// Note [Monitor]: the coordinator's one background thread, whatever the number of ranks. It
// wakes every `period` and runs `inspect`, which checks what no RPC triggers: ranks silent
// past the heartbeat timeout (lost), stalled tensors, and waiting calls past their deadlines
// (registrations, key-value gets, status waits). Liveness and stalls are therefore noticed
// within one period of their deadline.
#ifndef BRAID_COORDINATOR_MONITOR_H_
#define BRAID_COORDINATOR_MONITOR_H_

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid::coordinator {

class Monitor {
 public:
  // Starts the thread; `inspect` runs on it every `period`, first one period from now.
  Monitor(absl::Duration period, std::function<void()> inspect);
  // Stops and joins the thread (must not be called from `inspect`).
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  absl::Duration period() const { return period_; }

 private:
  void Loop();

  const absl::Duration period_;
  const std::function<void()> inspect_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_MONITOR_H_
