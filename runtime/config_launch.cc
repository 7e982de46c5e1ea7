// Where the coordinator is when no launcher of braid's said (runtime/config.h: ConfigFromEnv):
// Note [Coordinator address], from torchrun's MASTER_ADDR/MASTER_PORT, Slurm's node list or
// Open MPI's HNP URI.
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

absl::StatusOr<RuntimeConfig> ConfigFromEnv(const Getenv& env) {
  auto launch = LaunchInfoFromEnv(env);
  if (!launch.ok()) return launch.status();
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
