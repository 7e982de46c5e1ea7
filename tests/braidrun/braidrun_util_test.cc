// Unit tests of braidrun's pure parts: host lists and files, rank placement, rank
// environments, the ssh command and script of remote ranks, line prefixing.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config.h"
#include "tools/braidrun/discovery.h"
#include "tools/braidrun/host_list.h"
#include "tools/braidrun/line_prefixer.h"
#include "tools/braidrun/network.h"
#include "tools/braidrun/rank_env.h"
#include "tools/braidrun/remote.h"
#include "tools/braidrun/watch.h"

namespace braid::braidrun {
namespace {

using ::testing::ElementsAre;

// ---- host lists ----

TEST(ParseHostList, HostsWithSlots) {
  auto h = ParseHostList("localhost:2,node-1:4");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[0].host, "localhost");
  EXPECT_EQ((*h)[0].slots, 2);
  EXPECT_EQ((*h)[1].host, "node-1");
  EXPECT_EQ((*h)[1].slots, 4);
}

TEST(ParseHostList, SlotsDefaultToOneAndSpacesAreTrimmed) {
  auto h = ParseHostList(" a , b:3 ");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[0].host, "a");
  EXPECT_EQ((*h)[0].slots, 1);
  EXPECT_EQ((*h)[1].host, "b");
  EXPECT_EQ((*h)[1].slots, 3);
}

TEST(ParseHostList, LastColonSeparatesSlots) {
  auto h = ParseHostList("::1:2");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)[0].host, "::1");
  EXPECT_EQ((*h)[0].slots, 2);
}

TEST(ParseHostList, Errors) {
  struct Case {
    const char* spec;
    const char* message;
  } cases[] = {
      {"", "-H: the host list is empty"},
      {"a:2,,b", "-H 'a:2,,b': empty entry (expected host:slots,host:slots,...)"},
      {"a:x", "-H: 'a:x': slots must be a positive integer, got 'x'"},
      {"a:0", "-H: 'a:0': slots must be a positive integer, got '0'"},
      {"a:-1", "-H: 'a:-1': slots must be a positive integer, got '-1'"},
      {"a:", "-H: 'a:': slots must be a positive integer, got ''"},
      {":2", "-H: ':2': empty host name"},
      {"a:1,a:2", "-H: host 'a' is listed twice (give it one entry with all its slots)"},
  };
  for (const Case& c : cases) {
    auto h = ParseHostList(c.spec);
    ASSERT_FALSE(h.ok()) << c.spec;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << c.spec;
    EXPECT_EQ(h.status().message(), c.message) << c.spec;
  }
}

TEST(LocalHostNames, IncludesHostnameAndShortName) {
  EXPECT_THAT(LocalHostNames("box.example.org"),
              ElementsAre("localhost", "127.0.0.1", "::1", "box.example.org", "box"));
  EXPECT_THAT(LocalHostNames("box"), ElementsAre("localhost", "127.0.0.1", "::1", "box"));
  EXPECT_THAT(LocalHostNames(""), ElementsAre("localhost", "127.0.0.1", "::1"));
}

TEST(IsLocalHost, NamesOfThisMachineInAnyCase) {
  auto names = LocalHostNames("box");
  EXPECT_TRUE(IsLocalHost("localhost", names));
  EXPECT_TRUE(IsLocalHost("LOCALHOST", names));
  EXPECT_TRUE(IsLocalHost("Box", names));
  EXPECT_TRUE(IsLocalHost("127.0.0.1", names));
  EXPECT_FALSE(IsLocalHost("node7", names));
  EXPECT_FALSE(IsLocalHost("root@box", names));  // a login on another account goes over ssh
}

