#include "runtime/config.h"
#include "runtime/config_proto.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/limits.h"
#include "common/secret.h"
#include "common/status_macros.h"
#include "compression/compression_plan.h"
#include "compression/registry.h"

namespace braid {
namespace {

constexpr int64_t kMaxSeconds = 365 * 24 * 3600;  // one year
constexpr int64_t kMaxFusionThreshold = kMaxFusionThresholdBytes;
const absl::Duration kMinHeartbeatTimeout = absl::Milliseconds(400);
constexpr int64_t kMinTimelineBytes = 65536;

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// "12.5" -> {"12", "5"}; false unless the text is digits with an optional ".digits".
bool SplitDecimal(absl::string_view text, absl::string_view* whole, absl::string_view* frac) {
  size_t dot = text.find('.');
  *whole = text.substr(0, dot);
  *frac = dot == absl::string_view::npos ? absl::string_view() : text.substr(dot + 1);
  return AllDigits(*whole) && (dot == absl::string_view::npos || AllDigits(*frac));
}

// The variables of RuntimeConfig, each with its grammar. `what` is the name errors use.
struct Variable {
  const char* name;
  absl::Status (*parse)(absl::string_view what, absl::string_view text, RuntimeConfig* c);
};

template <typename T>
absl::Status Assign(absl::StatusOr<T> v, T* out) {
  if (!v.ok()) return v.status();
  *out = *std::move(v);
  return absl::OkStatus();
}

template <typename T, typename U>
absl::Status AssignOptional(absl::StatusOr<T> v, std::optional<U>* out) {
  if (!v.ok()) return v.status();
  *out = static_cast<U>(*v);
  return absl::OkStatus();
}

// BRAID_COMPRESSION comes after BRAID_TEST_COMPRESSORS, which decides what it may name.
const Variable kVariables[] = {
    {"BRAID_COORDINATOR",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseAddress(w, t), &c->coordinator);
     }},
    {"BRAID_COORDINATOR_PORT",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       c->coordinator_port_from = std::string(w);
       return Assign(ParsePort(w, t, /*zero_allowed=*/false), &c->coordinator_port);
     }},
    {"BRAID_JOB_SECRET",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       BRAID_RETURN_IF_ERROR(CheckSecret(w, t));
       c->job_secret = std::string(t);
       return absl::OkStatus();
     }},
    {"BRAID_JOB_SECRET_FILE",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       if (!c->job_secret.empty()) {
         return absl::InvalidArgumentError(absl::StrCat(
             "BRAID_JOB_SECRET and ", w, " are both set: set one of them"));
       }
       return Assign(ReadSecretFile(w, std::string(t)), &c->job_secret);
     }},
    // HOME, then XDG_CONFIG_HOME, which takes precedence.
    {"HOME",
     [](absl::string_view, absl::string_view t, RuntimeConfig* c) {
       c->user_key_file = absl::StrCat(t, "/.config/braid/user.key");
       return absl::OkStatus();
     }},
    {"XDG_CONFIG_HOME",
     [](absl::string_view, absl::string_view t, RuntimeConfig* c) {
       c->user_key_file = absl::StrCat(t, "/braid/user.key");
       return absl::OkStatus();
     }},
    {"BRAID_TLS_CERT",
     [](absl::string_view, absl::string_view t, RuntimeConfig* c) {
       c->tls_cert_file = std::string(t);
       return absl::OkStatus();
     }},
    {"BRAID_TLS_KEY",
     [](absl::string_view, absl::string_view t, RuntimeConfig* c) {
       c->tls_key_file = std::string(t);
       return absl::OkStatus();
     }},
    {"BRAID_TLS_CA",
     [](absl::string_view, absl::string_view t, RuntimeConfig* c) {
       c->tls_ca_file = std::string(t);
       return absl::OkStatus();
     }},
    {"BRAID_TIMELINE",
     [](absl::string_view, absl::string_view t, RuntimeConfig* c) {
       c->timeline_path = std::string(t);
       return absl::OkStatus();
     }},
    {"BRAID_TIMELINE_MAX_BYTES",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       auto v = ParseInteger(w, t, 0, int64_t{1} << 50);
       // A file must hold at least a few events besides the rows' names.
       if (v.ok() && *v != 0 && *v < kMinTimelineBytes) {
         return absl::InvalidArgumentError(absl::StrCat(
             w, " must be 0 (no limit) or at least ", kMinTimelineBytes, " bytes, got ", t));
       }
       return Assign(std::move(v), &c->timeline_max_bytes);
     }},
    {"BRAID_CYCLE_TIME_MS",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       auto ms = ParseInteger(w, t, 0, 60000);
       if (ms.ok()) c->cycle_time = absl::Milliseconds(*ms);
       return ms.status();
     }},
    {"BRAID_SEED",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       auto v = ParseInteger(w, t, 0, INT64_MAX);
       if (v.ok()) c->seed = static_cast<uint64_t>(*v);
       return v.status();
     }},
    {"BRAID_TEST_COMPRESSORS",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseZeroOrOne(w, t), &c->test_compressors);
     }},
    {"BRAID_TIMEOUT_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseSeconds(w, t, /*zero_allowed=*/false), &c->timeout);
     }},
    {"BRAID_REGISTER_TIMEOUT_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseSeconds(w, t, /*zero_allowed=*/false), &c->register_timeout);
     }},
    {"BRAID_ELASTIC",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseZeroOrOne(w, t), &c->elastic);
     }},
    {"BRAID_ELASTIC_TIMEOUT_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseSeconds(w, t, /*zero_allowed=*/false), &c->elastic_timeout);
     }},
    {"BRAID_UCX_PEER_ERROR_HANDLING",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseZeroOrOne(w, t), &c->ucx_peer_error_handling);
     }},
    {"BRAID_LOOP_CPU",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       // 1023: CPU_SETSIZE - 1, the highest CPU a thread's affinity mask names here.
       if (t == "auto" || t == "none" || ParseInteger(w, t, 0, 1023).ok()) {
         c->loop_cpu = std::string(t);
         return absl::OkStatus();
       }
       return absl::InvalidArgumentError(absl::StrCat(
           w, " must be 'auto', 'none' or a CPU number from 0 to 1023, got '", t, "'"));
     }},
    {"BRAID_PIPELINED_COPY",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseZeroOrOne(w, t), &c->pipelined_copy);
     }},
    {"BRAID_CUDA_UNVERIFIED",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return Assign(ParseZeroOrOne(w, t), &c->cuda_unverified);
     }},
    {"BRAID_LAUNCHER_PIPE",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       const size_t colon = t.find(':');
       auto fd = ParseInteger(w, t.substr(0, colon), 0, 1 << 20);
       auto inode = ParseInteger(w, colon == absl::string_view::npos ? "" : t.substr(colon + 1),
                                 1, INT64_MAX);
       if (!fd.ok() || !inode.ok()) {
         return absl::InvalidArgumentError(
             absl::StrCat(w, " must be FD:INODE (braidrun sets it), got '", t, "'"));
       }
       c->launcher_pipe_fd = static_cast<int>(*fd);
       c->launcher_pipe_inode = static_cast<uint64_t>(*inode);
       return absl::OkStatus();
     }},
    {"BRAID_FUSION_THRESHOLD",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseInteger(w, t, 0, kMaxFusionThreshold),
                             &c->job.fusion_threshold_bytes);
     }},
    {"BRAID_CACHE_CAPACITY",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseInteger(w, t, 0, 1 << 24), &c->job.cache_capacity);
     }},
    {"BRAID_STALL_CHECK_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseSeconds(w, t, /*zero_allowed=*/false), &c->job.stall_check);
     }},
    {"BRAID_STALL_SHUTDOWN_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseSeconds(w, t, /*zero_allowed=*/true), &c->job.stall_shutdown);
     }},
    {"BRAID_HEARTBEAT_TIMEOUT_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       auto v = ParseSeconds(w, t, /*zero_allowed=*/false);
       // Ranks beat every timeout / 4, but at most ten times a second: a shorter timeout
       // would be shorter than four heartbeat intervals (coordinator/client.h).
       if (v.ok() && *v < kMinHeartbeatTimeout) {
         return absl::InvalidArgumentError(absl::StrCat(
             w, " must be at least ", absl::FormatDuration(kMinHeartbeatTimeout),
             " (four heartbeats, which ranks send at most every 100ms), got '", t, "'"));
       }
       return AssignOptional(std::move(v), &c->job.heartbeat_timeout);
     }},
    {"BRAID_NEGOTIATION_TIMEOUT_S",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseSeconds(w, t, /*zero_allowed=*/false),
                             &c->job.negotiation_timeout);
     }},
    {"BRAID_FAST_PATH",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseZeroOrOne(w, t), &c->job.fast_path);
     }},
    {"BRAID_GPU_DATA_PLANE",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       static constexpr absl::string_view kValues[] = {"auto", "nccl", "host"};
       for (int i = 0; i < 3; ++i) {
         if (t == kValues[i]) {
           c->job.gpu_data_plane = i;
           return absl::OkStatus();
         }
       }
       return absl::InvalidArgumentError(
           absl::StrCat(w, " must be auto, nccl or host, got '", t, "'"));
     }},
    {"BRAID_RING_CHUNK_BYTES",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       auto v = ParseInteger(w, t, 0, kMaxRingChunkBytes);
       if (v.ok() && *v != 0 && *v < kMinRingChunkBytes) {
         return absl::InvalidArgumentError(absl::StrCat(
             w, " must be 0 (by topology) or from ", kMinRingChunkBytes, " to ",
             kMaxRingChunkBytes, " bytes, got '", t, "'"));
       }
       return AssignOptional(std::move(v), &c->job.ring_chunk_bytes);
     }},
    {"BRAID_RING_WINDOW",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       auto v = ParseInteger(w, t, 1, kMaxRingWindow);
       if (!v.ok()) return v.status();
       c->job.ring_window = static_cast<int>(*v);
       return absl::OkStatus();
     }},
    {"BRAID_AUTOTUNE",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       return AssignOptional(ParseZeroOrOne(w, t), &c->job.autotune);
     }},
    {"BRAID_AUTOTUNE_LOG",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       c->autotune_log_path = std::string(t);
       return absl::OkStatus();
     }},
    {"BRAID_COMPRESSION",
     [](absl::string_view w, absl::string_view t, RuntimeConfig* c) {
       compression::RegistryOptions ro;
       ro.test_methods = c->test_compressors;
       if (compression::CompressionPlan::IsPlan(t)) {  // Note [Compression plans]
         auto plan = compression::CompressionPlan::Parse(t, ro);
         if (!plan.ok()) {
           return absl::InvalidArgumentError(absl::StrCat(w, ": ", plan.status().message()));
         }
         c->compression = plan->canonical();
         return absl::OkStatus();
       }
       auto spec = compression::ParseCompressionSpec(t, ro);
       if (!spec.ok()) {
         return absl::InvalidArgumentError(absl::StrCat(w, ": ", spec.status().message()));
       }
       c->compression = spec->canonical;
       return absl::OkStatus();
     }},
};

}  // namespace

