// Note [Ranks die with their launcher]
// A rank must not outlive its launcher. braidrun's watchdog stops the ranks when braidrun
// alone is killed (Note [Ranks die with braidrun] in tools/braidrun/watchdog.h), and a rank
// inside a braid call fails when it loses the coordinator braidrun hosted; but when braidrun
// and its watchdog are both killed with SIGKILL, a rank busy in its own work (not inside a
// braid call) would run on for ever. So braidrun gives every rank on its host the read end
// of a pipe, at descriptor 3 (BRAID_LAUNCHER_PIPE=3:INODE), whose only write end braidrun
// holds. However braidrun dies, the kernel closes that end and the read end reports a
// hang-up. From init() on, a thread of the rank waits for it (on a private duplicate of the
// descriptor, since the program may close or reuse descriptor 3; it never reads: the pipe
// carries nothing), then sends SIGTERM to the rank's process group (the rank and what it
// started: `sh -c 'python ...'`'s shell, DataLoader workers) and, if the rank still lives
// kLauncherGrace later, SIGKILL. A descriptor that is not that pipe (INODE differs: a child
// of a rank that closed it and opened something else there) is not watched.
// Not PR_SET_PDEATHSIG: posix_spawn (which braidrun must use: it holds gRPC threads) cannot
// set it, it follows the thread that started the process, and it reaches the rank's process
// alone, not its group. Not a lost coordinator: a rank busy outside braid calls nothing that
// would notice, and the coordinator need not be the launcher's (a standalone one).
#ifndef BRAID_RUNTIME_LAUNCHER_WATCH_H_
#define BRAID_RUNTIME_LAUNCHER_WATCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace braid {

// After SIGTERM, how long the rank's process group gets before SIGKILL (as braidrun's
// watchdog gives it).
inline constexpr absl::Duration kLauncherGrace = absl::Seconds(2);

// Starts the watch of Note [Ranks die with their launcher] on descriptor `fd`, which must be
// the pipe of inode `inode`; `rank` names this process in the message it prints. Once per
// process: later calls do nothing (OK). FailedPrecondition when `fd` is not that pipe (then
// nothing is watched).
absl::Status WatchLauncher(int fd, uint64_t inode, int rank);

}  // namespace braid

#endif  // BRAID_RUNTIME_LAUNCHER_WATCH_H_
