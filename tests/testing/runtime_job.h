// Runs a braid::Runtime job for multi-process tests: a real coordinator process, one forked
// process per rank, real UCX between them. Header-only (gtest assertions in the parent).
#ifndef BRAID_TESTS_TESTING_RUNTIME_JOB_H_
#define BRAID_TESTS_TESTING_RUNTIME_JOB_H_

#include <stdlib.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "runtime/runtime.h"
#include "tests/testing/coordinator_process.h"
#include "tests/testing/fork_ranks.h"

namespace braid::testing {

// Everything a rank checks goes through here: a failure prints and makes the rank exit 1.
struct Checker {
  int rank;
  int failures = 0;
  bool Expect(bool ok, const std::string& what) {
    if (!ok && ++failures <= 20) fprintf(stderr, "[rank %d] FAILED: %s\n", rank, what.c_str());
    return ok;
  }
  bool Ok(const absl::Status& s, const std::string& what) {
    return Expect(s.ok(), what + ": " + s.ToString());
  }
};

inline void SetRankEnv(const std::string& coordinator, int rank, int size, double timeout_s = 30) {
  setenv("BRAID_COORDINATOR", coordinator.c_str(), 1);
  setenv("BRAID_RANK", std::to_string(rank).c_str(), 1);
  setenv("BRAID_SIZE", std::to_string(size).c_str(), 1);
  setenv("BRAID_TIMEOUT_S", std::to_string(timeout_s).c_str(), 1);
  setenv("UCX_TLS", "sm", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
}

inline absl::Status InitRuntime(Runtime& rt) {
  auto cfg = ConfigFromProcessEnv();
  if (!cfg.ok()) return cfg.status();
  return rt.Init(*cfg);
}

// Runs `body(rank, runtime, checker)` on `size` ranks against a fresh coordinator process and
// expects every rank to exit 0 within `deadline`. `env` is set on every rank, then
// `before_init(rank)` runs (a rank's own settings), then the runtime starts.
inline void RunJob(int size, const std::function<void(int, Runtime&, Checker&)>& body,
            absl::Duration deadline = absl::Seconds(120), double timeout_s = 30,
            const std::vector<std::pair<std::string, std::string>>& env = {},
            const std::function<void(int)>& before_init = {}) {
  CoordinatorProcess coord(size);
  ASSERT_FALSE(coord.address().empty()) << "coordinator did not start";
  RunRanksOptions o;
  o.ranks = size;
  o.deadline = deadline;
  auto exits = RunRanks(o, [&](int rank) {
    SetRankEnv(coord.address(), rank, size, timeout_s);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    if (before_init) before_init(rank);
    Checker c{rank};
    Runtime rt;
    if (!c.Ok(InitRuntime(rt), "init")) return 1;
    body(rank, rt, c);
    absl::Time t0 = absl::Now();
    c.Ok(rt.Shutdown(), "shutdown");
    c.Expect(absl::Now() - t0 < absl::Seconds(2),
             absl::StrCat("shutdown took ", absl::FormatDuration(absl::Now() - t0)));
    return c.failures == 0 ? 0 : 1;
  });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung";
    EXPECT_EQ(e.signal, 0) << "rank " << e.rank << " died of signal " << e.signal;
    EXPECT_EQ(e.exit_code, 0) << "rank " << e.rank << " failed (see its stderr)";
  }
}

inline CollectiveRequest AllReduceOf(const std::string& name, const float* in, float* out, int64_t n,
                              ReduceOp op) {
  CollectiveRequest r;
  r.name = name;
  r.collective = Collective::kAllReduce;
  r.dtype = DataType::kFloat32;
  r.shape = {n};
  r.input = in;
  r.output = out;
  r.op = op;
  return r;
}

// Waits for a handle under a deadline and returns its status.
inline absl::Status WaitFor(const absl::StatusOr<std::shared_ptr<Handle>>& h,
                     absl::Duration d = absl::Seconds(30)) {
  if (!h.ok()) return h.status();
  return (*h)->Wait(d);
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_RUNTIME_JOB_H_
