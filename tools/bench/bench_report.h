// Output of braid-bench: the nccl-tests style table on stdout and the JSON file that
// tools/bench/compare.py merges with the Open MPI and gloo peers (same row format).
#ifndef BRAID_TOOLS_BENCH_BENCH_REPORT_H_
#define BRAID_TOOLS_BENCH_BENCH_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/bench/bench_math.h"

namespace braid::bench {

// One measured (size, placement) pair; times are the max over ranks, as nccl-tests reports.
struct Row {
  uint64_t bytes = 0;
  size_t count = 0;
  bool inplace = false;
  double time_us = 0;         // max over ranks of each rank's mean per iteration
  double time_us_median = 0;  // max over ranks of each rank's median per iteration
  double time_us_max = 0;     // slowest single iteration on any rank (stall detector)
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::optional<int64_t> wrong;  // summed over ranks; empty without -c 1
};

// What a run measured, for the header and the JSON file.
struct RunInfo {
  std::string impl = "braid";
  Collective collective = Collective::kAllReduce;
  int ranks = 0;
  std::string dtype;
  std::string op;  // "none" for the copying collectives
  int iters = 0;
  int warmup = 0;
  bool check = false;
  double memcpy_gbps = 0;
  std::string transports;
};

// The header, printed once before the first row.
void PrintHeader(std::FILE* out, const RunInfo& info, bool has_inplace);

// One table line for a size: out-of-place and, when given, in-place.
void PrintRowLine(std::FILE* out, const RunInfo& info, const Row& out_of_place,
                  const Row* in_place);

// The footer: wrong elements in total and the mean bus bandwidth over rows (nccl-tests' "Avg
// bus bandwidth"), plus `error` when the run failed.
void PrintFooter(std::FILE* out, const std::vector<Row>& rows, const absl::Status& error);

// Writes {"memcpy_gbps", "transports", "rows": [...], ...} to `path` (see compare.py).
absl::Status WriteJson(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
                       const absl::Status& error);

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_BENCH_REPORT_H_
