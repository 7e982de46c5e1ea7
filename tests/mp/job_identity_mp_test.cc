// A job's identity without braidrun, and TLS between ranks and the coordinator, with real
// processes (Note [Job identity] in runtime/job_identity.h, Note [Who may join] in
// coordinator/admission.h):
//   - two jobs started with torchrun-style variables on one port: while the first runs, the
//     second's rank 0 cannot host its coordinator and its rank 1 is refused by the first's,
//     each with a clear error within 10 s, and a rank of another user (another key) is
//     refused too; the first job's results stay exact;
//   - a 2-rank job over TLS (a self-signed certificate the test makes) passes, and clients
//     without the certificate authority are refused.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "runtime/config.h"
#include "tests/testing/exact_job.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/runtime_job.h"

namespace braid {
namespace {

using testing::AwaitFile;
using testing::Checker;
using testing::CoordinatorBinary;
using testing::ExactAllReduces;
using testing::RankExit;
using testing::RunRanks;
using testing::RunRanksOptions;
using testing::ScopedEnv;
using testing::Shell;
using testing::Touch;

// A port the kernel just handed out (an ephemeral one: at least 1024, where
// DerivedCoordinatorPort is one-to-one).
int FreePort() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    close(fd);
    if (port >= 1024) return port;
  }
  return 0;
}

// The variables torchrun sets for `rank` of 2 (torchrun itself does not start on this
// Python), with no braid variable and no secret: the job's secret is derived from the user
// key under `config_home`.
void SetTorchrunEnv(int rank, int master_port, const std::string& config_home) {
  for (const char* v : {"BRAID_COORDINATOR", "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK",
                        "BRAID_LOCAL_SIZE", "BRAID_COORDINATOR_PORT", "BRAID_JOB_SECRET",
                        "BRAID_JOB_SECRET_FILE", "TORCHELASTIC_RUN_ID"}) {
    unsetenv(v);
  }
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
  setenv("XDG_CONFIG_HOME", config_home.c_str(), 1);
  setenv("BRAID_TIMEOUT_S", "30", 1);
  setenv("UCX_TLS", "sm", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
}

// A rank of the second job: its init must fail, within 10 s, with `want` in the message.
int SecondJobRank(int rank, int master_port, const std::string& config_home,
                  const std::string& want, absl::StatusCode code) {
  Checker c{rank};
  SetTorchrunEnv(rank, master_port, config_home);
  Runtime rt;
  const absl::Time t0 = absl::Now();
  absl::Status s = testing::InitRuntime(rt);
  const absl::Duration took = absl::Now() - t0;
  c.Expect(s.code() == code && absl::StrContains(s.message(), want),
           absl::StrCat("second job's rank ", rank, ": ", s.ToString()));
  c.Expect(took < absl::Seconds(10), absl::StrCat("refused after ", absl::FormatDuration(took)));
  return c.failures == 0 ? 0 : 1;
}

TEST(JobIdentityTest, TwoTorchrunStyleJobsOnOnePortNeverMix) {
  const std::string dir = testing::MakeTempDir("braid_two_jobs_");
  const std::string signals = dir + "/signals";
  ASSERT_EQ(mkdir(signals.c_str(), 0700), 0);
  const int port = FreePort();
  ASSERT_GE(port, 1024);
  // The MASTER_PORT whose derived coordinator port (runtime/config.h) is `port`.
  const int master_port = 1024 + (port - 1024 - 16384 + 2 * 64512) % 64512;
  ASSERT_EQ(DerivedCoordinatorPort(master_port), port);
  const std::string user = dir + "/user", other_user = dir + "/other-user";
  RunRanksOptions o;
  o.ranks = 5;
  o.deadline = absl::Seconds(120);
  auto exits = RunRanks(o, [&](int p) {
    if (p < 2) {  // the first job
      Checker c{p};
      SetTorchrunEnv(p, master_port, user);
      Runtime rt;
      if (!c.Ok(testing::InitRuntime(rt), "first job's init")) return 1;
      ExactAllReduces(rt, c, signals + "/started", signals + "/all_done", 10);
      c.Ok(rt.Shutdown(), "shutdown");
      return c.failures == 0 ? 0 : 1;
    }
    if (!AwaitFile(signals + "/started", absl::Seconds(60))) return 3;
    int rc = 0;
    if (p == 2) {  // the second job's rank 0: the port is taken
      rc = SecondJobRank(0, master_port, user,
                         absl::StrCat("coordinator cannot listen on 127.0.0.1:", port,
                                      ": bind: Address already in use (the port is in use, "
                                      "maybe by another job's coordinator)"),
                         absl::StatusCode::kUnavailable);
      Touch(signals + "/second_rank0_done");
    } else if (p == 3) {  // the second job's rank 1: the first job's coordinator says no
      rc = SecondJobRank(1, master_port, user,
                         "tried to join a job of 2 ranks that is already running on this "
                         "coordinator: is a second job using the same coordinator port? Give "
                         "each job its own port (BRAID_COORDINATOR_PORT or MASTER_PORT)",
                         absl::StatusCode::kFailedPrecondition);
      Touch(signals + "/second_rank1_done");
    } else {  // another user's rank 1 on the same port: another key, another secret
      if (!AwaitFile(signals + "/second_rank0_done", absl::Seconds(60)) ||
          !AwaitFile(signals + "/second_rank1_done", absl::Seconds(60))) {
        return 3;
      }
      rc = SecondJobRank(1, master_port, other_user,
                         absl::StrCat("refused Register: wrong job secret (every rank, braidctl "
                                      "and braid-coordinator must use the job's secret: "
                                      "BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE); this rank's "
                                      "secret is derived from ", other_user,
                                      "/braid/user.key"),
                         absl::StatusCode::kPermissionDenied);
      Touch(signals + "/all_done");
    }
    return rc;
  });
  const char* who[] = {"first job's rank 0", "first job's rank 1", "second job's rank 0",
                       "second job's rank 1", "another user's rank 1"};
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << who[e.rank] << " hung";
    EXPECT_EQ(e.exit_code, 0) << who[e.rank] << " failed (see its stderr)";
  }
}

