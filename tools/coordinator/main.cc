// braid-coordinator: the coordinator as a standalone daemon, for long-lived or multi-job
// setups (braidrun hosts one itself; without braidrun, rank 0 hosts one in-process).
//
// It runs one job at a time (Note [One job at a time] in coordinator/service.h): a job forms
// as its ranks register, runs, and ends when every rank has shut down or was lost; the next
// job's first registration starts it with every counter and table at zero, and a rank that
// registers while a job runs waits for it to end. `braidctl status` shows one job only.
//
// Job settings (--fusion-threshold-mb, --cache-capacity, --stall-check-seconds,
// --stall-shutdown-seconds, --heartbeat-timeout, --negotiation-timeout, or their BRAID_*
// variables in this process's environment) bind every job it runs; the ones left unset are
// the ranks' to set.
// Stops on SIGINT, SIGTERM or a Shutdown RPC.
//
// Every call must carry the job secret (Note [Who may join] in coordinator/admission.h):
// --secret-file FILE (read; or created with a random secret, mode 0600, when missing), else
// BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE. Never on the command line: --secret is refused
// (every user of the host could read it with ps). TLS: --tls-cert / --tls-key (or
// BRAID_TLS_CERT / BRAID_TLS_KEY).
#include <signal.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "tools/cli.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/server.h"
#include "glog/logging.h"
#include "common/secret.h"
#include "runtime/config.h"
#include "runtime/config_proto.h"

