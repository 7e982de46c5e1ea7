// braidrun: starts a braid job on this host or across hosts (over ssh). It hosts the
// coordinator in-process, starts N rank processes with the BRAID_* environment, prefixes
// their output with "[rank] ", forwards SIGINT/SIGTERM, and tears the whole job down when
// any rank fails.
//
//   braidrun -np 4 python3 train.py --epochs 3
//   braidrun -np 4 -H node1:2,node2:2 python3 train.py
//
// See tools/braidrun/README.md.
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/secret.h"
#include "coordinator/server.h"
#include "coordinator/service.h"
#include "glog/logging.h"
#include "runtime/config.h"
#include "runtime/config_proto.h"
#include "tools/braidrun/host_list.h"
#include "tools/braidrun/launcher.h"
#include "tools/braidrun/network.h"
#include "tools/braidrun/rank_env.h"
#include "tools/braidrun/watchdog.h"
#include "tools/braidrun/remote.h"
#include "tools/braidrun/watch.h"
#include "tools/cli.h"

extern char** environ;

namespace {

using braid::braidrun::JobEnv;

using braid::tools::kUsageError;

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

// An existing directory holding braid's Python package (braid/__init__.py), resolved; "".
std::string PackageDir(const std::string& candidate) {
  char resolved[PATH_MAX];
  if (realpath(candidate.c_str(), resolved) == nullptr) return "";
  struct stat st;
  const std::string init = std::string(resolved) + "/braid/__init__.py";
  if (stat(init.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  return resolved;
}

// Where braid's Python package is, for the ranks' PYTHONPATH ("" when Python finds it
// anyway): <dir of this executable>/../../python in a build tree (build/tools/braidrun/
// braidrun -> build/python), so ranks can `import braid` uninstalled; P/<python dir> when
// installed under a prefix P (P/bin/braidrun) other than /usr and /usr/local, whose
// dist-packages Debian's Python searches already (and whose order must not change).
std::string ExecutableDir() {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

std::string PythonPackageDir() {
  std::string dir = ExecutableDir();
  if (dir.empty()) return "";
  if (std::string build = PackageDir(dir + "/../../python"); !build.empty()) return build;
#ifdef BRAIDRUN_PYTHON_RELDIR
  std::string installed = PackageDir(dir + "/../" BRAIDRUN_PYTHON_RELDIR);
  if (!installed.empty() && installed.rfind("/usr/lib/", 0) != 0 &&
      installed.rfind("/usr/local/lib/", 0) != 0) {
    return installed;
  }
#endif
  return "";
}

// Removes the secret file braidrun made for its job (Note [Watching a braidrun job]) when
// braidrun leaves main(), however it does.
struct OwnSecretFile {
  std::string path;
  OwnSecretFile() = default;
  OwnSecretFile(const OwnSecretFile&) = delete;
  OwnSecretFile& operator=(const OwnSecretFile&) = delete;
  ~OwnSecretFile() {
    if (!path.empty()) unlink(path.c_str());
  }
};

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
  // Note [Elastic braidrun] (launcher.h): 0 unless --min-np or --max-np was given.
  int min_np = 0;
  int max_np = 0;
  std::string min_np_text, max_np_text;
  // Note [Elastic braidrun]: growth from a host discovery script.
  std::string discovery_script;
  double discovery_interval_s = 5;
  double blacklist_cooldown_s = 60;
  int port = 0;
  std::string hosts_spec;
  std::string hostfile;
  std::string network_interface;
  braid::braidrun::SshOptions ssh;
  std::string ssh_port = "0";
  bool verbose = false;
  std::string secret_file;  // --secret-file
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
// --min-np and --max-np ("" when not given): 1 <= min <= np <= max, both np when not given.
absl::Status CheckElastic(const std::string& min_np, const std::string& max_np, Args* args) {
  if (min_np.empty() && max_np.empty() && args->discovery_script.empty()) {
    return absl::OkStatus();
  }
  if (!(args->discovery_interval_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--discovery-interval must be a positive number of seconds, got ",
        args->discovery_interval_s));
  }
  if (!(args->blacklist_cooldown_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--blacklist-cooldown must be 0 or more seconds, got ", args->blacklist_cooldown_s));
  }
  args->min_np = args->np;
  // With a discovery script the job may grow to whatever the hosts offer (as horovodrun).
  args->max_np = args->discovery_script.empty() ? args->np : 65536;
  if (!min_np.empty()) {
    auto n = braid::ParseInteger("--min-np", min_np, 1, 65536);
    if (!n.ok()) return n.status();
    args->min_np = static_cast<int>(*n);
  }
  if (!max_np.empty()) {
    auto n = braid::ParseInteger("--max-np", max_np, 1, 65536);
    if (!n.ok()) return n.status();
    args->max_np = static_cast<int>(*n);
  }
  if (args->min_np > args->np) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min-np ", args->min_np, " is more than -np ", args->np, ": the job would start below it"));
  }
  if (args->np > args->max_np) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-np ", args->max_np, " is less than -np ", args->np));
  }
  return absl::OkStatus();
}

absl::Status CheckArgs(const std::string& np, const std::string& port,
                       const std::map<std::string, std::string>& flag_text, Args* args) {
  auto n = braid::ParseInteger("-np", np, 1, 65536);
  if (!n.ok()) return n.status();
  args->np = static_cast<int>(*n);
  if (absl::Status s = CheckElastic(args->min_np_text, args->max_np_text, args); !s.ok()) {
    return s;
  }
  auto p = braid::ParsePort("--coordinator-port", port, /*zero_allowed=*/true);
  if (!p.ok()) return p.status();
  args->port = *p;
  auto ssh_port = braid::ParsePort("--ssh-port", args->ssh_port, /*zero_allowed=*/true);
  if (!ssh_port.ok()) return ssh_port.status();
  args->ssh.port = *ssh_port;
  if (!args->hosts_spec.empty() && !args->hostfile.empty()) {
    return absl::InvalidArgumentError("give -H or --hostfile, not both");
  }
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
    if (n == "BRAID_COORDINATOR") return nullptr;  // braidrun's
    // --secret-file replaces the secret of the environment.
    if (!args->secret_file.empty() && (n == "BRAID_JOB_SECRET" || n == "BRAID_JOB_SECRET_FILE")) {
      return nullptr;
    }
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
  CLI::App app{"braidrun: start a braid job of N ranks, on this host or across hosts over ssh"};
  braid::tools::SetUsage(app, "braidrun -np N [-H host:slots,...] [OPTIONS] COMMAND [ARGS...]");
  app.footer(
      "COMMAND runs once per rank (rank r of N) with BRAID_RANK, BRAID_SIZE, BRAID_LOCAL_RANK,\n"
      "BRAID_LOCAL_SIZE, BRAID_COORDINATOR (the coordinator braidrun hosts), BRAID_JOB_SECRET,\n"
      "PYTHONUNBUFFERED=1, OMP_NUM_THREADS=1, UCX_NET_DEVICES=lo on one host (unless set), the\n"
      "variables of the flags above (ranks on other hosts get braidrun's environment, less\n"
      "what describes this host). Each line a rank prints is prefixed with \"[r] \".\n"
      "Options end at COMMAND (or at \"--\"). When a rank fails the others are stopped and\n"
      "braidrun exits with its code. See tools/braidrun/README.md.\n");
  Args args;
  std::string np, port = "0";
  // Values stay text for CLI11: the configuration parser reads them (one grammar).
  std::map<std::string, std::string> flag_text;
  app.add_option("-n,--np", np, "number of ranks (also -np)")->required();
  app.add_option("--min-np", args.min_np_text,
                 "elastic: the job goes on while at least this many ranks run (a lost or "
                 "failed rank no longer ends it; braid.torch.elastic): docs/elastic.md");
  app.add_option("--max-np", args.max_np_text,
                 "elastic: at most this many ranks (default -np; with a discovery script, "
                 "as many as the hosts' slots)");
  app.add_option("--host-discovery-script", args.discovery_script,
                 "elastic: a command printing the available hosts, one 'host:slots' per line, "
                 "re-run every --discovery-interval; a free slot gets a new rank");
  app.add_option("--discovery-interval", args.discovery_interval_s,
                 "elastic: seconds between runs of the discovery script")
      ->capture_default_str();
  app.add_option("--blacklist-cooldown", args.blacklist_cooldown_s,
                 "elastic: seconds a host whose rank failed gets no new rank (doubling with "
                 "each further failure, at most 16 times)")
      ->capture_default_str();
  app.add_option("--coordinator-port", port, "coordinator port (0: any free port)")
      ->capture_default_str();
  app.add_option("-H,--hosts", args.hosts_spec,
                 "host:slots,... ranks fill the hosts in order (default: all on this host)");
  app.add_option("--hostfile", args.hostfile,
                 "file with one 'host slots=N' (or 'host:N') per line, instead of -H");
  app.add_option("--network-interface", args.network_interface,
                 "interface whose address the coordinator binds and the ranks reach it at "
                 "(also UCX_NET_DEVICES, unless set); default across hosts: the one routing "
                 "to the first other host");
  app.add_option("--ssh-port", args.ssh_port, "port of the other hosts' sshd (0: ssh's default)");
  app.add_option("--ssh-identity-file", args.ssh.identity_file, "private key for ssh (ssh -i)");
  app.add_option("--ssh-option", args.ssh.options,
                 "an ssh option, as ssh -o takes it (repeatable): StrictHostKeyChecking=no")
      ->allow_extra_args(false);
  for (const braid::SettingFlag& f : braid::SettingFlags()) {
    if (f.boolean) {
      app.add_flag(f.flag)->description(absl::StrCat(f.help, " (", f.variable, "=1)"));
      flag_text[f.flag] = "1";  // kept only when given (below)
    } else {
      app.add_option(f.flag, flag_text[f.flag], absl::StrCat(f.help, " (", f.variable, ")"));
    }
  }
  app.add_flag("-v,--verbose", args.verbose, "report every rank's pid and exit status");
  app.add_option("--secret-file", args.secret_file,
                 "the job secret, in a file of mode 0600 (created with a random secret when "
                 "missing), for braidctl to present too (default: BRAID_JOB_SECRET(_FILE), "
                 "else a random secret)");
  std::string secret;
  app.add_option("--secret", secret, "refused: a secret on the command line is visible to "
                                     "every user (ps); use --secret-file");
  std::vector<std::string> own = OwnArgs(app, argc, argv, &args.command);
  std::vector<char*> own_argv;
  for (std::string& s : own) own_argv.push_back(s.data());
  try {
    app.parse(static_cast<int>(own_argv.size()), own_argv.data());
  } catch (const CLI::ParseError& e) {
    *exit_code = braid::tools::ExitCodeFor(app, e);
    return std::nullopt;
  }
  *exit_code = kUsageError;
  if (args.command.empty()) {
    Fail("no COMMAND given (braidrun -np N COMMAND [ARGS...]; see --help)");
    return std::nullopt;
  }
  if (app.get_option("--secret")->count() > 0) {
    Fail("--secret is refused: every user of this host could read it (ps); use --secret-file "
         "FILE (mode 0600) or BRAID_JOB_SECRET");
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

// The hosts of -H or --hostfile (default: this host with -np slots), and where each rank
// runs.
// Note [Ranks die with their launcher] (runtime/launcher_watch.h): the pipe whose read end
// every local rank gets at kLauncherPipeFd, and BRAID_LAUNCHER_PIPE naming it.
struct LauncherPipe {
  int read_end = -1;  // -1 (and no variable) when no pipe could be made
  std::string variable;
};

LauncherPipe MakeLauncherPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    Fail(absl::StrCat("warning: no launcher pipe (ranks would outlive a braidrun killed with "
                      "its watchdog): ", std::strerror(errno)));
    return {};
  }
  // The write end is never written: it only has to stay open as long as braidrun lives.
  int read_end = fds[0];
  if (read_end == braid::braidrun::kLauncherPipeFd) {
    // Spawning dup2()s it onto that very number, which would keep it close-on-exec.
    read_end = fcntl(fds[0], F_DUPFD_CLOEXEC, 10);
    close(fds[0]);
  }
  struct stat st;
  if (read_end < 0 || fstat(read_end, &st) != 0) return {};
  return {read_end, absl::StrCat(braid::braidrun::kLauncherPipeFd, ":", st.st_ino)};
}

absl::StatusOr<std::vector<braid::braidrun::RankPlacement>> PlaceJob(const Args& args) {
  std::vector<braid::braidrun::HostSlots> hosts = {{"localhost", args.np}};
  if (!args.discovery_script.empty() && args.hosts_spec.empty() && args.hostfile.empty()) {
    // The first hosts are the script's (as horovodrun's).
    auto found = braid::braidrun::RunDiscoveryScript(args.discovery_script, absl::Seconds(30));
    if (!found.ok()) return found.status();
    hosts = *std::move(found);
    int slots = 0;
    for (const auto& h : hosts) slots += h.slots;
    if (slots < args.np) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--host-discovery-script '", args.discovery_script, "' offers ", slots, " slot",
          slots == 1 ? "" : "s", " at start, fewer than -np ", args.np));
    }
  } else if (!args.hosts_spec.empty()) {
    auto parsed = braid::braidrun::ParseHostList(args.hosts_spec);
    if (!parsed.ok()) return parsed.status();
    hosts = *std::move(parsed);
  } else if (!args.hostfile.empty()) {
    std::ifstream in(args.hostfile);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hostfile: cannot read '", args.hostfile, "': ", std::strerror(errno)));
    }
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = braid::braidrun::ParseHostfile(text.str(), args.hostfile);
    if (!parsed.ok()) return parsed.status();
    hosts = *std::move(parsed);
  }
  auto placed = braid::braidrun::PlaceRanks(hosts, args.np);
  if (!placed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.hostfile.empty() ? "-H" : "--hostfile", ": ", placed.status().message()));
  }
  return placed;
}

