#include "runtime/config.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/registry.h"

namespace braid {
namespace {

using Getenv = std::function<const char*(const char*)>;

// Reads an integer variable into *out when it is set; false when unset.
absl::StatusOr<bool> ReadInt(const Getenv& env, const char* name, int64_t* out) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return false;
  if (!absl::SimpleAtoi(v, out)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be an integer, got '", v, "'"));
  }
  return true;
}

absl::StatusOr<bool> ReadSeconds(const Getenv& env, const char* name, absl::Duration* out,
                                 bool allow_zero) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return false;
  double s = 0;
  if (!absl::SimpleAtod(v, &s) || s < 0 || (!allow_zero && s == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be a ", allow_zero ? "non-negative" : "positive", " number of seconds, got '",
        v, "'"));
  }
  *out = absl::Seconds(s);
  return true;
}

struct Scheme {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

}  // namespace

absl::StatusOr<LaunchInfo> LaunchInfoFromEnv(const Getenv& env) {
  static const Scheme kSchemes[] = {
      {"braid", "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  LaunchInfo info;
  for (const Scheme& s : kSchemes) {
    int64_t rank = -1, size = 0;
    auto has_rank = ReadInt(env, s.rank, &rank);
    if (!has_rank.ok()) return has_rank.status();
    auto has_size = ReadInt(env, s.size, &size);
    if (!has_size.ok()) return has_size.status();
    if (!*has_rank && !*has_size) continue;
    if (*has_size && size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(s.size, " must be at least 1, got ", size));
    }
    if (*has_rank && (rank < 0 || (*has_size && rank >= size))) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.rank, "=", rank, " is outside the world of size ", size));
    }
    info.source = s.source;
    info.rank = *has_rank ? static_cast<int>(rank) : -1;
    info.size = *has_size ? static_cast<int>(size) : 0;
    int64_t lr = -1, ls = 0;
    auto has_lr = ReadInt(env, s.local_rank, &lr);
    if (!has_lr.ok()) return has_lr.status();
    // Slurm's SLURM_NTASKS_PER_NODE reads "2(x3)" on uneven layouts: an unreadable local
    // size is left to the coordinator, which numbers local ranks by host.
    auto has_ls = ReadInt(env, s.local_size, &ls);
    const bool local_known = has_ls.ok() && *has_ls && *has_lr && ls > 0;
    info.local_rank = local_known ? static_cast<int>(lr) : -1;
    info.local_size = local_known ? static_cast<int>(ls) : 0;
    if (info.local_size == 0) info.local_rank = -1;
    return info;
  }
  return info;
}

absl::StatusOr<RuntimeConfig> ConfigFromEnv(const Getenv& env) {
  RuntimeConfig c;
  auto launch = LaunchInfoFromEnv(env);
  if (!launch.ok()) return launch.status();
  c.launch = *launch;
  auto str = [&](const char* name, std::string* out) {
    const char* v = env(name);
    if (v != nullptr && *v != '\0') *out = v;
  };
  str("BRAID_COORDINATOR", &c.coordinator);
  str("MASTER_ADDR", &c.coordinator_host);
  str("BRAID_JOB_SECRET", &c.job_secret);
  str("BRAID_TIMELINE", &c.timeline_path);
  str("BRAID_LOG_LEVEL", &c.log_level);
  str("BRAID_COMPRESSION", &c.compression);
  int64_t v = 0;
  absl::StatusOr<bool> has;
#define BRAID_READ_INT(NAME, MIN, MAX, TARGET)                                              \
  has = ReadInt(env, NAME, &v);                                                           \
  if (!has.ok()) return has.status();                                                     \
  if (*has) {                                                                             \
    if (v < (MIN) || v > (MAX)) {                                                         \
      return absl::InvalidArgumentError(                                                  \
          absl::StrCat(NAME, " must be in [", (MIN), ", ", (MAX), "], got ", v));         \
    }                                                                                     \
    TARGET;                                                                               \
  }
  BRAID_READ_INT("BRAID_COORDINATOR_PORT", 0, 65535, c.coordinator_port = static_cast<int>(v));
  BRAID_READ_INT("BRAID_FUSION_THRESHOLD", 0, int64_t{1} << 40, c.fusion_threshold_bytes = v);
  BRAID_READ_INT("BRAID_CYCLE_TIME_MS", 0, 60000, c.cycle_time = absl::Milliseconds(v));
  BRAID_READ_INT("BRAID_CACHE_CAPACITY", 0, 1 << 24, c.cache_capacity = static_cast<int>(v));
  BRAID_READ_INT("BRAID_UCX_PEER_ERROR_HANDLING", 0, 1, c.ucx_peer_error_handling = v != 0);
  BRAID_READ_INT("BRAID_SEED", 0, int64_t{1} << 62, c.seed = static_cast<uint64_t>(v));
  BRAID_READ_INT("BRAID_TEST_COMPRESSORS", 0, 1, c.test_compressors = v != 0);
#undef BRAID_READ_INT
  for (auto [name, target, zero_ok] :
       {std::tuple{"BRAID_STALL_CHECK_S", &c.stall_check, false},
        std::tuple{"BRAID_STALL_SHUTDOWN_S", &c.stall_shutdown, true},
        std::tuple{"BRAID_TIMEOUT_S", &c.timeout, false},
        std::tuple{"BRAID_HEARTBEAT_TIMEOUT_S", &c.heartbeat_timeout, false}}) {
    auto r = ReadSeconds(env, name, target, zero_ok);
    if (!r.ok()) return r.status();
  }
  compression::RegistryOptions ro;
  ro.test_methods = c.test_compressors;
  auto spec = compression::ParseCompressionSpec(c.compression, ro);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("BRAID_COMPRESSION: ", spec.status().message()));
  }
  c.compression = spec->canonical;
  return c;
}

absl::StatusOr<RuntimeConfig> ConfigFromProcessEnv() {
  return ConfigFromEnv([](const char* n) { return std::getenv(n); });
}

}  // namespace braid
