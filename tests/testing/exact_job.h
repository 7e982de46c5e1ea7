// Helpers of the tests of who may join a job (tests/mp/admission_mp_test.cc,
// job_identity_mp_test.cc): a job whose every result is checked exactly while someone else
// acts, the real braid-coordinator binary in a child process, and commands run through the
// shell. Header-only; the test's own process never starts gRPC or UCX.
#ifndef BRAID_TESTS_TESTING_EXACT_JOB_H_
#define BRAID_TESTS_TESTING_EXACT_JOB_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/runtime.h"
#include "tests/testing/runtime_job.h"

extern char** environ;

namespace braid::testing {

inline bool FileExists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

inline void Touch(const std::string& path) {
  std::ofstream f(path);
}

// Waits (10 ms steps: a file has no change notification worth the code here) until `path`
// exists or `limit` passes; whether it exists.
inline bool AwaitFile(const std::string& path, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (!FileExists(path)) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// All-reduces (sum) of a known pattern, one after the other, until `stop_file` exists, every
// element checked exactly: rank r contributes (r + 1) * ((i + step) % 97), so element i of
// step s must be size(size+1)/2 * ((i + s) % 97), a small integer that float32 sums exactly.
// The last element is the stop flag: rank 0 contributes 1 once `stop_file` exists and at
// least `min_steps` steps ran, so every rank stops after the same step. Rank 0 touches
// `started_file` once the first step is done. Returns the steps run.
inline int ExactAllReduces(Runtime& rt, Checker& c, const std::string& started_file,
                           const std::string& stop_file, int min_steps,
                           absl::Duration limit = absl::Seconds(60)) {
  constexpr int64_t kN = 4097;
  const int rank = *rt.rank(), size = *rt.size();
  const absl::Time deadline = absl::Now() + limit;
  std::vector<float> in(kN), out(kN);
  for (int step = 0;; ++step) {
    for (int64_t i = 0; i + 1 < kN; ++i) in[i] = static_cast<float>((rank + 1) * ((i + step) % 97));
    const bool stop = step >= min_steps && (FileExists(stop_file) || absl::Now() > deadline);
    in[kN - 1] = rank == 0 && stop ? 1.0f : 0.0f;
    if (!c.Ok(WaitFor(rt.Enqueue(AllReduceOf("exact", in.data(), out.data(), kN, ReduceOp::kSum))),
              absl::StrCat("all-reduce step ", step))) {
      return step;
    }
    int wrong = 0;
    for (int64_t i = 0; i + 1 < kN; ++i) {
      wrong += out[i] != static_cast<float>(size * (size + 1) / 2 * ((i + step) % 97));
    }
    c.Expect(wrong == 0, absl::StrCat(wrong, " wrong elements at step ", step));
    if (step == 0 && rank == 0) Touch(started_file);
    if (out[kN - 1] != 0.0f) return step + 1;
  }
}

// Runs `command` through /bin/sh, stdout and stderr together; *rc its exit code.
inline std::string Shell(const std::string& command, int* rc) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// The braid-coordinator binary in a child process on 127.0.0.1 port 0, with `args` added,
// its output in DIR/coordinator.log; stopped with SIGTERM. address() is empty if it did not
// start within 30 s.
class CoordinatorBinary {
 public:
  CoordinatorBinary(const std::string& binary, const std::string& dir,
                    std::vector<std::string> args) {
    const std::string port_file = dir + "/coordinator.port";
    unlink(port_file.c_str());
    std::vector<std::string> all = {binary, "--bind", "127.0.0.1", "--port", "0",
                                    "--port-file", port_file};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = dir + "/coordinator.log";
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    const int spawned = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (spawned != 0) {
      pid_ = -1;
      return;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!FileExists(port_file)) {
      if (absl::Now() >= deadline || waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;  // did not start, or exited (its log says why)
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::ifstream f(port_file);
    std::string text;
    int port = 0;
    if (f >> text && absl::SimpleAtoi(text, &port)) address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~CoordinatorBinary() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

// Sets (or, with nullptr, unsets) an environment variable of this process for its lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Writes `text` to a new file `path` with `mode`.
inline std::string WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_EXACT_JOB_H_
