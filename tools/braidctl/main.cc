// braidctl: watch a braid job.
//
//   braidctl status [--coordinator HOST:PORT] [--json] [--watch SECONDS] [--once]
//
// Asks the coordinator (BRAID_COORDINATOR when --coordinator is not given; braidrun prints
// its address at start) for one job's status: every rank's host, pid, state and last contact,
// the job's counters and settings, per group of tensors (compression method and the plan
// pattern that gave it) the tensors negotiated and the bytes the ranks measured
// (uncompressed, payload, transport: summed over ranks, reported with heartbeats), its
// process sets (each one's ranks, tensors negotiated and pending; shown only when the job has
// sets), and the tensors waiting for some ranks (stalled ones flagged, with the ranks
// missing; a process set's under its qualified name, ps<id>/<name>). A status
// is always one job's: a coordinator that runs several jobs one after the other starts every
// counter afresh for each. --json prints the StatusResponse message as JSON with its proto
// field names (stable: fields are only ever added).
//
// --once follows one job, the coordinator's current one when braidctl starts, to its end:
// it waits (without polling; the coordinator answers when the job ends), prints that job's
// final status and exits. With --watch S it also prints the status every S seconds until
// then. Exit codes: 0 the job ended with every rank shut down cleanly; 1 the job ended
// aborted (a rank lost, a stall, a failed registration); 2 usage error, or the coordinator
// cannot be reached at start; 3 the coordinator went away before the job ended (braidrun
// stops its coordinator when its ranks have exited).
//
// The coordinator answers only callers that present the job's secret (Note [Who may join] in
// coordinator/admission.h): --secret-file FILE (mode 0600), else BRAID_JOB_SECRET or
// BRAID_JOB_SECRET_FILE; --secret is refused (ps would show it to every user). Over TLS:
// --tls-ca FILE (or BRAID_TLS_CA), the certificate(s) to trust for the coordinator.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "tools/cli.h"
#include "tools/braidctl/compression_table.h"
#include "runtime/resolve.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "common/secret.h"
#include "control/tuned_settings.h"
#include "coordinator/credentials.h"
#include "proto/braid.grpc.pb.h"
#include "runtime/config.h"