// The address the coordinator binds and the ranks reach it at: --network-interface's, else
// (ranks on other hosts) the one this host uses to reach the first of them, else loopback.
absl::StatusOr<std::string> CoordinatorHost(const Args& args,
                                            const std::vector<std::string>& remote_hosts) {
  if (!args.network_interface.empty()) {
    auto a = braid::braidrun::InterfaceAddress(args.network_interface);
    if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat("--network-interface: ", a.status().message()));
    return a;
  }
  if (remote_hosts.empty()) return std::string("127.0.0.1");
  auto a = braid::braidrun::SourceAddressFor(remote_hosts.front());
  if (!a.ok()) {
    return absl::Status(a.status().code(),
                        absl::StrCat(a.status().message(), ", which chooses the coordinator's "
                                     "address: give --network-interface"));
  }
  return a;
}

// Rank r's RankSpec: COMMAND itself on this host, ssh (Note [Remote ranks]) elsewhere.
braid::braidrun::RankSpec MakeRankSpec(const Args& args, const JobEnv& job, int r,
                                       const braid::braidrun::RankPlacement& p, bool remote) {
  const std::vector<std::string> base = CurrentEnvironment();
  JobEnv rank_job = job;
  if (remote) rank_job.launcher_pipe.clear();  // the pipe does not reach another host
  std::vector<std::string> env =
      braid::braidrun::BuildRankEnv(base, rank_job, r, p.local_rank, p.local_size);
  braid::braidrun::RankSpec rank;
  rank.host = p.host;
  if (!remote) {
    rank.argv = args.command;
    rank.env = std::move(env);
    return rank;
  }
  char cwd[PATH_MAX] = "/";
  if (getcwd(cwd, sizeof(cwd)) == nullptr) cwd[0] = '/';
  braid::braidrun::RemoteEnv split = braid::braidrun::SplitRemoteEnv(env);
  if (args.verbose && r == 0 && !split.dropped.empty()) {
    Fail(absl::StrCat("not forwarded (a newline in a private value): ",
                      absl::StrJoin(split.dropped, ", ")));
  }
  rank.argv = braid::braidrun::SshArgv(
      args.ssh, p.host, braid::braidrun::RemoteScript(cwd, split.public_vars, args.command));
  rank.env = base;  // ssh's own (SSH_AUTH_SOCK, HOME for its config and keys)
  rank.remote_host = p.host;
  rank.stdin_preamble = braid::braidrun::RemoteStdinPreamble(split.private_vars);
  return rank;
}