absl::StatusOr<int64_t> ParseInteger(absl::string_view what, absl::string_view text,
                                     int64_t min, int64_t max) {
  absl::string_view digits = text;
  absl::ConsumePrefix(&digits, "-");
  int64_t v = 0;
  // from_chars reads the sign itself; the digits after it must be all there is.
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (!AllDigits(digits) || ec == std::errc::invalid_argument ||
      end != text.data() + text.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer, got '", text, "'"));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be in [", min, ", ", max, "], got ", text));
  }
  return v;
}

absl::StatusOr<absl::Duration> ParseSeconds(absl::string_view what, absl::string_view text,
                                            bool zero_allowed) {
  absl::string_view whole, frac;
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be a ", zero_allowed ? "non-negative" : "positive",
        " number of seconds, got '", text, "'"));
  };
  if (!SplitDecimal(text, &whole, &frac)) return bad();
  // Exact decimal arithmetic: no binary floating point between the text and the duration.
  for (size_t i = 3; i < frac.size(); ++i) {
    if (frac[i] != '0') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " must be a whole number of milliseconds, got '", text, "'"));
    }
  }
  size_t first = whole.find_first_not_of('0');
  whole = first == absl::string_view::npos ? absl::string_view("0") : whole.substr(first);
  int64_t seconds = 0;
  if (whole.size() > 12 || !absl::SimpleAtoi(whole, &seconds) || seconds > kMaxSeconds ||
      (seconds == kMaxSeconds && frac.find_first_not_of('0') != absl::string_view::npos)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be at most ", kMaxSeconds, " seconds (one year), got '", text, "'"));
  }
  int64_t ms = seconds * 1000;
  for (size_t i = 0; i < 3; ++i) {
    ms += (i < frac.size() ? frac[i] - '0' : 0) * (i == 0 ? 100 : i == 1 ? 10 : 1);
  }
  if (ms == 0 && !zero_allowed) return bad();
  return absl::Milliseconds(ms);
}

