// Rank assignment from each launcher's variables, and the configuration parser.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/registry.h"
#include "gtest/gtest.h"
#include "runtime/config.h"
#include "runtime/config_proto.h"

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

TEST(LaunchInfoTest, EachLauncher) {
  struct Case {
    std::map<std::string, std::string> vars;
    LaunchInfo want;
  };
  const Case cases[] = {
      {{{"BRAID_RANK", "3"}, {"BRAID_SIZE", "4"}, {"BRAID_LOCAL_RANK", "1"}, {"BRAID_LOCAL_SIZE", "2"}},
       {3, 4, 1, 2, "braid", ""}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}},
       {1, 2, 1, 2, "torchrun", ""}},
      {{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}},
       {5, 8, 1, 4, "slurm", ""}},
      {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}},
       {2, 3, 0, 1, "openmpi", ""}},
      // braid's own variables win over a launcher's.
      {{{"BRAID_RANK", "0"}, {"BRAID_SIZE", "2"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}}, {0, 2, -1, 0, "braid", ""}},
      // Slurm's uneven "2(x3)" local size is left to the coordinator (by host).
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "2(x3)"}},
       {0, 6, -1, 0, "slurm", ""}},
      {{}, {-1, 0, -1, 0, "", ""}},
  };
  for (const Case& c : cases) {
    Env env{c.vars};
    auto got = LaunchInfoFromEnv(env.fn());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->rank, c.want.rank) << c.want.source;
    EXPECT_EQ(got->size, c.want.size) << c.want.source;
    EXPECT_EQ(got->local_rank, c.want.local_rank) << c.want.source;
    EXPECT_EQ(got->local_size, c.want.local_size) << c.want.source;
    EXPECT_EQ(got->source, c.want.source);
  }
}

TEST(LaunchInfoTest, BadValuesAreNamed) {
  Env env{{{"RANK", "x"}, {"WORLD_SIZE", "2"}}};
  EXPECT_EQ(LaunchInfoFromEnv(env.fn()).status().message(), "RANK must be an integer, got 'x'");
  Env out{{{"BRAID_RANK", "2"}, {"BRAID_SIZE", "2"}}};
  EXPECT_EQ(LaunchInfoFromEnv(out.fn()).status().message(),
            "BRAID_RANK=2 is outside the world of size 2");
}

// torchrun and mpirun always set the world size with the rank: a rank alone is a hand-made
// environment missing it (RANK=1 alone waited a minute for a coordinator, RANK=0 alone ran
// as a world of one). Slurm's batch step has SLURM_PROCID without SLURM_NTASKS; braid's own
// rank may take the size from a standalone coordinator, but not from nowhere.
TEST(LaunchInfoTest, ARankWithoutTheWorldSizeIsAnErrorWhereTheLauncherSetsBoth) {
  Env torchrun{{{"RANK", "1"}}};
  EXPECT_EQ(LaunchInfoFromEnv(torchrun.fn()).status().message(),
            "RANK=1 is set but WORLD_SIZE is not: set both (WORLD_SIZE is the number of ranks "
            "in the job)");
  Env torchrun0{{{"RANK", "0"}}};
  EXPECT_EQ(ConfigFromEnv(torchrun0.fn()).status().code(), absl::StatusCode::kInvalidArgument);
  Env mpi{{{"OMPI_COMM_WORLD_RANK", "0"}}};
  EXPECT_EQ(LaunchInfoFromEnv(mpi.fn()).status().message(),
            "OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_SIZE is not: set both "
            "(OMPI_COMM_WORLD_SIZE is the number of ranks in the job)");
  Env slurm{{{"SLURM_PROCID", "0"}}};
  EXPECT_TRUE(ConfigFromEnv(slurm.fn()).ok());
  Env braid{{{"BRAID_RANK", "1"}}};
  EXPECT_EQ(ConfigFromEnv(braid.fn()).status().message(),
            "BRAID_RANK=1 is set but neither BRAID_SIZE nor BRAID_COORDINATOR: set BRAID_SIZE "
            "(the number of ranks in the job), or BRAID_COORDINATOR to a braid-coordinator "
            "started with --size");
  Env standalone{{{"BRAID_RANK", "1"}, {"BRAID_COORDINATOR", "h:1"}}};
  EXPECT_TRUE(ConfigFromEnv(standalone.fn()).ok());
}

