// braid-bench: nccl-tests style benchmark of braid's UCX Communicator on one host.
//
//   braid-bench allreduce -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 --ranks 2 [--json out.json]
//
// The parent measures memcpy bandwidth, makes a FileStore directory and fork()s one child per
// rank before anything touches UCX (UCX does not survive fork); every child creates its
// Communicator and runs the sweep; rank 0 prints the table and writes the JSON file. The parent
// waits for the children with a deadline, kills the rest when one fails, and exits non-zero
// when any rank failed (2) or any element was wrong (1).
//
// Method (nccl-tests): buffers are allocated and touched once for the largest size (page
// faults cost ~15 us/page in these VMs), then for each size: `warmup` untimed iterations, a
// Barrier, `iters` timed iterations. A rank's time is its mean per iteration (its median is
// kept too); the reported time is the max over ranks, gathered with a small all-reduce.
// With -c 1 the inputs hold an exact integer pattern and one more call is checked element
// by element against a locally computed reference (tools/bench/bench_check.h).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "tools/cli.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "tools/bench/bench_check.h"
#include "tools/bench/bench_buffer.h"
#include "tools/bench/bench_math.h"
#include "tools/bench/bench_ranks.h"
#include "tools/bench/bench_report.h"
#include "transport/communicator.h"
#include "common/store.h"
#include "transport/ucx_communicator.h"

namespace braid::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  Collective collective = Collective::kAllReduce;
  std::vector<uint64_t> sizes;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  int ranks = 2;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::string json_path;
  absl::Duration timeout = absl::Seconds(60);   // UcxOptions::timeout and connect_timeout
  absl::Duration deadline = absl::Minutes(10);  // the whole run, enforced by the parent
  std::optional<size_t> chunk_bytes;
  std::optional<size_t> ring_threshold_bytes;
  std::optional<int> ring_window;
  std::optional<int> direct_max_ranks;
  std::optional<double> spin_us;
  bool warm_shared_memory = true;
  // --peer-error-handling (falling back to BRAID_UCX_PEER_ERROR_HANDLING), validated in the
  // parent; the flags above override the rest.
  transport::UcxOptions ucx_base;
};

bool IsReduction(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}

// In-place variants the Communicator API defines: only all-reduce (send == recv). All-gather
// and reduce-scatter have no documented aliasing rule, so they are measured out of place only.
bool HasInPlace(Collective c) { return c == Collective::kAllReduce; }


// Single-thread memcpy bandwidth of a 64 MiB buffer already touched: bytes copied per second,
// median of 9 copies. Measured in the parent before fork, with no rank running.
double MeasureMemcpyGbps() {
  constexpr size_t kBytes = size_t{64} << 20;
  Buffer src(kBytes), dst(kBytes);
  std::memset(src.data, 1, kBytes);
  std::memcpy(dst.data, src.data, kBytes);
  std::vector<double> gbps;
  for (int i = 0; i < 9; ++i) {
    auto t0 = Clock::now();
    std::memcpy(dst.data, src.data, kBytes);
    std::chrono::duration<double> dt = Clock::now() - t0;
    gbps.push_back(GigabytesPerSecond(kBytes, dt.count()));
  }
  // Keep the copies observable so they are not optimised away.
  volatile char sink = dst.data[kBytes / 2];
  (void)sink;
  return Median(gbps);
}

// Buffers and per-call arguments for one size of the sweep.
class Call {
 public:
  Call(const Config& cfg, transport::Communicator* comm, const CollectiveShape& shape)
      : cfg_(cfg), comm_(comm), shape_(shape), elem_(DataTypeSize(cfg.dtype)) {
    const size_t n = static_cast<size_t>(comm->size());
    block_bytes_.assign(n, shape.block_count * elem_);
    block_counts_.assign(n, shape.block_count);
  }

  // Bytes of the send and receive buffers `shape` needs.
  static size_t SendBytes(Collective c, const CollectiveShape& s, size_t elem) {
    switch (c) {
      case Collective::kAllGather: return s.block_count * elem;
      case Collective::kBroadcast: return 0;  // one buffer: recv
      default: return s.count * elem;
    }
  }
  static size_t RecvBytes(Collective c, const CollectiveShape& s, size_t elem) {
    return c == Collective::kReduceScatter ? s.block_count * elem : s.count * elem;
  }

