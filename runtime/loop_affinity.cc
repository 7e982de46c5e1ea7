#include "runtime/loop_affinity.h"

#include <sched.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace braid {

int ChooseLoopCpu(absl::string_view setting, const std::vector<int>& allowed, int local_rank,
                  int local_size) {
  if (setting == "none") return -1;
  int cpu = -1;
  if (setting != "auto") return absl::SimpleAtoi(setting, &cpu) ? cpu : -1;
  const int n = static_cast<int>(allowed.size());
  if (local_size < 2 || local_size > n || local_rank < 0 || local_rank >= local_size) {
    return -1;
  }
  return allowed[static_cast<size_t>(static_cast<long>(local_rank) * n / local_size)];
}

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

absl::Status BindThread(pthread_t thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int err = pthread_setaffinity_np(thread, sizeof(set), &set);
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cannot bind braid-loop to CPU ", cpu, ": ", std::strerror(err)));
}

}  // namespace braid