absl::StatusOr<bool> ParseZeroOrOne(absl::string_view what, absl::string_view text) {
  if (text == "0" || text == "1") return text == "1";
  return absl::InvalidArgumentError(absl::StrCat(what, " must be 0 or 1, got '", text, "'"));
}

absl::StatusOr<int> ParsePort(absl::string_view what, absl::string_view text, bool zero_allowed) {
  auto v = ParseInteger(what, text, zero_allowed ? 0 : 1, 65535);
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

absl::StatusOr<std::string> ParseAddress(absl::string_view what, absl::string_view text) {
  if (absl::StartsWith(text, "unix:") && text.size() > 5) return std::string(text);
  absl::string_view host, port;
  if (absl::StartsWith(text, "[")) {
    size_t close = text.find("]:");
    if (close != absl::string_view::npos) {
      host = text.substr(1, close - 1);
      port = text.substr(close + 2);
    }
  } else if (size_t colon = text.rfind(':'); colon != absl::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (absl::StrContains(host, ':')) host = {};  // a bare IPv6 address needs brackets
  }
  int64_t p = 0;
  if (host.empty() || !AllDigits(port) || port.size() > 5 || !absl::SimpleAtoi(port, &p) ||
      p < 1 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be HOST:PORT (a port in [1, 65535]) or unix:PATH, got '", text, "'"));
  }
  return std::string(text);
}

absl::StatusOr<int64_t> ParseMebibytes(absl::string_view what, absl::string_view text,
                                       int64_t max_bytes) {
  absl::string_view whole, frac;
  if (!SplitDecimal(text, &whole, &frac) || whole.size() > 12 || frac.size() > 18) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-negative number of MiB, got '", text, "'"));
  }
  int64_t mib = 0, f = 0;
  (void)absl::SimpleAtoi(whole, &mib);
  if (!frac.empty()) (void)absl::SimpleAtoi(frac, &f);
  // bytes = (mib + f / 10^k) * 2^20, exactly.
  __int128 scale = 1;
  for (size_t i = 0; i < frac.size(); ++i) scale *= 10;
  const __int128 frac_bytes_scaled = static_cast<__int128>(f) << 20;
  if (frac_bytes_scaled % scale != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", text, " MiB is not a whole number of bytes"));
  }
  const __int128 bytes = (static_cast<__int128>(mib) << 20) + frac_bytes_scaled / scale;
  if (bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be at most ", max_bytes >> 20,
                                                   " MiB, got '", text, "'"));
  }
  return static_cast<int64_t>(bytes);
}


