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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/server.h"
#include "glog/logging.h"
#include "runtime/config.h"
#include "tools/braidrun/host_list.h"
#include "tools/braidrun/launcher.h"
#include "tools/braidrun/rank_env.h"
#include "tools/braidrun/watchdog.h"

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

// braidrun's command line, checked: every value through the configuration parser
// (runtime/config.h), so a bad one is refused here, naming its flag, before any rank starts.
struct Args {
  int np = 0;
  int port = 0;
  std::string hosts_spec;
  bool verbose = false;
  std::vector<std::string> command;
  // Variables of the setting flags given, in SettingFlags() order.
  std::vector<std::pair<std::string, std::string>> settings;
  // The settings of braidrun's environment with the flags applied, checked.
  braid::RuntimeConfig config;
};

// Splits braidrun's own options from COMMAND: options end at "--" or at the first word that
// is neither an option nor an option's value. "-np" is rewritten to "--np" (CLI11 reads
// single-dash names as one letter).
std::vector<std::string> OwnArgs(CLI::App& app, int argc, char** argv,
                                 std::vector<std::string>* command) {
  std::vector<std::string> own = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      command->assign(argv + i + 1, argv + argc);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      command->assign(argv + i, argv + argc);
      break;
    }
    if (a == "-np") a = "--np";
    if (a.rfind("-np=", 0) == 0) a = "-" + a;
    own.push_back(a);
    if (a.find('=') != std::string::npos) continue;
    const CLI::Option* opt = app.get_option_no_throw(a);
    if (opt != nullptr && opt->get_items_expected_max() > 0 && i + 1 < argc) own.push_back(argv[++i]);
  }
  return own;
}

// Checks every value and maps the setting flags onto their variables. The whole
// environment the ranks will inherit is checked too (an inherited BRAID_CYCLE_TIME_MS=abc
// fails here, once, not in every rank), except the variables braidrun sets itself.
absl::Status CheckArgs(const std::string& np, const std::string& port,
                       const std::map<std::string, std::string>& flag_text, Args* args) {
  auto n = braid::ParseInteger("-np", np, 1, 65536);
  if (!n.ok()) return n.status();
  args->np = static_cast<int>(*n);
  auto p = braid::ParsePort("--coordinator-port", port, /*zero_allowed=*/true);
  if (!p.ok()) return p.status();
  args->port = *p;
  std::map<std::string, std::string> flag_of;  // variable -> flag, for messages
  for (const braid::SettingFlag& f : braid::SettingFlags()) {
    auto it = flag_text.find(f.flag);
    if (it == flag_text.end()) continue;
    auto value = braid::SettingFlagValue(f, it->second);
    if (!value.ok()) return value.status();
    args->settings.emplace_back(f.variable, *value);
    flag_of[f.variable] = f.flag;
  }
  auto getenv = [&](const char* name) -> const char* {
    for (const auto& [var, value] : args->settings) {
      if (var == name) return value.c_str();
    }
    const std::string n(name);
    if (n == "BRAID_COORDINATOR" || n == "BRAID_JOB_SECRET") return nullptr;  // braidrun's
    return std::getenv(name);
  };
  auto name_of = [&](absl::string_view var) {
    auto it = flag_of.find(std::string(var));
    return it == flag_of.end() ? std::string(var) : it->second;
  };
  auto config = braid::SettingsFromEnv(getenv, name_of);
  if (!config.ok()) return config.status();
  args->config = *std::move(config);
  return absl::OkStatus();
}

// Parses and checks the command line; nullopt with *exit_code set when braidrun must exit.
std::optional<Args> ParseArgs(int argc, char** argv, int* exit_code) {
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
  Args args;
  std::string np, port = "0";
  // Values stay text for CLI11: the configuration parser reads them (one grammar).
  std::map<std::string, std::string> flag_text;
  app.add_option("-n,--np", np, "number of ranks (also -np)")->required();
  app.add_option("--coordinator-port", port, "coordinator port on 127.0.0.1 (0: any free port)")
      ->capture_default_str();
  app.add_option("-H,--hosts", args.hosts_spec, "host:slots,... (only this host is supported yet)");
  for (const braid::SettingFlag& f : braid::SettingFlags()) {
    app.add_option(f.flag, flag_text[f.flag], absl::StrCat(f.help, " (", f.variable, ")"));
  }
  app.add_flag("-v,--verbose", args.verbose, "report every rank's pid and exit status");
  std::vector<std::string> own = OwnArgs(app, argc, argv, &args.command);
  std::vector<char*> own_argv;
  for (std::string& s : own) own_argv.push_back(s.data());
  try {
    app.parse(static_cast<int>(own_argv.size()), own_argv.data());
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    *exit_code = rc == 0 ? 0 : kUsageError;
    return std::nullopt;
  }
  *exit_code = kUsageError;
  if (args.command.empty()) {
    Fail("no COMMAND given (braidrun -np N COMMAND [ARGS...]; see --help)");
    return std::nullopt;
  }
  for (auto it = flag_text.begin(); it != flag_text.end();) {
    it = app.get_option(it->first)->count() ? std::next(it) : flag_text.erase(it);
  }
  absl::Status s = CheckArgs(np, port, flag_text, &args);
  if (!s.ok()) {
    Fail(std::string(s.message()));
    return std::nullopt;
  }
  return args;
}