namespace {

using braid::tools::kUsageError;

// The flags of runtime/config.h it takes: the job settings, and the registration deadline.
constexpr const char* kSettingFlags[] = {"--fusion-threshold-mb", "--cache-capacity",
                                         "--stall-check-seconds", "--stall-shutdown-seconds",
                                         "--heartbeat-timeout", "--negotiation-timeout",
                                         "--register-timeout"};
// The registration deadline without --register-timeout or BRAID_REGISTER_TIMEOUT_S: a
// standalone coordinator's ranks may be started by hand, one host after the other.
constexpr absl::Duration kDefaultRegisterTimeout = absl::Seconds(120);

struct Flags {
  std::string bind = "127.0.0.1", port = "0", size = "0", secret, secret_file, port_file;
  std::string tls_cert, tls_key;
  bool secret_given = false;  // --secret: refused
  std::map<std::string, std::string> settings;  // setting flag -> text, when given
};

// The server's options from the flags and the environment, through the configuration parser
// (runtime/config.h): a bad value is an error naming its flag or variable.
absl::StatusOr<braid::coordinator::ServerOptions> Options(const Flags& f) {
  braid::coordinator::ServerOptions o;
  o.bind_address = f.bind;
  auto port = braid::ParsePort("--port", f.port, /*zero_allowed=*/true);
  if (!port.ok()) return port.status();
  o.port = *port;
  auto size = braid::ParseInteger("--size", f.size, 0, 65536);
  if (!size.ok()) return size.status();
  o.world_size = static_cast<int>(*size);
  std::map<std::string, std::string> value_of, flag_of;  // variable -> value / flag
  for (const auto& [flag, text] : f.settings) {
    const braid::SettingFlag* sf = braid::FindSettingFlag(flag);
    auto v = braid::SettingFlagValue(*sf, text);
    if (!v.ok()) return v.status();
    value_of[sf->variable] = *v;
    flag_of[sf->variable] = flag;
  }
  auto config = braid::SettingsFromEnv(
      [&](const char* name) -> const char* {
        auto it = value_of.find(name);
        if (it != value_of.end()) return it->second.c_str();
        // --secret-file replaces the secret of the environment.
        const std::string n(name);
        if (!f.secret_file.empty() && (n == "BRAID_JOB_SECRET" || n == "BRAID_JOB_SECRET_FILE")) {
          return nullptr;
        }
        return std::getenv(name);
      },
      [&](absl::string_view var) {
        auto it = flag_of.find(std::string(var));
        return it == flag_of.end() ? std::string(var) : it->second;
      });
  if (!config.ok()) return config.status();
  o.settings = braid::ToProto(config->job);
  o.register_timeout = config->register_timeout.value_or(kDefaultRegisterTimeout);
  o.tls_cert_file = f.tls_cert.empty() ? config->tls_cert_file : f.tls_cert;
  o.tls_key_file = f.tls_key.empty() ? config->tls_key_file : f.tls_key;
  if (f.secret_given) {
    return absl::InvalidArgumentError(
        "--secret is refused: every user of this host could read it (ps); use --secret-file "
        "FILE (mode 0600) or BRAID_JOB_SECRET");
  }
  if (!f.secret_file.empty()) {
    auto secret = braid::ReadOrCreateSecretFile("--secret-file", f.secret_file);
    if (!secret.ok()) return secret.status();
    o.job_secret = *secret;
  } else {
    o.job_secret = config->job_secret;
  }
  if (o.job_secret.empty()) {
    return absl::InvalidArgumentError(
        "no job secret: pass --secret-file FILE (created with a random secret when missing) "
        "or set BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE; ranks and braidctl use the same");
  }
  return o;
}

// Writes the port to `path` through a temporary file renamed into place, so a reader polling
// for it never sees half a number. An error names the path and the system's reason: a
// coordinator nobody can find must not run on (scripts would wait for the file for ever).
absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  auto failed = [&](int e) {
    unlink(tmp.c_str());
    return absl::InvalidArgumentError(absl::StrCat(
        "--port-file: cannot write '", path, "' (through '", tmp, "'): ", std::strerror(e)));
  };
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return failed(errno);
  if (std::fprintf(f, "%d\n", port) < 0) {
    const int e = errno;
    std::fclose(f);
    return failed(e);
  }
  if (std::fclose(f) != 0) return failed(errno);  // a full disk shows at the flush
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return failed(errno);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braid-coordinator: negotiates which tensors are ready on every rank, one job "
               "at a time"};
  Flags f;
  app.add_option("--bind", f.bind, "address to listen on")->capture_default_str();
  app.add_option("--port", f.port, "port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--size", f.size, "world size of every job (0: each job's first rank's)")
      ->capture_default_str();
  app.add_option("--secret-file", f.secret_file,
                 "file holding the job secret every call must present (mode 0600; created "
                 "with a random secret when missing). Default: BRAID_JOB_SECRET(_FILE)");
  app.add_option("--secret", f.secret, "refused: a secret on the command line is visible to "
                                       "every user (ps); use --secret-file");
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate: serve TLS (default: BRAID_TLS_CERT)");
  app.add_option("--tls-key", f.tls_key, "PEM private key, mode 0600 (default: BRAID_TLS_KEY)");
  app.add_option("--port-file", f.port_file, "write the chosen port to this file once listening");
  for (const char* flag : kSettingFlags) {
    const braid::SettingFlag* sf = braid::FindSettingFlag(flag);
    app.add_option(flag, f.settings[flag], absl::StrCat(sf->help, " (", sf->variable, ")"));
  }
  BRAID_CLI_PARSE(app, argc, argv);
  for (const char* flag : kSettingFlags) {
    if (app.get_option(flag)->count() == 0) f.settings.erase(flag);
  }
  f.secret_given = app.get_option("--secret")->count() > 0;
  auto options = Options(f);
  if (!options.ok()) {
    std::cerr << "braid-coordinator: " << options.status().message() << "\n";
    return kUsageError;
  }
  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    FLAGS_v = std::max(FLAGS_v, 1);  // one line as each job forms and ends
    google::InitGoogleLogging("braid-coordinator");
  }

  // Before gRPC starts threads: SIGINT/SIGTERM stay blocked in every thread and are taken
  // by sigwait below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto server = braid::coordinator::StartCoordinator(*options);
  if (!server.ok()) {
    std::cerr << "braid-coordinator: " << server.status().message() << "\n";
    return kUsageError;
  }
  std::cout << "braid-coordinator listening on " << (*server)->address() << std::endl;
  if (!f.port_file.empty()) {
    if (absl::Status s = WritePortFile(f.port_file, (*server)->port()); !s.ok()) {
      std::cerr << "braid-coordinator: " << s.message() << "\n";
      (*server)->Shutdown(absl::Seconds(1));
      return kUsageError;
    }
  }
  // A Shutdown RPC stops the server: the waiter then wakes the sigwait below.
  std::thread waiter([&] {
    (*server)->Wait();
    kill(getpid(), SIGTERM);
  });
  int sig = 0;
  sigwait(&stop, &sig);
  (*server)->Shutdown(absl::Seconds(1));
  waiter.join();
  return 0;
}