proto::JobSettings ToProto(const JobSettings& s) {
  proto::JobSettings p;
  if (s.fusion_threshold_bytes) p.set_fusion_threshold_bytes(*s.fusion_threshold_bytes);
  if (s.cache_capacity) p.set_cache_capacity(*s.cache_capacity);
  if (s.stall_check) p.set_stall_check_ms(absl::ToInt64Milliseconds(*s.stall_check));
  if (s.stall_shutdown) p.set_stall_shutdown_ms(absl::ToInt64Milliseconds(*s.stall_shutdown));
  if (s.heartbeat_timeout) {
    p.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(*s.heartbeat_timeout));
  }
  if (s.negotiation_timeout) {
    p.set_negotiation_timeout_ms(absl::ToInt64Milliseconds(*s.negotiation_timeout));
  }
  if (s.fast_path) p.set_fast_path(*s.fast_path ? 1 : 0);
  if (s.gpu_data_plane) p.set_gpu_data_plane(*s.gpu_data_plane);
  if (s.ring_chunk_bytes) p.set_ring_chunk_bytes(*s.ring_chunk_bytes);
  if (s.ring_window) p.set_ring_window(*s.ring_window);
  if (s.autotune) p.set_autotune(*s.autotune ? 1 : 0);
  return p;
}