TEST(PlaceRanks, FillsEachHostsSlotsInOrder) {
  auto placed = PlaceRanks({{"a", 2}, {"b", 3}, {"c", 4}}, 4);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_EQ(placed->size(), 4u);
  const std::vector<std::tuple<std::string, int, int, int>> want = {
      {"a", 0, 0, 2}, {"a", 0, 1, 2}, {"b", 1, 0, 2}, {"b", 1, 1, 2}};
  for (size_t r = 0; r < want.size(); ++r) {
    const RankPlacement& p = (*placed)[r];
    EXPECT_EQ(std::make_tuple(p.host, p.host_index, p.local_rank, p.local_size), want[r]) << r;
  }
  // Host c got no rank; a single host takes every rank.
  placed = PlaceRanks({{"localhost", 3}}, 3);
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)[2].local_rank, 2);
  EXPECT_EQ((*placed)[2].local_size, 3);
}

TEST(PlaceRanks, TooFewSlots) {
  absl::Status s = PlaceRanks({{"localhost", 1}, {"box", 2}}, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "the hosts have 3 slots in all, fewer than -np 4");
  EXPECT_EQ(PlaceRanks({{"localhost", 1}}, 2).status().message(),
            "the hosts have 1 slot in all, fewer than -np 2");
}

TEST(ParseHostfile, EveryFormAndComments) {
  auto hosts = ParseHostfile(
      "# cluster\n"
      "n1 slots=4\n"
      "\n"
      "  n2:2   # two GPUs\n"
      "n3\n"
      "10.0.0.9 slots=1\n",
      "hosts.txt");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 4u);
  EXPECT_EQ((*hosts)[0].host, "n1");
  EXPECT_EQ((*hosts)[0].slots, 4);
  EXPECT_EQ((*hosts)[1].host, "n2");
  EXPECT_EQ((*hosts)[1].slots, 2);
  EXPECT_EQ((*hosts)[2].host, "n3");
  EXPECT_EQ((*hosts)[2].slots, 1);
  EXPECT_EQ((*hosts)[3].host, "10.0.0.9");
}

TEST(ParseHostfile, ErrorsNameTheFileAndLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"n1\nn2 slots=0\n",
       "f:2: 'n2 slots=0': slots must be a positive integer, got '0' (expected 'host', "
       "'host slots=N' or 'host:N')"},
      {"n1 cpus=4\n",
       "f:1: 'n1 cpus=4': unexpected words after the host name (expected 'host', "
       "'host slots=N' or 'host:N')"},
      {"n1\nn1:2\n",
       "f:2: 'n1:2': the host is listed twice (expected 'host', 'host slots=N' or 'host:N')"},
      {"-oProxyCommand=x\n",
       "f:1: '-oProxyCommand=x': a host name cannot start with '-' (expected 'host', "
       "'host slots=N' or 'host:N')"},
      {"# nothing\n\n", "f: no hosts"},
  };
  for (const auto& [text, want] : cases) {
    absl::Status s = ParseHostfile(text, "f").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(s.message(), want);
  }
}

// ---- the coordinator's address ----

TEST(Network, InterfaceAndRouteAddresses) {
  auto lo = InterfaceAddress("lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "127.0.0.1");
  absl::Status s = InterfaceAddress("nosuch0").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()),
              ::testing::ContainsRegex("^network interface 'nosuch0' has no IPv4 address "
                                       "\\(interfaces with one: .*lo.*\\)$"));
  auto self = SourceAddressFor("127.0.0.1");
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_EQ(*self, "127.0.0.1");
  EXPECT_EQ(SourceAddressFor("localhost").value_or(""), "127.0.0.1");
  EXPECT_EQ(SourceAddressFor("no-such-host.invalid").status().code(), absl::StatusCode::kNotFound);
}

// ---- remote ranks ----

