// What the launcher says of this process (runtime/config.h): its place in the job
// (LaunchInfoFromEnv: braidrun's, torchrun's, Open MPI's or Slurm's variables), and where the
// coordinator is when no launcher of braid's said (ConfigFromEnv): Note [Coordinator
// address], from torchrun's MASTER_ADDR/MASTER_PORT, Slurm's node list or Open MPI's HNP URI.
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/config.h"

namespace braid {
namespace {

struct Scheme {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  // Whether the launcher always sets the size with the rank, so a rank without it is a
  // hand-made environment missing a variable: torchrun and mpirun do; braidrun's rank may
  // take the size from a standalone coordinator (BRAID_COORDINATOR, checked in
  // ConfigFromEnv), and a Slurm batch script has SLURM_PROCID without SLURM_NTASKS.
  bool size_required;
};

// Reads an integer variable into *out when it is set; false when unset.
absl::StatusOr<bool> ReadInt(const Getenv& env, const char* name, int64_t* out) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return false;
  auto parsed = ParseInteger(name, v, INT64_MIN, INT64_MAX);
  if (!parsed.ok()) return parsed.status();
  *out = *parsed;
  return true;
}

// The launcher's name for the job (LaunchInfo::job_id), whichever launcher set one.
std::string LauncherJobId(const Getenv& env) {
  auto get = [&env](const char* name) -> std::string {
    const char* v = env(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  // torchrun's static rendezvous names every run "none": no identity.
  if (std::string id = get("TORCHELASTIC_RUN_ID"); !id.empty() && id != "none") {
    return absl::StrCat("torchrun:", id);
  }
  if (std::string id = get("SLURM_JOB_ID"); !id.empty()) {
    return absl::StrCat("slurm:", id, ".", get("SLURM_STEP_ID"));
  }
  if (std::string id = get("OMPI_MCA_ess_base_jobid"); !id.empty()) {
    return absl::StrCat("openmpi:", id);
  }
  if (std::string id = get("PMIX_NAMESPACE"); !id.empty()) return absl::StrCat("pmix:", id);
  return "";
}

// braidrun's number for this process (BRAID_WORKER); -1 when unset.
absl::StatusOr<int> LauncherWorker(const Getenv& env) {
  int64_t worker = -1;
  auto has_worker = ReadInt(env, "BRAID_WORKER", &worker);
  if (!has_worker.ok()) return has_worker.status();
  if (*has_worker && (worker < 0 || worker >= (1 << 16))) {
    return absl::InvalidArgumentError(
        absl::StrCat("BRAID_WORKER must be in [0, 65536), got ", worker));
  }
  return static_cast<int>(worker);
}

}  // namespace

absl::StatusOr<LaunchInfo> LaunchInfoFromEnv(const Getenv& env) {
  static const Scheme kSchemes[] = {
      {"braid", "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE", false},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", true},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
       false},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE", true},
  };
  LaunchInfo info;
  for (const Scheme& s : kSchemes) {
    int64_t rank = -1, size = 0;
    auto has_rank = ReadInt(env, s.rank, &rank);
    if (!has_rank.ok()) return has_rank.status();
    auto has_size = ReadInt(env, s.size, &size);
    if (!has_size.ok()) return has_size.status();
    if (!*has_rank && !*has_size) continue;
    if (*has_rank && !*has_size && s.size_required) {
      return absl::InvalidArgumentError(absl::StrCat(
          s.rank, "=", rank, " is set but ", s.size, " is not: set both (", s.size,
          " is the number of ranks in the job)"));
    }
    if (*has_size && (size < 1 || size > (1 << 16))) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.size, " must be in [1, 65536], got ", size));
    }
    if (*has_rank && (rank < 0 || (*has_size && rank >= size) || rank >= (1 << 16))) {
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
    if (!has_ls.ok() && absl::string_view(s.local_size) != "SLURM_NTASKS_PER_NODE") {
      return has_ls.status();
    }
    const bool local_known = has_ls.ok() && *has_ls && *has_lr && ls > 0 && ls <= (1 << 16) &&
                             lr >= 0 && lr < ls;
    if (has_ls.ok() && *has_ls && *has_lr && !local_known) {
      return absl::InvalidArgumentError(absl::StrCat(s.local_rank, "=", lr, " is outside ",
                                                     s.local_size, "=", ls));
    }
    info.local_rank = local_known ? static_cast<int>(lr) : -1;
    info.local_size = local_known ? static_cast<int>(ls) : 0;
    break;
  }
  info.job_id = LauncherJobId(env);
  auto worker = LauncherWorker(env);
  if (!worker.ok()) return worker.status();
  info.worker = *worker;
  return info;
}


int DerivedCoordinatorPort(int p) { return 1024 + (p - 1024 + 16384 + 64512) % 64512; }

absl::StatusOr<std::string> FirstHostOfNodeList(absl::string_view what, absl::string_view list) {
  // The first entry: up to the first comma outside brackets.
  int depth = 0;
  size_t end = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']' && --depth < 0) break;
    if (list[end] == ',' && depth == 0) break;
  }
  absl::string_view entry = absl::StripAsciiWhitespace(list.substr(0, end));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", list, "': ", why));
  };
  if (depth != 0) return bad("unbalanced brackets");
  // Each bracket group "[003-010,12]" becomes its first number, zero padding kept.
  std::string host;
  while (!entry.empty()) {
    const size_t open = entry.find('[');
    absl::StrAppend(&host, entry.substr(0, open));
    if (open == absl::string_view::npos) break;
    const size_t close = entry.find(']', open);
    if (close == absl::string_view::npos) return bad("unbalanced brackets");
    absl::string_view group = entry.substr(open + 1, close - open - 1);
    absl::string_view first = group.substr(0, group.find_first_of(",-"));
    if (first.empty()) return bad("an empty range");
    absl::StrAppend(&host, first);
    entry.remove_prefix(close + 1);
  }
  if (host.empty()) return bad("no host");
  return host;
}