namespace {

using braid::tools::kUsageError;  // also: the coordinator cannot be reached at start
constexpr int kGone = 3;

std::string Duration(int64_t ms) {
  if (ms < 0) return "-";
  if (ms < 1000) return absl::StrCat(ms, "ms");
  return absl::StrFormat("%.1fs", ms / 1000.0);
}

void PrintTable(const braid::proto::StatusResponse& s, const std::string& address) {
  std::printf("braid job %lld at %s: %s, world size %d, for %s (coordinator up %s)\n",
              static_cast<long long>(s.job_id()), address.c_str(), s.job_state().c_str(),
              s.size(), Duration(s.job_elapsed_ms()).c_str(), Duration(s.uptime_ms()).c_str());
  std::printf("cycles %lld  tensors negotiated %lld  buckets %lld  bytes negotiated %lld  pending %lld"
              "  register RPCs %lld  key-value RPCs %lld\n",
              static_cast<long long>(s.cycles()), static_cast<long long>(s.tensors_negotiated()),
              static_cast<long long>(s.responses_sent()),
              static_cast<long long>(s.bytes_negotiated()),
              static_cast<long long>(s.tensors_pending()),
              static_cast<long long>(s.register_rpcs()), static_cast<long long>(s.kv_rpcs()));
  if (s.has_settings()) {
    const auto& j = s.settings();
    std::printf("settings: fusion threshold %lld B, cache capacity %d, stall check %s, "
                "stall shutdown %s, heartbeat timeout %s, negotiation timeout %s, fast path %s, "
                "GPU data plane %s\n",
                static_cast<long long>(j.fusion_threshold_bytes()), j.cache_capacity(),
                Duration(j.stall_check_ms()).c_str(),
                j.stall_shutdown_ms() == 0 ? "never" : Duration(j.stall_shutdown_ms()).c_str(),
                Duration(j.heartbeat_timeout_ms()).c_str(),
                Duration(j.negotiation_timeout_ms()).c_str(), j.fast_path() != 0 ? "on" : "off",
                j.gpu_data_plane() == 1 ? "nccl" : j.gpu_data_plane() == 2 ? "host" : "auto");
    std::printf("data plane: ring chunk %s, ring window %lld; autotune %s\n",
                j.ring_chunk_bytes() == 0
                    ? "by topology"
                    : absl::StrCat(j.ring_chunk_bytes(), " B").c_str(),
                static_cast<long long>(j.ring_window()),
                s.autotune().empty() ? "off" : s.autotune().c_str());
  }
  // Note [Settings changes]: the settings in force when the job changed them, since when
  // and why.
  if (s.has_settings_change()) {
    const auto& c = s.settings_change();
    std::printf("settings changed: epoch %lld, %s: %s (%s)\n",
                static_cast<long long>(c.epoch()),
                s.settings_since_step() > 0
                    ? absl::StrCat("in force since step ", s.settings_since_step()).c_str()
                    : "sent, not in force yet",
                braid::DescribeSettings(c.settings()).c_str(),
                c.reason().c_str());
  }
  // Note [Auto compression]: the method `auto` tensors run with and why.
  if (!s.auto_compression().empty()) {
    std::printf("compression auto: %s\n", s.auto_compression().c_str());
  }
  if (s.compression_size() > 0) std::printf("\n%s", braid::tools::CompressionTable(s).c_str());
  std::printf("\n%-5s %-20s %-8s %-12s %s\n", "RANK", "HOST", "PID", "STATE", "LAST SEEN");
  for (const auto& r : s.ranks()) {
    // A rank of -1 registered without one; the coordinator assigns it when the job forms.
    std::printf("%-5s %-20s %-8lld %-12s %s\n",
                r.rank() < 0 ? "-" : std::to_string(r.rank()).c_str(), r.host().c_str(),
                static_cast<long long>(r.pid()), r.state().c_str(),
                r.last_seen_ms_ago() < 0 ? "never" : (Duration(r.last_seen_ms_ago()) + " ago").c_str());
  }
  // Note [Process sets] (control/process_sets.h): only a job that has sets shows them; their
  // pending tensors are listed below under their qualified names (ps<id>/<name>).
  if (s.process_sets_size() > 0) {
    std::printf("\n%-12s %-24s %-12s %s\n", "PROCESS SET", "RANKS", "NEGOTIATED", "PENDING");
    for (const auto& p : s.process_sets()) {
      std::printf("%-12d %-24s %-12lld %lld\n", p.id(), absl::StrJoin(p.ranks(), ",").c_str(),
                  static_cast<long long>(p.tensors_negotiated()),
                  static_cast<long long>(p.tensors_pending()));
    }
    if (s.settings().fast_path() != 0) {
      std::printf("(NEGOTIATED: the fast path's steps reach it with the ranks' heartbeats)\n");
    }
  }
  if (s.pending_size() > 0) {
    std::printf("\n%-32s %-9s %-16s %-16s %s\n", "PENDING TENSOR", "WAITING", "READY RANKS",
                "MISSING RANKS", "");
    for (const auto& p : s.pending()) {
      std::printf("%-32s %-9s %-16s %-16s %s\n", p.name().c_str(), Duration(p.waiting_ms()).c_str(),
                  absl::StrJoin(p.ready_ranks(), ",").c_str(),
                  absl::StrJoin(p.missing_ranks(), ",").c_str(), p.stalled() ? "STALLED" : "");
    }
  }
}

void Print(const braid::proto::StatusResponse& s, const std::string& address, bool json) {
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    opts.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(s, &out, opts);
    std::printf("%s\n", out.c_str());
  } else {
    PrintTable(s, address);
  }
  std::fflush(stdout);
}

class StatusClient {
 public:
  StatusClient(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
               std::string secret)
      : stub_(braid::proto::Coordinator::NewStub(grpc::CreateChannel(address, credentials))),
        secret_(std::move(secret)) {}

  // The status of `job_id` (0: the current job), waiting up to `wait` for it to end.
  grpc::Status Get(int64_t job_id, absl::Duration wait, braid::proto::StatusResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoMilliseconds(wait + absl::Seconds(3)));
    braid::coordinator::AddCallCredentials(&ctx, secret_);
    braid::proto::StatusRequest req;
    req.set_job_id(job_id);
    req.set_wait_for_end_ms(absl::ToInt64Milliseconds(wait));
    return stub_->Status(&ctx, req, resp);
  }

 private:
  std::unique_ptr<braid::proto::Coordinator::Stub> stub_;
  const std::string secret_;
};

struct Options {
  std::string address;
  std::string secret;
  std::string tls_ca_file;
  bool json = false;
  absl::Duration watch = absl::ZeroDuration();
  bool once = false;
};

// --once: follows the current job to its end (see the top of this file for exit codes).
int FollowOneJob(StatusClient& client, const Options& o) {
  braid::proto::StatusResponse s;
  grpc::Status st = client.Get(0, absl::ZeroDuration(), &s);
  if (!st.ok()) {
    std::cerr << "braidctl: cannot reach the coordinator at " << o.address << ": "
              << st.error_message() << "\n";
    return kUsageError;
  }
  const int64_t job = s.job_id();
  // The coordinator answers a wait when the job ends; each wait is bounded, so a coordinator
  // that vanished is noticed within one of them.
  const absl::Duration wait = o.watch > absl::ZeroDuration() ? o.watch : absl::Seconds(10);
  while (s.phase() != braid::proto::JOB_ENDED) {
    if (o.watch > absl::ZeroDuration()) Print(s, o.address, o.json);
    st = client.Get(job, wait, &s);
    if (!st.ok()) {
      std::cerr << "braidctl: the coordinator at " << o.address << " went away before job "
                << job << " ended: " << st.error_message() << "\n";
      return kGone;
    }
    if (o.watch > absl::ZeroDuration() && !o.json) std::printf("\n");
  }
  Print(s, o.address, o.json);
  return s.abort_message().empty() ? 0 : 1;
}

