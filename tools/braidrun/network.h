// Which address braidrun's coordinator binds and advertises (BRAID_COORDINATOR) when ranks
// run on other hosts: the address of --network-interface, else the address this host uses
// to reach the first remote host (what the kernel's routing table picks for it).
#ifndef BRAID_TOOLS_BRAIDRUN_NETWORK_H_
#define BRAID_TOOLS_BRAIDRUN_NETWORK_H_

#include <string>

#include "absl/status/statusor.h"

namespace braid::braidrun {

// The IPv4 address of network interface `name` ("eth0" -> "198.18.0.1"). NotFound, naming
// the interfaces that have one, when it has none or does not exist.
absl::StatusOr<std::string> InterfaceAddress(const std::string& name);

// The local IPv4 address the routing table uses to send to `host` (a name or an address):
// a UDP socket is connected to it (which sends nothing) and asked for its own address.
// NotFound when `host` does not resolve, Unavailable when there is no route to it.
absl::StatusOr<std::string> SourceAddressFor(const std::string& host);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_NETWORK_H_