TEST(SplitRemoteEnv, PrivateNamesTravelOverStdinAndHostVariablesStayHome) {
  RemoteEnv env = SplitRemoteEnv(
      {"PATH=/usr/bin", "HOME=/root", "HOSTNAME=h0", "BRAID_RANK=1", "BRAID_JOB_SECRET=abc",
       "SSH_AUTH_SOCK=/tmp/a", "XDG_RUNTIME_DIR=/run/u", "BASH_FUNC_f%%=() { :; }",
       "HF_TOKEN=t", "MULTI_SECRET=a\nb", "A=x y'z", "_=/usr/bin/braidrun", "PWD=/w"});
  EXPECT_THAT(env.public_vars, ElementsAre("PATH=/usr/bin", "BRAID_RANK=1", "A=x y'z"));
  EXPECT_THAT(env.private_vars, ElementsAre("BRAID_JOB_SECRET=abc", "HF_TOKEN=t"));
  EXPECT_THAT(env.dropped, ElementsAre("MULTI_SECRET"));
}

TEST(ShellQuote, SingleQuotesAreEscaped) {
  EXPECT_EQ(ShellQuote("plain"), "'plain'");
  EXPECT_EQ(ShellQuote("it's $HOME"), R"('it'\''s $HOME')");
  EXPECT_EQ(ShellQuote(""), "''");
}

TEST(SshArgv, UserOptionsComeFirstSoTheyWin) {
  SshOptions o;
  o.port = 2222;
  o.identity_file = "/k/id";
  o.options = {"StrictHostKeyChecking=no"};
  EXPECT_THAT(SshArgv(o, "h1", "echo 'hi'"),
              ElementsAre("ssh", "-T", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                          "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-p",
                          "2222", "-i", "/k/id", "h1", R"(exec /bin/sh -c 'echo '\''hi'\''')"));
  EXPECT_THAT(SshArgv(SshOptions{}, "h1", "true"),
              ElementsAre("ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o",
                          "ServerAliveCountMax=3", "h1", "exec /bin/sh -c 'true'"));
}

TEST(RemoteStdin, PreambleThenSignalLines) {
  EXPECT_EQ(RemoteStdinPreamble({"BRAID_JOB_SECRET=abc", "T=1"}), "BRAID_JOB_SECRET=abc\nT=1\n\n");
  EXPECT_EQ(RemoteStdinPreamble({}), "\n");
  EXPECT_EQ(RemoteSignalLine(SIGINT), "INT\n");
  EXPECT_EQ(RemoteSignalLine(SIGKILL), "KILL\n");
}

TEST(RemoteScript, QuotesEveryWordAndStartsTheRankInItsOwnSession) {
  const std::string script = RemoteScript("/w d", {"A=it's"}, {"python3", "-c", "print(1)"});
  EXPECT_THAT(script, ::testing::StartsWith("cd '/w d' 2>/dev/null || "));
  EXPECT_THAT(script, ::testing::HasSubstr(
                          R"(setsid env --default-signal -- 'A=it'\''s' 'python3' '-c' )"
                          "'print(1)' </dev/null &\n"));
  EXPECT_THAT(script, ::testing::EndsWith("exit \"$braidrun_rc\"\n"));
}

// ---- rank environments ----

JobEnv MinimalJob() {
  JobEnv job;
  job.world_size = 4;
  job.coordinator = "127.0.0.1:4242";
  job.job_secret = "s3cret";
  return job;
}

TEST(BuildRankEnv, MinimalJobAppendsLauncherVariables) {
  std::vector<std::string> env =
      BuildRankEnv({"HOME=/root", "PATH=/usr/bin"}, MinimalJob(), 2, 2, 4);
  EXPECT_THAT(env, ElementsAre("HOME=/root", "PATH=/usr/bin", "BRAID_COORDINATOR=127.0.0.1:4242",
                               "BRAID_RANK=2", "BRAID_SIZE=4", "BRAID_LOCAL_RANK=2",
                               "BRAID_LOCAL_SIZE=4", "BRAID_WORKER=2", "BRAID_JOB_SECRET=s3cret",
                               "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1", "UCX_NET_DEVICES=lo"));
}

