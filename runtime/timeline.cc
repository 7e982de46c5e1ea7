#include "runtime/timeline.h"

#include <pthread.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace braid {

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank) {
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
  return std::unique_ptr<Timeline>(new Timeline(f, rank));
}

Timeline::Timeline(FILE* f, int rank) : file_(f), rank_(rank), start_(absl::Now()) {
  std::fputs("[\n]\n", file_);
  std::fflush(file_);
  writer_ = std::thread([this] { WriterLoop(); });
  pthread_setname_np(writer_.native_handle(), "braid-timeline");  // Note [Threads and locks]
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
    queue_.push_back(nlohmann::json{{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_},
                                    {"tid", it->second}, {"args", {{"name", tensor}}}}.dump());
  }
  return it->second;
}

void Timeline::Emit(std::string event) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(event));
}

void Timeline::Begin(const std::string& tensor, const std::string& phase, const std::string& args,
                     absl::Time at) {
  absl::MutexLock lock(&mu_);
  nlohmann::json e{{"name", phase}, {"ph", "B"}, {"ts", absl::ToInt64Microseconds(at - start_)},
                   {"pid", rank_}, {"tid", TidFor(tensor)}};
  if (!args.empty()) e["args"] = nlohmann::json::parse("{" + args + "}");
  queue_.push_back(e.dump());
}

void Timeline::End(const std::string& tensor, const std::string& phase, absl::Time at) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(nlohmann::json{{"name", phase}, {"ph", "E"},
                                  {"ts", absl::ToInt64Microseconds(at - start_)}, {"pid", rank_},
                                  {"tid", TidFor(tensor)}}.dump());
}

void Timeline::Mark(const std::string& tensor, const std::string& what, absl::Time at) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(nlohmann::json{{"name", what}, {"ph", "i"}, {"s", "t"},
                                  {"ts", absl::ToInt64Microseconds(at - start_)}, {"pid", rank_},
                                  {"tid", TidFor(tensor)}}.dump());
}

void Timeline::Flush() {
  absl::MutexLock lock(&mu_);
  int64_t target = written_ + static_cast<int64_t>(queue_.size());
  auto done = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return written_ >= target; };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(5));
}

void Timeline::WriterLoop() {
  while (true) {
    std::deque<std::string> batch;
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      batch.swap(queue_);
      stop = stop_;
    }
    if (!batch.empty()) {
      // Overwrite the closing "]\n" and put it back after the new events: the file is a
      // complete JSON array after every batch.
      std::fseek(file_, -2, SEEK_END);
      for (const std::string& e : batch) {
        std::fputs(first_event_ ? "" : ",\n", file_);
        std::fputs(e.c_str(), file_);
        first_event_ = false;
      }
      std::fputs("\n]\n", file_);
      std::fflush(file_);
      absl::MutexLock lock(&mu_);
      written_ += static_cast<int64_t>(batch.size());
    }
    if (stop) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
    }
  }
}

}  // namespace braid
