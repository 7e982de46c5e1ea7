// Note [Loop thread affinity]
// Each rank's braid-loop thread drives its data plane by spinning a while before it sleeps
// (Note [Adaptive spin]), and two ranks on one host wait on each other all the time: rank 0
// spins for a message that rank 1's loop thread sends. Linux places a woken thread on its
// waker's CPU when that looks cheap (wake-affine), and then both ranks' loop threads can
// end up taking turns on one core while another is idle: every exchange then costs a
// scheduler slice (30-130 us) instead of a microsecond. A run stays in that mode for
// seconds, so small all-reduces took 15-25 us in some runs and 120-250 us in others
// (BENCHMARKS.md, section 23(c) and 24(c)). MPI launchers avoid it by binding each rank to
// its own core by default; braid binds only its loop thread, and by default (`auto`) only
// when there is something to keep apart: this host runs 2 or more ranks and the process
// may run on at least as many CPUs as there are ranks here. The loop thread of local rank r
// of n then takes the allowed CPU at position r * allowed / n (spread, so ranks bound by a
// launcher to disjoint CPU sets, whose sets hold one CPU each, stay where they are), and the
// rank's other threads (the framework's) stay unbound. BRAID_LOOP_CPU=none leaves the
// thread to the scheduler; BRAID_LOOP_CPU=N binds it to CPU N.
#ifndef BRAID_RUNTIME_LOOP_AFFINITY_H_
#define BRAID_RUNTIME_LOOP_AFFINITY_H_

#include <pthread.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace braid {

// The CPU the loop thread is bound to under `setting` (BRAID_LOOP_CPU as the configuration
// checked it: "auto", "none" or a CPU number), or -1
// for none: Note [Loop thread affinity]. `allowed`: the CPUs this process may run on, in
// increasing order.
int ChooseLoopCpu(absl::string_view setting, const std::vector<int>& allowed, int local_rank,
                  int local_size);

// The CPUs this process may run on (sched_getaffinity), in increasing order; empty when
// that cannot be read.
std::vector<int> AllowedCpus();

// Binds `thread` to `cpu`. Internal naming the CPU when the kernel refuses (a CPU outside
// the process's set, or one that does not exist).
absl::Status BindThread(pthread_t thread, int cpu);

}  // namespace braid

#endif  // BRAID_RUNTIME_LOOP_AFFINITY_H_
