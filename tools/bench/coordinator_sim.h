// A load generator for the coordinator: N simulated ranks, each a real coordinator client
// (coordinator/client.h: its own gRPC channel and connection, registration, negotiation
// stream, heartbeats) in its own thread, submit T all-reduce requests per step in a random
// order of their own and wait for every one of them to come back, as a training step does.
// No tensor bytes move: this measures the coordinator alone (negotiation, validation,
// ordering, fusion planning, the response cache, and the streams to every rank).
//
// A rank answers its step's tensors from its response cache as the runtime does: once the
// coordinator gave a name a cache id, the rank sends the id instead of the request, until an
// eviction in the response stream drops it.
#ifndef BRAID_TOOLS_BENCH_COORDINATOR_SIM_H_
#define BRAID_TOOLS_BENCH_COORDINATOR_SIM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::bench {

struct SimOptions {
  std::string address;        // the coordinator's host:port
  int ranks = 8;              // simulated world size N
  int tensors = 200;          // tensors per step T
  int warmup = 2;             // untimed steps (the first fills the response cache)
  int steps = 20;             // timed steps
  // Request lists each rank sends per step (its shuffled tensors split evenly), as the
  // runtime sends what was enqueued during each cycle.
  int batches = 4;
  int cache_capacity = 1024;  // job setting BRAID_CACHE_CAPACITY; 0: no response cache
  int64_t fusion_threshold_bytes = 64 << 20;  // job setting; 0: one response per tensor
  uint64_t seed = 1;
  // Bounds registration and every step: a step not complete by then fails the run.
  absl::Duration timeout = absl::Seconds(120);
  // Called (from one rank's thread) once every rank finished its warm-up and before any
  // timed step starts, and once the last rank finished the last timed step.
  std::function<void()> on_timed_start;
  std::function<void()> on_timed_end;
};

struct SimResult {
  // Per rank, over warm-up and timed steps: tensor names received in OK responses,
  // responses (buckets) received, and ERROR responses.
  std::vector<int64_t> names_received;
  std::vector<int64_t> responses_received;
  std::vector<int64_t> errors;
  std::string first_error;      // the first ERROR response's message, if any
  absl::Duration timed;         // wall time of the timed steps (all ranks)
  double steps_per_second = 0;
  // Per timed step: from the previous step's completion on every rank to this one's.
  std::vector<absl::Duration> step_times;
};

// The tensors' sizes in elements (float32), the same on every rank: a spread like a CNN's
// gradient set (a few large weights, many small biases), deterministic in `seed`.
std::vector<int64_t> SimTensorSizes(int tensors, uint64_t seed);

// Runs the simulation. Errors: Unavailable (the coordinator cannot be reached),
// DeadlineExceeded (registration or a step took longer than options.timeout), or the
// registration's own error. ERROR responses do not fail the run: they are counted.
absl::StatusOr<SimResult> RunSimulation(const SimOptions& options);

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_COORDINATOR_SIM_H_
