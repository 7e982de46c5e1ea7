// braid-coordinator-sim: the coordinator at scale, by simulation. For each world size N and
// response-cache setting it starts a real braid-coordinator process (127.0.0.1, port 0),
// drives it with N simulated ranks (coordinator_sim.h: real gRPC clients, one thread each,
// in this process) submitting T tensors per step in random orders, and reports steps per
// second and the CPU time per step of the coordinator process and of this one (the
// simulated ranks), read from /proc/PID/stat around the timed steps.
//
//   braid-coordinator-sim --ranks 8,64,256 --tensors 200 --steps 20 --cache on,off
//
// Exit code 1 with --check: a rank received another count of tensors than steps x T, or an
// ERROR response; 2: the run failed.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tools/bench/coordinator_sim.h"

extern char** environ;

namespace {

// CPU time (user + system, all threads) of process `pid` so far, from /proc/PID/stat.
absl::Duration ProcessCpu(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return absl::ZeroDuration();
  std::istringstream rest(text.substr(paren + 2));
  std::string field;
  long long utime = 0, stime = 0;
  // Fields 3.. follow the name; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return absl::Seconds(static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK));
}

// A braid-coordinator process on 127.0.0.1, port 0.
class CoordinatorProcess {
 public:
  absl::Status Start(const std::string& binary, absl::Duration timeout) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::vector<std::string> args = {binary, "--bind", "127.0.0.1", "--port", "0"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // posix_spawn, not fork: this process runs gRPC's threads.
    const int rc = posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fds[0];
    if (rc != 0) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("cannot start ", binary, ": ", strerror(rc)));
    }
    // Its first line: "braid-coordinator listening on ADDR:PORT".
    std::string line;
    const absl::Time deadline = absl::Now() + timeout;
    while (line.find('\n') == std::string::npos) {
      pollfd p{out_, POLLIN, 0};
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char buf[256];
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, n);
    }
    const std::string prefix = "listening on ";
    const size_t at = line.find(prefix), nl = line.find('\n');
    if (at == std::string::npos || nl == std::string::npos) {
      return absl::UnavailableError(absl::StrCat(binary, " did not say where it listens within ",
                                                 absl::FormatDuration(timeout)));
    }
    address_ = line.substr(at + prefix.size(), nl - at - prefix.size());
    return absl::OkStatus();
  }
  ~CoordinatorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    if (out_ >= 0) close(out_);
  }
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string address_;
};

std::string DefaultCoordinatorBinary() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string("./x");
  dir = dir.substr(0, dir.rfind('/'));
  // The build trees (CMake's and Bazel's) put tools/bench and tools/coordinator side by side.
  return dir + "/../coordinator/braid-coordinator";
}

struct Row {
  int ranks, tensors, steps;
  bool cache;
  double steps_per_second, step_ms_median, step_ms_min, step_ms_max;
  double coordinator_cpu_ms_per_step, generator_cpu_ms_per_step;
  double coordinator_cpu_ns_per_rank_tensor;
  int64_t names_expected;
  int64_t names_min, names_max, errors;
};

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

