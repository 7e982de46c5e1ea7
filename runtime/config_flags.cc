// braidrun's flags for the job's settings (config.h: SettingFlags): a flag per variable, the
// launcher's spelling of what the environment sets.
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "runtime/config.h"

namespace braid {

const std::vector<SettingFlag>& SettingFlags() {
  static const std::vector<SettingFlag> kFlags = {
      {"--timeout", "BRAID_TIMEOUT_S", "seconds a collective may make no progress"},
      {"--register-timeout", "BRAID_REGISTER_TIMEOUT_S",
       "seconds the whole world may take to register (default: braidrun's and rank 0's "
       "coordinator --timeout, at least 60; braid-coordinator 120)"},
      {"--fusion-threshold-mb", "BRAID_FUSION_THRESHOLD",
       "fusion bucket size in MiB (the variable is in bytes; 0: no fusion)"},
      {"--cycle-time-ms", "BRAID_CYCLE_TIME_MS", "batching window for new requests, in ms"},
      {"--cache-capacity", "BRAID_CACHE_CAPACITY", "response cache entries (0: off)"},
      {"--timeline-filename", "BRAID_TIMELINE", "write a Chrome-trace timeline to this file"},
      {"--stall-check-seconds", "BRAID_STALL_CHECK_S",
       "seconds before a tensor missing on some ranks is reported"},
      {"--stall-shutdown-seconds", "BRAID_STALL_SHUTDOWN_S",
       "seconds before such a stall aborts the job (0: never)"},
      {"--heartbeat-timeout", "BRAID_HEARTBEAT_TIMEOUT_S",
       "seconds of silence before a rank is declared lost"},
      {"--negotiation-timeout", "BRAID_NEGOTIATION_TIMEOUT_S",
       "seconds before a tensor some ranks submitted and others did not fails on every rank"},
      {"--fast-path", "BRAID_FAST_PATH",
       "1 (default): ranks agree on cached tensors over the data plane, 0: always ask the "
       "coordinator"},
      {"--compression", "BRAID_COMPRESSION",
       "default compression of float all-reduces, e.g. fp16, fp4:ef=1, auto (braid chooses "
       "from the link and step it measures), or a plan of name patterns to specs, e.g. "
       "'{\"*.bias\": \"none\", \"*\": \"fp4\"}'"},
      {"--autotune", "BRAID_AUTOTUNE",
       "the coordinator tunes the fusion threshold, cycle time and ring chunk and window by "
       "measuring the job's steps (docs/configuration.md)",
       /*boolean=*/true},
      {"--autotune-log-file", "BRAID_AUTOTUNE_LOG",
       "rank 0 writes one CSV row per measured autotuning candidate to this file"},
      {"--ring-chunk-bytes", "BRAID_RING_CHUNK_BYTES",
       "pipeline piece of the data plane's ring, in bytes (0, default: 256 KiB on one host, "
       "16 KiB across hosts)"},
      {"--ring-window", "BRAID_RING_WINDOW", "pipeline pieces in flight per peer (default 4)"},
      {"--gpu-data-plane", "BRAID_GPU_DATA_PLANE",
       "auto (default): uncompressed GPU all-reduces over NCCL where every rank can run it, "
       "else through the host; nccl: NCCL or fail; host: always through the host"},
  };
  return kFlags;
}

const SettingFlag* FindSettingFlag(absl::string_view flag) {
  for (const SettingFlag& f : SettingFlags()) {
    if (flag == f.flag) return &f;
  }
  return nullptr;
}

absl::StatusOr<std::string> SettingFlagValue(const SettingFlag& flag, absl::string_view text) {
  if (absl::string_view(flag.flag) == "--fusion-threshold-mb") {
    auto bytes = ParseMebibytes(flag.flag, text, kMaxFusionThresholdBytes);
    if (!bytes.ok()) return bytes.status();
    return absl::StrCat(*bytes);
  }
  return std::string(text);
}

}  // namespace braid