// Stale torchrun variables under mpirun split one job into worlds of one, each training
// alone; torchrun started by mpirun (TORCHELASTIC_RUN_ID) and agreeing values are fine.
TEST(LaunchInfoTest, TorchrunVariablesThatDisagreeWithMpirunsAreAnError) {
  Env stale{{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "1"},
             {"OMPI_COMM_WORLD_SIZE", "2"}}};
  EXPECT_EQ(ConfigFromEnv(stale.fn()).status().message(),
            "RANK=0 and WORLD_SIZE=1 (torchrun's variables, without torchrun's "
            "TORCHELASTIC_RUN_ID) disagree with mpirun's OMPI_COMM_WORLD_RANK=1 and "
            "OMPI_COMM_WORLD_SIZE=2: under mpirun, unset RANK and WORLD_SIZE (braid reads "
            "Open MPI's own)");
  Env torchrun{{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"TORCHELASTIC_RUN_ID", "r"},
                {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}};
  EXPECT_TRUE(ConfigFromEnv(torchrun.fn()).ok());
  Env agreeing{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"}}};
  EXPECT_TRUE(ConfigFromEnv(agreeing.fn()).ok());
}

// A misspelt BRAID_ variable, or a Horovod one with a braid equivalent, is a warning naming
// what to set instead; braid's own names and everything else are not.
TEST(ConfigWarningsTest, UnknownBraidAndHorovodVariablesAreNamedWithWhatToSet) {
  EXPECT_EQ(EnvironmentWarnings({"BRAID_COMPRESION", "BRAID_FUSION_THRESHOLD_MB", "BRAID_TIMEOUT_S",
                                 "BRAID_RANK", "BRAID_XYZZY_PLUGH_FOO", "HOROVOD_CYCLE_TIME",
                                 "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_WITH_PYTORCH",
                                 "PATH"}),
            (std::vector<std::string>{
                "BRAID_COMPRESION is not a braid variable and is ignored: did you mean "
                "BRAID_COMPRESSION?",
                "BRAID_FUSION_THRESHOLD_MB is not a braid variable and is ignored: did you "
                "mean BRAID_FUSION_THRESHOLD?",
                "BRAID_XYZZY_PLUGH_FOO is not a braid variable and is ignored ("
                "docs/configuration.md lists them)",
                "HOROVOD_CYCLE_TIME is Horovod's and braid ignores it: set BRAID_CYCLE_TIME_MS "
                "(milliseconds, as Horovod's) instead",
                "HOROVOD_STALL_CHECK_TIME_SECONDS is Horovod's and braid ignores it: set "
                "BRAID_STALL_CHECK_S (seconds, as Horovod's) instead"}));
  // Every variable the parser reads, and every flag's, is known: none warns.
  std::vector<std::string> names(KnownBraidVariables());
  for (const SettingFlag& f : SettingFlags()) names.push_back(f.variable);
  EXPECT_EQ(EnvironmentWarnings(names), std::vector<std::string>{});
  EXPECT_GT(KnownBraidVariables().size(), 25u);
}

TEST(LaunchInfoTest, LocalRankOutsideLocalSizeIsAnError) {
  Env env{{{"BRAID_RANK", "0"}, {"BRAID_SIZE", "2"}, {"BRAID_LOCAL_RANK", "2"},
           {"BRAID_LOCAL_SIZE", "2"}}};
  EXPECT_EQ(LaunchInfoFromEnv(env.fn()).status().message(),
            "BRAID_LOCAL_RANK=2 is outside BRAID_LOCAL_SIZE=2");
  Env bad{{{"BRAID_RANK", "0"}, {"BRAID_SIZE", "2"}, {"BRAID_LOCAL_RANK", "0"},
           {"BRAID_LOCAL_SIZE", "2.0"}}};
  EXPECT_EQ(LaunchInfoFromEnv(bad.fn()).status().message(),
            "BRAID_LOCAL_SIZE must be an integer, got '2.0'");
}