absl::StatusOr<Row> RunOne(const std::string& binary, braid::bench::SimOptions o) {
  CoordinatorProcess coordinator;
  absl::Status s = coordinator.Start(binary, absl::Seconds(30));
  if (!s.ok()) return s;
  o.address = coordinator.address();
  absl::Duration coord0, coord1, self0, self1;
  const pid_t pid = coordinator.pid();
  o.on_timed_start = [&] { coord0 = ProcessCpu(pid); self0 = ProcessCpu(getpid()); };
  o.on_timed_end = [&] { coord1 = ProcessCpu(pid); self1 = ProcessCpu(getpid()); };
  auto result = braid::bench::RunSimulation(o);
  if (!result.ok()) return result.status();
  std::vector<absl::Duration> t = result->step_times;
  std::sort(t.begin(), t.end());
  Row row{o.ranks, o.tensors, o.steps, o.cache_capacity > 0,
          result->steps_per_second, Ms(t[t.size() / 2]), Ms(t.front()), Ms(t.back()),
          Ms(coord1 - coord0) / o.steps, Ms(self1 - self0) / o.steps, 0,
          int64_t{o.tensors} * (o.warmup + o.steps), 0, 0, 0};
  row.coordinator_cpu_ns_per_rank_tensor =
      row.coordinator_cpu_ms_per_step * 1e6 / (static_cast<double>(o.ranks) * o.tensors);
  row.names_min = *std::min_element(result->names_received.begin(), result->names_received.end());
  row.names_max = *std::max_element(result->names_received.begin(), result->names_received.end());
  for (int64_t e : result->errors) row.errors += e;
  if (row.errors > 0) std::cerr << "first error: " << result->first_error << "\n";
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braid-coordinator-sim: N simulated ranks drive a real braid-coordinator"};
  std::string ranks_list = "8,64,256", cache_list = "on,off", json_path;
  std::string binary = DefaultCoordinatorBinary();
  braid::bench::SimOptions o;
  double fusion_mb = 64, timeout_s = 120;
  bool check = false;
  app.add_option("--ranks", ranks_list, "simulated world sizes, comma-separated")->capture_default_str();
  app.add_option("--tensors", o.tensors, "tensors per step")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--batches", o.batches, "request lists per rank per step")->capture_default_str();
  app.add_option("--cache", cache_list, "response cache: on, off or on,off")->capture_default_str();
  app.add_option("--cache-capacity", o.cache_capacity, "cache entries when on")->capture_default_str();
  app.add_option("--fusion-threshold-mb", fusion_mb, "fusion threshold (0: no fusion)")->capture_default_str();
  app.add_option("--seed", o.seed, "tensor sizes and orders")->capture_default_str();
  app.add_option("--timeout", timeout_s, "seconds a step (or registration) may take")->capture_default_str();
  app.add_option("--coordinator-bin", binary, "braid-coordinator to start")->capture_default_str();
  app.add_option("--json", json_path, "also write the rows here");
  app.add_flag("--check", check, "exit 1 unless every rank got exactly (warmup+steps) x T tensors and no error");
  CLI11_PARSE(app, argc, argv);
  o.fusion_threshold_bytes = static_cast<int64_t>(fusion_mb * (1 << 20));
  o.timeout = absl::Seconds(timeout_s);
  const int capacity = o.cache_capacity;

  std::vector<Row> rows;
  std::printf("# coordinator simulation: T=%d tensors/step, %d timed steps (+%d warm-up), "
              "%d request lists/rank/step, fusion %.0f MiB\n",
              o.tensors, o.steps, o.warmup, o.batches, fusion_mb);
  std::printf("%6s %6s %5s %9s %9s %9s %9s %11s %11s %10s %8s\n", "ranks", "tensors", "cache",
              "steps/s", "step_ms", "min_ms", "max_ms", "coord_cpu", "ns/(N*T)", "gen_cpu",
              "errors");
  std::printf("%6s %6s %5s %9s %9s %9s %9s %11s %11s %10s %8s\n", "", "", "", "", "median", "",
              "", "ms/step", "coord", "ms/step", "");
  bool bad = false;
  for (absl::string_view n_text : absl::StrSplit(ranks_list, ',')) {
    for (absl::string_view c : absl::StrSplit(cache_list, ',')) {
      o.ranks = std::stoi(std::string(n_text));
      o.cache_capacity = c == "on" ? capacity : 0;
      auto row = RunOne(binary, o);
      if (!row.ok()) {
        std::cerr << "braid-coordinator-sim: N=" << o.ranks << " cache " << c << ": "
                  << row.status().message() << "\n";
        return 2;
      }
      std::printf("%6d %6d %5s %9.1f %9.2f %9.2f %9.2f %11.2f %11.1f %10.2f %8lld\n", row->ranks,
                  row->tensors, row->cache ? "on" : "off", row->steps_per_second,
                  row->step_ms_median, row->step_ms_min, row->step_ms_max,
                  row->coordinator_cpu_ms_per_step, row->coordinator_cpu_ns_per_rank_tensor,
                  row->generator_cpu_ms_per_step, static_cast<long long>(row->errors));
      std::fflush(stdout);
      if (row->names_min != row->names_expected || row->names_max != row->names_expected ||
          row->errors != 0) {
        std::cerr << "N=" << row->ranks << ": ranks received " << row->names_min << ".."
                  << row->names_max << " tensors, expected " << row->names_expected << "\n";
        bad = true;
      }
      rows.push_back(*row);
    }
  }
  if (!json_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      j.push_back({{"ranks", r.ranks}, {"tensors", r.tensors}, {"steps", r.steps},
                   {"cache", r.cache}, {"steps_per_second", r.steps_per_second},
                   {"step_ms_median", r.step_ms_median}, {"step_ms_min", r.step_ms_min},
                   {"step_ms_max", r.step_ms_max},
                   {"coordinator_cpu_ms_per_step", r.coordinator_cpu_ms_per_step},
                   {"coordinator_cpu_ns_per_rank_tensor", r.coordinator_cpu_ns_per_rank_tensor},
                   {"generator_cpu_ms_per_step", r.generator_cpu_ms_per_step},
                   {"names_expected", r.names_expected}, {"names_min", r.names_min},
                   {"names_max", r.names_max}, {"errors", r.errors}});
    }
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  return check && bad ? 1 : 0;
}
