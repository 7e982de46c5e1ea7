#include "coordinator/monitor.h"

#include <utility>

namespace braid::coordinator {

Monitor::Monitor(absl::Duration period, std::function<void()> inspect)
    : period_(period), inspect_(std::move(inspect)) {
  thread_ = std::thread([this] { Loop(); });
}

Monitor::~Monitor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Monitor::Loop() {
  absl::Time next = absl::Now() + period_;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wakes at the next tick, or at once when stopped.
      if (mu_.AwaitWithDeadline(absl::Condition(&stop_), next)) return;
    }
    inspect_();
    // Ticks stay on the period's grid; an inspection that overran skips the ticks it missed.
    const absl::Time now = absl::Now();
    next += period_;
    if (next <= now) next = now + period_;
  }
}

}  // namespace braid::coordinator
