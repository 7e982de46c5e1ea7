// Resolving the coordinator's host name once, with a bounded wait, so that a misspelt or
// unknown host fails at once naming it, in every process that needs the coordinator
// (braidctl, and each rank without braidrun: MASTER_ADDR and the like).
#ifndef BRAID_RUNTIME_RESOLVE_H_
#define BRAID_RUNTIME_RESOLVE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace braid {

// How long a process waits for the coordinator's host name to resolve.
inline constexpr absl::Duration kResolveTimeout = absl::Seconds(3);

// The host of HOST:PORT or [IPV6]:PORT (brackets removed); "" for unix:PATH.
std::string HostOfAddress(absl::string_view address);

// OK when `host` is an IP address or resolves within `timeout`; else Unavailable
// "cannot resolve the coordinator's host 'HOST' (WHERE): REASON", `where` saying where the
// name came from (the address given, "MASTER_ADDR", ...) and REASON the resolver's, or that
// no answer came in time. "" resolves trivially (a unix:PATH address).
absl::Status CheckHostResolves(const std::string& host, absl::string_view where,
                               absl::Duration timeout = kResolveTimeout);

}  // namespace braid

#endif  // BRAID_RUNTIME_RESOLVE_H_
