// braid-coordinator: the coordinator as a standalone daemon, for long-lived or multi-job
// setups (braidrun hosts one itself; without braidrun, rank 0 hosts one in-process).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "coordinator/server.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braid coordinator: negotiates which tensors are ready on every rank"};
  braid::coordinator::ServerOptions o;
  std::string port_file;
  double register_timeout_s = 120, heartbeat_timeout_s = 10;
  app.add_option("--bind", o.bind_address, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--size", o.world_size, "world size (0: from the first rank)")->capture_default_str();
  app.add_option("--secret", o.job_secret, "job secret ranks must present (BRAID_JOB_SECRET)");
  app.add_option("--port-file", port_file, "write the chosen port to this file once listening");
  app.add_option("--register-timeout", register_timeout_s, "seconds to wait for every rank")->capture_default_str();
  app.add_option("--heartbeat-timeout", heartbeat_timeout_s, "seconds of silence before a rank is lost")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.register_timeout = absl::Seconds(register_timeout_s);
  o.heartbeat_timeout = absl::Seconds(heartbeat_timeout_s);

  auto server = braid::coordinator::StartCoordinator(o);
  if (!server.ok()) {
    std::cerr << "braid-coordinator: " << server.status().message() << "\n";
    return 2;
  }
  std::cout << "braid-coordinator listening on " << (*server)->address() << std::endl;
  if (!port_file.empty()) {
    std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  // Ends on SIGINT/SIGTERM or a Shutdown RPC.
  std::thread waiter([&] {
    (*server)->Wait();
    g_stop = true;
  });
  while (!g_stop) absl::SleepFor(absl::Milliseconds(100));
  (*server)->Shutdown(absl::Seconds(1));
  waiter.join();
  return 0;
}
