// The timeline: a Chrome-trace JSON file (opens in Perfetto and chrome://tracing) with one
// row per tensor showing NEGOTIATE (with a mark when each rank reported the tensor), QUEUE,
// MEMCPY_IN_FUSION_BUFFER, the collective, MEMCPY_OUT_FUSION_BUFFER, and later COMPRESS /
// DECOMPRESS. Events are queued and written by the timeline's own thread. The file is valid
// JSON after every write (the closing bracket is rewritten each time), so it parses after a
// normal shutdown and after the process is killed.
#ifndef BRAID_RUNTIME_TIMELINE_H_
#define BRAID_RUNTIME_TIMELINE_H_

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid {

class Timeline {
 public:
  // Opens `path` for writing. InvalidArgument when it is a directory or cannot be written.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int rank);
  ~Timeline();  // flushes and closes

  // Begin / end of a phase of `tensor` (phases nest per tensor). `args` is a JSON object
  // body such as "\"bucket\": 3, \"bytes\": 4096" (may be empty).
  void Begin(const std::string& tensor, const std::string& phase, const std::string& args = "",
             absl::Time at = absl::Now());
  void End(const std::string& tensor, const std::string& phase, absl::Time at = absl::Now());
  // An instant mark on the tensor's row.
  void Mark(const std::string& tensor, const std::string& what, absl::Time at);

  void Flush();

 private:
  Timeline(FILE* f, int rank);
  void Emit(std::string event);
  void WriterLoop();
  int TidFor(const std::string& tensor);

  FILE* file_;
  const int rank_;
  const absl::Time start_;
  absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> tids_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t pending_flush_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_event_ = true;  // writer thread only
  std::thread writer_;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_TIMELINE_H_
