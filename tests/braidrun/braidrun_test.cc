// Process tests of braidrun: runs the real launcher (BRAIDRUN_PATH, from CMake) with small
// /bin/sh ranks and checks output prefixing, the ranks' environment, failure propagation,
// signal forwarding, bounded teardown and that no descriptor leaks into the ranks.
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef BRAID_EXAMPLE_PATH
#error "BRAID_EXAMPLE_PATH must name the allreduce_blocking C example"
#endif
#ifndef BRAIDRUN_PATH
#error "BRAIDRUN_PATH must name the braidrun executable"
#endif

extern char** environ;

namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Lines that do not come from braidrun itself ("braidrun: ...").
std::vector<std::string> RankLines(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& l : Lines(text)) {
    if (l.rfind("braidrun: ", 0) != 0) out.push_back(l);
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The test's environment without the variables braidrun sets or defaults, so that its
// defaults show.
std::vector<std::string> CleanEnv(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s = *e;
    if (s.rfind("BRAID_", 0) == 0 || s.rfind("OMP_NUM_THREADS=", 0) == 0 ||
        s.rfind("UCX_NET_DEVICES=", 0) == 0 || s.rfind("PYTHONPATH=", 0) == 0 ||
        s.rfind("PYTHONUNBUFFERED=", 0) == 0) {
      continue;
    }
    env.push_back(s);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

struct Result {
  int status = -1;  // waitpid status
  std::string out, err;
  double seconds = 0;
  int exit_code() const {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
  }
};

// braidrun as a child of the test, its stdout and stderr captured.
class Braidrun {
 public:
  explicit Braidrun(std::vector<std::string> args, std::vector<std::string> env = CleanEnv(),
                    std::string exe = BRAIDRUN_PATH) {
    args.insert(args.begin(), exe);
    int out[2], err[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, s);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    start_ = Clock::now();
    int rc = posix_spawn(&pid_, exe.c_str(), &fa, &attr, argv.data(), envp.data());
    EXPECT_EQ(rc, 0) << std::strerror(rc);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Braidrun() {
    if (!reaped_ && pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }

  pid_t pid() const { return pid_; }

  // Reads output for up to `seconds` or until `until` holds (checked between reads).
  void Pump(double seconds, const std::function<bool()>& until = nullptr) {
    auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
      if (until && until()) return;
      PollOnce(50);
    }
  }

  // Waits (at most `timeout` seconds) for braidrun to exit and its pipes to close; a
  // braidrun still running then is killed and the test fails.
  Result Finish(double timeout = 30) {
    auto deadline = Clock::now() + std::chrono::duration<double>(timeout);
    while (!reaped_ || out_fd_ >= 0 || err_fd_ >= 0) {
      if (!reaped_) {
        pid_t p = waitpid(pid_, &result_.status, WNOHANG);
        if (p == pid_) {
          reaped_ = true;
          result_.seconds = SecondsSince(start_);
        }
      }
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "braidrun did not finish within " << timeout << " s; stderr so far:\n"
                      << result_.err;
        kill(pid_, SIGKILL);
        if (!reaped_) waitpid(pid_, &result_.status, 0);
        reaped_ = true;
        break;
      }
      if (out_fd_ >= 0 || err_fd_ >= 0) {
        PollOnce(20);
      } else {
        usleep(10000);
      }
    }
    return result_;
  }

  const std::string& err_so_far() const { return result_.err; }

 private:
  void PollOnce(int timeout_ms) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (poll(fds, 2, timeout_ms) <= 0) return;
    ReadFrom(&out_fd_, &result_.out, fds[0].revents);
    ReadFrom(&err_fd_, &result_.err, fds[1].revents);
  }
  static void ReadFrom(int* fd, std::string* into, short revents) {
    if (*fd < 0 || revents == 0) return;
    char buf[4096];
    ssize_t n = read(*fd, buf, sizeof(buf));
    if (n > 0) {
      into->append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      close(*fd);
      *fd = -1;
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int out_fd_ = -1, err_fd_ = -1;
  Clock::time_point start_;
  Result result_;
};

Result RunBraidrun(const std::vector<std::string>& args, double timeout = 30,
                   std::vector<std::string> env = CleanEnv()) {
  Braidrun b(args, std::move(env));
  return b.Finish(timeout);
}

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/braidrun_test.XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The pids the ranks wrote to DIR/pid.<rank>.
std::vector<pid_t> RankPids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::string s = ReadFile(dir + "/pid." + std::to_string(r));
    pids.push_back(s.empty() ? -1 : static_cast<pid_t>(std::atoi(s.c_str())));
  }
  return pids;
}

bool AllPidFilesWritten(const std::string& dir, int n) {
  for (int r = 0; r < n; ++r) {
    if (ReadFile(dir + "/pid." + std::to_string(r)).find('\n') == std::string::npos) {
      return false;
    }
  }
  return true;
}

// Processes (other than zombies about to be reaped) whose pid or process group is one of
// `pids`: each rank leads its own process group, so this finds the rank and anything it
// started.
std::vector<std::string> Survivors(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  DIR* d = opendir("/proc");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::string stat = ReadFile(std::string("/proc/") + e->d_name + "/stat");
    size_t rp = stat.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(stat.substr(rp + 2));
    char state = 0;
    long ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    pid_t pid = std::atoi(e->d_name);
    if (state == 'Z' || state == 'X') continue;
    for (pid_t p : pids) {
      if (p > 0 && (pid == p || pgrp == p)) {
        found.push_back(std::string(e->d_name) + " (" + stat.substr(0, rp + 1) + ", state " +
                        state + ")");
      }
    }
  }
  closedir(d);
  return found;
}

