#include "tools/braidrun/rank_env.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace braid::braidrun {
namespace {

// An ordered environment: entries keep their first position.
class EnvBuilder {
 public:
  explicit EnvBuilder(const std::vector<std::string>& base) {
    for (const std::string& e : base) {
      size_t eq = e.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      Set(e.substr(0, eq), e.substr(eq + 1));
    }
  }
  void Set(const std::string& name, const std::string& value) {
    auto it = index_.find(name);
    if (it != index_.end()) {
      entries_[it->second].second = value;
      return;
    }
    index_[name] = entries_.size();
    entries_.emplace_back(name, value);
  }
  void SetDefault(const std::string& name, const std::string& value) {
    if (!Has(name)) Set(name, value);
  }
  bool Has(const std::string& name) const { return index_.count(name) != 0; }
  const std::string& Get(const std::string& name) const {
    return entries_[index_.at(name)].second;
  }
  std::vector<std::string> Build() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [k, v] : entries_) out.push_back(absl::StrCat(k, "=", v));
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
  std::map<std::string, size_t> index_;
};

}  // namespace

std::vector<std::string> BuildRankEnv(const std::vector<std::string>& base, const JobEnv& job,
                                      int rank, int local_rank, int local_size) {
  EnvBuilder env(base);
  env.Set("BRAID_COORDINATOR", job.coordinator);
  auto place = [&job](int value) { return job.elastic ? std::string() : absl::StrCat(value); };
  env.Set("BRAID_RANK", place(rank));
  env.Set("BRAID_SIZE", place(job.world_size));
  env.Set("BRAID_LOCAL_RANK", place(local_rank));
  env.Set("BRAID_LOCAL_SIZE", place(local_size));
  env.Set("BRAID_WORKER", absl::StrCat(rank));
  if (job.elastic) env.Set("BRAID_ELASTIC", "1");
  env.Set("BRAID_JOB_SECRET", job.job_secret);
  // An inherited secret file would contradict the secret above: empty is unset.
  if (env.Has("BRAID_JOB_SECRET_FILE")) env.Set("BRAID_JOB_SECRET_FILE", "");
  if (!job.launcher_pipe.empty() || env.Has("BRAID_LAUNCHER_PIPE")) {
    env.Set("BRAID_LAUNCHER_PIPE", job.launcher_pipe);  // an inherited one is not this job's
  }
  env.Set("PYTHONUNBUFFERED", "1");
  for (const auto& [name, value] : job.settings) env.Set(name, value);
  env.SetDefault("OMP_NUM_THREADS", "1");
  if (!job.ucx_net_devices.empty()) env.SetDefault("UCX_NET_DEVICES", job.ucx_net_devices);
  if (!job.python_path.empty()) {
    const std::string inherited = env.Has("PYTHONPATH") ? env.Get("PYTHONPATH") : "";
    const std::vector<absl::string_view> entries = absl::StrSplit(inherited, ':');
    if (inherited.empty()) {
      env.Set("PYTHONPATH", job.python_path);
    } else if (std::find(entries.begin(), entries.end(), job.python_path) == entries.end()) {
      env.Set("PYTHONPATH", absl::StrCat(job.python_path, ":", inherited));
    }
  }
  return env.Build();
}

}  // namespace braid::braidrun
