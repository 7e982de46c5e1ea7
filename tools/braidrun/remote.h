// Starting a rank on another host over OpenSSH: the ssh command line, the script the remote
// host runs, and what braidrun writes to that script's stdin. Pure functions, unit-tested in
// tests/braidrun/braidrun_util_test.cc; launcher.cc runs them.
//
// Note [Remote ranks]
//   braidrun runs `ssh HOST 'exec /bin/sh -c SCRIPT'` per remote rank, with a pipe as ssh's
//   stdin. SCRIPT (RemoteScript) goes to braidrun's working directory, reads the private
//   variables (names with SECRET, TOKEN, PASSWORD or CREDENTIAL: they never appear on a
//   command line, where `ps` would show them on both hosts) from its stdin up to an empty
//   line, and starts the rank in a session of its own (`setsid`), so that the whole process
//   group of the rank can be signalled, as braidrun does for local ranks. Then a watcher
//   reads control lines from the same stdin: each line is a signal name sent to the rank's
//   process group (how braidrun forwards SIGINT, SIGTERM and SIGKILL to remote ranks); end of
//   file means braidrun or its ssh is gone (or the connection broke), and the rank's group
//   is killed. When the rank exits, whatever it left in its group is killed and the script
//   exits with the rank's status (128+N for a death by signal N), which ssh returns to
//   braidrun; ssh itself exits 255 when the connection fails or is lost.
//   The remote host needs /bin/sh, setsid (util-linux) and env with --default-signal
//   (coreutils 8.31 or later). --default-signal matters: a POSIX shell starts a background
//   command with SIGINT and SIGQUIT ignored, and a rank that inherited that would never see
//   a forwarded Ctrl-C.
#ifndef BRAID_TOOLS_BRAIDRUN_REMOTE_H_
#define BRAID_TOOLS_BRAIDRUN_REMOTE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace braid::braidrun {

// How braidrun calls ssh (flags --ssh-port, --ssh-identity-file, --ssh-option).
struct SshOptions {
  std::string ssh = "ssh";        // the client program
  int port = 0;                   // -p; 0: ssh's default (its config, else 22)
  std::string identity_file;      // -i; empty: ssh's default keys
  std::vector<std::string> options;  // each passed as -o OPTION ("StrictHostKeyChecking=no")
};

// The environment of a remote rank, from its full environment ("NAME=value" entries):
//   public:  on the remote command line (env NAME=value ...);
//   private: names containing SECRET, TOKEN, PASSWORD or CREDENTIAL (case-insensitive),
//            sent over ssh's stdin; a private value with a newline cannot travel that way
//            and is left out (listed in `dropped`).
// Left out as well, because they describe this host or this login, not the job: HOSTNAME,
// HOME, USER, LOGNAME, SHELL, PWD, OLDPWD, SHLVL, TERM, TERMCAP, COLUMNS, LINES, DISPLAY,
// MAIL, MAILPATH, _, and every SSH_*, XDG_* and BASH_FUNC_* variable.
struct RemoteEnv {
  std::vector<std::string> public_vars;
  std::vector<std::string> private_vars;
  std::vector<std::string> dropped;  // names
};
RemoteEnv SplitRemoteEnv(const std::vector<std::string>& env);

// `text` as one word of a POSIX shell command ('...' with ' written as '\'').
std::string ShellQuote(absl::string_view text);

// The script a remote host runs for one rank (Note [Remote ranks]): `cwd` is the directory
// to start in (a missing one is reported and the rank starts in the login directory).
std::string RemoteScript(const std::string& cwd, const std::vector<std::string>& public_vars,
                         const std::vector<std::string>& command);

// What braidrun writes to ssh's stdin before any control line: the private variables, one
// per line, then an empty line.
std::string RemoteStdinPreamble(const std::vector<std::string>& private_vars);

// A control line: the signal's name as kill(1) takes it ("INT\n" for SIGINT).
std::string RemoteSignalLine(int sig);

// ssh's argv: ssh -T -o BatchMode=yes -o ServerAliveInterval=5 -o ServerAliveCountMax=3
// [-p PORT] [-i FILE] [-o OPTION]... HOST 'exec /bin/sh -c SCRIPT'. No terminal (-T): the
// rank's stdout and stderr stay apart. BatchMode: never a password prompt, which would hang
// the job (ssh fails instead). The keepalive makes ssh notice a host that went silent within
// about 15 s.
std::vector<std::string> SshArgv(const SshOptions& ssh, const std::string& host,
                                 const std::string& script);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_REMOTE_H_
