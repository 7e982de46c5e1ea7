// Prefixes every line of a byte stream (a rank's stdout or stderr) with "[rank] ". Lines are
// released whole, so lines of different ranks never interleave mid-line; a partial line waits
// for its newline (or for Flush at end of stream). Pure, unit-tested in
// tests/braidrun/braidrun_util_test.cc.
#ifndef BRAID_TOOLS_BRAIDRUN_LINE_PREFIXER_H_
#define BRAID_TOOLS_BRAIDRUN_LINE_PREFIXER_H_

#include <cstddef>
#include <string>

namespace braid::braidrun {

class LinePrefixer {
 public:
  // A partial line longer than `max_partial` bytes (a progress bar redrawn with '\r', a
  // stream without newlines) is released as a line of its own rather than held forever.
  explicit LinePrefixer(std::string prefix, size_t max_partial = 64 * 1024);

  // Appends to *out every line that `data` completes, each as prefix + line + '\n'; keeps
  // the trailing partial line.
  void Feed(const char* data, size_t n, std::string* out);
  void Feed(const std::string& data, std::string* out) { Feed(data.data(), data.size(), out); }

  // End of stream: appends the partial line, if any, as prefix + text + '\n'.
  void Flush(std::string* out);

  bool has_partial() const { return !partial_.empty(); }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  size_t max_partial_;
  std::string partial_;
};

// "[rank] "
std::string RankPrefix(int rank);

}  // namespace braid::braidrun

#endif  // BRAID_TOOLS_BRAIDRUN_LINE_PREFIXER_H_
