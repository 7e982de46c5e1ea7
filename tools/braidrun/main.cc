// braidrun: starts a braid job on this host. It hosts the coordinator in-process, starts N
// rank processes with the BRAID_* environment, prefixes their output with "[rank] ",
// forwards SIGINT/SIGTERM, and tears the whole job down when any rank fails.
//
//   braidrun -np 4 python3 train.py --epochs 3
//
// See tools/braidrun/README.md.
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/registry.h"
#include "coordinator/server.h"
#include "glog/logging.h"
#include "tools/braidrun/host_list.h"
#include "tools/braidrun/launcher.h"
#include "tools/braidrun/rank_env.h"

extern char** environ;

namespace {

using braid::braidrun::JobEnv;

constexpr int kUsageError = 2;

void Fail(const std::string& msg) { std::cerr << "braidrun: " << msg << std::endl; }

// A closed stdin/stdout/stderr would let a pipe take its number (and a rank's output land in
// the wrong place).
void EnsureStdFds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) == -1) {
      int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (n >= 0 && n != fd) {
        dup2(n, fd);
        close(n);
      }
    }
  }
}

std::string RandomSecret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += absl::StrFormat("%02x", b);
  return hex;
}

// <dir of this executable>/../../python (build/tools/braidrun/braidrun -> build/python),
// when it exists: the build tree's braid package, so ranks can `import braid` uninstalled.
std::string BuildTreePythonDir() {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  std::string path(exe, static_cast<size_t>(n));
  std::string dir = path.substr(0, path.rfind('/'));
  std::string candidate = dir + "/../../python";
  char resolved[PATH_MAX];
  if (realpath(candidate.c_str(), resolved) == nullptr) return "";
  struct stat st;
  if (stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  return resolved;
}

std::string Hostname() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace

int main(int argc, char** argv) {
  EnsureStdFds();

  CLI::App app{
      "braidrun: start a braid job of N ranks on this host\n"
      "  braidrun -np N [OPTIONS] COMMAND [ARGS...]"};
  app.footer(
      "COMMAND runs once per rank (rank r of N) with BRAID_RANK, BRAID_SIZE, BRAID_LOCAL_RANK,\n"
      "BRAID_LOCAL_SIZE, BRAID_COORDINATOR (the coordinator braidrun hosts), BRAID_JOB_SECRET,\n"
      "PYTHONUNBUFFERED=1, OMP_NUM_THREADS=1 and UCX_NET_DEVICES=lo (unless set) and the\n"
      "variables of the flags above. Each line a rank prints is prefixed with \"[r] \".\n"
      "Options end at COMMAND (or at \"--\"). When a rank fails the others are stopped and\n"
      "braidrun exits with its code. See tools/braidrun/README.md.\n");
  int np = 0;
  int port = 0;
  double timeout_s = 0, fusion_mb = 0, stall_check_s = 0, stall_shutdown_s = 0;
  int cycle_ms = 0, cache_capacity = 0;
  std::string hosts_spec, timeline, compression;
  bool verbose = false;
  app.add_option("-n,--np", np, "number of ranks (also -np)")->required()->check(CLI::Range(1, 65536));
  app.add_option("--coordinator-port", port, "coordinator port on 127.0.0.1 (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  auto* o_timeout = app.add_option("--timeout", timeout_s,
                                   "seconds a collective may make no progress (BRAID_TIMEOUT_S)")
                        ->check(CLI::PositiveNumber);
  app.add_option("-H,--hosts", hosts_spec, "host:slots,... (only this host is supported yet)");
  auto* o_fusion = app.add_option("--fusion-threshold-mb", fusion_mb,
                                  "fusion buffer size in MiB (BRAID_FUSION_THRESHOLD, in bytes)")
                       ->check(CLI::Range(0.0, 1e6));
  auto* o_cycle = app.add_option("--cycle-time-ms", cycle_ms,
                                 "background loop cycle in ms (BRAID_CYCLE_TIME_MS)")
                      ->check(CLI::Range(0, 60000));
  auto* o_cache = app.add_option("--cache-capacity", cache_capacity,
                                 "response cache entries (BRAID_CACHE_CAPACITY)")
                      ->check(CLI::Range(0, 1 << 24));
  auto* o_timeline = app.add_option("--timeline-filename", timeline,
                                    "write a timeline to this file (BRAID_TIMELINE)");
  auto* o_stall_check = app.add_option("--stall-check-seconds", stall_check_s,
                                       "warn about stalled tensors after S s (BRAID_STALL_CHECK_S)")
                            ->check(CLI::PositiveNumber);
  auto* o_stall_shutdown =
      app.add_option("--stall-shutdown-seconds", stall_shutdown_s,
                     "abort the job after a stall of S s, 0: never (BRAID_STALL_SHUTDOWN_S)")
          ->check(CLI::NonNegativeNumber);
  auto* o_compression = app.add_option("--compression", compression,
                                       "default compression of float all-reduces, e.g. fp16, fp4:ef=1 (BRAID_COMPRESSION)");
  app.add_flag("-v,--verbose", verbose, "report every rank's pid and exit status");

  // Split braidrun's own options from COMMAND: options end at "--" or at the first word
  // that is neither an option nor an option's value. "-np" is rewritten to "--np" (CLI11
  // reads single-dash names as one letter).
  std::vector<std::string> own = {argv[0]};
  std::vector<std::string> command;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      command.assign(argv + i + 1, argv + argc);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      command.assign(argv + i, argv + argc);
      break;
    }
    if (a == "-np") a = "--np";
    if (a.rfind("-np=", 0) == 0) a = "-" + a;
    own.push_back(a);
    if (a.find('=') != std::string::npos) continue;
    const CLI::Option* opt = app.get_option_no_throw(a);
    if (opt != nullptr && opt->get_items_expected_max() > 0 && i + 1 < argc) own.push_back(argv[++i]);
  }
  std::vector<char*> own_argv;
  for (std::string& s : own) own_argv.push_back(s.data());
  try {
    app.parse(static_cast<int>(own_argv.size()), own_argv.data());
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kUsageError;
  }
  if (command.empty()) {
    Fail("no COMMAND given (braidrun -np N COMMAND [ARGS...]; see --help)");
    return kUsageError;
  }

  // A bad compression spec (the flag's, else an inherited BRAID_COMPRESSION) fails here,
  // once, not in every rank's init.
  const char* env_compression = std::getenv("BRAID_COMPRESSION");
  if (o_compression->count() || (env_compression != nullptr && *env_compression != '\0')) {
    braid::compression::RegistryOptions ro;
    const char* tests = std::getenv("BRAID_TEST_COMPRESSORS");
    ro.test_methods = tests != nullptr && std::string(tests) == "1";
    const bool flag = o_compression->count() > 0;
    auto spec = braid::compression::ParseCompressionSpec(flag ? compression : env_compression, ro);
    if (!spec.ok()) {
      Fail(absl::StrCat(flag ? "--compression: " : "BRAID_COMPRESSION: ", spec.status().message()));
      return kUsageError;
    }
  }

  // Hosts: the flag parses and validates; only this host can be used yet.
  {
    std::vector<braid::braidrun::HostSlots> hosts = {{"localhost", np}};
    if (!hosts_spec.empty()) {
      auto parsed = braid::braidrun::ParseHostList(hosts_spec);
      if (!parsed.ok()) {
        Fail(std::string(parsed.status().message()));
        return kUsageError;
      }
      hosts = *std::move(parsed);
    }
    absl::Status local = braid::braidrun::CheckHostsForLocalLaunch(
        hosts, np, braid::braidrun::LocalHostNames(Hostname()));
    if (!local.ok()) {
      Fail(std::string(local.message()));
      return kUsageError;
    }
  }

  // Before any thread exists (gRPC's, glog's): every thread inherits the blocked mask, so
  // SIGINT/SIGTERM/SIGCHLD arrive only through braidrun's signalfd.
  braid::braidrun::SignalSetup signals = braid::braidrun::BlockSignals();
  if (signals.signal_fd < 0) {
    Fail(absl::StrCat("signalfd: ", std::strerror(errno)));
    return 1;
  }

  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging("braidrun");
  }

  braid::coordinator::ServerOptions so;
  so.bind_address = "127.0.0.1";
  so.port = port;
  so.world_size = np;
  so.job_secret = RandomSecret();
  if (const char* hb = std::getenv("BRAID_HEARTBEAT_TIMEOUT_S")) {
    double s = 0;
    if (absl::SimpleAtod(hb, &s) && s > 0) so.heartbeat_timeout = absl::Seconds(s);
  }
  auto server = braid::coordinator::StartCoordinator(so);
  if (!server.ok()) {
    Fail(absl::StrCat("cannot start the coordinator: ", server.status().message()));
    return 1;
  }
  std::unique_ptr<braid::coordinator::CoordinatorServer> coordinator = *std::move(server);
  const std::string address = coordinator->address();
  std::cerr << "braidrun: coordinator listening on " << address << std::endl;

  JobEnv job;
  job.world_size = np;
  job.coordinator = address;
  job.job_secret = so.job_secret;
  if (o_timeout->count()) job.timeout_s = timeout_s;
  if (o_fusion->count()) job.fusion_threshold_bytes = braid::braidrun::MegabytesToBytes(fusion_mb);
  if (o_cycle->count()) job.cycle_time_ms = cycle_ms;
  if (o_cache->count()) job.cache_capacity = cache_capacity;
  if (o_timeline->count()) job.timeline = timeline;
  if (o_stall_check->count()) job.stall_check_s = stall_check_s;
  if (o_stall_shutdown->count()) job.stall_shutdown_s = stall_shutdown_s;
  if (o_compression->count()) job.compression = compression;
  job.python_path = BuildTreePythonDir();
  job.single_host = true;

  braid::braidrun::LaunchSpec spec;
  spec.command = command;
  spec.verbose = verbose;
  const std::vector<std::string> base = CurrentEnvironment();
  for (int r = 0; r < np; ++r) {
    spec.rank_envs.push_back(braid::braidrun::BuildRankEnv(base, job, r, r, np));
  }
  if (verbose) {
    if (!job.python_path.empty()) {
      std::cerr << "braidrun: PYTHONPATH starts with " << job.python_path << std::endl;
    }
    std::cerr << "braidrun: starting " << np << " rank" << (np == 1 ? "" : "s") << ": "
              << command[0] << std::endl;
  }

  int rc = braid::braidrun::RunRanks(spec, signals);
  coordinator->Shutdown(absl::Seconds(1));
  coordinator.reset();
  if (verbose) std::cerr << "braidrun: exit code " << rc << std::endl;
  return rc;
}