  absl::Status Run(char* send, char* recv, bool inplace) {
    switch (cfg_.collective) {
      case Collective::kAllReduce:
        return comm_->AllReduce(inplace ? recv : send, recv, shape_.count, cfg_.dtype, cfg_.op);
      case Collective::kReduceScatter:
        return comm_->ReduceScatter(send, recv, block_counts_, cfg_.dtype, cfg_.op);
      case Collective::kAllGather:
        return comm_->AllGather(send, shape_.block_count * elem_, recv, block_bytes_);
      case Collective::kAllToAll: return comm_->AllToAll(send, block_bytes_, recv, block_bytes_);
      case Collective::kBroadcast: return comm_->Broadcast(recv, shape_.count * elem_, cfg_.root);
    }
    return absl::InternalError("unreachable");
  }

  // Fills the inputs with the check pattern and poisons the outputs (0xff: NaN / -1), so a
  // call that writes nothing cannot pass.
  void Prepare(char* send, char* recv, bool inplace) {
    const int rank = comm_->rank();
    const ReduceOp pat = PatternOp();
    const size_t recv_bytes = RecvBytes(cfg_.collective, shape_, elem_);
    if (!inplace) std::memset(recv, 0xff, recv_bytes);
    switch (cfg_.collective) {
      case Collective::kAllReduce:
        FillPattern(inplace ? recv : send, shape_.count, cfg_.dtype, pat, rank, 0);
        break;
      case Collective::kReduceScatter:
      case Collective::kAllToAll: FillPattern(send, shape_.count, cfg_.dtype, pat, rank, 0); break;
      case Collective::kAllGather:
        FillPattern(send, shape_.block_count, cfg_.dtype, pat, rank, 0);
        break;
      case Collective::kBroadcast:
        if (rank == cfg_.root) FillPattern(recv, shape_.count, cfg_.dtype, pat, rank, 0);
        break;
    }
  }

  // Wrong elements of this rank's output after a call on Prepare()d buffers.
  size_t CountWrong(const char* recv) const {
    const int rank = comm_->rank();
    const int n = comm_->size();
    const size_t b = shape_.block_count;
    const ReduceOp pat = PatternOp();
    size_t wrong = 0;
    switch (cfg_.collective) {
      case Collective::kAllReduce:
        return CountWrongReduced(recv, shape_.count, cfg_.dtype, cfg_.op, n, 0);
      case Collective::kReduceScatter:
        return CountWrongReduced(recv, b, cfg_.dtype, cfg_.op, n, rank * b);
      case Collective::kAllGather:
        for (int p = 0; p < n; ++p) {
          wrong += CountWrongCopied(recv + p * b * elem_, b, cfg_.dtype, pat, p, 0);
        }
        return wrong;
      case Collective::kAllToAll:
        for (int p = 0; p < n; ++p) {
          wrong += CountWrongCopied(recv + p * b * elem_, b, cfg_.dtype, pat, p, rank * b);
        }
        return wrong;
      case Collective::kBroadcast:
        return CountWrongCopied(recv, shape_.count, cfg_.dtype, pat, cfg_.root, 0);
    }
    return wrong;
  }

 private:
  // The copying collectives use the sum pattern whatever --op says.
  ReduceOp PatternOp() const { return IsReduction(cfg_.collective) ? cfg_.op : ReduceOp::kSum; }

  const Config& cfg_;
  transport::Communicator* comm_;
  CollectiveShape shape_;
  size_t elem_;
  std::vector<size_t> block_bytes_;
  std::vector<size_t> block_counts_;
};