TEST(ConfigTest, DefaultsAndOverrides) {
  Env empty;
  auto d = ConfigFromEnv(empty.fn());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->cycle_time, absl::Milliseconds(1));
  EXPECT_EQ(d->coordinator_port, 29600);
  EXPECT_EQ(d->timeout, absl::Seconds(60));
  EXPECT_EQ(d->compression, "none");
  // Job-wide settings are unset unless their variable is: the coordinator decides them
  // (its defaults are coordinator::DefaultJobSettings, tested with the rendezvous).
  EXPECT_FALSE(d->job.fusion_threshold_bytes.has_value());
  EXPECT_TRUE(d->pipelined_copy);
  EXPECT_EQ(d->loop_cpu, "auto");
  EXPECT_FALSE(d->job.cache_capacity.has_value());
  EXPECT_FALSE(d->job.heartbeat_timeout.has_value());
  EXPECT_FALSE(d->job.stall_check.has_value());
  EXPECT_FALSE(d->job.stall_shutdown.has_value());
  EXPECT_EQ(ToProto(d->job).ByteSizeLong(), 0u);
  Env set{{{"BRAID_TIMEOUT_S", "2.5"}, {"BRAID_FUSION_THRESHOLD", "0"}, {"BRAID_COORDINATOR", "h:1"},
           {"BRAID_COMPRESSION", "fp16"}, {"BRAID_COORDINATOR_PORT", "29700"},
           {"BRAID_STALL_CHECK_S", "1.5"}, {"BRAID_STALL_SHUTDOWN_S", "0"},
           {"BRAID_CACHE_CAPACITY", "5"}, {"BRAID_HEARTBEAT_TIMEOUT_S", "2"},
           {"BRAID_CYCLE_TIME_MS", "3"}, {"BRAID_UCX_PEER_ERROR_HANDLING", "1"},
           {"BRAID_PIPELINED_COPY", "0"}, {"BRAID_LOOP_CPU", "none"},
           {"BRAID_RING_CHUNK_BYTES", "65536"}, {"BRAID_RING_WINDOW", "8"},
           {"BRAID_AUTOTUNE", "1"}, {"BRAID_AUTOTUNE_LOG", "/tmp/tune.csv"}}};
  auto s = ConfigFromEnv(set.fn());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->timeout, absl::Milliseconds(2500));
  EXPECT_EQ(s->coordinator, "h:1");
  EXPECT_EQ(s->compression, "fp16");
  EXPECT_EQ(s->coordinator_port, 29700);
  EXPECT_EQ(s->cycle_time, absl::Milliseconds(3));
  EXPECT_TRUE(s->ucx_peer_error_handling);
  EXPECT_FALSE(s->pipelined_copy);
  EXPECT_EQ(s->loop_cpu, "none");
  EXPECT_EQ(s->job.fusion_threshold_bytes, 0);
  EXPECT_EQ(s->job.cache_capacity, 5);
  EXPECT_EQ(s->job.stall_check, absl::Milliseconds(1500));
  EXPECT_EQ(s->job.stall_shutdown, absl::ZeroDuration());
  EXPECT_EQ(s->job.heartbeat_timeout, absl::Seconds(2));
  proto::JobSettings p = ToProto(s->job);
  EXPECT_TRUE(p.has_fusion_threshold_bytes());
  EXPECT_EQ(p.fusion_threshold_bytes(), 0);
  EXPECT_EQ(p.stall_check_ms(), 1500);
  EXPECT_TRUE(p.has_stall_shutdown_ms());
  EXPECT_EQ(p.heartbeat_timeout_ms(), 2000);
  EXPECT_EQ(p.cache_capacity(), 5);
  EXPECT_EQ(p.ring_chunk_bytes(), 65536);
  EXPECT_EQ(p.ring_window(), 8);
  EXPECT_EQ(p.autotune(), 1);
  EXPECT_EQ(s->autotune_log_path, "/tmp/tune.csv");
  Env bad{{{"BRAID_TIMEOUT_S", "0"}}};
  EXPECT_EQ(ConfigFromEnv(bad.fn()).status().message(),
            "BRAID_TIMEOUT_S must be a positive number of seconds, got '0'");
  Env port{{{"BRAID_COORDINATOR_PORT", "70000"}}};
  EXPECT_EQ(ConfigFromEnv(port.fn()).status().message(),
            "BRAID_COORDINATOR_PORT must be in [1, 65535], got 70000");
}

