// A job's identity without braidrun (Note [Job identity] in runtime/job_identity.h): where
// its secret comes from, the launcher's job id, and the coordinator port derived from
// MASTER_PORT; the configuration variables that carry secrets and TLS files.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "common/secret.h"
#include "gtest/gtest.h"
#include "runtime/config.h"
#include "runtime/job_identity.h"

namespace braid {
namespace {

struct Env {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> fn() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string t = std::string(base != nullptr ? base : "/tmp") + "/job_identity_test.XXXXXX";
  return mkdtemp(t.data()) != nullptr ? t : "";
}

RuntimeConfig Config(const Env& env) {
  auto c = ConfigFromEnv(env.fn());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : RuntimeConfig();
}

TEST(JobIdentityTest, SecretComesFromTheVariableOrAPrivateFileNeverBoth) {
  const std::string dir = TempDir();
  const std::string file = dir + "/secret";
  // Strong enough (Note [Secret strength]): 128 bits and more.
  const std::string from_variable = "from-the-variable-0123456789abcdef";
  const std::string from_file = "from-the-file-0123456789abcdef";
  std::ofstream(file) << from_file << "\n";
  chmod(file.c_str(), 0600);
  EXPECT_EQ(Config(Env{{{"BRAID_JOB_SECRET", from_variable}}}).job_secret, from_variable);
  EXPECT_EQ(Config(Env{{{"BRAID_JOB_SECRET_FILE", file}}}).job_secret, from_file);
  Env both{{{"BRAID_JOB_SECRET", from_variable}, {"BRAID_JOB_SECRET_FILE", file}}};
  EXPECT_EQ(ConfigFromEnv(both.fn()).status().message(),
            "BRAID_JOB_SECRET and BRAID_JOB_SECRET_FILE are both set: set one of them");
  chmod(file.c_str(), 0604);
  Env open{{{"BRAID_JOB_SECRET_FILE", file}}};
  EXPECT_EQ(ConfigFromEnv(open.fn()).status().message(),
            "BRAID_JOB_SECRET_FILE: '" + file + "' has mode 0604: other users could read or "
            "change it; it must be 0600 (chmod 600 '" + file + "')");
}

TEST(JobIdentityTest, TlsFilesAndTheUserKeyLocation) {
  RuntimeConfig c = Config(Env{{{"BRAID_TLS_CERT", "/c.pem"}, {"BRAID_TLS_KEY", "/k.pem"},
                                {"BRAID_TLS_CA", "/ca.pem"}, {"HOME", "/home/u"}}});
  EXPECT_EQ(c.tls_cert_file, "/c.pem");
  EXPECT_EQ(c.tls_key_file, "/k.pem");
  EXPECT_EQ(c.tls_ca_file, "/ca.pem");
  EXPECT_EQ(c.user_key_file, "/home/u/.config/braid/user.key");
  EXPECT_EQ(Config(Env{{{"HOME", "/home/u"}, {"XDG_CONFIG_HOME", "/x"}}}).user_key_file,
            "/x/braid/user.key");
}

TEST(JobIdentityTest, CoordinatorPortFollowsMasterPortUnlessSetItself) {
  EXPECT_EQ(Config(Env{}).coordinator_port, 29600);
  // DerivedCoordinatorPort: 1024 + (p - 1024 + 16384) mod 64512.
  EXPECT_EQ(Config(Env{{{"MASTER_PORT", "29500"}}}).coordinator_port, 45884);
  EXPECT_EQ(Config(Env{{{"MASTER_PORT", "29501"}}}).coordinator_port, 45885);
  EXPECT_EQ(Config(Env{{{"MASTER_PORT", "60000"}}}).coordinator_port, 11872);
  EXPECT_EQ(Config(Env{{{"MASTER_PORT", "29500"}, {"BRAID_COORDINATOR_PORT", "1234"}}})
                .coordinator_port,
            1234);
  Env bad{{{"MASTER_PORT", "http"}}};
  EXPECT_EQ(ConfigFromEnv(bad.fn()).status().message(),
            "MASTER_PORT must be an integer, got 'http'");
}

TEST(JobIdentityTest, LauncherJobIds) {
  auto id = [](Env e) { return LaunchInfoFromEnv(e.fn())->job_id; };
  EXPECT_EQ(id(Env{{{"RANK", "0"}, {"WORLD_SIZE", "2"}}}), "");
  EXPECT_EQ(id(Env{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "none"}}}), "");
  EXPECT_EQ(id(Env{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "abc"}}}),
            "torchrun:abc");
  EXPECT_EQ(id(Env{{{"SLURM_PROCID", "1"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}}}),
            "slurm:77.3");
  EXPECT_EQ(id(Env{{{"OMPI_MCA_ess_base_jobid", "12345"}}}), "openmpi:12345");
  EXPECT_EQ(id(Env{{{"PMIX_NAMESPACE", "prterun-h-1@1"}}}), "pmix:prterun-h-1@1");
}

