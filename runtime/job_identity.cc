#include "runtime/job_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "common/status_macros.h"

namespace braid {
namespace {

// mkdir -p with mode 0700 for the directories it creates.
absl::Status MakePrivateDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string prefix = dir.substr(0, i);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create '", prefix, "': ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string JobIdentity(const RuntimeConfig& config, const LaunchInfo& launch) {
  // Length-prefixed fields: no two different identities serialize alike.
  // Not the world size: ranks that disagree on it must meet, so the coordinator can refuse
  // them naming both sizes, rather than be refused for a wrong secret that names neither.
  std::string id = "braid job identity v2";
  for (const std::string& field : {launch.source, launch.job_id, config.coordinator_host,
                                   absl::StrCat(config.coordinator_port)}) {
    absl::StrAppend(&id, "|", field.size(), ":", field);
  }
  return id;
}

absl::StatusOr<JobSecret> ResolveJobSecret(const RuntimeConfig& config, const LaunchInfo& launch,
                                           bool alone) {
  if (!config.job_secret.empty()) return JobSecret{config.job_secret, "BRAID_JOB_SECRET(_FILE)"};
  if (alone) return JobSecret{RandomSecret(), "random"};
  if (!config.coordinator.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BRAID_COORDINATOR is set (", config.coordinator,
        ") but no job secret: set BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE to that "
        "coordinator's secret"));
  }
  if (config.user_key_file.empty()) {
    return absl::InvalidArgumentError(
        "no job secret and no home directory to keep a key in: set BRAID_JOB_SECRET or "
        "BRAID_JOB_SECRET_FILE (or HOME)");
  }
  const std::string& path = config.user_key_file;
  if (absl::Status s = MakePrivateDirs(path.substr(0, path.rfind('/'))); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the key for derived job secrets: ", s.message()));
  }
  auto key = ReadOrCreateSecretFile("the key for derived job secrets", path);
  if (!key.ok()) return key.status();
  // The inputs, named in a refusal: ranks that reach one coordinator by different names
  // ("localhost" and "127.0.0.1") or under different launcher job ids derive different
  // secrets, and only the inputs say which.
  return JobSecret{
      absl::BytesToHexString(HmacSha256(*key, JobIdentity(config, launch))),
      absl::StrCat("derived from ", path, " and the job identity (launcher ",
                   launch.source.empty() ? "none" : launch.source, ", launcher job id ",
                   launch.job_id.empty() ? "none" : absl::StrCat("'", launch.job_id, "'"),
                   ", coordinator host '", config.coordinator_host, "' from ",
                   config.coordinator_host_from, ", port ", config.coordinator_port, " from ",
                   config.coordinator_port_from, ")")};
}

absl::Status ExplainRefusedSecret(const absl::Status& s, const JobSecret& secret) {
  if (s.code() != absl::StatusCode::kPermissionDenied) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), "; this rank's secret is ",
                                             secret.origin,
                                             absl::StartsWith(secret.origin, "derived")
                                                 ? " (ranks on hosts that do not share this "
                                                   "file need BRAID_JOB_SECRET)"
                                                 : ""));
}

}  // namespace braid