braid::braidrun::LaunchSpec BuildLaunch(const Args& args, const JobEnv& job,
                                        const std::vector<braid::braidrun::RankPlacement>& places,
                                        const std::vector<bool>& remote) {
  braid::braidrun::LaunchSpec spec;
  spec.verbose = args.verbose;
  for (size_t r = 0; r < places.size(); ++r) {
    spec.ranks.push_back(MakeRankSpec(args, job, static_cast<int>(r), places[r], remote[r]));
  }
  return spec;
}

// "braidrun: ranks 0-1 on h0 (this host), 2-3 on h1 (ssh)"
std::string DescribePlacement(const std::vector<braid::braidrun::RankPlacement>& places,
                              const std::vector<bool>& remote) {
  std::vector<std::string> parts;
  for (size_t r = 0; r < places.size();) {
    size_t end = r;
    while (end + 1 < places.size() && places[end + 1].host_index == places[r].host_index) ++end;
    parts.push_back(absl::StrCat(r == end ? "rank " : "ranks ", r,
                                 r == end ? "" : absl::StrCat("-", end), " on ", places[r].host,
                                 remote[r] ? " (ssh)" : " (this host)"));
    r = end + 1;
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace

int main(int argc, char** argv) {
  EnsureStdFds();
  int exit_code = 0;
  std::optional<Args> args = ParseArgs(argc, argv, &exit_code);
  if (!args) return exit_code;
  // Once for the whole job (the ranks, started by braidrun, do not repeat them).
  for (const std::string& w : braid::EnvironmentWarnings(braid::ProcessEnvironmentNames())) {
    Fail(absl::StrCat("warning: ", w));
  }
  auto places = PlaceJob(*args);
  if (!places.ok()) {
    Fail(std::string(places.status().message()));
    return kUsageError;
  }
  const std::vector<std::string> local_names = braid::braidrun::LocalHostNames(Hostname());
  std::vector<bool> remote;
  std::vector<std::string> remote_hosts;
  for (const auto& p : *places) {
    remote.push_back(!braid::braidrun::IsLocalHost(p.host, local_names));
    if (remote.back() && (remote_hosts.empty() || remote_hosts.back() != p.host)) {
      remote_hosts.push_back(p.host);
    }
  }
  auto coordinator_host = CoordinatorHost(*args, remote_hosts);
  if (!coordinator_host.ok()) {
    Fail(std::string(coordinator_host.status().message()));
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
  so.bind_address = *coordinator_host;
  so.port = args->port;
  so.world_size = args->np;
  // Note [Who may join]: the job's secret, for its ranks (and braidctl, when given).
  so.job_secret = args->config.job_secret;
  if (!args->secret_file.empty()) {
    auto secret = braid::ReadOrCreateSecretFile("--secret-file", args->secret_file);
    if (!secret.ok()) {
      Fail(std::string(secret.status().message()));
      return kUsageError;
    }
    so.job_secret = *secret;
  }
  // Note [Watching a braidrun job]: a secret made up here is also kept in a file only this
  // user can read, for the braidctl command printed below; the file goes when braidrun ends.
  std::string watch_secret_file = args->secret_file;
  if (const char* f = std::getenv("BRAID_JOB_SECRET_FILE");
      watch_secret_file.empty() && f != nullptr) {
    watch_secret_file = f;  // the secret so.job_secret holds (args->config read it)
  }
  OwnSecretFile own_secret_file;
  std::string unwatchable;  // why a made-up secret could not be kept for braidctl
  if (so.job_secret.empty()) {
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    const char* home = std::getenv("HOME");
    auto dir = braid::braidrun::JobSecretDir(xdg ? xdg : "", home ? home : "");
    if (dir.ok()) {
      braid::braidrun::RemoveStaleJobSecrets(*dir);
      std::string path = braid::braidrun::JobSecretPath(*dir, getpid());
      unlink(path.c_str());  // a file of a dead braidrun whose pid this one got
      auto secret = braid::ReadOrCreateSecretFile("the job's secret file", path);
      if (secret.ok()) {
        so.job_secret = *secret;
        own_secret_file.path = path;
        watch_secret_file = path;
      } else {
        unwatchable = std::string(secret.status().message());
      }
    } else {
      unwatchable = absl::StrCat("no private directory for its secret: ",
                                 dir.status().message());
    }
  }
  if (so.job_secret.empty()) so.job_secret = braid::RandomSecret();
  so.single_job = true;
  // Registrations that wait longer fail naming the missing ranks, before the ranks' own
  // deadline (RegistrationTimeout in runtime/config.h).
  // Elastic: each membership change too, bounded by BRAID_ELASTIC_TIMEOUT_S (its ranks read
  // the same, BRAID_ELASTIC=1 set).
  braid::RuntimeConfig timeouts = args->config;
  timeouts.elastic = args->min_np > 0;
  so.register_timeout = braid::RegistrationTimeout(timeouts);
  so.tls_cert_file = args->config.tls_cert_file;
  so.tls_key_file = args->config.tls_key_file;
  // The job settings given to braidrun (flags, or its environment) are the job's: ranks
  // that set others are refused (Note [Job settings] in coordinator/rendezvous.h).
  so.settings = braid::ToProto(args->config.job);
  // Note [Lost ranks]: declared by the coordinator, ended by the supervisor if still running.
  braid::braidrun::LostRanks lost_ranks;
  so.on_rank_lost = [&lost_ranks](int rank, int worker, const std::string& why) {
    lost_ranks.Post(worker >= 0 ? worker : rank, why);
  };
  // Note [Elastic braidrun]: each membership as large as the ranks still running.
  braid::braidrun::ElasticWorld world(args->np);
  if (args->min_np > 0) {
    so.elastic_world_size = [&world] { return world.Size(); };
    so.elastic_admit = [&world](int worker) {
      std::optional<std::string> why = world.Admit(worker);
      if (!why) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat(braid::coordinator::kElasticLeave, ": ", *why));
    };
    so.elastic_leaving = [&world](int worker) { return world.Leaving(worker); };
  }
  auto server = braid::coordinator::StartCoordinator(so);
  if (!server.ok()) {
    Fail(absl::StrCat("cannot start the coordinator: ", server.status().message()));
    return 1;
  }
  std::unique_ptr<braid::coordinator::CoordinatorServer> coordinator = *std::move(server);
  const std::string address = coordinator->address();
  std::cerr << "braidrun: coordinator listening on " << address << std::endl;
  // Every printed command pastes into a shell as it is; what it needs besides is a comment.
  const std::string braidctl = braid::braidrun::BraidctlPath(ExecutableDir());
  std::string tls_ca = args->config.tls_ca_file;
  if (tls_ca.empty() && !args->config.tls_cert_file.empty()) tls_ca = "CA_FILE";
  const std::string tls_note =
      tls_ca == "CA_FILE" ? "  # CA_FILE: the CA that signed the job's TLS certificate" : "";
  if (!unwatchable.empty()) {
    std::cerr << "braidrun: this job cannot be watched with braidctl (" << unwatchable
              << "); give braidrun --secret-file FILE to watch a job" << std::endl;
  } else {  // without a secret file, the secret came from BRAID_JOB_SECRET
    std::cerr << "braidrun: watch this job with: "
              << braid::braidrun::WatchCommand(braidctl, address, watch_secret_file, tls_ca)
              << (watch_secret_file.empty()
                      ? "  # with this job's BRAID_JOB_SECRET in the environment"
                      : "")
              << tls_note << std::endl;
  }

  JobEnv job;
  job.world_size = args->np;
  job.elastic = args->min_np > 0;
  job.coordinator = address;
  job.job_secret = so.job_secret;
  job.settings = args->settings;
  job.python_path = PythonPackageDir();
  job.ucx_net_devices = !args->network_interface.empty() ? args->network_interface
                        : remote_hosts.empty()           ? "lo"
                                                         : "";
  // Note [Ranks die with their launcher]: the write end stays here alone (close-on-exec, and
  // the watchdog closed what it inherited), so it closes exactly when braidrun dies.
  LauncherPipe launcher_pipe = MakeLauncherPipe();
  job.launcher_pipe = launcher_pipe.variable;
  braid::braidrun::LaunchSpec spec = BuildLaunch(*args, job, *places, remote);
  spec.lost_ranks = &lost_ranks;
  spec.min_np = args->min_np;
  spec.max_np = args->max_np;
  spec.world = &world;
  spec.blacklist_cooldown = absl::Seconds(args->blacklist_cooldown_s);
  std::optional<braid::braidrun::HostDiscovery> discovery;
  if (!args->discovery_script.empty()) {
    discovery.emplace(args->discovery_script, absl::Seconds(args->discovery_interval_s),
                      absl::Seconds(30));
    spec.discovery = &*discovery;
    spec.make_rank = [&](int worker, const std::string& host) {
      braid::braidrun::RankPlacement p;
      p.host = host;
      return MakeRankSpec(*args, job, worker, p,
                          !braid::braidrun::IsLocalHost(host, local_names));
    };
  }
  spec.launcher_pipe = launcher_pipe.read_end;
  if (watchdog.ok()) {
    spec.group_started = [&](pid_t group) { watchdog->Watch(group); };
    spec.group_gone = [&](pid_t group) { watchdog->Forget(group); };
    if (args->verbose) std::cerr << "braidrun: watchdog pid " << watchdog->pid() << std::endl;
  }
  if (args->verbose) {
    if (!job.python_path.empty()) {
      std::cerr << "braidrun: PYTHONPATH starts with " << job.python_path << std::endl;
    }
    std::cerr << "braidrun: starting " << args->np << " rank" << (args->np == 1 ? "" : "s")
              << ": " << args->command[0] << "; " << DescribePlacement(*places, remote)
              << std::endl;
  }

  int rc = braid::braidrun::RunRanks(spec, signals);
  if (launcher_pipe.read_end >= 0) close(launcher_pipe.read_end);
  coordinator->Shutdown(absl::Seconds(1));
  coordinator.reset();
  if (args->verbose) std::cerr << "braidrun: exit code " << rc << std::endl;
  return rc;
}
