#include "runtime/timeline.h"

#include <pthread.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace braid {

namespace {

constexpr char kEmpty[] = "[\n]\n";  // a valid, empty file: the closing "\n]\n" is rewritten

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank,
                                                         TimelineOptions options) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BRAID_TIMELINE='", path, "' is a directory; give a file path"));
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("BRAID_TIMELINE='", path,
                                                   "' cannot be written: ", std::strerror(errno)));
  }
  return std::unique_ptr<Timeline>(new Timeline(f, path, rank, options));
}

Timeline::Timeline(FILE* f, std::string path, int rank, TimelineOptions options)
    : file_(f), path_(std::move(path)), rank_(rank), options_(options), start_(absl::Now()) {
  std::fputs(kEmpty, file_);
  std::fflush(file_);
  file_bytes_ = sizeof(kEmpty) - 1;
  writer_ = std::thread([this] { WriterLoop(); });
  pthread_setname_np(writer_.native_handle(), "braid-timeline");  // Note [Threads and locks]
}

int64_t Timeline::rotations() const {
  absl::MutexLock lock(&mu_);
  return rotations_;
}

Timeline::~Timeline() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
  std::fclose(file_);
}

int Timeline::TidFor(const std::string& tensor) {
  auto [it, inserted] = tids_.emplace(tensor, static_cast<int>(tids_.size()) + 1);
  if (inserted) {
    // Name the row after the tensor (a metadata event).
    queue_.push_back({nlohmann::json{{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_},
                                     {"tid", it->second}, {"args", {{"name", tensor}}}}.dump(),
                      /*row_name=*/true});
  }
  return it->second;
}

void Timeline::Begin(const std::string& tensor, const std::string& phase, const std::string& args,
                     absl::Time at) {
  absl::MutexLock lock(&mu_);
  nlohmann::json e{{"name", phase}, {"ph", "B"}, {"ts", absl::ToInt64Microseconds(at - start_)},
                   {"pid", rank_}, {"tid", TidFor(tensor)}};
  if (!args.empty()) e["args"] = nlohmann::json::parse("{" + args + "}");
  queue_.push_back({e.dump()});
}

void Timeline::End(const std::string& tensor, const std::string& phase, absl::Time at) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({nlohmann::json{{"name", phase}, {"ph", "E"},
                                   {"ts", absl::ToInt64Microseconds(at - start_)}, {"pid", rank_},
                                   {"tid", TidFor(tensor)}}.dump()});
}

void Timeline::Mark(const std::string& tensor, const std::string& what, absl::Time at) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({nlohmann::json{{"name", what}, {"ph", "i"}, {"s", "t"},
                                   {"ts", absl::ToInt64Microseconds(at - start_)}, {"pid", rank_},
                                   {"tid", TidFor(tensor)}}.dump()});
}

void Timeline::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t target = taken_ + static_cast<int64_t>(queue_.size());
  auto done = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return written_ >= target; };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(5));
}

void Timeline::WriterLoop() {
  while (true) {
    std::deque<Event> batch;
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      batch.swap(queue_);
      taken_ += static_cast<int64_t>(batch.size());
      stop = stop_;
    }
    if (!batch.empty()) {
      Write(batch);
      absl::MutexLock lock(&mu_);
      written_ += static_cast<int64_t>(batch.size());
    }
    if (stop) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
    }
  }
}

void Timeline::Write(const std::deque<Event>& batch) {
  // Overwrite the closing "\n]\n" and put it back after the new events: the file is a
  // complete JSON array after every batch. All three bytes: a "\n" left behind would sit
  // uncounted by the rotation check below, and a file closed right after it would end one
  // byte over max_bytes.
  std::fseek(file_, -3, SEEK_END);
  file_bytes_ -= 3;
  for (const Event& e : batch) {
    if (e.row_name) row_names_.push_back(e.json);
    const int64_t bytes = static_cast<int64_t>(e.json.size()) + (first_event_ ? 0 : 2);
    // Never a file with no event but the rows' names: each file moves the timeline on.
    if (options_.max_bytes > 0 && events_in_file_ > 0 &&
        file_bytes_ + bytes + 3 > options_.max_bytes) {
      Rotate();
    }
    if (!e.row_name) ++events_in_file_;
    std::fputs(first_event_ ? "" : ",\n", file_);
    std::fputs(e.json.c_str(), file_);
    file_bytes_ += static_cast<int64_t>(e.json.size()) + (first_event_ ? 0 : 2);
    first_event_ = false;
  }
  std::fputs("\n]\n", file_);
  file_bytes_ += 3;
  std::fflush(file_);
}

void Timeline::Rotate() {
  // Close the current file as a complete array, keep it as PATH.1, and start PATH again
  // with every row's name, so the new file reads on its own.
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  const std::string previous = path_ + ".1";
  std::rename(path_.c_str(), previous.c_str());
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr) {
    // Nowhere to write (the directory went away): later events are dropped into /dev/null.
    file_ = std::fopen("/dev/null", "w");
  }
  std::fputs("[\n", file_);
  file_bytes_ = 2;
  first_event_ = true;
  events_in_file_ = 0;
  for (const std::string& name : row_names_) {
    std::fputs(first_event_ ? "" : ",\n", file_);
    std::fputs(name.c_str(), file_);
    file_bytes_ += static_cast<int64_t>(name.size()) + (first_event_ ? 0 : 2);
    first_event_ = false;
  }
  absl::MutexLock lock(&mu_);
  ++rotations_;
}

}  // namespace braid