// Hosts: the flag parses and validates; only this host can be used yet.
absl::Status CheckHosts(const Args& args) {
  std::vector<braid::braidrun::HostSlots> hosts = {{"localhost", args.np}};
  if (!args.hosts_spec.empty()) {
    auto parsed = braid::braidrun::ParseHostList(args.hosts_spec);
    if (!parsed.ok()) return parsed.status();
    hosts = *std::move(parsed);
  }
  return braid::braidrun::CheckHostsForLocalLaunch(hosts, args.np,
                                                  braid::braidrun::LocalHostNames(Hostname()));
}

}  // namespace

int main(int argc, char** argv) {
  EnsureStdFds();
  int exit_code = 0;
  std::optional<Args> args = ParseArgs(argc, argv, &exit_code);
  if (!args) return exit_code;
  if (absl::Status s = CheckHosts(*args); !s.ok()) {
    Fail(std::string(s.message()));
    return kUsageError;
  }

  // Note [Ranks die with braidrun]: forked while braidrun has one thread.
  absl::StatusOr<braid::braidrun::Watchdog> watchdog = braid::braidrun::Watchdog::Start();
  if (!watchdog.ok()) {
    Fail(absl::StrCat("no watchdog (ranks would outlive a killed braidrun): ",
                      watchdog.status().message()));
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
  so.port = args->port;
  so.world_size = args->np;
  so.job_secret = RandomSecret();
  // The job settings given to braidrun (flags, or its environment) are the job's: ranks
  // that set others are refused (Note [Job settings] in coordinator/rendezvous.h).
  so.settings = braid::ToProto(args->config.job);
  auto server = braid::coordinator::StartCoordinator(so);
  if (!server.ok()) {
    Fail(absl::StrCat("cannot start the coordinator: ", server.status().message()));
    return 1;
  }
  std::unique_ptr<braid::coordinator::CoordinatorServer> coordinator = *std::move(server);
  const std::string address = coordinator->address();
  std::cerr << "braidrun: coordinator listening on " << address << std::endl;

  JobEnv job;
  job.world_size = args->np;
  job.coordinator = address;
  job.job_secret = so.job_secret;
  job.settings = args->settings;
  job.python_path = BuildTreePythonDir();
  job.single_host = true;

  braid::braidrun::LaunchSpec spec;
  spec.command = args->command;
  spec.verbose = args->verbose;
  if (watchdog.ok()) {
    spec.group_started = [&](pid_t group) { watchdog->Watch(group); };
    spec.group_gone = [&](pid_t group) { watchdog->Forget(group); };
    if (args->verbose) std::cerr << "braidrun: watchdog pid " << watchdog->pid() << std::endl;
  }
  const std::vector<std::string> base = CurrentEnvironment();
  for (int r = 0; r < args->np; ++r) {
    spec.rank_envs.push_back(braid::braidrun::BuildRankEnv(base, job, r, r, args->np));
  }
  if (args->verbose) {
    if (!job.python_path.empty()) {
      std::cerr << "braidrun: PYTHONPATH starts with " << job.python_path << std::endl;
    }
    std::cerr << "braidrun: starting " << args->np << " rank" << (args->np == 1 ? "" : "s")
              << ": " << args->command[0] << std::endl;
  }

  int rc = braid::braidrun::RunRanks(spec, signals);
  coordinator->Shutdown(absl::Seconds(1));
  coordinator.reset();
  if (args->verbose) std::cerr << "braidrun: exit code " << rc << std::endl;
  return rc;
}
