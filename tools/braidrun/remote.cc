#include "tools/braidrun/remote.h"

#include <signal.h>
#include <string.h>

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::braidrun {
namespace {

bool DescribesThisHost(absl::string_view name) {
  static const std::set<std::string, std::less<>> kNames = {
      "HOSTNAME", "HOME", "USER",    "LOGNAME", "SHELL",   "PWD",  "OLDPWD",   "SHLVL",
      "TERM",     "TERMCAP", "COLUMNS", "LINES", "DISPLAY", "MAIL", "MAILPATH", "_"};
  return kNames.count(name) != 0 || absl::StartsWith(name, "SSH_") ||
         absl::StartsWith(name, "XDG_") || absl::StartsWith(name, "BASH_FUNC_");
}

bool IsPrivate(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (absl::string_view word : {"SECRET", "TOKEN", "PASSWORD", "CREDENTIAL"}) {
    if (absl::StrContains(upper, word)) return true;
  }
  return false;
}

// A name the remote shell can `export` (private variables go through its `export`).
bool IsShellName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

}  // namespace

RemoteEnv SplitRemoteEnv(const std::vector<std::string>& env) {
  RemoteEnv out;
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    absl::string_view name(e.data(), eq);
    if (DescribesThisHost(name)) continue;
    if (!IsPrivate(name)) {
      out.public_vars.push_back(e);
    } else if (IsShellName(name) && e.find('\n') == std::string::npos) {
      out.private_vars.push_back(e);
    } else {
      out.dropped.emplace_back(name);
    }
  }
  return out;
}

std::string ShellQuote(absl::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

std::string RemoteScript(const std::string& cwd, const std::vector<std::string>& public_vars,
                         const std::vector<std::string>& command) {
  std::vector<std::string> words = {"setsid", "env", "--default-signal", "--"};
  for (const std::string& v : public_vars) words.push_back(ShellQuote(v));
  for (const std::string& a : command) words.push_back(ShellQuote(a));
  const std::string dir = ShellQuote(cwd);
  // Shell variables are prefixed braidrun_ so that they cannot shadow the rank's own.
  return absl::StrCat(
      "cd ", dir, " 2>/dev/null || printf 'braidrun: %s: no directory %s; starting in %s\\n' ",
      "\"$(hostname)\" ", dir, " \"$PWD\" >&2\n",
      "exec 3<&0\n",
      "while IFS= read -r braidrun_v <&3 && [ -n \"$braidrun_v\" ]; do export \"$braidrun_v\"; "
      "done\n",
      absl::StrJoin(words, " "), " </dev/null &\n",
      "braidrun_pid=$!\n",
      "(while IFS= read -r braidrun_s; do kill -s \"$braidrun_s\" -- \"-$braidrun_pid\" "
      "2>/dev/null; done; kill -s KILL -- \"-$braidrun_pid\" 2>/dev/null) <&3 &\n",
      "braidrun_watch=$!\n",
      "exec 3<&-\n",
      "wait \"$braidrun_pid\"\n",
      "braidrun_rc=$?\n",
      "kill \"$braidrun_watch\" 2>/dev/null\n",
      "kill -s KILL -- \"-$braidrun_pid\" 2>/dev/null\n",
      "exit \"$braidrun_rc\"\n");
}

std::string RemoteStdinPreamble(const std::vector<std::string>& private_vars) {
  std::string out;
  for (const std::string& v : private_vars) absl::StrAppend(&out, v, "\n");
  out += "\n";
  return out;
}

std::string RemoteSignalLine(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return absl::StrCat(abbrev != nullptr ? abbrev : absl::StrCat(sig), "\n");
}

std::vector<std::string> SshArgv(const SshOptions& ssh, const std::string& host,
                                 const std::string& script) {
  std::vector<std::string> argv = {ssh.ssh, "-T"};
  // ssh keeps the first value it is given for an option: the user's come first.
  for (const std::string& o : ssh.options) {
    argv.push_back("-o");
    argv.push_back(o);
  }
  for (const char* o : {"BatchMode=yes", "ServerAliveInterval=5", "ServerAliveCountMax=3"}) {
    argv.push_back("-o");
    argv.push_back(o);
  }
  if (ssh.port > 0) {
    argv.push_back("-p");
    argv.push_back(absl::StrCat(ssh.port));
  }
  if (!ssh.identity_file.empty()) {
    argv.push_back("-i");
    argv.push_back(ssh.identity_file);
  }
  argv.push_back(host);
  argv.push_back(absl::StrCat("exec /bin/sh -c ", ShellQuote(script)));
  return argv;
}

}  // namespace braid::braidrun
