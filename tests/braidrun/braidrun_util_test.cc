// Unit tests of braidrun's pure parts: host lists, rank environments, line prefixing.
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config.h"
#include "tools/braidrun/host_list.h"
#include "tools/braidrun/line_prefixer.h"
#include "tools/braidrun/rank_env.h"

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

TEST(CheckHostsForLocalLaunch, LocalHostsWithEnoughSlots) {
  auto names = LocalHostNames("box");
  EXPECT_TRUE(CheckHostsForLocalLaunch({{"localhost", 4}}, 4, names).ok());
  EXPECT_TRUE(CheckHostsForLocalLaunch({{"LOCALHOST", 2}, {"box", 2}}, 3, names).ok());
  EXPECT_TRUE(CheckHostsForLocalLaunch({{"127.0.0.1", 8}}, 1, names).ok());
}

TEST(CheckHostsForLocalLaunch, TooFewSlots) {
  absl::Status s = CheckHostsForLocalLaunch({{"localhost", 1}, {"box", 2}}, 4,
                                            LocalHostNames("box"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "-H: the hosts have 3 slots in all, fewer than -np 4");
  s = CheckHostsForLocalLaunch({{"localhost", 1}}, 2, LocalHostNames("box"));
  EXPECT_EQ(s.message(), "-H: the hosts have 1 slot in all, fewer than -np 2");
}

TEST(CheckHostsForLocalLaunch, RemoteHostIsNotImplemented) {
  absl::Status s = CheckHostsForLocalLaunch({{"localhost", 2}, {"node7", 2}}, 4,
                                            LocalHostNames("box"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(),
            "-H: host node7 is not this machine; multi-host launching (over ssh) is not "
            "implemented yet: run braidrun on one host, or start the ranks with another "
            "launcher (torchrun, srun, mpirun) and a braid-coordinator");
  s = CheckHostsForLocalLaunch({{"n1", 2}, {"n2", 2}}, 4, LocalHostNames("box"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("-H: hosts n1, n2 are not this machine;"));
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
                               "BRAID_LOCAL_SIZE=4", "BRAID_JOB_SECRET=s3cret",
                               "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1", "UCX_NET_DEVICES=lo"));
}

TEST(BuildRankEnv, LauncherVariablesReplaceInheritedOnesInPlace) {
  std::vector<std::string> env = BuildRankEnv(
      {"BRAID_RANK=9", "A=1", "PYTHONUNBUFFERED=0", "OMP_NUM_THREADS=4", "UCX_NET_DEVICES=eth0",
       "NOEQUALS", "=bad", "B=x=y"},
      MinimalJob(), 0, 0, 4);
  EXPECT_THAT(env, ElementsAre("BRAID_RANK=0", "A=1", "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=4",
                               "UCX_NET_DEVICES=eth0", "B=x=y", "BRAID_COORDINATOR=127.0.0.1:4242",
                               "BRAID_SIZE=4", "BRAID_LOCAL_RANK=0", "BRAID_LOCAL_SIZE=4",
                               "BRAID_JOB_SECRET=s3cret"));
}

// Flags map onto their variables through the configuration parser (runtime/config.h), in
// SettingFlags() order, values as given except for the flag's own unit.
TEST(BuildRankEnv, FlagsBecomeVariables) {
  JobEnv job = MinimalJob();
  const std::vector<std::pair<std::string, std::string>> given = {
      {"--timeout", "30"},          {"--fusion-threshold-mb", "2"},
      {"--cycle-time-ms", "5"},     {"--cache-capacity", "0"},
      {"--timeline-filename", "/tmp/tl.json"}, {"--stall-check-seconds", "0.5"},
      {"--stall-shutdown-seconds", "0"},       {"--heartbeat-timeout", "4"},
      {"--negotiation-timeout", "90"},         {"--compression", "powersgd:rank=2"}};
  for (const auto& [flag, text] : given) {
    const braid::SettingFlag* f = braid::FindSettingFlag(flag);
    ASSERT_NE(f, nullptr) << flag;
    auto value = braid::SettingFlagValue(*f, text);
    ASSERT_TRUE(value.ok()) << value.status();
    job.settings.emplace_back(f->variable, *value);
  }
  job.single_host = false;
  std::vector<std::string> env = BuildRankEnv({}, job, 1, 0, 2);
  EXPECT_THAT(env,
              ElementsAre("BRAID_COORDINATOR=127.0.0.1:4242", "BRAID_RANK=1", "BRAID_SIZE=4",
                          "BRAID_LOCAL_RANK=0", "BRAID_LOCAL_SIZE=2", "BRAID_JOB_SECRET=s3cret",
                          "PYTHONUNBUFFERED=1", "BRAID_TIMEOUT_S=30",
                          "BRAID_FUSION_THRESHOLD=2097152", "BRAID_CYCLE_TIME_MS=5",
                          "BRAID_CACHE_CAPACITY=0", "BRAID_TIMELINE=/tmp/tl.json",
                          "BRAID_STALL_CHECK_S=0.5", "BRAID_STALL_SHUTDOWN_S=0",
                          "BRAID_HEARTBEAT_TIMEOUT_S=4", "BRAID_NEGOTIATION_TIMEOUT_S=90",
                          "BRAID_COMPRESSION=powersgd:rank=2",
                          "OMP_NUM_THREADS=1"));
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

}  // namespace
}  // namespace braid::braidrun