absl::StatusOr<RuntimeConfig> SettingsFromEnv(const Getenv& env, const NameOf& name_of) {
  RuntimeConfig c;
  for (const Variable& v : kVariables) {
    const char* text = env(v.name);
    if (text == nullptr || *text == '\0') continue;
    const std::string what = name_of ? name_of(v.name) : std::string(v.name);
    absl::Status s = v.parse(what, text, &c);
    if (!s.ok()) return s;
  }
  return c;
}

const std::vector<std::string>& KnownBraidVariables() {
  static const std::vector<std::string>* const kKnown = [] {
    auto* known = new std::vector<std::string>{
        "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE",
        // braidrun's number for a process (braid.torch.elastic: docs/elastic.md).
        "BRAID_WORKER",
        // The torch.distributed backend's all-reduce method, read by braid.torch.distributed
        // (docs/torch.md), which checks it with the registry's canonical_compression.
        "BRAID_C10D_COMPRESSION",
        // Horovod's HOROVOD_DYNAMIC_PROCESS_SETS, read by braid's Python init (docs/
        // process-sets.md): 1 is init(process_sets="dynamic").
        "BRAID_DYNAMIC_PROCESS_SETS",
        // The test suite's: the build tree (tests/python), coordinator_wire_test's report.
        "BRAID_BUILD_DIR", "BRAID_MEMORY_TEST_OMIT_APPLIED"};
    for (const Variable& v : kVariables) {
      if (absl::StartsWith(v.name, "BRAID_")) known->push_back(v.name);
    }
    return known;
  }();
  return *kKnown;
}

absl::StatusOr<RuntimeConfig> ConfigFromProcessEnv() {
  auto c = ConfigFromEnv([](const char* n) { return std::getenv(n); });
  if (c.ok()) c->environment_warnings = EnvironmentWarnings(ProcessEnvironmentNames());
  return c;
}

absl::Duration RegistrationTimeout(const RuntimeConfig& config) {
  if (config.register_timeout.has_value()) return *config.register_timeout;
  // A membership change of an elastic job waits for the old membership to end and the new
  // one to form: BRAID_ELASTIC_TIMEOUT_S bounds both (docs/elastic.md).
  if (config.elastic) return config.elastic_timeout;
  return std::max(config.timeout, absl::Seconds(60));
}

}  // namespace braid