// Note [Elastic braidrun]: the coordinator places an elastic job's ranks at each membership,
// so braidrun leaves the place empty (unset) and names the process by BRAID_WORKER alone.
TEST(BuildRankEnv, ElasticRanksGetAWorkerNumberAndNoPlace) {
  JobEnv job = MinimalJob();
  job.elastic = true;
  std::vector<std::string> env = BuildRankEnv({"BRAID_RANK=9"}, job, 2, 2, 4);
  EXPECT_THAT(env, ElementsAre("BRAID_RANK=", "BRAID_COORDINATOR=127.0.0.1:4242", "BRAID_SIZE=",
                               "BRAID_LOCAL_RANK=", "BRAID_LOCAL_SIZE=", "BRAID_WORKER=2",
                               "BRAID_ELASTIC=1", "BRAID_JOB_SECRET=s3cret",
                               "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1", "UCX_NET_DEVICES=lo"));
}

TEST(BuildRankEnv, LauncherVariablesReplaceInheritedOnesInPlace) {
  std::vector<std::string> env = BuildRankEnv(
      {"BRAID_RANK=9", "A=1", "PYTHONUNBUFFERED=0", "OMP_NUM_THREADS=4", "UCX_NET_DEVICES=eth0",
       "NOEQUALS", "=bad", "B=x=y", "BRAID_JOB_SECRET_FILE=/home/u/other.secret"},
      MinimalJob(), 0, 0, 4);
  // The job's secret replaces an inherited secret file (empty is unset).
  EXPECT_THAT(env, ElementsAre("BRAID_RANK=0", "A=1", "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=4",
                               "UCX_NET_DEVICES=eth0", "B=x=y", "BRAID_JOB_SECRET_FILE=",
                               "BRAID_COORDINATOR=127.0.0.1:4242",
                               "BRAID_SIZE=4", "BRAID_LOCAL_RANK=0", "BRAID_LOCAL_SIZE=4",
                               "BRAID_WORKER=0", "BRAID_JOB_SECRET=s3cret"));
}

// Note [Ranks die with their launcher]: the pipe's variable for ranks on this host; an
// inherited one (braidrun started by a rank of another braidrun) is emptied for the others.
TEST(BuildRankEnv, TheLauncherPipeIsTheJobsOwn) {
  JobEnv job = MinimalJob();
  job.launcher_pipe = "3:4711";
  EXPECT_THAT(BuildRankEnv({"BRAID_LAUNCHER_PIPE=3:1", "A=1"}, job, 0, 0, 4),
              ::testing::Contains("BRAID_LAUNCHER_PIPE=3:4711"));
  EXPECT_THAT(BuildRankEnv({"BRAID_LAUNCHER_PIPE=3:1", "A=1"}, MinimalJob(), 0, 0, 4),
              ::testing::Contains("BRAID_LAUNCHER_PIPE="));
  for (const std::string& e : BuildRankEnv({"A=1"}, MinimalJob(), 0, 0, 4)) {
    EXPECT_NE(e.rfind("BRAID_LAUNCHER_PIPE", 0), 0u) << e;
  }
}