// One grammar: every bad value is InvalidArgument naming the variable and the value. A
// parser that accepted any of these (NaN, Inf, negative, meaningless zero, a float where an
// integer is meant, a truncating float, an out-of-range port) fails here.
TEST(ConfigTest, BadValuesAreNamedErrors) {
  const std::pair<std::pair<const char*, const char*>, const char*> cases[] = {
      {{"BRAID_TIMEOUT_S", "nan"}, "BRAID_TIMEOUT_S must be a positive number of seconds, got 'nan'"},
      {{"BRAID_TIMEOUT_S", "inf"}, "BRAID_TIMEOUT_S must be a positive number of seconds, got 'inf'"},
      {{"BRAID_TIMEOUT_S", "-1"}, "BRAID_TIMEOUT_S must be a positive number of seconds, got '-1'"},
      {{"BRAID_TIMEOUT_S", "1e3"}, "BRAID_TIMEOUT_S must be a positive number of seconds, got '1e3'"},
      {{"BRAID_TIMEOUT_S", " 5"}, "BRAID_TIMEOUT_S must be a positive number of seconds, got ' 5'"},
      {{"BRAID_TIMEOUT_S", "0.0001"}, "BRAID_TIMEOUT_S must be a whole number of milliseconds, got '0.0001'"},
      {{"BRAID_TIMEOUT_S", "99999999"}, "BRAID_TIMEOUT_S must be at most 31536000 seconds (one year), got '99999999'"},
      {{"BRAID_HEARTBEAT_TIMEOUT_S", "0"}, "BRAID_HEARTBEAT_TIMEOUT_S must be a positive number of seconds, got '0'"},
      // Shorter than four heartbeat intervals (ranks beat at most every 100 ms).
      {{"BRAID_HEARTBEAT_TIMEOUT_S", "0.1"}, "BRAID_HEARTBEAT_TIMEOUT_S must be at least 400ms (four heartbeats, which ranks send at most every 100ms), got '0.1'"},
      {{"BRAID_TIMELINE_MAX_BYTES", "100"}, "BRAID_TIMELINE_MAX_BYTES must be 0 (no limit) or at least 65536 bytes, got 100"},
      {{"BRAID_TIMELINE_MAX_BYTES", "1GiB"}, "BRAID_TIMELINE_MAX_BYTES must be an integer, got '1GiB'"},
      {{"BRAID_NEGOTIATION_TIMEOUT_S", "0"}, "BRAID_NEGOTIATION_TIMEOUT_S must be a positive number of seconds, got '0'"},
      {{"BRAID_NEGOTIATION_TIMEOUT_S", "NaN"}, "BRAID_NEGOTIATION_TIMEOUT_S must be a positive number of seconds, got 'NaN'"},
      {{"BRAID_STALL_CHECK_S", "0"}, "BRAID_STALL_CHECK_S must be a positive number of seconds, got '0'"},
      {{"BRAID_STALL_SHUTDOWN_S", "-0.5"}, "BRAID_STALL_SHUTDOWN_S must be a non-negative number of seconds, got '-0.5'"},
      {{"BRAID_FUSION_THRESHOLD", "1.5"}, "BRAID_FUSION_THRESHOLD must be an integer, got '1.5'"},
      {{"BRAID_FUSION_THRESHOLD", "-1"}, "BRAID_FUSION_THRESHOLD must be in [0, 1099511627776], got -1"},
      {{"BRAID_FUSION_THRESHOLD", "64M"}, "BRAID_FUSION_THRESHOLD must be an integer, got '64M'"},
      {{"BRAID_CYCLE_TIME_MS", "2.5"}, "BRAID_CYCLE_TIME_MS must be an integer, got '2.5'"},
      {{"BRAID_CACHE_CAPACITY", "+5"}, "BRAID_CACHE_CAPACITY must be an integer, got '+5'"},
      {{"BRAID_CACHE_CAPACITY", "99999999999999999999"}, "BRAID_CACHE_CAPACITY must be in [0, 16777216], got 99999999999999999999"},
      {{"BRAID_COORDINATOR_PORT", "0"}, "BRAID_COORDINATOR_PORT must be in [1, 65535], got 0"},
      {{"BRAID_COORDINATOR", "localhost"}, "BRAID_COORDINATOR must be HOST:PORT (a port in [1, 65535]) or unix:PATH, got 'localhost'"},
      {{"BRAID_COORDINATOR", "h:0"}, "BRAID_COORDINATOR must be HOST:PORT (a port in [1, 65535]) or unix:PATH, got 'h:0'"},
      {{"BRAID_UCX_PEER_ERROR_HANDLING", "yes"}, "BRAID_UCX_PEER_ERROR_HANDLING must be 0 or 1, got 'yes'"},
      {{"BRAID_LOOP_CPU", "-1"}, "BRAID_LOOP_CPU must be 'auto', 'none' or a CPU number from 0 to 1023, got '-1'"},
      {{"BRAID_LOOP_CPU", "1024"}, "BRAID_LOOP_CPU must be 'auto', 'none' or a CPU number from 0 to 1023, got '1024'"},
      {{"BRAID_LOOP_CPU", "+1"}, "BRAID_LOOP_CPU must be 'auto', 'none' or a CPU number from 0 to 1023, got '+1'"},
      {{"BRAID_LOOP_CPU", " 1"}, "BRAID_LOOP_CPU must be 'auto', 'none' or a CPU number from 0 to 1023, got ' 1'"},
      {{"BRAID_TEST_COMPRESSORS", "2"}, "BRAID_TEST_COMPRESSORS must be 0 or 1, got '2'"},
      {{"BRAID_GPU_DATA_PLANE", "NCCL"}, "BRAID_GPU_DATA_PLANE must be auto, nccl or host, got 'NCCL'"},
      {{"BRAID_RING_WINDOW", "0"}, "BRAID_RING_WINDOW must be in [1, 64], got 0"},
      {{"BRAID_RING_CHUNK_BYTES", "512"}, "BRAID_RING_CHUNK_BYTES must be 0 (by topology) or from 1024 to 67108864 bytes, got '512'"},
      {{"BRAID_RING_CHUNK_BYTES", "67108865"}, "BRAID_RING_CHUNK_BYTES must be in [0, 67108864], got 67108865"},
      {{"BRAID_AUTOTUNE", "yes"}, "BRAID_AUTOTUNE must be 0 or 1, got 'yes'"},
      {{"BRAID_SEED", "-3"}, "BRAID_SEED must be in [0, 9223372036854775807], got -3"},
      {{"RANK", "1.0"}, "RANK must be an integer, got '1.0'"},
      {{"WORLD_SIZE", "0"}, "WORLD_SIZE must be in [1, 65536], got 0"},
  };
  for (const auto& [var, want] : cases) {
    Env env{{{var.first, var.second}}};
    auto c = ConfigFromEnv(env.fn());
    ASSERT_FALSE(c.ok()) << var.first << "=" << var.second;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message(), want);
  }
  // Accepted forms, converted exactly.
  EXPECT_EQ(*ParseSeconds("X", "0.001", false), absl::Milliseconds(1));
  EXPECT_EQ(*ParseSeconds("X", "2.5000", false), absl::Milliseconds(2500));
  EXPECT_EQ(*ParseSeconds("X", "31536000", false), absl::Seconds(31536000));
  EXPECT_EQ(*ParseSeconds("X", "0", true), absl::ZeroDuration());
  Env hb{{{"BRAID_HEARTBEAT_TIMEOUT_S", "0.4"}, {"BRAID_NEGOTIATION_TIMEOUT_S", "5"}}};
  auto minimal = ConfigFromEnv(hb.fn());
  ASSERT_TRUE(minimal.ok()) << minimal.status();
  EXPECT_EQ(minimal->job.heartbeat_timeout, absl::Milliseconds(400));
  EXPECT_EQ(ToProto(minimal->job).negotiation_timeout_ms(), 5000);
  EXPECT_EQ(*ParseAddress("X", "[::1]:29600"), "[::1]:29600");
  EXPECT_EQ(*ParseAddress("X", "unix:/tmp/braid.sock"), "unix:/tmp/braid.sock");
  EXPECT_FALSE(ParseAddress("X", "::1:29600").ok());  // IPv6 needs brackets
  EXPECT_EQ(*ParseInteger("X", "-7", -10, 10), -7);
  // An empty value is an unset variable.
  Env blank{{{"BRAID_TIMEOUT_S", ""}}};
  EXPECT_EQ(ConfigFromEnv(blank.fn())->timeout, absl::Seconds(60));
}

