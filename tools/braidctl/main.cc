// braidctl: watch a running braid job.
//
//   braidctl status [--coordinator HOST:PORT] [--json] [--watch SECONDS]
//
// Asks the coordinator (BRAID_COORDINATOR when --coordinator is not given; braidrun prints
// its address at start) for the job's status: every rank's host, pid, state and last
// contact, counters, per compression method the tensors negotiated and the bytes the ranks
// measured (uncompressed, payload, transport: summed over ranks, reported with heartbeats),
// and the tensors waiting for some ranks (stalled ones flagged, with the
// ranks missing). --json prints the StatusResponse message as JSON with its proto field
// names (stable: fields are only ever added). An unreachable coordinator: one line on
// stderr, exit code 2.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "proto/braid.grpc.pb.h"

namespace {

std::string Duration(int64_t ms) {
  if (ms < 0) return "-";
  if (ms < 1000) return absl::StrCat(ms, "ms");
  return absl::StrFormat("%.1fs", ms / 1000.0);
}

void PrintTable(const braid::proto::StatusResponse& s, const std::string& address) {
  std::printf("braid job at %s: %s, world size %d, up %s\n", address.c_str(),
              s.job_state().c_str(), s.size(), Duration(s.uptime_ms()).c_str());
  std::printf("cycles %lld  tensors negotiated %lld  buckets %lld  bytes negotiated %lld  pending %lld\n",
              static_cast<long long>(s.cycles()), static_cast<long long>(s.tensors_negotiated()),
              static_cast<long long>(s.responses_sent()),
              static_cast<long long>(s.bytes_negotiated()),
              static_cast<long long>(s.tensors_pending()));
  if (s.compression_size() > 0) {
    // TENSORS as negotiated; the byte columns are what the ranks measured, summed over the
    // RANKS that reported (proto CompressionStat); "-" until a rank has reported.
    std::printf("\n%-24s %-10s %-16s %-16s %-16s %-8s %s\n", "COMPRESSION", "TENSORS",
                "UNCOMPRESSED", "PAYLOAD", "TRANSPORT", "RATIO", "RANKS");
    for (const auto& c : s.compression()) {
      const bool reported = c.ranks_reporting() > 0;
      auto bytes = [reported](int64_t v) {
        return reported ? absl::StrCat(v) : std::string("-");
      };
      const std::string ratio = c.ratio() > 0 ? absl::StrFormat("%.2f", c.ratio()) : "-";
      std::printf("%-24s %-10lld %-16s %-16s %-16s %-8s %d\n", c.method().c_str(),
                  static_cast<long long>(c.tensors()), bytes(c.uncompressed_bytes()).c_str(),
                  bytes(c.payload_bytes()).c_str(), bytes(c.transport_bytes()).c_str(),
                  ratio.c_str(), c.ranks_reporting());
    }
    std::printf("(bytes summed over the RANKS that reported; RATIO = uncompressed / payload)\n");
  }
  std::printf("\n%-5s %-20s %-8s %-12s %s\n", "RANK", "HOST", "PID", "STATE", "LAST SEEN");
  for (const auto& r : s.ranks()) {
    std::printf("%-5d %-20s %-8lld %-12s %s\n", r.rank(), r.host().c_str(),
                static_cast<long long>(r.pid()), r.state().c_str(),
                r.last_seen_ms_ago() < 0 ? "never" : (Duration(r.last_seen_ms_ago()) + " ago").c_str());
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braidctl: inspect a running braid job"};
  app.require_subcommand(1);
  CLI::App* status = app.add_subcommand("status", "show the job's ranks, counters and pending tensors");
  std::string address;
  bool json = false;
  double watch = 0;
  status->add_option("--coordinator", address, "HOST:PORT (default: $BRAID_COORDINATOR)");
  status->add_flag("--json", json, "print JSON (proto field names)");
  status->add_option("--watch", watch, "refresh every SECONDS until interrupted");
  CLI11_PARSE(app, argc, argv);

  if (address.empty()) {
    const char* env = std::getenv("BRAID_COORDINATOR");
    if (env == nullptr || *env == '\0') {
      std::cerr << "braidctl: no coordinator: pass --coordinator HOST:PORT or set BRAID_COORDINATOR\n";
      return 2;
    }
    address = env;
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = braid::proto::Coordinator::NewStub(channel);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    braid::proto::StatusRequest req;
    braid::proto::StatusResponse resp;
    grpc::Status st = stub->Status(&ctx, req, &resp);
    if (!st.ok()) {
      std::cerr << "braidctl: cannot reach the coordinator at " << address << ": "
                << st.error_message() << "\n";
      return 2;
    }
    if (json) {
      std::string out;
      google::protobuf::util::JsonPrintOptions opts;
      opts.preserve_proto_field_names = true;
      opts.always_print_primitive_fields = true;
      (void)google::protobuf::util::MessageToJsonString(resp, &out, opts);
      std::printf("%s\n", out.c_str());
    } else {
      PrintTable(resp, address);
    }
    std::fflush(stdout);
    if (watch <= 0) return 0;
    absl::SleepFor(absl::Seconds(watch));
    if (!json) std::printf("\n");
  }
}