TEST(JobIdentityTest, ExplicitRandomOrRefused) {
  const std::string given = RandomSecret();
  RuntimeConfig c = Config(Env{{{"BRAID_JOB_SECRET", given}}});
  EXPECT_EQ(ResolveJobSecret(c, c.launch, false)->secret, given);
  c = Config(Env{});
  auto a = ResolveJobSecret(c, c.launch, /*alone=*/true);
  auto b = ResolveJobSecret(c, c.launch, /*alone=*/true);
  EXPECT_EQ(a->secret.size(), 64u);
  EXPECT_NE(a->secret, b->secret);
  c = Config(Env{{{"BRAID_COORDINATOR", "h:1"}, {"BRAID_RANK", "1"}, {"BRAID_SIZE", "2"}}});
  EXPECT_EQ(ResolveJobSecret(c, c.launch, false).status().message(),
            "BRAID_COORDINATOR is set (h:1) but no job secret: set BRAID_JOB_SECRET or "
            "BRAID_JOB_SECRET_FILE to that coordinator's secret");
}

// Rule 3: every rank of one job derives the same secret from the user's key and the job's
// identity; another job, port or user key gives another secret. The world size is not part
// of it: ranks that disagree on it reach the coordinator, which names both sizes.
TEST(JobIdentityTest, DerivedSecretsAgreeWithinAJobAndDifferAcrossJobs) {
  const std::string home = TempDir();
  auto derive = [&](Env e) {
    e.vars["XDG_CONFIG_HOME"] = home + "/config";
    RuntimeConfig c = Config(e);
    auto s = ResolveJobSecret(c, c.launch, false);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->secret : "";
  };
  Env rank0{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}};
  Env rank1{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}};
  const std::string s0 = derive(rank0);
  EXPECT_EQ(s0.size(), 64u);
  EXPECT_EQ(derive(rank1), s0);
  struct stat st;
  ASSERT_EQ(stat((home + "/config/braid/user.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((home + "/config/braid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  Env other_port = rank1;
  other_port.vars["MASTER_PORT"] = "29501";
  EXPECT_NE(derive(other_port), s0);
  Env other_size = rank1;
  other_size.vars["WORLD_SIZE"] = "3";
  EXPECT_EQ(derive(other_size), s0);
  Env other_job = rank1;
  other_job.vars["TORCHELASTIC_RUN_ID"] = "run-2";
  EXPECT_NE(derive(other_job), s0);
  // Another user (another key) derives another secret for the same job.
  ASSERT_EQ(unlink((home + "/config/braid/user.key").c_str()), 0);
  EXPECT_NE(derive(rank1), s0);
  // A refusal names the derivation's inputs (two ranks that name rank 0's host differently
  // derive different secrets).
  {
    Env e = rank0;
    e.vars["XDG_CONFIG_HOME"] = home + "/config";
    e.vars["MASTER_ADDR"] = "localhost";
    RuntimeConfig c = Config(e);
    auto s = ResolveJobSecret(c, c.launch, false);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->origin, "derived from " + home + "/config/braid/user.key and the job identity "
                         "(launcher torchrun, launcher job id none, coordinator host 'localhost' "
                         "from MASTER_ADDR, port 45884 from MASTER_PORT)");
  }
  // The identity names every field, length-prefixed.
  RuntimeConfig c = Config(rank0);
  EXPECT_EQ(JobIdentity(c, c.launch),
            "braid job identity v2|8:torchrun|0:|9:127.0.0.1|5:45884");
}

TEST(JobIdentityTest, ARefusedDerivedSecretSaysWhereItCameFrom) {
  JobSecret derived{"x", "derived from /h/.config/braid/user.key"};
  absl::Status s = ExplainRefusedSecret(absl::PermissionDeniedError("refused"), derived);
  EXPECT_EQ(s.message(),
            "refused; this rank's secret is derived from /h/.config/braid/user.key (ranks on "
            "hosts that do not share this file need BRAID_JOB_SECRET)");
  EXPECT_EQ(ExplainRefusedSecret(absl::UnavailableError("gone"), derived).message(), "gone");
}

}  // namespace
}  // namespace braid
