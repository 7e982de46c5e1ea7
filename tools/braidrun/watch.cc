#include "tools/braidrun/watch.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tools/braidrun/remote.h"

namespace braid::braidrun {
namespace {

// mkdir -m 0700 of `dir` when missing; then the checks of Note [Watching a braidrun job].
absl::Status PrivateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(dir, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " belongs to another user"));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is open to group or others (mode ", mode, "); chmod 0700 it"));
  }
  return absl::OkStatus();
}

// mkdir -p with mode 0700 for each missing component below `base` (which must exist).
absl::Status MakeDirs(const std::string& base, std::initializer_list<const char*> parts) {
  std::string dir = base;
  for (const char* p : parts) {
    dir = absl::StrCat(dir, "/", p);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

bool NeedsNoQuote(absl::string_view word) {
  if (word.empty()) return false;
  for (char c : word) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
          c == '/' || c == ':' || c == '=' || c == ',' || c == '@' || c == '+')) {
      return false;
    }
  }
  return true;
}

std::string Word(absl::string_view word) {
  return NeedsNoQuote(word) ? std::string(word) : ShellQuote(word);
}

}  // namespace

absl::StatusOr<std::string> JobSecretDir(absl::string_view xdg_runtime_dir,
                                         absl::string_view home) {
  std::string xdg_refused = "XDG_RUNTIME_DIR is not set";
  if (!xdg_runtime_dir.empty()) {
    std::string dir = absl::StrCat(xdg_runtime_dir, "/braid");
    absl::Status ok = PrivateDir(std::string(xdg_runtime_dir));
    if (ok.ok()) ok = PrivateDir(dir);
    if (ok.ok()) return dir;
    xdg_refused = absl::StrCat("XDG_RUNTIME_DIR: ", ok.message());
  }
  if (home.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(xdg_refused, ", and HOME is not set"));
  }
  absl::Status made = MakeDirs(std::string(home), {".cache", "braid"});
  if (!made.ok()) return made;
  std::string dir = absl::StrCat(home, "/.cache/braid/jobs");
  absl::Status ok = PrivateDir(dir);
  if (!ok.ok()) return ok;
  return dir;
}

std::string JobSecretPath(const std::string& dir, pid_t pid) {
  return absl::StrCat(dir, "/job-", pid, ".secret");
}

int RemoveStaleJobSecrets(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, "job-") || !absl::ConsumeSuffix(&name, ".secret")) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name, &pid) || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to signal)
    if (unlink(absl::StrCat(dir, "/", e->d_name).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

std::string WatchCommand(absl::string_view braidctl, absl::string_view address,
                         absl::string_view secret_file, absl::string_view tls_ca) {
  std::string cmd = absl::StrCat(Word(braidctl), " status --coordinator ", Word(address));
  if (!secret_file.empty()) absl::StrAppend(&cmd, " --secret-file ", Word(secret_file));
  if (!tls_ca.empty()) absl::StrAppend(&cmd, " --tls-ca ", Word(tls_ca));
  return cmd;
}

std::string BraidctlPath(const std::string& braidrun_dir) {
  for (const std::string& p :
       {braidrun_dir + "/braidctl", braidrun_dir + "/../braidctl/braidctl"}) {
    if (access(p.c_str(), X_OK) == 0) {
      char real[PATH_MAX];
      if (realpath(p.c_str(), real) != nullptr) return real;
      return p;
    }
  }
  return "braidctl";
}

}  // namespace braid::braidrun
