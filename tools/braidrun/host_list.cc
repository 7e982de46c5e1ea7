#include "tools/braidrun/host_list.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace braid::braidrun {

absl::StatusOr<std::vector<HostSlots>> ParseHostList(const std::string& spec) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  if (absl::StripAsciiWhitespace(spec).empty()) {
    return absl::InvalidArgumentError("-H: the host list is empty");
  }
  for (absl::string_view raw : absl::StrSplit(spec, ',')) {
    absl::string_view entry = absl::StripAsciiWhitespace(raw);
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("-H '", spec, "': empty entry (expected host:slots,host:slots,...)"));
    }
    HostSlots h;
    size_t colon = entry.rfind(':');
    absl::string_view name = entry;
    if (colon != absl::string_view::npos) {
      name = entry.substr(0, colon);
      absl::string_view slots = entry.substr(colon + 1);
      int n = 0;
      if (!absl::SimpleAtoi(slots, &n) || n < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "-H: '", entry, "': slots must be a positive integer, got '", slots, "'"));
      }
      h.slots = n;
    }
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("-H: '", entry, "': empty host name"));
    }
    h.host = std::string(name);
    if (!seen.insert(h.host).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("-H: host '", h.host, "' is listed twice (give it one entry with all its slots)"));
    }
    hosts.push_back(std::move(h));
  }
  return hosts;
}

absl::Status CheckHostsForLocalLaunch(const std::vector<HostSlots>& hosts, int np,
                                      const std::vector<std::string>& local_names) {
  int64_t total = 0;
  for (const HostSlots& h : hosts) total += h.slots;
  if (total < np) {
    return absl::InvalidArgumentError(absl::StrCat(
        "-H: the hosts have ", total, " slot", total == 1 ? "" : "s", " in all, fewer than -np ",
        np));
  }
  std::vector<std::string> remote;
  for (const HostSlots& h : hosts) {
    const std::string lower = absl::AsciiStrToLower(h.host);
    bool local = std::any_of(local_names.begin(), local_names.end(), [&](const std::string& n) {
      return absl::AsciiStrToLower(n) == lower;
    });
    if (!local) remote.push_back(h.host);
  }
  if (!remote.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "-H: ", remote.size() == 1 ? "host " : "hosts ", absl::StrJoin(remote, ", "),
        remote.size() == 1 ? " is" : " are",
        " not this machine; multi-host launching (over ssh) is not implemented yet: "
        "run braidrun on one host, or start the ranks with another launcher (torchrun, srun, "
        "mpirun) and a braid-coordinator"));
  }
  return absl::OkStatus();
}

std::vector<std::string> LocalHostNames(const std::string& hostname) {
  std::vector<std::string> names = {"localhost", "127.0.0.1", "::1"};
  auto add = [&](const std::string& n) {
    if (n.empty()) return;
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  add(hostname);
  add(hostname.substr(0, hostname.find('.')));
  return names;
}

}  // namespace braid::braidrun
