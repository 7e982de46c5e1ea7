// FileStore: one file per key in a directory shared by every rank. A value is written to a
// private temporary file and rename()d into place, which POSIX makes atomic within a file
// system, so a reader sees either no file or the whole value. Readers poll with a backoff
// that grows from 1 ms to 50 ms: rendezvous happens once per job, and inotify would not work
// on the network file systems this store is also meant for.
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/store.h"

namespace braid {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(1);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(50);
// Keys listed in a DeadlineExceeded message; the rest are counted.
constexpr size_t kMaxKeysInMessage = 16;

absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat("FileStore: ", what, " ", path));
}

// mkdir -p: creates `dir` and its missing parents; existing directories are fine.
absl::Status MakeDirectories(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("FileStore: empty directory name");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "cannot create directory", prefix);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("FileStore: ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// The file's contents; NotFound when it does not exist (yet).
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return ErrnoError(errno, "cannot open", path);
  }
  std::string out;
  char buf[8192];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError(err, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Sleeps for the current backoff, never past `deadline`, and grows the backoff.
void Backoff(absl::Time deadline, absl::Duration* backoff) {
  absl::SleepFor(std::min(*backoff, deadline - absl::Now()));
  *backoff = std::min(*backoff * 2, kMaxBackoff);
}

std::string QuotedKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kMaxKeysInMessage; ++i) {
    shown.push_back(absl::StrCat("'", keys[i], "'"));
  }
  std::string out = absl::StrJoin(shown, ", ");
  if (keys.size() > kMaxKeysInMessage) {
    absl::StrAppend(&out, " and ", keys.size() - kMaxKeysInMessage, " more");
  }
  return out;
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {}

// Every byte outside [A-Za-z0-9_-] becomes %XX, so keys map one-to-one onto plain file names:
// '/' cannot make subdirectories, "." and ".." are not special, and no escaped key contains
// the '.' of a temporary file's ".tmp.<host>.<pid>.<n>" suffix.
std::string FileStore::PathFor(const std::string& key) const {
  std::string name;
  name.reserve(key.size());
  for (unsigned char c : key) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      name.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      name.append(hex);
    }
  }
  if (name.empty()) name = "%";  // the empty key; a lone '%' is no escape of anything else
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  if (absl::Status s = MakeDirectories(directory_); !s.ok()) return s;
  // Host and pid keep writers on a shared file system apart, the counter this process's
  // threads. Escaped keys contain no '.', so no key's file looks like a temporary one.
  static std::atomic<uint64_t> counter{0};
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  const std::string path = PathFor(key);
  const std::string tmp = absl::StrCat(path, ".tmp.", host, ".", ::getpid(), ".", counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create", tmp);
  absl::Status written = WriteAll(fd, value, tmp);
  if (::close(fd) != 0 && written.ok()) written = ErrnoError(errno, "cannot close", tmp);
  if (written.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    written = ErrnoError(errno, "cannot rename into place", path);
  }
  if (!written.ok()) ::unlink(tmp.c_str());
  return written;
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  const std::string path = PathFor(key);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = kFirstBackoff;
  while (true) {
    absl::StatusOr<std::string> value = ReadFile(path);
    if (!absl::IsNotFound(value.status())) return value;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("FileStore: key '", key, "' was not set within ",
                       absl::FormatDuration(timeout), " in directory ", directory_));
    }
    Backoff(deadline, &backoff);
  }
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = kFirstBackoff;
  std::vector<std::string> missing = keys;
  while (true) {
    missing.erase(std::remove_if(missing.begin(), missing.end(),
                                 [this](const std::string& k) { return Exists(PathFor(k)); }),
                  missing.end());
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "FileStore: ", missing.size(), " of ", keys.size(), " keys not set within ",
          absl::FormatDuration(timeout), " in directory ", directory_, ": ",
          QuotedKeys(missing)));
    }
    Backoff(deadline, &backoff);
  }
}

}  // namespace braid
