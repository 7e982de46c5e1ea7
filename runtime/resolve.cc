#include "runtime/resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace braid {

std::string HostOfAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:")) return "";
  std::string host(address.substr(0, address.rfind(':')));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// gRPC would only say "Deadline Exceeded" when the name servers do not answer in time, and a
// rank hosting the coordinator could not tell "cannot bind" from "no such host".
// getaddrinfo has no timeout of its own, so it runs on a detached thread that is left behind
// (and ends with the process) when it takes longer.
absl::Status CheckHostResolves(const std::string& host, absl::string_view where,
                               absl::Duration timeout) {
  if (host.empty()) return absl::OkStatus();
  unsigned char buf[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1) {
    return absl::OkStatus();
  }
  struct Lookup {
    absl::Mutex mu;
    bool done = false;
    int rc = 0;
  };
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host] {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (res != nullptr) freeaddrinfo(res);
    absl::MutexLock lock(&lookup->mu);
    lookup->rc = rc;
    lookup->done = true;
  }).detach();
  absl::MutexLock lock(&lookup->mu);
  if (!lookup->mu.AwaitWithTimeout(absl::Condition(&lookup->done), timeout)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve the coordinator's host '", host, "' (", where, "): no answer within ",
        absl::FormatDuration(timeout), " (are the name servers reachable?)"));
  }
  if (lookup->rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve the coordinator's host '", host,
                                               "' (", where, "): ", gai_strerror(lookup->rc)));
  }
  return absl::OkStatus();
}

}  // namespace braid
