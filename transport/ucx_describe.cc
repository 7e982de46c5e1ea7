// What the UCX endpoints actually use, for logs and benchmark reports.
#include <stdio.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "transport/ucx_internal.h"

namespace braid::transport::ucx {
namespace {

// The "transport/device" of one lane line of ucp_ep_print_info, e.g.
//   "#  lane[0]:  8:sysv/memory.0 md[4] ... tag_am"  ->  "sysv/memory"; "" if none.
std::string LaneTransport(absl::string_view line) {
  size_t lane = line.find("lane[");
  if (lane == absl::string_view::npos) return "";
  size_t colon = line.find(':', lane);
  if (colon == absl::string_view::npos) return "";
  std::vector<absl::string_view> words =
      absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
  for (absl::string_view w : words) {
    size_t c = w.find(':');
    size_t slash = w.find('/');
    if (c == absl::string_view::npos || slash == absl::string_view::npos || slash < c) continue;
    absl::string_view tl = w.substr(c + 1);
    size_t dot = tl.rfind('.');
    if (dot != absl::string_view::npos && dot > tl.find('/')) tl = tl.substr(0, dot);
    return std::string(tl);
  }
  return "";
}

}  // namespace

std::string DescribeEndpoints(const std::vector<ucp_ep_h>& eps) {
  std::set<std::string> tls;
  for (ucp_ep_h ep : eps) {
    if (ep == nullptr) continue;
    char* text = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    if (f == nullptr) continue;
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (absl::string_view line : absl::StrSplit(absl::string_view(text, len), '\n')) {
      std::string tl = LaneTransport(line);
      if (!tl.empty()) tls.insert(tl);
    }
    free(text);
  }
  return absl::StrCat("ucx ", absl::StrJoin(tls, " "));
}

}  // namespace braid::transport::ucx
