#include "tools/braidrun/host_list.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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
    if (name[0] == '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("-H: '", entry, "': a host name cannot start with '-'"));
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

absl::StatusOr<std::vector<HostSlots>> ParseHostfile(const std::string& text,
                                                     const std::string& source) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = raw.substr(0, raw.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_no, ": '", line, "': ", why,
                       " (expected 'host', 'host slots=N' or 'host:N')"));
    };
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    HostSlots h;
    absl::string_view name = words[0];
    std::optional<absl::string_view> slots;
    if (words.size() > 2) return bad("unexpected words after the host name");
    if (words.size() == 2) {
      absl::string_view w = words[1];
      if (!absl::ConsumePrefix(&w, "slots=")) return bad("unexpected words after the host name");
      slots = w;
    } else if (size_t colon = name.rfind(':'); colon != absl::string_view::npos) {
      slots = name.substr(colon + 1);
      name = name.substr(0, colon);
    }
    if (slots && (!absl::SimpleAtoi(*slots, &h.slots) || h.slots < 1)) {
      return bad(absl::StrCat("slots must be a positive integer, got '", *slots, "'"));
    }
    if (name.empty()) return bad("empty host name");
    if (name[0] == '-') return bad("a host name cannot start with '-'");
    h.host = std::string(name);
    if (!seen.insert(h.host).second) return bad("the host is listed twice");
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no hosts"));
  return hosts;
}

absl::StatusOr<std::vector<RankPlacement>> PlaceRanks(const std::vector<HostSlots>& hosts,
                                                      int np) {
  int64_t total = 0;
  for (const HostSlots& h : hosts) total += h.slots;
  if (total < np) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the hosts have ", total, " slot", total == 1 ? "" : "s", " in all, fewer than -np ",
        np));
  }
  std::vector<RankPlacement> ranks;
  for (size_t i = 0; i < hosts.size() && static_cast<int>(ranks.size()) < np; ++i) {
    const int n = std::min<int64_t>(hosts[i].slots, np - static_cast<int>(ranks.size()));
    for (int l = 0; l < n; ++l) {
      ranks.push_back({hosts[i].host, static_cast<int>(i), l, n});
    }
  }
  return ranks;
}

bool IsLocalHost(const std::string& host, const std::vector<std::string>& local_names) {
  const std::string lower = absl::AsciiStrToLower(host);
  return std::any_of(local_names.begin(), local_names.end(), [&](const std::string& n) {
    return absl::AsciiStrToLower(n) == lower;
  });
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