// One (size, placement) measurement on this rank; `row` gets the values agreed by all ranks.
absl::Status Measure(const Config& cfg, transport::Communicator* comm, const CollectiveShape& shape,
                     Buffer& send, Buffer& recv, bool inplace, int64_t* local_wrong, Row* row) {
  Call call(cfg, comm, shape);
  if (cfg.check) call.Prepare(send.data, recv.data, inplace);
  for (int i = 0; i < cfg.warmup; ++i) {
    BRAID_RETURN_IF_ERROR(call.Run(send.data, recv.data, inplace));
  }
  BRAID_RETURN_IF_ERROR(comm->Barrier());
  std::vector<double> iter_us(static_cast<size_t>(cfg.iters));
  const auto start = Clock::now();
  auto t = start;
  for (int i = 0; i < cfg.iters; ++i) {
    BRAID_RETURN_IF_ERROR(call.Run(send.data, recv.data, inplace));
    const auto now = Clock::now();
    iter_us[static_cast<size_t>(i)] = std::chrono::duration<double, std::micro>(now - t).count();
    t = now;
  }
  const double mean_us =
      std::chrono::duration<double, std::micro>(t - start).count() / std::max(cfg.iters, 1);

  double wrong = 0;
  if (cfg.check) {
    call.Prepare(send.data, recv.data, inplace);
    BRAID_RETURN_IF_ERROR(call.Run(send.data, recv.data, inplace));
    wrong = static_cast<double>(call.CountWrong(recv.data));
    *local_wrong += static_cast<int64_t>(wrong);
  }

  // Agree on the numbers: the max over ranks of the times (nccl-tests) and the total of the
  // wrong elements. float64 keeps counts exact below 2^53.
  double agree_max[3] = {mean_us, Median(iter_us),
                         *std::max_element(iter_us.begin(), iter_us.end())};
  double agree_sum[1] = {wrong};
  BRAID_RETURN_IF_ERROR(
      comm->AllReduce(agree_max, agree_max, 3, DataType::kFloat64, ReduceOp::kMax));
  BRAID_RETURN_IF_ERROR(
      comm->AllReduce(agree_sum, agree_sum, 1, DataType::kFloat64, ReduceOp::kSum));
  row->bytes = shape.bytes;
  row->count = shape.count;
  row->inplace = inplace;
  row->time_us = agree_max[0];
  row->time_us_median = agree_max[1];
  row->time_us_max = agree_max[2];
  row->algbw_gbps = GigabytesPerSecond(shape.bytes, row->time_us * 1e-6);
  row->busbw_gbps = row->algbw_gbps * BusBwFactor(cfg.collective, comm->size());
  if (cfg.check) row->wrong = static_cast<int64_t>(agree_sum[0]);
  return absl::OkStatus();
}

RunInfo MakeRunInfo(const Config& cfg, double memcpy_gbps) {
  RunInfo info;
  info.collective = cfg.collective;
  info.ranks = cfg.ranks;
  info.dtype = std::string(DataTypeName(cfg.dtype));
  info.op = IsReduction(cfg.collective) ? std::string(ReduceOpName(cfg.op)) : "none";
  info.iters = cfg.iters;
  info.warmup = cfg.warmup;
  info.check = cfg.check;
  info.memcpy_gbps = memcpy_gbps;
  return info;
}