// Flags map onto their variables through the configuration parser (runtime/config.h), in
// SettingFlags() order, values as given except for the flag's own unit.
TEST(BuildRankEnv, FlagsBecomeVariables) {
  JobEnv job = MinimalJob();
  const std::vector<std::pair<std::string, std::string>> given = {
      {"--timeout", "30"},          {"--register-timeout", "7.5"},
      {"--fusion-threshold-mb", "2"},
      {"--cycle-time-ms", "5"},     {"--cache-capacity", "0"},
      {"--timeline-filename", "/tmp/tl.json"}, {"--stall-check-seconds", "0.5"},
      {"--stall-shutdown-seconds", "0"},       {"--heartbeat-timeout", "4"},
      {"--negotiation-timeout", "90"},         {"--fast-path", "0"},
      {"--compression", "powersgd:rank=2"},    {"--autotune", "1"},
      {"--autotune-log-file", "/tmp/tune.csv"}, {"--ring-chunk-bytes", "65536"},
      {"--ring-window", "8"},                   {"--gpu-data-plane", "host"}};
  for (const auto& [flag, text] : given) {
    const braid::SettingFlag* f = braid::FindSettingFlag(flag);
    ASSERT_NE(f, nullptr) << flag;
    auto value = braid::SettingFlagValue(*f, text);
    ASSERT_TRUE(value.ok()) << value.status();
    job.settings.emplace_back(f->variable, *value);
  }
  job.ucx_net_devices = "";
  std::vector<std::string> env = BuildRankEnv({}, job, 1, 0, 2);
  EXPECT_THAT(env,
              ElementsAre("BRAID_COORDINATOR=127.0.0.1:4242", "BRAID_RANK=1", "BRAID_SIZE=4",
                          "BRAID_LOCAL_RANK=0", "BRAID_LOCAL_SIZE=2", "BRAID_WORKER=1",
                          "BRAID_JOB_SECRET=s3cret", "PYTHONUNBUFFERED=1", "BRAID_TIMEOUT_S=30",
                          "BRAID_REGISTER_TIMEOUT_S=7.5",
                          "BRAID_FUSION_THRESHOLD=2097152", "BRAID_CYCLE_TIME_MS=5",
                          "BRAID_CACHE_CAPACITY=0", "BRAID_TIMELINE=/tmp/tl.json",
                          "BRAID_STALL_CHECK_S=0.5", "BRAID_STALL_SHUTDOWN_S=0",
                          "BRAID_HEARTBEAT_TIMEOUT_S=4", "BRAID_NEGOTIATION_TIMEOUT_S=90",
                          "BRAID_FAST_PATH=0", "BRAID_COMPRESSION=powersgd:rank=2",
                          "BRAID_AUTOTUNE=1", "BRAID_AUTOTUNE_LOG=/tmp/tune.csv",
                          "BRAID_RING_CHUNK_BYTES=65536", "BRAID_RING_WINDOW=8",
                          "BRAID_GPU_DATA_PLANE=host", "OMP_NUM_THREADS=1"));
  // The order braidrun sets them in is the table's.
  std::vector<std::string> flags;
  for (const braid::SettingFlag& f : braid::SettingFlags()) flags.push_back(f.flag);
  std::vector<std::string> want;
  for (const auto& [flag, text] : given) want.push_back(flag);
  EXPECT_EQ(flags, want);
}

TEST(BuildRankEnv, PythonPathIsPrepended) {
  JobEnv job = MinimalJob();
  job.python_path = "/src/build/python";
  std::vector<std::string> env = BuildRankEnv({"PYTHONPATH=/opt/lib"}, job, 0, 0, 1);
  EXPECT_EQ(env[0], "PYTHONPATH=/src/build/python:/opt/lib");
  env = BuildRankEnv({"PYTHONPATH="}, job, 0, 0, 1);
  EXPECT_EQ(env[0], "PYTHONPATH=/src/build/python");
  env = BuildRankEnv({}, job, 0, 0, 1);
  EXPECT_EQ(env.back(), "PYTHONPATH=/src/build/python");
  // Already there (a launcher above braidrun set it): not added twice.
  env = BuildRankEnv({"PYTHONPATH=/opt/lib:/src/build/python"}, job, 0, 0, 1);
  EXPECT_EQ(env[0], "PYTHONPATH=/opt/lib:/src/build/python");
  job.python_path.clear();
  env = BuildRankEnv({"PYTHONPATH=/opt/lib"}, job, 0, 0, 1);
  EXPECT_EQ(env[0], "PYTHONPATH=/opt/lib");
}

// ---- line prefixing ----

std::string FeedAll(LinePrefixer& p, const std::vector<std::string>& chunks) {
  std::string out;
  for (const std::string& c : chunks) p.Feed(c, &out);
  return out;
}