// braidrun's and braid-coordinator's flags: each maps onto its variable, in the flag's
// unit, and errors name the flag.
// Note [Coordinator address]: where rank 0 hosts the coordinator under each launcher.
TEST(CoordinatorAddressTest, EachLauncher) {
  struct Case {
    const char* what;
    std::map<std::string, std::string> vars;
    std::string host, host_from;
    int port;
    std::string port_from;
  };
  const std::string hnp = "1785462784.0;tcp://198.18.0.1,10.0.0.1:45685;tcp6://[fd00::2]:41297";
  const Case cases[] = {
      {"nothing", {}, "127.0.0.1", "the default", 29600, "the default"},
      {"torchrun",
       {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "29500"}},
       "h0", "MASTER_ADDR", 45884, "MASTER_PORT"},
      {"BRAID_COORDINATOR_PORT wins over MASTER_PORT",
       {{"MASTER_PORT", "29500"}, {"BRAID_COORDINATOR_PORT", "29700"}},
       "127.0.0.1", "the default", 29700, "BRAID_COORDINATOR_PORT"},
      {"slurm across nodes",
       {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_NODES", "9"},
        {"SLURM_STEP_NODELIST", "node[003-010,12],gpu1"}},
       "node003", "SLURM_STEP_NODELIST", 29600, "the default"},
      {"slurm on one node",
       {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_NODES", "1"},
        {"SLURM_STEP_NODELIST", "vm"}},
       "127.0.0.1", "the default", 29600, "the default"},
      {"MASTER_ADDR wins over slurm",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"},
        {"SLURM_STEP_NODELIST", "n[1-2]"}, {"MASTER_ADDR", "10.1.1.1"}},
       "10.1.1.1", "MASTER_ADDR", 29600, "the default"},
      {"open mpi across nodes",
       {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_MCA_orte_num_nodes", "2"}, {"OMPI_MCA_orte_hnp_uri", hnp}},
       "198.18.0.1", "OMPI_MCA_orte_hnp_uri", 29600, "the default"},
      {"open mpi on one node",
       {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_MCA_orte_num_nodes", "1"}, {"OMPI_MCA_orte_hnp_uri", hnp}},
       "127.0.0.1", "the default", 29600, "the default"},
      {"a launcher's node list is not read under another launcher",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_NNODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}},
       "127.0.0.1", "the default", 29600, "the default"},
  };
  for (const Case& c : cases) {
    Env env{c.vars};
    auto got = ConfigFromEnv(env.fn());
    ASSERT_TRUE(got.ok()) << c.what << ": " << got.status();
    EXPECT_EQ(got->coordinator_host, c.host) << c.what;
    EXPECT_EQ(got->coordinator_host_from, c.host_from) << c.what;
    EXPECT_EQ(got->coordinator_port, c.port) << c.what;
    EXPECT_EQ(got->coordinator_port_from, c.port_from) << c.what;
  }
}