// The sweep on one rank. Rank 0 prints and writes the JSON (also after a failure, with the
// rows it has). Returns the rank's exit code: 0, 1 (wrong elements), 2 (error).
int RunRank(const Config& cfg, int rank, const std::string& store_dir, double memcpy_gbps) {
  RunInfo info = MakeRunInfo(cfg, memcpy_gbps);
  std::vector<Row> rows;
  int64_t local_wrong = 0;
  bool header_printed = false;
  auto sweep = [&]() -> absl::Status {
    FileStore store(store_dir);
    transport::UcxOptions opts = cfg.ucx_base;
    opts.rank = rank;
    opts.size = cfg.ranks;
    opts.store = &store;
    opts.store_prefix = "bench";
    opts.timeout = cfg.timeout;
    opts.connect_timeout = cfg.timeout;
    if (cfg.chunk_bytes) opts.chunk_bytes = *cfg.chunk_bytes;
    if (cfg.ring_threshold_bytes) opts.ring_threshold_bytes = *cfg.ring_threshold_bytes;
    if (cfg.ring_window) opts.ring_window = *cfg.ring_window;
    if (cfg.direct_max_ranks) opts.direct_max_ranks = *cfg.direct_max_ranks;
    if (cfg.spin_us) opts.spin = absl::Microseconds(*cfg.spin_us);
    opts.warm_shared_memory = cfg.warm_shared_memory;
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<transport::Communicator> comm,
                           transport::CreateUcxCommunicator(opts));
    info.transports = comm->Describe();

    const size_t elem = DataTypeSize(cfg.dtype);
    size_t send_max = 0, recv_max = 0;
    for (uint64_t s : cfg.sizes) {
      CollectiveShape shape = ShapeFor(cfg.collective, s, elem, cfg.ranks);
      send_max = std::max(send_max, Call::SendBytes(cfg.collective, shape, elem));
      recv_max = std::max(recv_max, Call::RecvBytes(cfg.collective, shape, elem));
    }
    Buffer send(send_max), recv(recv_max);

    if (rank == 0) {
      PrintHeader(stdout, info, HasInPlace(cfg.collective));
      header_printed = true;
    }
    for (uint64_t s : cfg.sizes) {
      CollectiveShape shape = ShapeFor(cfg.collective, s, elem, cfg.ranks);
      Row out_of_place, in_place;
      BRAID_RETURN_IF_ERROR(
          Measure(cfg, comm.get(), shape, send, recv, false, &local_wrong, &out_of_place));
      rows.push_back(out_of_place);
      if (HasInPlace(cfg.collective)) {
        BRAID_RETURN_IF_ERROR(
            Measure(cfg, comm.get(), shape, send, recv, true, &local_wrong, &in_place));
        rows.push_back(in_place);
      }
      if (rank == 0) {
        PrintRowLine(stdout, info, out_of_place, HasInPlace(cfg.collective) ? &in_place : nullptr);
        // Rewritten after every size, so a run killed later still leaves its rows behind.
        if (!cfg.json_path.empty()) {
          WriteJson(cfg.json_path, info, rows,
                    absl::AbortedError("run did not finish (killed or still running)"))
              .IgnoreError();
        }
      }
    }
    // Nobody closes endpoints while a peer still reads the last result.
    return comm->Barrier();
  };
  absl::Status status = sweep();
  if (!status.ok()) {
    std::fprintf(stderr, "braid-bench: rank %d: %s\n", rank, status.ToString().c_str());
  }
  if (rank == 0) {
    if (!header_printed) PrintHeader(stdout, info, HasInPlace(cfg.collective));
    PrintFooter(stdout, rows, status);
    if (!cfg.json_path.empty()) {
      absl::Status written = WriteJson(cfg.json_path, info, rows, status);
      if (!written.ok()) {
        std::fprintf(stderr, "braid-bench: %s\n", written.ToString().c_str());
        if (status.ok()) status = written;
      }
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  if (!status.ok()) return 2;
  return local_wrong > 0 ? 1 : 0;
}

// Forks the ranks and waits for them (tools/bench/bench_ranks.h).
int RunParent(const Config& cfg) {
  const double memcpy_gbps = MeasureMemcpyGbps();

  std::string tmpl = (std::filesystem::temp_directory_path() / "braid-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "braid-bench: mkdtemp(%s): %s\n", tmpl.c_str(), std::strerror(errno));
    return 2;
  }
  const std::string store_dir = tmpl;

  RanksOptions opts;
  opts.ranks = cfg.ranks;
  opts.deadline = cfg.deadline;
  opts.prog = "braid-bench";
  const RanksRun run =
      RunRanks(opts, [&](int r) { return RunRank(cfg, r, store_dir, memcpy_gbps); });

  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  return ReportRanks(run, opts.prog, " (wrong elements)");
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) {
  using namespace braid;
  using namespace braid::bench;
  CLI::App app{"nccl-tests style benchmark of braid's UCX Communicator on one host"};
  std::string collective, min_s = "8", max_s = "64M", factor_s = "2", dtype_s = "float32",
                          op_s = "sum";
  Config cfg;
  int check = 1;
  double timeout_s = 60, deadline_s = 600;
  std::string chunk_s, threshold_s;
  double spin_us = -1;
  int ring_window = 0, peer_error_handling = 0, direct_max_ranks = -1;
  app.add_option("collective", collective,
                 "allreduce | allgather | reducescatter | alltoall | broadcast")
      ->required();
  app.add_option("-b,--minbytes", min_s, "smallest size (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor_s, "multiply the size by this")->capture_default_str();
  app.add_option("-n,--iters", cfg.iters, "timed iterations per size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", cfg.warmup, "untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", check, "1: check the results, count wrong elements")
      ->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "local ranks to start")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("-d,--dtype", dtype_s, "float32 float64 float16 bfloat16 int32 int64 uint8")
      ->capture_default_str();
  app.add_option("-o,--op", op_s, "sum average min max product")->capture_default_str();
  app.add_option("-r,--root", cfg.root, "broadcast root")->capture_default_str();
  app.add_option("--json", cfg.json_path, "write the rows as JSON here");
  app.add_option("--timeout", timeout_s,
                 "seconds without progress before a collective fails (UcxOptions::timeout)")
      ->envname("BRAID_TIMEOUT_S")
      ->capture_default_str();
  app.add_option("--deadline", deadline_s, "seconds for the whole run before ranks are killed")
      ->capture_default_str();
  app.add_option("--chunk", chunk_s, "UcxOptions::chunk_bytes (ring pipeline chunk)");
  app.add_option("--ring-threshold", threshold_s, "UcxOptions::ring_threshold_bytes");
  app.add_option("--ring-window", ring_window, "UcxOptions::ring_window (chunks in flight)");
  app.add_option("--direct-max-ranks", direct_max_ranks,
                 "UcxOptions::direct_max_ranks: direct reduce-scatter up to this many ranks, "
                 "ring above (default 16)");
  app.add_option("--peer-error-handling", peer_error_handling,
                 "UcxOptions::peer_error_handling for local peers: 0 or 1")
      ->envname("BRAID_UCX_PEER_ERROR_HANDLING")
      ->capture_default_str();
  app.add_option("--spin-us", spin_us,
                 "UcxOptions::spin in microseconds (negative: by over-subscription)")
      ->capture_default_str();
  int warm_shared_memory = 1;
  app.add_option("--warm-shared-memory", warm_shared_memory,
                 "UcxOptions::warm_shared_memory: 1 pages UCX's shared-memory receive "
                 "descriptors in at connection, 0 leaves them to the first messages")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  BRAID_CLI_PARSE(app, argc, argv);

  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "braid-bench: %s\n", s.ToString().c_str());
    return 2;
  };
  absl::StatusOr<braid::bench::Collective> c = ParseCollective(collective);
  if (!c.ok()) return fail(c.status());
  cfg.collective = *c;
  absl::StatusOr<uint64_t> min_b = ParseSize(min_s), max_b = ParseSize(max_s),
                           factor = ParseSize(factor_s);
  for (const auto* s : {&min_b, &max_b, &factor}) {
    if (!s->ok()) return fail(s->status());
  }
  absl::StatusOr<std::vector<uint64_t>> sizes = SizeList(*min_b, *max_b, *factor);
  if (!sizes.ok()) return fail(sizes.status());
  cfg.sizes = *sizes;
  bool dtype_found = false, op_found = false;
  for (int32_t v = 0; v < kNumDataTypes; ++v) {
    if (DataTypeName(static_cast<DataType>(v)) == dtype_s) {
      cfg.dtype = static_cast<DataType>(v);
      dtype_found = true;
    }
  }
  for (int32_t v = 0; v < kNumReduceOps; ++v) {
    if (ReduceOpName(static_cast<ReduceOp>(v)) == op_s) {
      cfg.op = static_cast<ReduceOp>(v);
      op_found = true;
    }
  }
  if (!dtype_found) return fail(absl::InvalidArgumentError("unknown --dtype " + dtype_s));
  if (!op_found) return fail(absl::InvalidArgumentError("unknown --op " + op_s));
  if (IsReduction(cfg.collective)) {
    absl::Status ok = CheckReduceOp(cfg.dtype, cfg.op);
    if (!ok.ok()) return fail(ok);
  }
  if (cfg.root < 0 || cfg.root >= cfg.ranks) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--root ", cfg.root, " is not a rank of ", cfg.ranks)));
  }
  if (check && cfg.ranks > kMaxExactRanks) {
    std::fprintf(stderr, "braid-bench: note: beyond %d ranks the check may be inexact\n",
                 kMaxExactRanks);
  }
  cfg.check = check != 0;
  if (timeout_s <= 0 || deadline_s <= 0) {
    return fail(absl::InvalidArgumentError("--timeout and --deadline must be positive"));
  }
  cfg.timeout = absl::Seconds(timeout_s);
  cfg.deadline = absl::Seconds(deadline_s);
  for (auto [text, dst] : {std::pair{&chunk_s, &cfg.chunk_bytes},
                           std::pair{&threshold_s, &cfg.ring_threshold_bytes}}) {
    if (text->empty()) continue;
    absl::StatusOr<uint64_t> v = ParseSize(*text);
    if (!v.ok()) return fail(v.status());
    *dst = static_cast<size_t>(*v);
  }
  if (spin_us >= 0) cfg.spin_us = spin_us;
  cfg.warm_shared_memory = warm_shared_memory == 1;
  if (ring_window > 0) cfg.ring_window = ring_window;
  if (direct_max_ranks >= 0) cfg.direct_max_ranks = direct_max_ranks;
  if (peer_error_handling != 0 && peer_error_handling != 1) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--peer-error-handling (or BRAID_UCX_PEER_ERROR_HANDLING) must be 0 or 1, got ",
        peer_error_handling)));
  }
  cfg.ucx_base.peer_error_handling = peer_error_handling != 0;

  if (!google::IsGoogleLoggingInitialized()) google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return RunParent(cfg);
}