TEST(LinePrefixer, CompleteLines) {
  LinePrefixer p(RankPrefix(3));
  EXPECT_EQ(FeedAll(p, {"a\nbb\n"}), "[3] a\n[3] bb\n");
  EXPECT_FALSE(p.has_partial());
}

TEST(LinePrefixer, EmptyLinesArePrefixedToo) {
  LinePrefixer p(RankPrefix(0));
  EXPECT_EQ(FeedAll(p, {"\n\nx\n"}), "[0] \n[0] \n[0] x\n");
}

TEST(LinePrefixer, PartialLinesWaitForTheirNewline) {
  LinePrefixer p(RankPrefix(1));
  std::string out;
  p.Feed("hel", &out);
  EXPECT_EQ(out, "");
  EXPECT_TRUE(p.has_partial());
  p.Feed("lo", &out);
  EXPECT_EQ(out, "");
  p.Feed(" world\nnext", &out);
  EXPECT_EQ(out, "[1] hello world\n");
  p.Feed("\n", &out);
  EXPECT_EQ(out, "[1] hello world\n[1] next\n");
}

TEST(LinePrefixer, FlushReleasesThePartialLastLineWithANewline) {
  LinePrefixer p(RankPrefix(12));
  std::string out;
  p.Feed("done\nno newline", &out);
  EXPECT_EQ(out, "[12] done\n");
  p.Flush(&out);
  EXPECT_EQ(out, "[12] done\n[12] no newline\n");
  EXPECT_FALSE(p.has_partial());
  p.Flush(&out);  // nothing left
  EXPECT_EQ(out, "[12] done\n[12] no newline\n");
}

TEST(LinePrefixer, ByteAtATime) {
  LinePrefixer p(RankPrefix(0));
  std::string in = "x\r\nyz\n\nq";
  std::string out;
  for (char c : in) p.Feed(&c, 1, &out);
  p.Flush(&out);
  EXPECT_EQ(out, "[0] x\r\n[0] yz\n[0] \n[0] q\n");
}

TEST(LinePrefixer, OverlongPartialLineIsReleasedInChunks) {
  LinePrefixer p(RankPrefix(0), 4);
  std::string out;
  p.Feed("abcdefghij", &out);
  EXPECT_EQ(out, "[0] abcd\n[0] efgh\n");
  p.Feed("k\n", &out);
  EXPECT_EQ(out, "[0] abcd\n[0] efgh\n[0] ijk\n");
}

TEST(LinePrefixer, BinaryBytesPassThrough) {
  LinePrefixer p(RankPrefix(0));
  std::string in("a\0b\n", 4);
  std::string out;
  p.Feed(in, &out);
  EXPECT_EQ(out, std::string("[0] a\0b\n", 8));
}

// ---- watching a job (Note [Watching a braidrun job]) ----

TEST(Watch, TheCommandQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(WatchCommand("/opt/braid/bin/braidctl", "10.0.0.1:5000", "/run/user/1000/braid/"
                         "job-12.secret", ""),
            "/opt/braid/bin/braidctl status --coordinator 10.0.0.1:5000 --secret-file "
            "/run/user/1000/braid/job-12.secret");
  EXPECT_EQ(WatchCommand("braidctl", "[::1]:5000", "/home/a b/s", "ca.pem"),
            "braidctl status --coordinator '[::1]:5000' --secret-file '/home/a b/s' "
            "--tls-ca ca.pem");
  EXPECT_EQ(WatchCommand("braidctl", "127.0.0.1:5000", "", ""),
            "braidctl status --coordinator 127.0.0.1:5000");
}

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "braid_watch.XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

