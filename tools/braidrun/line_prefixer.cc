#include "tools/braidrun/line_prefixer.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace braid::braidrun {

LinePrefixer::LinePrefixer(std::string prefix, size_t max_partial)
    : prefix_(std::move(prefix)), max_partial_(max_partial == 0 ? 1 : max_partial) {}

void LinePrefixer::Feed(const char* data, size_t n, std::string* out) {
  size_t pos = 0;
  while (pos < n) {
    const void* nl = std::memchr(data + pos, '\n', n - pos);
    if (nl == nullptr) {
      // No newline: hold the rest, releasing full-size chunks of an overlong line.
      while (pos < n) {
        size_t take = std::min(n - pos, max_partial_ - partial_.size());
        partial_.append(data + pos, take);
        pos += take;
        if (partial_.size() >= max_partial_) {
          out->append(prefix_).append(partial_).push_back('\n');
          partial_.clear();
        }
      }
      return;
    }
    size_t end = static_cast<const char*>(nl) - data;  // index of '\n'
    out->append(prefix_);
    if (!partial_.empty()) {
      out->append(partial_);
      partial_.clear();
    }
    out->append(data + pos, end + 1 - pos);
    pos = end + 1;
  }
}

void LinePrefixer::Flush(std::string* out) {
  if (partial_.empty()) return;
  out->append(prefix_).append(partial_).push_back('\n');
  partial_.clear();
}

std::string RankPrefix(int rank) { return "[" + std::to_string(rank) + "] "; }

}  // namespace braid::braidrun