// The secret and the TLS trust from the flags, else from the environment (only the variables
// braidctl uses: a rank's setting that braidctl does not read cannot stop it).
absl::Status Credentials(const std::string& secret_file, const std::string& tls_ca,
                         Options* o) {
  auto config = braid::SettingsFromEnv([](const char* name) -> const char* {
    const std::string n(name);
    if (n == "BRAID_JOB_SECRET" || n == "BRAID_JOB_SECRET_FILE" || n == "BRAID_TLS_CA") {
      return std::getenv(name);
    }
    return nullptr;
  });
  if (!config.ok()) return config.status();
  o->tls_ca_file = tls_ca.empty() ? config->tls_ca_file : tls_ca;
  if (!secret_file.empty()) {
    auto secret = braid::ReadSecretFile("--secret-file", secret_file);
    if (!secret.ok()) return secret.status();
    o->secret = *secret;
  } else {
    o->secret = config->job_secret;
  }
  if (o->secret.empty()) {
    return absl::InvalidArgumentError(
        "no job secret: pass --secret-file FILE or set BRAID_JOB_SECRET or "
        "BRAID_JOB_SECRET_FILE (the coordinator answers only its job's callers)");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braidctl: inspect a braid job"};
  app.require_subcommand(1);
  CLI::App* status = app.add_subcommand("status", "show a job's ranks, counters and pending tensors");
  Options o;
  std::string address, watch, secret_file, secret, tls_ca;
  status->add_option("--coordinator", address, "HOST:PORT (default: $BRAID_COORDINATOR)");
  status->add_option("--secret-file", secret_file,
                     "file holding the job secret, mode 0600 (default: $BRAID_JOB_SECRET, "
                     "$BRAID_JOB_SECRET_FILE)");
  status->add_option("--secret", secret, "refused: a secret on the command line is visible "
                                         "to every user (ps); use --secret-file");
  status->add_option("--tls-ca", tls_ca, "PEM certificate(s) to trust: speak TLS (default: "
                                         "$BRAID_TLS_CA)");
  status->add_flag("--json", o.json, "print JSON (proto field names)");
  status->add_option("--watch", watch, "refresh every SECONDS (until interrupted, or --once)");
  status->add_flag("--once", o.once, "follow the current job until it ends, then exit with "
                                     "0 (clean), 1 (aborted) or 3 (coordinator gone)");
  BRAID_CLI_PARSE(app, argc, argv);

  auto fail = [](const absl::Status& s) {
    std::cerr << "braidctl: " << s.message() << "\n";
    return kUsageError;
  };
  if (!watch.empty()) {
    auto w = braid::ParseSeconds("--watch", watch, /*zero_allowed=*/true);
    if (!w.ok()) return fail(w.status());
    o.watch = *w;
  }
  if (address.empty()) {
    const char* env = std::getenv("BRAID_COORDINATOR");
    if (env == nullptr || *env == '\0') {
      std::cerr << "braidctl: no coordinator: pass --coordinator HOST:PORT or set BRAID_COORDINATOR\n";
      return kUsageError;
    }
    auto a = braid::ParseAddress("BRAID_COORDINATOR", env);
    if (!a.ok()) return fail(a.status());
    o.address = *a;
  } else {
    auto a = braid::ParseAddress("--coordinator", address);
    if (!a.ok()) return fail(a.status());
    o.address = *a;
  }
  if (status->get_option("--secret")->count() > 0) {
    return fail(absl::InvalidArgumentError(
        "--secret is refused: every user of this host could read it (ps); use --secret-file "
        "FILE (mode 0600) or BRAID_JOB_SECRET"));
  }
  if (absl::Status s = Credentials(secret_file, tls_ca, &o); !s.ok()) return fail(s);
  // A misspelt or unknown host fails at once, naming it (runtime/resolve.h).
  if (absl::Status s = braid::CheckHostResolves(braid::HostOfAddress(o.address), o.address);
      !s.ok()) {
    return fail(s);
  }
  auto credentials = braid::coordinator::MakeChannelCredentials(o.tls_ca_file);
  if (!credentials.ok()) return fail(credentials.status());
  StatusClient client(o.address, *credentials, o.secret);
  if (o.once) return FollowOneJob(client, o);
  while (true) {
    braid::proto::StatusResponse resp;
    grpc::Status st = client.Get(0, absl::ZeroDuration(), &resp);
    if (!st.ok()) {
      std::cerr << "braidctl: cannot reach the coordinator at " << o.address << ": "
                << st.error_message() << "\n";
      return kUsageError;
    }
    Print(resp, o.address, o.json);
    if (o.watch <= absl::ZeroDuration()) return 0;
    absl::SleepFor(o.watch);
    if (!o.json) std::printf("\n");
  }
}
