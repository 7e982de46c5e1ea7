#include "tools/braidrun/network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::braidrun {
namespace {

std::string Ipv4Text(const sockaddr_in& a) {
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace

absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string found;
  std::set<std::string> with_ipv4;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    with_ipv4.insert(i->ifa_name);
    if (found.empty() && name == i->ifa_name) {
      found = Ipv4Text(*reinterpret_cast<const sockaddr_in*>(i->ifa_addr));
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat("network interface '", name,
                                            "' has no IPv4 address (interfaces with one: ",
                                            absl::StrJoin(with_ipv4, ", "), ")"));
  }
  return found;
}

absl::StatusOr<std::string> SourceAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0 || res == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve host '", host, "' (IPv4): ", gai_strerror(rc)));
  }
  sockaddr_in to = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in self{};
  socklen_t len = sizeof(self);
  absl::Status status;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("no route to host '", host, "' (", Ipv4Text(to), "): ", std::strerror(errno)));
  } else if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) {
    status = absl::InternalError(absl::StrCat("getsockname: ", std::strerror(errno)));
  }
  close(fd);
  if (!status.ok()) return status;
  return Ipv4Text(self);
}

}  // namespace braid::braidrun
