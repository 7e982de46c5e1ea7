// The timeline: a Chrome-trace JSON file (opens in Perfetto and chrome://tracing) with one
// row per tensor showing NEGOTIATE (with a mark when each rank reported the tensor), QUEUE,
// MEMCPY_IN_FUSION_BUFFER, the collective, MEMCPY_OUT_FUSION_BUFFER, and later COMPRESS /
// DECOMPRESS. Events are queued and written by the timeline's own thread. The file is valid
// JSON after every write (the closing bracket is rewritten each time), so it parses after a
// normal shutdown and after the process is killed.
//
// Size: a long job's timeline would grow without end, so the file is rotated. An event that
// would take it past `max_bytes` first closes it (valid JSON), renames it PATH.1 (replacing
// the one before) and starts PATH afresh, with the rows' names again; the latest activity is
// always in PATH, the activity before it in PATH.1, and the two never take more than
// 2 × max_bytes (plus one event). Events queue without bound only while the writer is
// behind.
#ifndef BRAID_RUNTIME_TIMELINE_H_
#define BRAID_RUNTIME_TIMELINE_H_

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid {

struct TimelineOptions {
  // Rotation threshold of the file, in bytes (BRAID_TIMELINE_MAX_BYTES); 0: no limit.
  int64_t max_bytes = int64_t{1} << 30;
};

class Timeline {
 public:
  // Opens `path` for writing. InvalidArgument when it is a directory or cannot be written.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int rank,
                                                        TimelineOptions options = {});
  ~Timeline();  // flushes and closes

  // Begin / end of a phase of `tensor` (phases nest per tensor). `args` is a JSON object
  // body such as "\"bucket\": 3, \"bytes\": 4096" (may be empty).
  void Begin(const std::string& tensor, const std::string& phase, const std::string& args = "",
             absl::Time at = absl::Now());
  void End(const std::string& tensor, const std::string& phase, absl::Time at = absl::Now());
  // An instant mark on the tensor's row.
  void Mark(const std::string& tensor, const std::string& what, absl::Time at);

  void Flush();

  // Files rotated so far (PATH moved to PATH.1).
  int64_t rotations() const;

 private:
  struct Event {
    std::string json;
    bool row_name = false;  // a thread_name metadata event: written again after a rotation
  };
  Timeline(FILE* f, std::string path, int rank, TimelineOptions options);
  void WriterLoop();
  int TidFor(const std::string& tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Write(const std::deque<Event>& batch);  // writer thread
  void Rotate();                               // writer thread

  FILE* file_;  // writer thread, after construction
  const std::string path_;
  const int rank_;
  const TimelineOptions options_;
  const absl::Time start_;
  mutable absl::Mutex mu_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> tids_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Events the writer has taken off queue_, and of those, written: Flush waits for every
  // event taken or queued when it was called, the batch being written included.
  int64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rotations_ ABSL_GUARDED_BY(mu_) = 0;
  // Writer thread only: the current file's state, and every row's name event.
  bool first_event_ = true;
  int64_t file_bytes_ = 0;
  int64_t events_in_file_ = 0;  // other than the rows' names
  std::vector<std::string> row_names_;
  std::thread writer_;
};

}  // namespace braid

#endif  // BRAID_RUNTIME_TIMELINE_H_
