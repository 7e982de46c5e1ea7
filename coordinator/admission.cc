#include "coordinator/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "glog/logging.h"

namespace braid::coordinator {

Admission::Admission(std::string job_secret) : secret_(std::move(job_secret)) {}

absl::Status Admission::Check(const Caller& caller, absl::string_view rpc) {
  if (!secret_.empty() && SecretsEqual(caller.job_secret, secret_)) return absl::OkStatus();
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