// Makes a self-signed certificate for 127.0.0.1 and its key (mode 0600) in `dir` as
// NAME.pem and NAME.key; false when openssl failed.
bool MakeCertificate(const std::string& dir, const std::string& name) {
  int rc = 0;
  std::string out = Shell(absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=braid-test -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ", dir,
      "/", name, ".key -out ", dir, "/", name, ".pem"), &rc);
  if (rc != 0) fprintf(stderr, "openssl: %s\n", out.c_str());
  chmod(absl::StrCat(dir, "/", name, ".key").c_str(), 0600);
  return rc == 0;
}

TEST(TlsTest, AJobOverTlsPassesAndAClientWithoutTheCaIsRefused) {
  const std::string dir = testing::MakeTempDir("braid_tls_");
  const std::string signals = dir + "/signals";
  ASSERT_EQ(mkdir(signals.c_str(), 0700), 0);
  ASSERT_TRUE(MakeCertificate(dir, "server"));
  ASSERT_TRUE(MakeCertificate(dir, "stranger"));
  ScopedEnv no_secret("BRAID_JOB_SECRET", nullptr);
  ScopedEnv no_ca("BRAID_TLS_CA", nullptr);
  ScopedEnv secret_file("BRAID_JOB_SECRET_FILE", (dir + "/job.secret").c_str());
  CoordinatorBinary coord(BRAID_COORDINATOR_PATH, dir,
                          {"--size", "2", "--secret-file", dir + "/job.secret", "--tls-cert",
                           dir + "/server.pem", "--tls-key", dir + "/server.key"});
  int log_rc = 0;
  ASSERT_FALSE(coord.address().empty()) << Shell("cat " + dir + "/coordinator.log", &log_rc);
  const std::string status =
      absl::StrCat(BRAIDCTL_PATH, " status --coordinator ", coord.address());
  std::string with_ca, plaintext, wrong_ca;
  int with_ca_rc = -1, plaintext_rc = -1, wrong_ca_rc = -1;
  RunRanksOptions o;
  o.ranks = 2;
  o.deadline = absl::Seconds(90);
  o.after_start = [&](const std::vector<pid_t>&) {
    if (AwaitFile(signals + "/started", absl::Seconds(60))) {
      with_ca = Shell(absl::StrCat(status, " --tls-ca ", dir, "/server.pem"), &with_ca_rc);
      plaintext = Shell(status, &plaintext_rc);
      wrong_ca = Shell(absl::StrCat(status, " --tls-ca ", dir, "/stranger.pem"), &wrong_ca_rc);
    }
    Touch(signals + "/checked");
  };
  auto exits = RunRanks(o, [&](int rank) {
    Checker c{rank};
    testing::SetRankEnv(coord.address(), rank, 2);
    unsetenv("BRAID_JOB_SECRET");
    setenv("BRAID_TLS_CA", (dir + "/server.pem").c_str(), 1);
    Runtime rt;
    if (!c.Ok(testing::InitRuntime(rt), "init over TLS")) return 1;
    ExactAllReduces(rt, c, signals + "/started", signals + "/checked", 10);
    c.Ok(rt.Shutdown(), "shutdown");
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " failed (see its stderr)";
  }
  EXPECT_EQ(with_ca_rc, 0) << with_ca;
  EXPECT_TRUE(absl::StrContains(with_ca, ": running, world size 2")) << with_ca;
  EXPECT_EQ(plaintext_rc, 2) << plaintext;
  EXPECT_TRUE(absl::StrContains(plaintext, "braidctl: cannot reach the coordinator at ")) << plaintext;
  EXPECT_EQ(wrong_ca_rc, 2) << wrong_ca;
  EXPECT_TRUE(absl::StrContains(wrong_ca, "braidctl: cannot reach the coordinator at ")) << wrong_ca;
}

}  // namespace
}  // namespace braid