TEST(CoordinatorAddressTest, BadValuesAreNamedOnlyWhenUsed) {
  Env bad_port{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}};
  EXPECT_EQ(std::string(ConfigFromEnv(bad_port.fn()).status().message()),
            "MASTER_PORT must be in [1, 65535], got 70000");
  Env bad_list{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "2"},
                {"SLURM_STEP_NODELIST", "n[1-2"}}};
  EXPECT_EQ(std::string(ConfigFromEnv(bad_list.fn()).status().message()),
            "SLURM_STEP_NODELIST 'n[1-2': unbalanced brackets");
  // Under braidrun (BRAID_COORDINATOR set) neither is read.
  Env braidrun{{{"BRAID_COORDINATOR", "h:1"}, {"MASTER_PORT", "x"}, {"SLURM_PROCID", "0"},
                {"SLURM_NNODES", "2"}, {"SLURM_STEP_NODELIST", "n[1-2"}}};
  EXPECT_TRUE(ConfigFromEnv(braidrun.fn()).ok());
}

TEST(CoordinatorAddressTest, DerivedPortIsOneToOneAndNeverTheSame) {
  std::vector<bool> taken(65536, false);
  for (int p = 1024; p <= 65535; ++p) {
    const int d = DerivedCoordinatorPort(p);
    ASSERT_GE(d, 1024) << p;
    ASSERT_LE(d, 65535) << p;
    ASSERT_NE(d, p);
    ASSERT_FALSE(taken[d]) << p << " -> " << d << " twice";
    taken[d] = true;
  }
  EXPECT_EQ(DerivedCoordinatorPort(29500), 45884);
  EXPECT_EQ(DerivedCoordinatorPort(49152), 1024);
  EXPECT_EQ(DerivedCoordinatorPort(65535), 17407);
}