// Survivors after giving the kernel a moment to finish dying processes.
std::vector<std::string> SurvivorsAfterSettling(const std::vector<pid_t>& pids) {
  std::vector<std::string> s;
  for (int i = 0; i < 50; ++i) {
    s = Survivors(pids);
    if (s.empty()) break;
    usleep(20000);
  }
  return s;
}

// A rank script: write $$ to DIR/pid.$BRAID_RANK, then `body`.
std::vector<std::string> ShRanks(int np, const std::string& dir, const std::string& body,
                                 std::vector<std::string> flags = {}) {
  std::vector<std::string> args = {"-np", std::to_string(np)};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {"/bin/sh", "-c", "D=" + dir + "; " + body});
  return args;
}

// Shell snippet: wait until every rank of `np` wrote its pid file.
std::string WaitForAllPids(int np) {
  return "for r in $(seq 0 " + std::to_string(np - 1) +
         "); do while [ ! -s $D/pid.$r ]; do sleep 0.05; done; done; ";
}

TEST(Braidrun, PrefixesEveryRanksStdoutAndStderr) {
  Result r = RunBraidrun({"-np", "3", "/bin/sh", "-c", "echo hello $BRAID_RANK; echo err >&2"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("[0] hello 0", "[1] hello 1", "[2] hello 2"));
  EXPECT_THAT(RankLines(r.err), UnorderedElementsAre("[0] err", "[1] err", "[2] err"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "(^|\n)braidrun: coordinator listening on 127\\.0\\.0\\.1:[0-9]+\n"));
}

TEST(Braidrun, PartialLastLinesAreFlushed) {
  Result r = RunBraidrun({"-np", "2", "/bin/sh", "-c", "printf 'a\\nno newline %s' $BRAID_RANK"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("[0] a", "[0] no newline 0", "[1] a",
                                                 "[1] no newline 1"));
  EXPECT_EQ(r.out.back(), '\n');
}

TEST(Braidrun, RanksSeeTheirEnvironment) {
  const char* script =
      "echo RANK=$BRAID_RANK SIZE=$BRAID_SIZE LRANK=$BRAID_LOCAL_RANK LSIZE=$BRAID_LOCAL_SIZE; "
      "echo COORD=$BRAID_COORDINATOR; echo UNBUF=$PYTHONUNBUFFERED OMP=$OMP_NUM_THREADS "
      "UCX=$UCX_NET_DEVICES; echo FUSION=$BRAID_FUSION_THRESHOLD CYCLE=$BRAID_CYCLE_TIME_MS "
      "CACHE=$BRAID_CACHE_CAPACITY TL=$BRAID_TIMELINE; echo STALL=$BRAID_STALL_CHECK_S "
      "STOP=$BRAID_STALL_SHUTDOWN_S COMP=$BRAID_COMPRESSION TIMEOUT=$BRAID_TIMEOUT_S; "
      "echo SECRET=${#BRAID_JOB_SECRET}";
  Result r = RunBraidrun({"-np", "2", "--fusion-threshold-mb", "2", "--cycle-time-ms", "3",
                          "--cache-capacity", "7", "--timeline-filename", "/tmp/tl.json",
                          "--stall-check-seconds", "1.5", "--stall-shutdown-seconds", "30",
                          "--compression", "fp4:ef=1", "--timeout", "20", "/bin/sh",
                          "-c", script});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  // The coordinator address the ranks got is the one braidrun announced.
  std::string announced;
  for (const std::string& l : Lines(r.err)) {
    const std::string p = "braidrun: coordinator listening on ";
    if (l.rfind(p, 0) == 0) announced = l.substr(p.size());
  }
  ASSERT_FALSE(announced.empty()) << r.err;
  std::vector<std::string> want;
  for (int k = 0; k < 2; ++k) {
    std::string pre = "[" + std::to_string(k) + "] ";
    want.push_back(pre + "RANK=" + std::to_string(k) + " SIZE=2 LRANK=" + std::to_string(k) +
                   " LSIZE=2");
    want.push_back(pre + "COORD=" + announced);
    want.push_back(pre + "UNBUF=1 OMP=1 UCX=lo");
    want.push_back(pre + "FUSION=2097152 CYCLE=3 CACHE=7 TL=/tmp/tl.json");
    want.push_back(pre + "STALL=1.5 STOP=30 COMP=fp4:ef=1 TIMEOUT=20");
    want.push_back(pre + "SECRET=64");  // RandomSecret: 32 random bytes as hex
  }
  EXPECT_THAT(Lines(r.out), ::testing::UnorderedElementsAreArray(want));
}

TEST(Braidrun, InheritedSettingsWinOverDefaultsAndUnsetFlagsSetNothing) {
  Result r = RunBraidrun({"-np", "1", "/bin/sh", "-c",
                          "echo OMP=$OMP_NUM_THREADS UCX=$UCX_NET_DEVICES "
                          "FUSION=${BRAID_FUSION_THRESHOLD-unset} KEEP=$KEEP"},
                         30, CleanEnv({"OMP_NUM_THREADS=3", "UCX_NET_DEVICES=eth9", "KEEP=me"}));
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("[0] OMP=3 UCX=eth9 FUSION=unset KEEP=me"));
}

TEST(Braidrun, CommandArgumentsAreNotBraidrunOptions) {
  Result r = RunBraidrun({"-np", "1", "-v", "/bin/sh", "-c", "echo \"$@\"", "sh", "-np", "5",
                          "-v", "--timeout", "3"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("[0] -np 5 -v --timeout 3"));
  r = RunBraidrun({"--np=2", "--", "/bin/echo", "x"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("[0] x", "[1] x"));
}

TEST(Braidrun, BuildTreePythonPackageIsPrependedToPythonPath) {
  TempDir dir;
  // <exe dir>/../../python must hold the braid package: make a build tree with a copy of
  // braidrun.
  const std::string bindir = dir.path() + "/build/tools/braidrun";
  ASSERT_EQ(std::system(("mkdir -p '" + bindir + "' '" + dir.path() + "/build/python/braid' && " +
                         "touch '" + dir.path() + "/build/python/braid/__init__.py' && cp '" +
                         BRAIDRUN_PATH + "' '" + bindir + "/braidrun'")
                            .c_str()),
            0);
  Braidrun b({"-np", "1", "/bin/sh", "-c", "echo PP=$PYTHONPATH"},
             CleanEnv({"PYTHONPATH=/opt/x"}), bindir + "/braidrun");
  Result r = b.Finish();
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  char real[PATH_MAX];
  ASSERT_NE(realpath((dir.path() + "/build/python").c_str(), real), nullptr);
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("[0] PP=" + std::string(real) + ":/opt/x"));
}

TEST(Braidrun, FailingRankStopsTheJobWithItsExitCode) {
  TempDir dir;
  Braidrun b(ShRanks(3, dir.path(),
                     "echo $$ > $D/pid.$BRAID_RANK; if [ $BRAID_RANK = 1 ]; then " +
                         WaitForAllPids(3) + "exit 7; fi; sleep 60"));
  Result r = b.Finish(20);
  EXPECT_EQ(r.exit_code(), 7) << r.err;
  EXPECT_LT(r.seconds, 10) << r.err;
  EXPECT_THAT(r.err, HasSubstr("braidrun: rank 1 exited with code 7\n"));
  std::vector<pid_t> pids = RankPids(dir.path(), 3);
  for (pid_t p : pids) EXPECT_GT(p, 0);
  EXPECT_THAT(SurvivorsAfterSettling(pids), ::testing::IsEmpty());
}

TEST(Braidrun, RankIgnoringSigtermIsKilled) {
  TempDir dir;
  Braidrun b(ShRanks(3, dir.path(),
                     "trap '' TERM; echo $$ > $D/pid.$BRAID_RANK; if [ $BRAID_RANK = 2 ]; then " +
                         WaitForAllPids(3) + "exit 5; fi; sleep 60"));
  Result r = b.Finish(20);
  EXPECT_EQ(r.exit_code(), 5) << r.err;
  EXPECT_LT(r.seconds, 10) << r.err;
  EXPECT_THAT(r.err, HasSubstr("braidrun: rank 2 exited with code 5\n"));
  EXPECT_GT(r.seconds, 2.5) << "SIGTERM first, SIGKILL after the grace period";
  EXPECT_THAT(r.err, HasSubstr("braidrun: sending SIGKILL to 2 ranks still running\n"));
  EXPECT_THAT(SurvivorsAfterSettling(RankPids(dir.path(), 3)), ::testing::IsEmpty());
}

TEST(Braidrun, RankKilledBySignalGives128PlusSignal) {
  Result r = RunBraidrun({"-np", "2", "/bin/sh", "-c",
                          "if [ $BRAID_RANK = 0 ]; then kill -KILL $$; fi; sleep 60"},
                         20);
  EXPECT_EQ(r.exit_code(), 128 + SIGKILL) << r.err;
  EXPECT_LT(r.seconds, 10) << r.err;
  EXPECT_THAT(r.err, HasSubstr("braidrun: rank 0 was killed by signal 9 (SIGKILL)\n"));
}

// np ranks that trap SIGINT (print "got INT", exit 3), under a braidrun that `start` spawns
// from braidrun's arguments; once every rank is in `sleep`, `sig` goes to that process,
// and the ranks must all stop on SIGINT, before the grace period's SIGKILL, leaving none
// behind. `*result`: braidrun's result, for the caller's own checks.
void ExpectRanksStopOnSigint(
    int np, int sig,
    const std::function<std::unique_ptr<Braidrun>(std::vector<std::string>)>& start,
    Result* result) {
  TempDir dir;
  std::unique_ptr<Braidrun> b = start(ShRanks(
      np, dir.path(), "trap 'echo got INT; exit 3' INT; echo $$ > $D/pid.$BRAID_RANK; sleep 60"));
  b->Pump(20, [&] { return AllPidFilesWritten(dir.path(), np); });
  ASSERT_TRUE(AllPidFilesWritten(dir.path(), np)) << b->err_so_far();
  usleep(200000);  // let the shells reach `sleep`
  auto t0 = Clock::now();
  ASSERT_EQ(kill(b->pid(), sig), 0);
  Result& r = *result;
  r = b->Finish(20);
  EXPECT_LT(SecondsSince(t0), 4.5) << "the ranks should exit on SIGINT, before any SIGKILL";
  std::vector<std::string> want;
  for (int i = 0; i < np; ++i) want.push_back("[" + std::to_string(i) + "] got INT");
  EXPECT_THAT(Lines(r.out), ::testing::UnorderedElementsAreArray(want)) << r.err;
  EXPECT_THAT(SurvivorsAfterSettling(RankPids(dir.path(), np)), ::testing::IsEmpty());
}

TEST(Braidrun, SigintIsForwardedToEveryRank) {
  Result r;
  ASSERT_NO_FATAL_FAILURE(ExpectRanksStopOnSigint(
      3, SIGINT,
      [](std::vector<std::string> args) { return std::make_unique<Braidrun>(std::move(args)); },
      &r));
  EXPECT_EQ(r.exit_code(), 128 + SIGINT) << r.err;
  EXPECT_THAT(r.err, HasSubstr("braidrun: received SIGINT"));
}

TEST(Braidrun, RanksOfABraidrunStartedWithSigintIgnoredStillStopOnSigint) {
  // As a non-interactive shell starts a background job: SIGINT ignored, inherited through
  // exec. SIGTERM to braidrun is forwarded as SIGINT, which the ranks must be able to act on.
  Result r;
  ExpectRanksStopOnSigint(
      2, SIGTERM,
      [](std::vector<std::string> args) {
        args.insert(args.begin(), {"-c", "trap '' INT; exec \"$0\" \"$@\"", BRAIDRUN_PATH});
        return std::make_unique<Braidrun>(std::move(args), CleanEnv(), "/bin/sh");
      },
      &r);
}

TEST(Braidrun, RankIgnoringSigintIsKilledAfterTheGracePeriod) {
  TempDir dir;
  Braidrun b(ShRanks(2, dir.path(), "trap '' INT TERM; echo $$ > $D/pid.$BRAID_RANK; sleep 60"));
  b.Pump(20, [&] { return AllPidFilesWritten(dir.path(), 2); });
  ASSERT_TRUE(AllPidFilesWritten(dir.path(), 2)) << b.err_so_far();
  auto t0 = Clock::now();
  ASSERT_EQ(kill(b.pid(), SIGTERM), 0);
  Result r = b.Finish(20);
  double took = SecondsSince(t0);
  EXPECT_GT(took, 4.0);
  EXPECT_LT(took, 10.0);
  EXPECT_EQ(r.exit_code(), 128 + SIGTERM) << r.err;
  EXPECT_THAT(SurvivorsAfterSettling(RankPids(dir.path(), 2)), ::testing::IsEmpty());
}

// Reads /proc/<pid>/fd: descriptor number -> link target.
std::vector<std::pair<int, std::string>> OpenFds(pid_t pid) {
  std::vector<std::pair<int, std::string>> fds;
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return fds;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[PATH_MAX];
    ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    fds.emplace_back(std::atoi(e->d_name), n > 0 ? std::string(target, n) : "?");
  }
  closedir(d);
  std::sort(fds.begin(), fds.end());
  return fds;
}

TEST(Braidrun, RanksGetOnlyStdioNoSocketsOrOtherPipes) {
  TempDir dir;
  Braidrun b(ShRanks(2, dir.path(), "echo $$ > $D/pid.$BRAID_RANK; exec sleep 30"));
  b.Pump(20, [&] { return AllPidFilesWritten(dir.path(), 2); });
  ASSERT_TRUE(AllPidFilesWritten(dir.path(), 2)) << b.err_so_far();
  std::vector<pid_t> pids = RankPids(dir.path(), 2);
  // Wait for the exec: the shell's own redirections are gone by then.
  for (pid_t p : pids) {
    for (int i = 0; i < 200 && ReadFile("/proc/" + std::to_string(p) + "/comm") != "sleep\n"; ++i) {
      usleep(20000);
    }
  }
  // braidrun itself holds the coordinator's listening socket...
  bool launcher_has_socket = false;
  for (const auto& [fd, target] : OpenFds(b.pid())) {
    launcher_has_socket |= target.rfind("socket:", 0) == 0;
  }
  EXPECT_TRUE(launcher_has_socket);
  // ...but a rank holds nothing beyond stdin (/dev/null), its own stdout/stderr pipes and,
  // at 3, the read end of the launcher pipe (Note [Ranks die with their launcher]).
  std::set<std::string> pipes_seen, launcher_pipes;
  for (pid_t p : pids) {
    auto fds = OpenFds(p);
    ASSERT_EQ(fds.size(), 4u) << "rank pid " << p << " fds: " << [&] {
      std::string s;
      for (const auto& [fd, t] : fds) s += std::to_string(fd) + "->" + t + " ";
      return s;
    }();
    EXPECT_EQ(fds[0], std::make_pair(0, std::string("/dev/null")));
    EXPECT_EQ(fds[1].first, 1);
    EXPECT_EQ(fds[2].first, 2);
    EXPECT_EQ(fds[3].first, 3);
    EXPECT_THAT(fds[1].second, ::testing::StartsWith("pipe:"));
    EXPECT_THAT(fds[2].second, ::testing::StartsWith("pipe:"));
    EXPECT_THAT(fds[3].second, ::testing::StartsWith("pipe:"));
    // Its read end only (flags 0: O_RDONLY, not close-on-exec): braidrun alone can write.
    EXPECT_THAT(ReadFile("/proc/" + std::to_string(p) + "/fdinfo/3"),
                ::testing::ContainsRegex("flags:\\s+0+\n"));
    pipes_seen.insert(fds[1].second);
    pipes_seen.insert(fds[2].second);
    launcher_pipes.insert(fds[3].second);
  }
  EXPECT_EQ(pipes_seen.size(), 4u) << "every rank has its own stdout and stderr pipe";
  EXPECT_EQ(launcher_pipes.size(), 1u) << "one launcher pipe for every rank";
  EXPECT_EQ(pipes_seen.count(*launcher_pipes.begin()), 0u);
  ASSERT_EQ(kill(b.pid(), SIGTERM), 0);
  Result r = b.Finish(20);
  EXPECT_EQ(r.exit_code(), 128 + SIGTERM) << r.err;
  EXPECT_THAT(SurvivorsAfterSettling(pids), ::testing::IsEmpty());
}

// Ranks on other hosts start over ssh (tests/multihost runs them); a host whose address
// cannot be found stops braidrun before anything starts: the coordinator's address is the
// one this host uses to reach the first other host.
TEST(Braidrun, UnresolvableRemoteHostIsAUsageError) {
  Result r = RunBraidrun({"-np", "2", "-H", "localhost:1,gpu-node-7.invalid:1", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("cannot resolve host 'gpu-node-7.invalid'"));
  EXPECT_THAT(r.err, HasSubstr("--network-interface"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("coordinator listening")));
}

TEST(Braidrun, HostfileAndNetworkInterface) {
  char path[] = "/tmp/braidrun_hostfile_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = "# this host\nlocalhost slots=2\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  Result r = RunBraidrun({"-np", "2", "--hostfile", path, "--network-interface", "lo",
                          "/bin/sh", "-c", "echo $BRAID_COORDINATOR $UCX_NET_DEVICES"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\\[1\\] 127\\.0\\.0\\.1:[0-9]+ lo"));
  r = RunBraidrun({"-np", "3", "--hostfile", path, "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("--hostfile: the hosts have 2 slots in all, fewer than -np 3"));
  r = RunBraidrun({"-np", "1", "--hostfile", path, "-H", "localhost", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("give -H or --hostfile, not both"));
  unlink(path);
  r = RunBraidrun({"-np", "1", "--hostfile", path, "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("--hostfile: cannot read"));
  r = RunBraidrun({"-np", "1", "--network-interface", "nosuch0", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("network interface 'nosuch0' has no IPv4 address"));
}

TEST(Braidrun, LocalHostListIsAccepted) {
  Result r = RunBraidrun({"-np", "2", "-H", "localhost:1,127.0.0.1:1", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  r = RunBraidrun({"-np", "3", "-H", "localhost:2", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("fewer than -np 3"));
}

// Every usage error exits 2 with a message starting "braidrun: ", CLI11's own included
// (tools/cli.h); --help shows one usage line, braidrun's.
TEST(Braidrun, UsageErrorsExit2) {
  EXPECT_EQ(RunBraidrun({"-np", "2"}).exit_code(), 2);
  EXPECT_EQ(RunBraidrun({"/bin/true"}).exit_code(), 2);
  EXPECT_EQ(RunBraidrun({"-np", "0", "/bin/true"}).exit_code(), 2);
  Result r = RunBraidrun({"-np", "1", "--bogus", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, ::testing::StartsWith(
                         "braidrun: The following argument was not expected: --bogus\n"));
  r = RunBraidrun({"-np", "1", "--np", "2", "/bin/true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, ::testing::StartsWith("braidrun: --np: At Most 1 required but received 2\n"));
  r = RunBraidrun({"--help"});
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_THAT(r.out, HasSubstr("\nUsage: braidrun -np N [-H host:slots,...] [OPTIONS] COMMAND "
                               "[ARGS...]\n"));
  EXPECT_EQ(r.out.find("Usage:"), r.out.rfind("Usage:")) << r.out;
}

// A misspelt BRAID_ variable is a warning printed once, by braidrun, not an error.
TEST(Braidrun, AMisspeltVariableIsAWarningPrintedOnce) {
  Result r = RunBraidrun({"-np", "2", "/bin/true"}, 30,
                         CleanEnv({"BRAID_COMPRESION=fp16", "HOROVOD_FUSION_THRESHOLD=1"}));
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  const std::string warning =
      "braidrun: warning: BRAID_COMPRESION is not a braid variable and is ignored: did you "
      "mean BRAID_COMPRESSION?\n";
  ASSERT_THAT(r.err, HasSubstr(warning));
  EXPECT_EQ(r.err.find(warning), r.err.rfind(warning)) << r.err;
  EXPECT_THAT(r.err, HasSubstr("braidrun: warning: HOROVOD_FUSION_THRESHOLD is Horovod's and "
                               "braid ignores it: set BRAID_FUSION_THRESHOLD (bytes, as "
                               "Horovod's) instead\n"));
}

TEST(Braidrun, BadCompressionSpecIsAUsageError) {
  Result r = RunBraidrun({"-np", "2", "--compression", "fp5", "/bin/echo", "started"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_EQ(r.out, "") << "no rank started";
  EXPECT_THAT(r.err, HasSubstr("braidrun: --compression: compression 'fp5': unknown method 'fp5'; "
                               "valid methods: none, auto, fp16, bf16, fp4, int4"));
  r = RunBraidrun({"-np", "2", "/bin/echo", "started"}, 30,
                  CleanEnv({"BRAID_COMPRESSION=fp4:chunk=1"}));
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("braidrun: BRAID_COMPRESSION: compression 'fp4:chunk=1': option "
                               "'chunk' must be an integer in [2, 2^30], got '1'"));
}

// Every flag value goes through the configuration parser: a bad one exits 2 before any
// rank starts, with a message naming the flag and what it expects.
TEST(Braidrun, BadSettingValuesAreUsageErrorsNamingTheFlag) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--timeout", "nan"}, "braidrun: --timeout must be a positive number of seconds, got 'nan'"},
      {{"--timeout", "inf"}, "braidrun: --timeout must be a positive number of seconds, got 'inf'"},
      {{"--stall-check-seconds", "0"},
       "braidrun: --stall-check-seconds must be a positive number of seconds, got '0'"},
      {{"--stall-shutdown-seconds", "-1"},
       "braidrun: --stall-shutdown-seconds must be a non-negative number of seconds, got '-1'"},
      {{"--cycle-time-ms", "1.5"}, "braidrun: --cycle-time-ms must be an integer, got '1.5'"},
      {{"--cache-capacity", "-2"}, "braidrun: --cache-capacity must be in [0, 16777216], got -2"},
      {{"--fusion-threshold-mb", "0.1"},
       "braidrun: --fusion-threshold-mb 0.1 MiB is not a whole number of bytes"},
      {{"--heartbeat-timeout", "1e3"},
       "braidrun: --heartbeat-timeout must be a positive number of seconds, got '1e3'"},
      {{"--coordinator-port", "65536"}, "braidrun: --coordinator-port must be in [0, 65535], got 65536"},
      {{"-np", "2.5"}, "braidrun: -np must be an integer, got '2.5'"},
  };
  for (const auto& [flags, want] : cases) {
    std::vector<std::string> args = {"-np", "2"};
    if (flags[0] == "-np") args.clear();
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"/bin/echo", "started"});
    Result r = RunBraidrun(args);
    EXPECT_EQ(r.exit_code(), 2) << flags[0];
    EXPECT_EQ(r.out, "") << "no rank started";
    EXPECT_THAT(r.err, HasSubstr(want));
  }
  // An inherited variable braidrun passes on is checked the same way, under its own name.
  Result r = RunBraidrun({"-np", "2", "/bin/echo", "started"}, 30,
                         CleanEnv({"BRAID_CYCLE_TIME_MS=fast"}));
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_THAT(r.err, HasSubstr("braidrun: BRAID_CYCLE_TIME_MS must be an integer, got 'fast'"));
}

// braidrun's job settings bind the job (Note [Job settings]): a rank that sets another value
// is refused at init, with the variable and both values named (every rank of the job gets
// the same error; the first to exit ends the job, so only its line is certain to show).
TEST(Braidrun, ARankOverridingBraidrunsJobSettingIsRefused) {
  Result r = RunBraidrun(
      {"-np", "2", "--stall-check-seconds", "30", "/bin/sh", "-c",
       "if [ $BRAID_RANK = 1 ]; then export BRAID_STALL_CHECK_S=5; fi; exec " BRAID_EXAMPLE_PATH},
      60, CleanEnv({"UCX_TLS=sm"}));
  EXPECT_EQ(r.exit_code(), 2) << r.err;  // the example's exit code for an API error
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "\\[[01]\\] braid_init\\(\\) failed: INVALID_ARGUMENT \\(registering "
                         "with the coordinator at 127.0.0.1:[0-9]+: BRAID_STALL_CHECK_S must be "
                         "the same for the whole job, got 30 at the coordinator; 5 on rank 1\\)"))
      << r.err;
}

// --register-timeout bounds the wait for the whole world to register, also below the 60 s
// floor of the default (BRAID_TIMEOUT_S): rank 1 never calls init, so rank 0's init fails
// once the deadline passes, naming the missing rank, and braidrun ends the job.
TEST(Braidrun, RegisterTimeoutBoundsTheWaitForMissingRanks) {
  const auto start = Clock::now();
  Result r = RunBraidrun(
      {"-np", "2", "--register-timeout", "2", "/bin/sh", "-c",
       "echo REG=$BRAID_REGISTER_TIMEOUT_S; if [ $BRAID_RANK = 1 ]; then exec sleep 60; fi; "
       "exec " BRAID_EXAMPLE_PATH},
      60, CleanEnv({"UCX_TLS=sm"}));
  const double elapsed = SecondsSince(start);
  EXPECT_EQ(r.exit_code(), 2) << r.err;  // the example's exit code for an API error
  EXPECT_THAT(Lines(r.out), ::testing::IsSupersetOf({"[0] REG=2", "[1] REG=2"}));
  EXPECT_THAT(r.err, HasSubstr("only 1 of 2 ranks registered within 2s: missing rank 1"))
      << r.err;
  EXPECT_LT(elapsed, 20.0) << "the default registration deadline is 60 s";
  Result bad = RunBraidrun({"-np", "2", "--register-timeout", "0", "/bin/echo", "started"});
  EXPECT_EQ(bad.exit_code(), 2);
  EXPECT_THAT(bad.err, HasSubstr("braidrun: --register-timeout must be a positive number of "
                                 "seconds, got '0'"));
}

TEST(Braidrun, MissingCommandExits127) {
  Result r = RunBraidrun({"-np", "2", "braid-no-such-command-xyz"});
  EXPECT_EQ(r.exit_code(), 127) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot start 'braid-no-such-command-xyz'"));
}

}  // namespace
