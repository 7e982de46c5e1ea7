// Watching a braidrun job with braidctl: where braidrun keeps the secret of a job it made one
// up for, and the command it prints.
#ifndef BRAID_TOOLS_BRAIDRUN_WATCH_H_
#define BRAID_TOOLS_BRAIDRUN_WATCH_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::braidrun {

// Note [Watching a braidrun job]
// braidctl needs the job's secret (Note [Who may join]). When the user gave none (no
// --secret-file, no BRAID_JOB_SECRET), braidrun makes one up; it used to live only in the
// ranks' environment, so the job could not be watched. braidrun now also keeps it in a
// file only its user can read, and prints at start the braidctl command that watches the
// job with it:
//   - the file: <dir>/job-<braidrun's pid>.secret, mode 0600, written atomically
//     (ReadOrCreateSecretFile), removed when braidrun exits; one left by a braidrun that was
//     killed (SIGKILL) is removed by the next braidrun once that pid is gone;
//   - <dir>: $XDG_RUNTIME_DIR/braid (a per-user directory of mode 0700, on tmpfs, under
//     systemd), else ~/.cache/braid/jobs; created with mode 0700, and used only when it is
//     a directory this user owns that group and others cannot enter (else braidrun says
//     why and prints no command; the job runs as before).
// Who may join is unchanged: the secret is the same 256 random bits, sent to the ranks as
// before; a file only this user can read tells nothing that this user could not already
// read in the ranks' environment (/proc/<pid>/environ is readable by the same user only).
//
// The directory for job secret files, created if missing (mode 0700), after the checks
// above. `xdg_runtime_dir` and `home` are the variables' values ("" when unset).
absl::StatusOr<std::string> JobSecretDir(absl::string_view xdg_runtime_dir,
                                         absl::string_view home);

// The secret file of the braidrun whose pid is `pid`, in `dir`.
std::string JobSecretPath(const std::string& dir, pid_t pid);

// Removes the job-<pid>.secret files in `dir` whose braidrun is gone (no process `pid`).
// Returns how many it removed.
int RemoveStaleJobSecrets(const std::string& dir);

// "BRAIDCTL status --coordinator ADDRESS --secret-file FILE" (each word shell-quoted when it
// needs it), without --secret-file when `secret_file` is empty (the secret then comes from
// BRAID_JOB_SECRET), with " --tls-ca CA" when `tls_ca` is not empty.
std::string WatchCommand(absl::string_view braidctl, absl::string_view address,
                         absl::string_view secret_file, absl::string_view tls_ca);

// The braidctl next to braidrun: <dir>/braidctl when installed (P/bin), <dir>/../braidctl/
// braidctl in a build tree; else "braidctl" (found on PATH). `braidrun_dir`: the directory
// of braidrun's executable.
std::string BraidctlPath(const std::string& braidrun_dir);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_WATCH_H_