TEST(CoordinatorAddressTest, FirstHostOfNodeList) {
  const std::pair<const char*, const char*> good[] = {
      {"h0", "h0"},           {"h[0-3]", "h0"},       {"a,b", "a"},
      {"node[003-010,12],gpu1", "node003"}, {"h[2,5-6]", "h2"}, {"rack[1-2]-n[3-4]", "rack1-n3"},
      {" vm ", "vm"},
  };
  for (const auto& [list, want] : good) {
    auto got = FirstHostOfNodeList("L", list);
    ASSERT_TRUE(got.ok()) << list << ": " << got.status();
    EXPECT_EQ(*got, want) << list;
  }
  for (const char* list : {"h[0-3", "", "h[]", "h]0[", ","}) {
    EXPECT_EQ(FirstHostOfNodeList("L", list).status().code(), absl::StatusCode::kInvalidArgument)
        << list;
  }
}

TEST(CoordinatorAddressTest, FirstAddressOfOmpiUri) {
  EXPECT_EQ(*FirstAddressOfOmpiUri("U", "1.0;tcp://10.0.0.1:5"), "10.0.0.1");
  EXPECT_EQ(*FirstAddressOfOmpiUri("U", "1.0;tcp6://[::1]:5;tcp://a,b:5"), "a");
  EXPECT_EQ(FirstAddressOfOmpiUri("U", "1.0;tcp6://[::1]:5").status().message(),
            "U '1.0;tcp6://[::1]:5' has no tcp:// address");
}

// The registration deadline: BRAID_REGISTER_TIMEOUT_S as given (shorter than 60 s too);
// else BRAID_TIMEOUT_S with a 60 s floor.
TEST(ConfigTest, RegistrationTimeout) {
  auto from = [](std::map<std::string, std::string> vars) {
    Env env{std::move(vars)};
    auto c = SettingsFromEnv(env.fn());
    EXPECT_TRUE(c.ok()) << c.status();
    return RegistrationTimeout(*c);
  };
  EXPECT_EQ(from({}), absl::Seconds(60));
  EXPECT_EQ(from({{"BRAID_TIMEOUT_S", "5"}}), absl::Seconds(60));
  EXPECT_EQ(from({{"BRAID_TIMEOUT_S", "90"}}), absl::Seconds(90));
  EXPECT_EQ(from({{"BRAID_REGISTER_TIMEOUT_S", "2.5"}}), absl::Milliseconds(2500));
  EXPECT_EQ(from({{"BRAID_REGISTER_TIMEOUT_S", "300"}, {"BRAID_TIMEOUT_S", "90"}}),
            absl::Seconds(300));
  Env zero{{{"BRAID_REGISTER_TIMEOUT_S", "0"}}};
  EXPECT_EQ(SettingsFromEnv(zero.fn()).status().message(),
            "BRAID_REGISTER_TIMEOUT_S must be a positive number of seconds, got '0'");
  const SettingFlag* flag = FindSettingFlag("--register-timeout");
  ASSERT_NE(flag, nullptr);
  EXPECT_STREQ(flag->variable, "BRAID_REGISTER_TIMEOUT_S");
  // An elastic job's rank (BRAID_ELASTIC=1): BRAID_ELASTIC_TIMEOUT_S, 600 by default, unless
  // BRAID_REGISTER_TIMEOUT_S is set.
  EXPECT_EQ(from({{"BRAID_ELASTIC", "1"}}), absl::Seconds(600));
  EXPECT_EQ(from({{"BRAID_ELASTIC", "1"}, {"BRAID_ELASTIC_TIMEOUT_S", "45"}}), absl::Seconds(45));
  EXPECT_EQ(from({{"BRAID_ELASTIC", "0"}, {"BRAID_ELASTIC_TIMEOUT_S", "45"}}), absl::Seconds(60));
  EXPECT_EQ(from({{"BRAID_ELASTIC", "1"}, {"BRAID_REGISTER_TIMEOUT_S", "7"}}), absl::Seconds(7));
  Env bad{{{"BRAID_ELASTIC_TIMEOUT_S", "soon"}}};
  EXPECT_EQ(SettingsFromEnv(bad.fn()).status().message(),
            "BRAID_ELASTIC_TIMEOUT_S must be a positive number of seconds, got 'soon'");
}