TEST(Watch, SecretDirIsPrivateAndPrefersXdgRuntimeDir) {
  const std::string base = MakeTempDir();
  const std::string xdg = base + "/xdg", home = base + "/home";
  ASSERT_EQ(mkdir(xdg.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(home.c_str(), 0755), 0);
  auto dir = JobSecretDir(xdg, home);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, xdg + "/braid");
  struct stat st;
  ASSERT_EQ(stat(dir->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // An XDG_RUNTIME_DIR open to others is passed over for HOME's cache.
  ASSERT_EQ(chmod(xdg.c_str(), 0755), 0);
  dir = JobSecretDir(xdg, home);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, home + "/.cache/braid/jobs");
  ASSERT_EQ(stat(dir->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // A jobs directory that group or others can enter is refused, naming it and its mode.
  ASSERT_EQ(chmod(dir->c_str(), 0750), 0);
  auto open = JobSecretDir("", home);
  EXPECT_EQ(open.status().message(),
            home + "/.cache/braid/jobs is open to group or others (mode 750); chmod 0700 it");
  EXPECT_EQ(JobSecretDir("", "").status().message(),
            "XDG_RUNTIME_DIR is not set, and HOME is not set");
  EXPECT_EQ(JobSecretDir(xdg, "").status().message(),
            "XDG_RUNTIME_DIR: " + xdg +
                " is open to group or others (mode 755); chmod 0700 it, and HOME is not set");
  std::filesystem::remove_all(base);
}

TEST(Watch, StaleSecretFilesOfDeadBraidrunsAreRemoved) {
  const std::string dir = MakeTempDir();
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  for (const std::string& p : {JobSecretPath(dir, dead), JobSecretPath(dir, getpid()),
                               dir + "/other.secret"}) {
    std::ofstream(p) << "x";
  }
  EXPECT_EQ(RemoveStaleJobSecrets(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(JobSecretPath(dir, dead)));
  EXPECT_TRUE(std::filesystem::exists(JobSecretPath(dir, getpid())));
  EXPECT_TRUE(std::filesystem::exists(dir + "/other.secret"));
  std::filesystem::remove_all(dir);
}

// Note [Elastic braidrun]: the discovery script's output is a host file; no line is no host.
TEST(DiscoveryScript, PrintsHostsAsAHostFile) {
  auto hosts = RunDiscoveryScript("printf 'a:2\\nb slots=3\\n# c\\nd\\n'", absl::Seconds(10));
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 3u);
  EXPECT_EQ((*hosts)[0].host, "a");
  EXPECT_EQ((*hosts)[0].slots, 2);
  EXPECT_EQ((*hosts)[1].slots, 3);
  EXPECT_EQ((*hosts)[2].slots, 1);
  auto none = RunDiscoveryScript("true", absl::Seconds(10));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(DiscoveryScript, FailuresNameTheScript) {
  auto failed = RunDiscoveryScript("exit 4", absl::Seconds(10));
  EXPECT_EQ(failed.status(), absl::InvalidArgumentError(
                                 "--host-discovery-script 'exit 4' exited with code 4"));
  auto bad = RunDiscoveryScript("echo a:zero", absl::Seconds(10));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("slots must be a positive integer, got 'zero'"));
  // A script that hangs is killed at its timeout, with what it started.
  const absl::Time start = absl::Now();
  auto slow = RunDiscoveryScript("sleep 30 & sleep 30", absl::Milliseconds(300));
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(Blacklist, EachFailureDoublesTheCoolDownUpTo16Times) {
  Blacklist b(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(b.Blocked("h", t0));
  EXPECT_EQ(b.Failed("h", t0), absl::Seconds(10));
  EXPECT_TRUE(b.Blocked("h", t0 + absl::Seconds(9)));
  EXPECT_FALSE(b.Blocked("h", t0 + absl::Seconds(10)));
  EXPECT_FALSE(b.Blocked("other", t0));
  EXPECT_EQ(b.Failed("h", t0), absl::Seconds(20));
  EXPECT_EQ(b.Failed("h", t0), absl::Seconds(40));
  EXPECT_EQ(b.Failed("h", t0), absl::Seconds(80));
  EXPECT_EQ(b.Failed("h", t0), absl::Seconds(160));
  EXPECT_EQ(b.Failed("h", t0), absl::Seconds(160));
}

}  // namespace
}  // namespace braid::braidrun
