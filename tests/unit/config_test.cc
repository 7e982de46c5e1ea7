// Rank assignment from each launcher's variables, and the configuration parser.
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "runtime/config.h"

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
       {3, 4, 1, 2, "braid"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}},
       {1, 2, 1, 2, "torchrun"}},
      {{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}},
       {5, 8, 1, 4, "slurm"}},
      {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}},
       {2, 3, 0, 1, "openmpi"}},
      // braid's own variables win over a launcher's.
      {{{"BRAID_RANK", "0"}, {"BRAID_SIZE", "2"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}}, {0, 2, -1, 0, "braid"}},
      // Slurm's uneven "2(x3)" local size is left to the coordinator (by host).
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "2(x3)"}},
       {0, 6, -1, 0, "slurm"}},
      {{}, {-1, 0, -1, 0, ""}},
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

TEST(ConfigTest, DefaultsAndOverrides) {
  Env empty;
  auto d = ConfigFromEnv(empty.fn());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->fusion_threshold_bytes, 64 << 20);
  EXPECT_EQ(d->cycle_time, absl::Milliseconds(1));
  EXPECT_EQ(d->cache_capacity, 1024);
  EXPECT_EQ(d->coordinator_port, 29600);
  EXPECT_EQ(d->timeout, absl::Seconds(60));
  EXPECT_EQ(d->heartbeat_timeout, absl::Seconds(10));
  EXPECT_EQ(d->stall_check, absl::Seconds(60));
  EXPECT_EQ(d->stall_shutdown, absl::ZeroDuration());
  Env set{{{"BRAID_TIMEOUT_S", "2.5"}, {"BRAID_FUSION_THRESHOLD", "0"}, {"BRAID_COORDINATOR", "h:1"},
           {"BRAID_COMPRESSION", "fp16"}, {"BRAID_COORDINATOR_PORT", "29700"}, {"MASTER_ADDR", "10.0.0.1"}}};
  auto s = ConfigFromEnv(set.fn());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->timeout, absl::Milliseconds(2500));
  EXPECT_EQ(s->fusion_threshold_bytes, 0);
  EXPECT_EQ(s->coordinator, "h:1");
  EXPECT_EQ(s->compression, "fp16");
  EXPECT_EQ(s->coordinator_port, 29700);
  EXPECT_EQ(s->coordinator_host, "10.0.0.1");
  Env bad{{{"BRAID_TIMEOUT_S", "0"}}};
  EXPECT_EQ(ConfigFromEnv(bad.fn()).status().message(),
            "BRAID_TIMEOUT_S must be a positive number of seconds, got '0'");
  Env port{{{"BRAID_COORDINATOR_PORT", "70000"}}};
  EXPECT_EQ(ConfigFromEnv(port.fn()).status().message(),
            "BRAID_COORDINATOR_PORT must be in [0, 65535], got 70000");
}

}  // namespace
}  // namespace braid