TEST(SettingFlagsTest, FlagsMapOntoVariablesAndErrorsNameTheFlag) {
  const SettingFlag* mb = FindSettingFlag("--fusion-threshold-mb");
  ASSERT_NE(mb, nullptr);
  EXPECT_STREQ(mb->variable, "BRAID_FUSION_THRESHOLD");
  EXPECT_EQ(*SettingFlagValue(*mb, "2"), "2097152");
  EXPECT_EQ(*SettingFlagValue(*mb, "0.5"), "524288");
  EXPECT_EQ(*SettingFlagValue(*mb, "0"), "0");
  EXPECT_EQ(SettingFlagValue(*mb, "0.1").status().message(),
            "--fusion-threshold-mb 0.1 MiB is not a whole number of bytes");
  EXPECT_EQ(SettingFlagValue(*mb, "-1").status().message(),
            "--fusion-threshold-mb must be a non-negative number of MiB, got '-1'");
  EXPECT_EQ(SettingFlagValue(*mb, "2000000").status().message(),
            "--fusion-threshold-mb must be at most 1048576 MiB, got '2000000'");
  EXPECT_EQ(*SettingFlagValue(*FindSettingFlag("--timeout"), "2.5"), "2.5");
  EXPECT_EQ(FindSettingFlag("--nope"), nullptr);
  for (const SettingFlag& f : SettingFlags()) {
    EXPECT_EQ(FindSettingFlag(f.flag), &f);
    EXPECT_EQ(std::string(f.variable).rfind("BRAID_", 0), 0u) << f.flag;
  }
  // The variable's grammar, reported under the flag's name.
  Env env{{{"BRAID_CYCLE_TIME_MS", "1.5"}}};
  auto c = SettingsFromEnv(env.fn(), [](absl::string_view v) {
    return v == "BRAID_CYCLE_TIME_MS" ? std::string("--cycle-time-ms") : std::string(v);
  });
  EXPECT_EQ(c.status().message(), "--cycle-time-ms must be an integer, got '1.5'");
  Env comp{{{"BRAID_COMPRESSION", "fp5"}}};
  EXPECT_EQ(SettingsFromEnv(comp.fn()).status().message(),
            absl::StrCat("BRAID_COMPRESSION: compression 'fp5': unknown method 'fp5'; valid methods: ",
                         absl::StrJoin(compression::CompressionMethods(), ", ")));
  // A plan (Note [Compression plans]) is kept canonical; a bad one names its key.
  Env plan{{{"BRAID_COMPRESSION", R"({"*.bias": "none", "*": "fp4:chunk=128"})"}}};
  auto p = SettingsFromEnv(plan.fn());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->compression,
            R"({"*.bias":"none","*":"fp4","$min_elements":1024,"$min_compression_rate":2.0})");
  Env bad_plan{{{"BRAID_COMPRESSION", R"({"*": "fp5"})"}}};
  EXPECT_TRUE(absl::StartsWith(SettingsFromEnv(bad_plan.fn()).status().message(),
                               "BRAID_COMPRESSION: compression plan, key '*': compression 'fp5'"))
      << SettingsFromEnv(bad_plan.fn()).status();
  // SettingsFromEnv leaves the launch info alone: a bad RANK is not the tools' business.
  Env rank{{{"RANK", "x"}}};
  EXPECT_TRUE(SettingsFromEnv(rank.fn()).ok());
}

}  // namespace
}  // namespace braid
