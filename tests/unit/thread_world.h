// Ranks as threads, for unit tests of compressors: one Communicator per rank over shared
// memory. Each collective posts this rank's buffers, meets the others at a barrier, computes
// its own result from everyone's buffers (reductions in rank order, so every rank gets the
// same bits), and meets them again before any buffer is reused. Every barrier has a deadline,
// so a rank that skips a collective fails the test instead of hanging it. Float32 and float64
// reductions only; no ReduceScatter; no byte counts (the multi-process tests measure bytes
// over UCX).
#ifndef BRAID_TESTS_UNIT_THREAD_WORLD_H_
#define BRAID_TESTS_UNIT_THREAD_WORLD_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/communicator.h"

namespace braid::testing {

class ThreadWorld {
 public:
  explicit ThreadWorld(int size) : size_(size), posts_(size) {
    for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<Comm>(this, r));
  }

  int size() const { return size_; }
  transport::Communicator& comm(int rank) { return *comms_[rank]; }

  // Runs body(rank, communicator) on one thread per rank and joins them.
  void Run(const std::function<void(int, transport::Communicator&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back([&, r] { body(r, *comms_[r]); });
    for (std::thread& t : threads) t.join();
  }

 private:
  struct Post {
    const void* send = nullptr;
    const size_t* sizes = nullptr;  // all-to-all: this rank's send sizes
  };

  class Comm : public transport::Communicator {
   public:
    Comm(ThreadWorld* w, int rank) : w_(w), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return w_->size_; }

    absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                           ReduceOp op) override {
      if (dtype == DataType::kFloat32) return Reduce<float>(send, recv, count, op);
      if (dtype == DataType::kFloat64) return Reduce<double>(send, recv, count, op);
      return absl::UnimplementedError("ThreadWorld: float32 and float64 reductions only");
    }
    absl::Status ReduceScatter(const void*, void*, absl::Span<const size_t>, DataType,
                               ReduceOp) override {
      return absl::UnimplementedError("ThreadWorld::ReduceScatter");
    }
    absl::Status AllGather(const void* send, size_t send_bytes, void* recv,
                           absl::Span<const size_t> recv_bytes) override {
      return Exchange(send, nullptr, [&] {
        size_t off = 0;
        for (int r = 0; r < size(); ++r) {
          std::memcpy(static_cast<char*>(recv) + off, w_->posts_[r].send, recv_bytes[r]);
          off += recv_bytes[r];
        }
      });
    }
    absl::Status AllToAll(const void* send, absl::Span<const size_t> send_bytes, void* recv,
                          absl::Span<const size_t> recv_bytes) override {
      return Exchange(send, send_bytes.data(), [&] {
        size_t off = 0;
        for (int r = 0; r < size(); ++r) {
          const size_t* theirs = w_->posts_[r].sizes;
          size_t src = 0;
          for (int q = 0; q < rank_; ++q) src += theirs[q];
          std::memcpy(static_cast<char*>(recv) + off,
                      static_cast<const char*>(w_->posts_[r].send) + src, recv_bytes[r]);
          off += recv_bytes[r];
        }
      });
    }
    absl::Status Broadcast(void* buf, size_t bytes, int root) override {
      if (root < 0 || root >= size()) return absl::InvalidArgumentError("bad root");
      // Copy through a private buffer: the root's buffer may be read by several ranks.
      std::vector<char> tmp;
      absl::Status s = Exchange(buf, nullptr, [&] {
        const char* src = static_cast<const char*>(w_->posts_[root].send);
        tmp.assign(src, src + bytes);
      });
      if (s.ok() && rank_ != root && bytes > 0) std::memcpy(buf, tmp.data(), bytes);
      return s;
    }
    absl::Status Barrier() override { return Exchange(nullptr, nullptr, [] {}); }
    void Abort(absl::Status) override {}
    transport::TransportStats stats() const override { return {}; }
    std::string Describe() const override { return "threads"; }

   private:
    template <typename T>
    absl::Status Reduce(const void* send, void* recv, size_t count, ReduceOp op) {
      std::vector<T> acc(count);
      absl::Status s = Exchange(send, nullptr, [&] {
        for (int r = 0; r < size(); ++r) {
          const T* x = static_cast<const T*>(w_->posts_[r].send);
          for (size_t i = 0; i < count; ++i) {
            if (r == 0) {
              acc[i] = x[i];
            } else if (op == ReduceOp::kMin) {
              acc[i] = std::min(acc[i], x[i]);
            } else if (op == ReduceOp::kMax) {
              acc[i] = std::max(acc[i], x[i]);
            } else {
              acc[i] += x[i];
            }
          }
        }
        if (op == ReduceOp::kAverage) {
          for (T& v : acc) v /= static_cast<T>(size());
        }
      });
      if (s.ok() && count > 0) std::memcpy(recv, acc.data(), count * sizeof(T));
      return s;
    }

    // Posts, meets, runs `read` while every post is valid, meets again.
    absl::Status Exchange(const void* send, const size_t* sizes, const std::function<void()>& read) {
      w_->posts_[rank_] = {send, sizes};
      absl::Status s = w_->Sync();
      if (!s.ok()) return s;
      read();
      return w_->Sync();
    }

    ThreadWorld* w_;
    int rank_;
  };

  absl::Status Sync() {
    absl::MutexLock lock(&mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      return absl::OkStatus();
    }
    auto passed = [&] { return generation_ != gen; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&passed), absl::Seconds(30))) {
      return absl::DeadlineExceededError(
          absl::StrCat("ThreadWorld: ranks did not all reach collective ", gen, " in 30 s"));
    }
    return absl::OkStatus();
  }

  const int size_;
  std::vector<Post> posts_;
  std::vector<std::unique_ptr<Comm>> comms_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_UNIT_THREAD_WORLD_H_