absl::StatusOr<std::string> FirstAddressOfOmpiUri(absl::string_view what, absl::string_view uri) {
  for (absl::string_view part : absl::StrSplit(uri, ';')) {
    if (!absl::ConsumePrefix(&part, "tcp://")) continue;
    const size_t colon = part.rfind(':');
    absl::string_view addresses = part.substr(0, colon);
    absl::string_view first = addresses.substr(0, addresses.find(','));
    if (!first.empty()) return std::string(first);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", uri, "' has no tcp:// address"));
}

namespace {

// Note [Coordinator address]: the host rank 0 binds and the other ranks connect to, and the
// port when BRAID_COORDINATOR_PORT did not set it.
absl::Status ResolveCoordinatorAddress(const Getenv& env, RuntimeConfig* c) {
  auto set = [](const Getenv& env, const char* name) {
    const char* v = env(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  auto more_than_one = [&](const char* name) {
    const char* v = set(env, name);
    int64_t n = 0;
    return v != nullptr && absl::SimpleAtoi(v, &n) && n > 1;
  };
  if (const char* addr = set(env, "MASTER_ADDR")) {
    c->coordinator_host = addr;
    c->coordinator_host_from = "MASTER_ADDR";
  } else if (c->launch.source == "slurm" && set(env, "SLURM_STEP_NODELIST") &&
             (more_than_one("SLURM_STEP_NUM_NODES") || more_than_one("SLURM_NNODES"))) {
    auto host = FirstHostOfNodeList("SLURM_STEP_NODELIST", set(env, "SLURM_STEP_NODELIST"));
    if (!host.ok()) return host.status();
    c->coordinator_host = *host;
    c->coordinator_host_from = "SLURM_STEP_NODELIST";
  } else if (c->launch.source == "openmpi" && set(env, "OMPI_MCA_orte_hnp_uri") &&
             more_than_one("OMPI_MCA_orte_num_nodes")) {
    auto host = FirstAddressOfOmpiUri("OMPI_MCA_orte_hnp_uri", set(env, "OMPI_MCA_orte_hnp_uri"));
    if (!host.ok()) return host.status();
    c->coordinator_host = *host;
    c->coordinator_host_from = "OMPI_MCA_orte_hnp_uri";
  }
  const char* master_port = set(env, "MASTER_PORT");
  if (c->coordinator_port_from == "the default" && master_port != nullptr) {
    auto p = ParsePort("MASTER_PORT", master_port, /*zero_allowed=*/false);
    if (!p.ok()) return p.status();
    c->coordinator_port = DerivedCoordinatorPort(*p);
    c->coordinator_port_from = "MASTER_PORT";
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// torchrun's RANK/WORLD_SIZE left in the environment of processes mpirun started (`-x RANK=0
// -x WORLD_SIZE=1`, or a shell that had them) win over Open MPI's own variables
// (LaunchInfoFromEnv's order, right for torchrun started by mpirun), and split one job into
// worlds that each train alone. torchrun itself always sets TORCHELASTIC_RUN_ID, so
// torchrun's variables without it beside Open MPI's that disagree are a mistake. (Not
// Slurm's: an sbatch script's own SLURM_PROCID and SLURM_NTASKS stay beside ranks started
// by hand.)
absl::Status CheckAgainstOpenMpi(const Getenv& env, const LaunchInfo& launch) {
  if (launch.source != "torchrun" || env("TORCHELASTIC_RUN_ID") != nullptr) {
    return absl::OkStatus();
  }
  const char* rank_text = env("OMPI_COMM_WORLD_RANK");
  const char* size_text = env("OMPI_COMM_WORLD_SIZE");
  int64_t rank = -1, size = 0;
  if (rank_text == nullptr || size_text == nullptr || !absl::SimpleAtoi(rank_text, &rank) ||
      !absl::SimpleAtoi(size_text, &size) || (rank == launch.rank && size == launch.size)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "RANK=", launch.rank, " and WORLD_SIZE=", launch.size, " (torchrun's variables, without "
      "torchrun's TORCHELASTIC_RUN_ID) disagree with mpirun's OMPI_COMM_WORLD_RANK=", rank,
      " and OMPI_COMM_WORLD_SIZE=", size, ": under mpirun, unset RANK and WORLD_SIZE (braid "
      "reads Open MPI's own)"));
}

}  // namespace

absl::StatusOr<RuntimeConfig> ConfigFromEnv(const Getenv& env) {
  auto launch = LaunchInfoFromEnv(env);
  if (!launch.ok()) return launch.status();
  if (absl::Status s = CheckAgainstOpenMpi(env, *launch); !s.ok()) return s;
  auto c = SettingsFromEnv(env);
  if (!c.ok()) return c.status();
  c->launch = *launch;
  if (c->coordinator.empty() && launch->source == "braid" && launch->rank >= 0 &&
      launch->size == 0) {
    // Without a standalone coordinator to take the world size from, nobody knows it.
    return absl::InvalidArgumentError(absl::StrCat(
        "BRAID_RANK=", launch->rank, " is set but neither BRAID_SIZE nor BRAID_COORDINATOR: "
        "set BRAID_SIZE (the number of ranks in the job), or BRAID_COORDINATOR to a "
        "braid-coordinator started with --size"));
  }
  if (c->coordinator.empty()) {
    absl::Status s = ResolveCoordinatorAddress(env, &*c);
    if (!s.ok()) return s;
  }
  return c;
}

}  // namespace braid
