// Who may join a job (Note [Who may join] in coordinator/admission.h), tried the way a hostile
// local user or a stale process would, against the real braid-coordinator with real ranks
// whose every result is checked exactly while the others act:
//   - an outsider (another user, made for the test when it runs as root) without the secret
//     and with wrong ones: every RPC refused, the secret file and the ranks' environment
//     unreadable, braidctl refused; the coordinator logs each refusal with the caller's
//     address;
//   - a process with the secret that claims another rank's identity: refused;
//   - a stale rank of an earlier job (its registration and a stream opened back then) while
//     the next job runs: refused, and the next job is served exactly;
//   - secrets never on a command line: --secret refused by all three tools, secret files
//     with an open mode refused.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/exact_job.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/raw_client.h"
#include "tests/testing/runtime_job.h"

namespace braid {
namespace {

using testing::AwaitFile;
using testing::Checker;
using testing::CoordinatorBinary;
using testing::ExactAllReduces;
using testing::RankExit;
using testing::RawClient;
using testing::RunRanks;
using testing::RunRanksOptions;
using testing::ScopedEnv;
using testing::Shell;
using testing::Touch;

constexpr grpc::StatusCode kDenied = grpc::StatusCode::PERMISSION_DENIED;

// The unprivileged user outsiders run as, made with useradd when missing; nullopt when this
// process is not root (outsiders then run as this user, and the checks of other users'
// access are skipped).
std::optional<std::pair<uid_t, gid_t>> OutsiderUser() {
  if (geteuid() != 0) return std::nullopt;
  const char* name = "braid-outsider";
  if (getpwnam(name) == nullptr) {
    int rc = 0;
    Shell(absl::StrCat("useradd --system --no-create-home --shell /usr/sbin/nologin ", name),
          &rc);
  }
  const passwd* pw = getpwnam(name);
  if (pw == nullptr) return std::nullopt;
  return std::make_pair(pw->pw_uid, pw->pw_gid);
}

// Becomes `user` for good (this process only: it is a forked child).
bool BecomeUser(const std::pair<uid_t, gid_t>& user) {
  return setgroups(0, nullptr) == 0 && setgid(user.second) == 0 && setuid(user.first) == 0;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every RPC as `secret` (empty: none) must be refused with PERMISSION_DENIED.
void ExpectEveryRpcRefused(RawClient& client, const std::string& secret, Checker& c) {
  const std::string as = secret.empty() ? "without a secret" : "with secret '" + secret + "'";
  auto denied = [&](const grpc::Status& s, const char* rpc) {
    c.Expect(s.error_code() == kDenied,
             absl::StrCat(rpc, " ", as, ": ", s.error_code(), " ", s.error_message()));
  };
  proto::RegisterRequest reg;
  reg.set_rank(0);
  reg.set_size(2);
  reg.set_transport_address("the outsider's address");
  proto::RegisterResponse resp;
  denied(client.Register(secret, reg, &resp), "Register");
  denied(client.KeyValueSet(secret, "peer/0", "forged"), "KeyValueSet");
  proto::KeyValueGetResponse got;
  denied(client.KeyValueGet(secret, "peer/0", &got), "KeyValueGet");
  denied(client.NegotiateRefused(secret, "", 0), "Negotiate");
  denied(client.Heartbeat(secret, "", 1), "Heartbeat");
  proto::StatusResponse status;
  denied(client.Status(secret, &status), "Status");
  c.Expect(status.ranks_size() == 0, "Status leaked the ranks " + as);
  denied(client.Shutdown(secret), "Shutdown");
}

// The outsider: another user, without the job's secret.
int Outsider(const std::string& dir, const std::string& address, const std::string& braidctl,
             const std::optional<std::pair<uid_t, gid_t>>& user) {
  Checker c{2};
  const pid_t parent = getppid();  // the test process
  unsetenv("BRAID_JOB_SECRET");
  unsetenv("BRAID_JOB_SECRET_FILE");
  if (!AwaitFile(dir + "/signals/started", absl::Seconds(60))) return 3;
  if (user && !c.Expect(BecomeUser(*user), "becoming the outsider user")) return 1;
  // Under Bazel the tools sit in root's private cache, out of the outsider's reach; under
  // CTest the outsider must be able to run braidctl.
  const bool bazel = std::getenv("TEST_SRCDIR") != nullptr;
  const bool run_braidctl = access(braidctl.c_str(), X_OK) == 0;
  c.Expect(run_braidctl || bazel, "the outsider cannot run " + braidctl);
  if (user) {
    const std::string rank0 = Slurp(dir + "/signals/rank0.pid");
    for (const std::string& path :
         {dir + "/job.secret", absl::StrCat("/proc/", rank0, "/environ"),
          absl::StrCat("/proc/", parent, "/environ")}) {
      int fd = open(path.c_str(), O_RDONLY);
      c.Expect(fd < 0 && errno == EACCES, "the outsider could open " + path);
      if (fd >= 0) close(fd);
    }
    if (run_braidctl) {
      int rc = 0;
      std::string out = Shell(absl::StrCat(braidctl, " status --coordinator ", address,
                                           " --secret-file ", dir, "/job.secret"), &rc);
      c.Expect(rc == 2 && absl::StrContains(out, "Permission denied"), "braidctl: " + out);
    }
  }
  RawClient client(address);
  for (const std::string& secret : {std::string(), std::string("guess"),
                                    std::string(64, '0')}) {
    ExpectEveryRpcRefused(client, secret, c);
  }
  if (run_braidctl) {
    int rc = 0;
    // A guess strong enough to be presented at all (Note [Secret strength]), but wrong.
    std::string out = Shell(absl::StrCat("BRAID_JOB_SECRET=0123456789abcdef0123456789abcdef ",
                                         braidctl, " status --coordinator ", address),
                            &rc);
    // Refused for its wrong secret, or unchecked: the guesses above spent this address's
    // refusal budget (Note [Refusal budget]).
    c.Expect(rc == 2 && (absl::StrContains(out, "refused Status: wrong job secret") ||
                         absl::StrContains(out, "refused Status: too many calls with a wrong "
                                                "job secret from ipv4:127.0.0.1")),
             "braidctl with a wrong secret: " + out);
  }
  Touch(dir + "/signals/outsider_done");
  return c.failures == 0 ? 0 : 1;
}

// A process of the job's user, with the secret, that claims to be rank 0 or 1.
int Impostor(const std::string& dir, const std::string& address, const std::string& secret) {
  Checker c{3};
  if (!AwaitFile(dir + "/signals/outsider_done", absl::Seconds(90))) return 3;
  RawClient client(address);
  for (const std::string& token : {std::string(), std::string(64, 'a')}) {
    for (int rank : {0, 1}) {
      grpc::Status s = client.NegotiateRefused(secret, token, rank);
      c.Expect(s.error_code() == kDenied,
               absl::StrCat("stream as rank ", rank, ": ", s.error_message()));
      s = client.Heartbeat(secret, token, rank);
      c.Expect(s.error_code() == kDenied,
               absl::StrCat("heartbeat as rank ", rank, ": ", s.error_message()));
    }
  }
  // Nothing changed: both ranks negotiating, no abort, two registrations, no key-value call.
  // The outsider's guesses from this host spent its refusal budget (Note [Refusal budget]):
  // until it refills (10 a second), calls other than the ranks' heartbeats are refused
  // unchecked, so this status call may have to wait for it.
  proto::StatusResponse st;
  grpc::Status status = client.Status(secret, &st);
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5);
       absl::StrContains(status.error_message(), "too many calls") && absl::Now() < deadline;
       status = client.Status(secret, &st)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  c.Expect(status.ok(), "status with the secret: " + status.error_message());
  c.Expect(st.phase() == proto::JOB_RUNNING && st.abort_message().empty() &&
               st.register_rpcs() == 2 && st.kv_rpcs() == 0 && st.ranks_size() == 2 &&
               st.ranks(0).state() == "negotiating" && st.ranks(1).state() == "negotiating",
           "the job changed: " + st.ShortDebugString());
  Touch(dir + "/signals/all_done");
  return c.failures == 0 ? 0 : 1;
}

TEST(AdmissionTest, OutsidersAndImpostorsAreRefusedWhileTheJobStaysExact) {
  const auto user = OutsiderUser();
  if (!user) fprintf(stderr, "not root: the outsider runs as this user\n");
  const std::string dir = testing::MakeTempDir("braid_admission_");
  ASSERT_FALSE(dir.empty());
  chmod(dir.c_str(), 0711);  // others may pass through, not list or read
  ASSERT_EQ(mkdir((dir + "/signals").c_str(), 0777), 0);
  chmod((dir + "/signals").c_str(), 0777);
  // The coordinator makes the secret file (0600) itself; the ranks read it.
  ScopedEnv no_secret("BRAID_JOB_SECRET", nullptr);
  ScopedEnv secret_file("BRAID_JOB_SECRET_FILE", (dir + "/job.secret").c_str());
  std::string address;
  std::vector<RankExit> exits;
  {
    CoordinatorBinary coord(BRAID_COORDINATOR_PATH, dir,
                            {"--size", "2", "--secret-file", dir + "/job.secret"});
    address = coord.address();
    ASSERT_FALSE(address.empty()) << "braid-coordinator did not start";
    const std::string secret = Slurp(dir + "/job.secret").substr(0, 64);
    ASSERT_EQ(secret.size(), 64u);
    RunRanksOptions o;
    o.ranks = 4;
    o.deadline = absl::Seconds(150);
    exits = RunRanks(o, [&](int r) {
      if (r == 2) return Outsider(dir, address, BRAIDCTL_PATH, user);
      if (r == 3) return Impostor(dir, address, secret);
      if (r == 0) testing::WriteFile(dir + "/signals/rank0.pid", absl::StrCat(getpid()), 0644);
      testing::SetRankEnv(address, r, 2);
      unsetenv("BRAID_JOB_SECRET");  // the file's secret is the one
      Checker c{r};
      Runtime rt;
      if (!c.Ok(testing::InitRuntime(rt), "init")) return 1;
      int steps = ExactAllReduces(rt, c, dir + "/signals/started", dir + "/signals/all_done",
                                  20, absl::Seconds(120));
      c.Expect(steps >= 20, absl::StrCat("only ", steps, " steps"));
      c.Ok(rt.Shutdown(), "shutdown");
      return c.failures == 0 ? 0 : 1;
    });
  }
  const char* who[] = {"rank 0", "rank 1", "the outsider", "the impostor"};
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << who[e.rank] << " hung";
    EXPECT_EQ(e.exit_code, 0) << who[e.rank] << " failed (see its stderr)";
  }
  // Each refusal is logged with the caller's address (at most one line a second).
  const std::string log = Slurp(dir + "/coordinator.log");
  EXPECT_TRUE(absl::StrContains(log, "coordinator: refused Register from ipv4:127.0.0.1:"))
      << log;
}

// A rank of an earlier job keeps its registration's token and a stream it opened back then;
// once the next job runs it says hello on that stream, opens another and beats: all refused,
// and the next job's results are exact.
TEST(AdmissionTest, AStandaloneCoordinatorServesTheNextJobDespiteAStaleRank) {
  const std::string dir = testing::MakeTempDir("braid_stale_");
  ASSERT_EQ(mkdir((dir + "/signals").c_str(), 0700), 0);
  ScopedEnv no_secret("BRAID_JOB_SECRET", nullptr);
  ScopedEnv secret_file("BRAID_JOB_SECRET_FILE", (dir + "/job.secret").c_str());
  CoordinatorBinary coord(BRAID_COORDINATOR_PATH, dir,
                          {"--secret-file", dir + "/job.secret", "--heartbeat-timeout", "2"});
  ASSERT_FALSE(coord.address().empty());
  const std::string secret = Slurp(dir + "/job.secret").substr(0, 64);
  const std::string address = coord.address();
  RunRanksOptions o;
  o.ranks = 3;
  o.deadline = absl::Seconds(120);
  auto exits = RunRanks(o, [&](int r) {
    Checker c{r};
    if (r == 2) {  // the stale rank: both registrations of job 1, then silence
      RawClient client(address);
      std::string tokens[2];
      std::thread other([&] {
        proto::RegisterRequest req;
        req.set_rank(1);
        req.set_size(2);
        proto::RegisterResponse resp;
        c.Expect(client.Register(secret, req, &resp).ok(), "job 1 rank 1 registers");
        tokens[1] = resp.rank_token();
      });
      proto::RegisterRequest req;
      req.set_rank(0);
      req.set_size(2);
      proto::RegisterResponse resp;
      c.Expect(client.Register(secret, req, &resp).ok(), "job 1 rank 0 registers");
      tokens[0] = resp.rank_token();
      other.join();
      // A stream opened in job 1 whose hello comes only in job 2.
      auto late = client.Negotiate(secret, tokens[0]);
      proto::StatusResponse st;
      const absl::Time limit = absl::Now() + absl::Seconds(30);
      while (client.Status(secret, &st).ok() && st.phase() != proto::JOB_ENDED &&
             absl::Now() < limit) {
        absl::SleepFor(absl::Milliseconds(50));  // job 1's ranks are lost after 2 s of silence
      }
      c.Expect(st.job_id() == 1 && st.phase() == proto::JOB_ENDED, "job 1 ended");
      Touch(dir + "/signals/job1_over");
      if (!AwaitFile(dir + "/signals/started", absl::Seconds(60))) return 3;
      // Its hello as rank 0, with a request that would fail job 2's "exact" if it counted.
      proto::RequestList hello;
      hello.set_rank(0);
      proto::Request* bad = hello.add_requests();
      bad->set_name("exact");
      bad->set_dtype(proto::FLOAT64);
      bad->add_shape(3);
      late->stream->Write(hello);
      late->stream->Write(hello);
      proto::ResponseList msg;
      while (late->stream->Read(&msg)) {
      }
      grpc::Status s = late->stream->Finish();
      c.Expect(s.error_code() == kDenied, "late hello: " + s.error_message());
      for (int rank : {0, 1}) {
        s = client.NegotiateRefused(secret, tokens[rank], rank);
        c.Expect(s.error_code() == kDenied, "job 1's token for a stream: " + s.error_message());
        s = client.Heartbeat(secret, tokens[rank], rank);
        c.Expect(s.error_code() == kDenied, "job 1's token for a heartbeat: " + s.error_message());
      }
      Touch(dir + "/signals/stale_done");
      return c.failures == 0 ? 0 : 1;
    }
    if (!AwaitFile(dir + "/signals/job1_over", absl::Seconds(60))) return 3;
    testing::SetRankEnv(address, r, 2);
    unsetenv("BRAID_JOB_SECRET");
    Runtime rt;
    if (!c.Ok(testing::InitRuntime(rt), "init")) return 1;
    ExactAllReduces(rt, c, dir + "/signals/started", dir + "/signals/stale_done", 10);
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "process " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "process " << e.rank << " failed (see its stderr)";
  }
  int rc = 0;
  std::string out = Shell(absl::StrCat(BRAIDCTL_PATH, " status --json --coordinator ", address,
                                       " --secret-file ", dir, "/job.secret"), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "\"job_id\":\"2\"")) << out;
  EXPECT_TRUE(absl::StrContains(out, "\"job_state\":\"ended\"")) << out;
}

// A secret is never taken from a command line, and a secret file others could read is refused.
TEST(AdmissionTest, SecretsNeverOnTheCommandLine) {
  const std::string dir = testing::MakeTempDir("braid_cmdline_");
  ScopedEnv no_secret("BRAID_JOB_SECRET", nullptr);
  ScopedEnv no_secret_file("BRAID_JOB_SECRET_FILE", nullptr);
  const std::string refused =
      "--secret is refused: every user of this host could read it (ps); use --secret-file "
      "FILE (mode 0600) or BRAID_JOB_SECRET";
  struct Case {
    std::string command, output;
  } cases[] = {
      {absl::StrCat(BRAID_COORDINATOR_PATH, " --secret s3cret"), "braid-coordinator: " + refused},
      {absl::StrCat(BRAIDCTL_PATH, " status --coordinator 127.0.0.1:1 --secret s3cret"),
       "braidctl: " + refused},
      {absl::StrCat(BRAIDRUN_PATH, " -np 1 --secret s3cret true"), "braidrun: " + refused},
      {absl::StrCat(BRAID_COORDINATOR_PATH, " --secret-file ",
                    testing::WriteFile(dir + "/open", "s3cret", 0644)),
       absl::StrCat("braid-coordinator: --secret-file: '", dir, "/open' has mode 0644: other "
                    "users could read or change it; it must be 0600 (chmod 600 '", dir,
                    "/open')")},
      {BRAID_COORDINATOR_PATH,
       "braid-coordinator: no job secret: pass --secret-file FILE (created with a random "
       "secret when missing) or set BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE; ranks and "
       "braidctl use the same"},
      {absl::StrCat("BRAID_JOB_SECRET_FILE=", dir, "/open ",
                    BRAIDCTL_PATH, " status --coordinator 127.0.0.1:1"),
       absl::StrCat("braidctl: BRAID_JOB_SECRET_FILE: '", dir, "/open' has mode 0644: other "
                    "users could read or change it; it must be 0600 (chmod 600 '", dir,
                    "/open')")},
  };
  for (const Case& c : cases) {
    int rc = 0;
    std::string out = Shell(c.command, &rc);
    EXPECT_EQ(rc, 2) << c.command << "\n" << out;
    EXPECT_EQ(out, c.output + "\n") << c.command;
  }
  // --secret-file names a file to create when there is none: mode 0600, a 256-bit secret.
  int rc = 0;
  const std::string made = dir + "/made.secret";
  Shell(absl::StrCat("timeout 30 ", BRAIDRUN_PATH, " -np 1 --secret-file ", made,
                     " true"), &rc);
  EXPECT_EQ(rc, 0);
  struct stat st;
  ASSERT_EQ(stat(made.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Slurp(made).size(), 65u);  // 64 hex digits and a newline
}

}  // namespace
}  // namespace braid
