#include "tools/bench/bench_report.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace braid::bench {
namespace {

void PrintCells(std::FILE* out, const Row& row) {
  std::fprintf(out, "  %10.2f  %7.3f  %7.3f", row.time_us, row.algbw_gbps, row.busbw_gbps);
  if (row.wrong.has_value()) {
    std::fprintf(out, "  %6lld", static_cast<long long>(*row.wrong));
  } else {
    std::fprintf(out, "  %6s", "N/A");
  }
}

nlohmann::json RowJson(const RunInfo& info, const Row& row) {
  nlohmann::json j;
  j["impl"] = info.impl;
  j["collective"] = std::string(CollectiveName(info.collective));
  j["ranks"] = info.ranks;
  j["bytes"] = row.bytes;
  j["count"] = row.count;
  j["dtype"] = info.dtype;
  j["op"] = info.op;
  j["inplace"] = row.inplace;
  j["time_us"] = row.time_us;
  j["time_us_median"] = row.time_us_median;
  j["time_us_max"] = row.time_us_max;
  j["algbw_gbps"] = row.algbw_gbps;
  j["busbw_gbps"] = row.busbw_gbps;
  j["wrong"] = row.wrong.has_value() ? nlohmann::json(*row.wrong) : nlohmann::json(nullptr);
  return j;
}

const char* EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

}  // namespace

void PrintHeader(std::FILE* out, const RunInfo& info, bool has_inplace) {
  std::fprintf(out, "# braid-bench %s: %d ranks, %s %s, %d iterations after %d warm-up, check %d\n",
               std::string(CollectiveName(info.collective)).c_str(), info.ranks, info.dtype.c_str(),
               info.op.c_str(), info.iters, info.warmup, info.check ? 1 : 0);
  std::fprintf(out, "# transports: %s\n", info.transports.c_str());
  std::fprintf(out, "# UCX_TLS=%s UCX_NET_DEVICES=%s\n", EnvOr("UCX_TLS", "(unset)"),
               EnvOr("UCX_NET_DEVICES", "(unset)"));
  std::fprintf(out, "# memcpy: %.2f GB/s (one thread, 64 MiB, warm buffers, median of 9)\n",
               info.memcpy_gbps);
  std::fprintf(out, "#\n");
  std::fprintf(out, "# %10s  %11s  %8s  %7s  %38s", "", "", "", "", "out-of-place");
  if (has_inplace) std::fprintf(out, "  %38s", "in-place");
  std::fprintf(out, "\n# %10s  %11s  %8s  %7s  %10s  %7s  %7s  %6s", "size", "count", "type",
               "redop", "time", "algbw", "busbw", "#wrong");
  if (has_inplace) {
    std::fprintf(out, "  %10s  %7s  %7s  %6s", "time", "algbw", "busbw", "#wrong");
  }
  std::fprintf(out, "\n# %10s  %11s  %8s  %7s  %10s  %7s  %7s  %6s", "(B)", "(elements)", "", "",
               "(us)", "(GB/s)", "(GB/s)", "");
  if (has_inplace) {
    std::fprintf(out, "  %10s  %7s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
  }
  std::fprintf(out, "\n");
  std::fflush(out);
}

void PrintRowLine(std::FILE* out, const RunInfo& info, const Row& out_of_place,
                  const Row* in_place) {
  std::fprintf(out, "  %10llu  %11zu  %8s  %7s",
               static_cast<unsigned long long>(out_of_place.bytes), out_of_place.count,
               info.dtype.c_str(), info.op.c_str());
  PrintCells(out, out_of_place);
  if (in_place != nullptr) PrintCells(out, *in_place);
  std::fprintf(out, "\n");
  std::fflush(out);
}

void PrintFooter(std::FILE* out, const std::vector<Row>& rows, const absl::Status& error) {
  int64_t wrong = 0;
  bool checked = false;
  double busbw_sum = 0;
  for (const Row& r : rows) {
    if (r.wrong.has_value()) {
      checked = true;
      wrong += *r.wrong;
    }
    busbw_sum += r.busbw_gbps;
  }
  if (checked) {
    std::fprintf(out, "# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
                 wrong == 0 ? "OK" : "FAILED");
  }
  std::fprintf(out, "# Avg bus bandwidth    : %.4f\n",
               rows.empty() ? 0.0 : busbw_sum / static_cast<double>(rows.size()));
  if (!error.ok()) std::fprintf(out, "# ERROR: %s\n", error.ToString().c_str());
  std::fprintf(out, "#\n");
  std::fflush(out);
}

absl::Status WriteJson(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
                       const absl::Status& error) {
  nlohmann::json j;
  j["impl"] = info.impl;
  j["collective"] = std::string(CollectiveName(info.collective));
  j["ranks"] = info.ranks;
  j["dtype"] = info.dtype;
  j["op"] = info.op;
  j["iters"] = info.iters;
  j["warmup"] = info.warmup;
  j["memcpy_gbps"] = info.memcpy_gbps;
  j["transports"] = info.transports;
  j["env"] = {{"UCX_TLS", EnvOr("UCX_TLS", "")}, {"UCX_NET_DEVICES", EnvOr("UCX_NET_DEVICES", "")}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) j["rows"].push_back(RowJson(info, r));
  j["ok"] = error.ok();
  if (!error.ok()) j["error"] = error.ToString();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f)
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    f << j.dump(1) << "\n";
    if (!f) return absl::InternalError(absl::StrCat("write to ", tmp, " failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace braid::bench
