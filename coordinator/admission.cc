#include "coordinator/admission.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "glog/logging.h"

namespace braid::coordinator {

namespace {

// The shared bucket of the addresses past kMaxTrackedAddresses (no peer address looks so).
constexpr char kOtherAddresses[] = "(other addresses)";

}  // namespace

std::string PeerAddress(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == peer.size()) return std::string(peer);
  const absl::string_view port = peer.substr(colon + 1);
  if (!std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) return std::string(peer);
  const absl::string_view host = peer.substr(0, colon);
  // "ipv6:::1" has no port: a port follows a bracket (plain or %5D-encoded) in IPv6 peers.
  if (absl::StartsWith(host, "ipv6:") && !absl::EndsWith(host, "]") &&
      !absl::EndsWith(host, "%5D") && !absl::EndsWith(host, "%5d")) {
    return std::string(peer);
  }
  return std::string(host);
}

Admission::Admission(std::string job_secret, std::function<absl::Time()> clock)
    : secret_(std::move(job_secret)), clock_(std::move(clock)) {}

Admission::Bucket* Admission::BucketLocked(const std::string& address, absl::Time now,
                                           bool create) {
  auto it = buckets_.find(address);
  if (it == buckets_.end()) {
    if (!create) return nullptr;
    if (buckets_.size() >= kMaxTrackedAddresses && now - swept_ >= absl::Seconds(1)) {
      // Full buckets hold nothing a new one would not: drop them before sharing one. At most
      // once a second, so a flood from many addresses does not sweep the table per call.
      swept_ = now;
      for (auto b = buckets_.begin(); b != buckets_.end();) {
        const double refilled =
            b->second.tokens + absl::ToDoubleSeconds(now - b->second.at) * kRefusalsPerSecond;
        b = refilled >= kRefusalBurst ? buckets_.erase(b) : std::next(b);
      }
    }
    const std::string& key =
        buckets_.size() >= kMaxTrackedAddresses ? kOtherAddresses : address;
    it = buckets_.try_emplace(key, Bucket{kRefusalBurst, now}).first;
  }
  Bucket& b = it->second;
  b.tokens = std::min(kRefusalBurst,
                      b.tokens + absl::ToDoubleSeconds(now - b.at) * kRefusalsPerSecond);
  b.at = now;
  return &b;
}

absl::Status Admission::Check(const Caller& caller, absl::string_view rpc,
                              bool holds_rank_token) {
  const std::string address = PeerAddress(caller.peer);
  if (!holds_rank_token) {
    absl::Duration wait;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = Now();
      Bucket* b = BucketLocked(address, now, /*create=*/false);
      if (b == nullptr && buckets_.size() >= kMaxTrackedAddresses) {
        b = BucketLocked(kOtherAddresses, now, /*create=*/false);
      }
      if (b != nullptr && b->tokens < 1) {
        wait = absl::Ceil(absl::Seconds((1 - b->tokens) / kRefusalsPerSecond),
                          absl::Milliseconds(1));
      }
    }
    if (wait > absl::ZeroDuration()) {
      LogRefusal(caller, rpc, "too many refused calls from its address");
      return absl::PermissionDeniedError(absl::StrCat(
          "the coordinator refused ", rpc, ": too many calls with a wrong job secret from ",
          address, " (at most ", kRefusalsPerSecond,
          " a second per address): this one's secret was not checked; retry in ",
          absl::FormatDuration(wait)));
    }
  }
  if (!secret_.empty() && SecretsEqual(caller.job_secret, secret_)) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    BucketLocked(address, Now(), /*create=*/true)->tokens -= 1;
  }
  const char* why = caller.job_secret.empty() ? "no job secret" : "wrong job secret";
  LogRefusal(caller, rpc, why);
  // The caller learns only that it was refused: nothing of the job.
  return absl::PermissionDeniedError(absl::StrCat(
      "the coordinator refused ", rpc, ": ", why,
      " (every rank, braidctl and braid-coordinator must use the job's secret: "
      "BRAID_JOB_SECRET or BRAID_JOB_SECRET_FILE)"));
}

void Admission::LogRefusal(const Caller& caller, absl::string_view rpc, absl::string_view why) {
  const absl::Time now = absl::Now();
  int64_t unlogged = 0;
  {
    absl::MutexLock lock(&mu_);
    ++refusals_;
    if (now - last_logged_ < absl::Seconds(1)) {
      ++unlogged_;
      return;
    }
    last_logged_ = now;
    unlogged = std::exchange(unlogged_, 0);
  }
  LOG(WARNING) << "coordinator: refused " << rpc << " from "
               << (caller.peer.empty() ? std::string("an unknown peer") : caller.peer) << ": "
               << why
               << (unlogged > 0 ? absl::StrCat(" (and ", unlogged, " refusals not logged since)")
                                : std::string());
}

int64_t Admission::refusals() const {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

}  // namespace braid::coordinator
