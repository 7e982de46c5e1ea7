// A test double of the NCCL calls braid makes (transport/nccl_api.h), for CPU tests of the
// NCCL data plane's own logic (transport/nccl_communicator.h: grouping, stream and event
// order, the watchdog, abort, errors reaching every rank) at 2-4 ranks played by threads.
// Buffers are host memory; each collective runs on the in-process transport
// (transport/local_communicator.h) on the thread of its stream, so it completes
// asynchronously, after the call returned, as a GPU's does. It imitates what braid relies
// on NCCL for:
//   - creation is nonblocking: CommState says kInProgress until every rank of the id called
//     CommInitRank;
//   - a collective's failure (a peer's endpoint gone: the in-process transport's
//     Unavailable) is reported by CommState as ncclRemoteError would be (Unavailable), the
//     stream going on past it, as a kernel that exits on a failed connection does;
//   - CommAbort ends this rank's work at once and destroys its endpoint, so its peers'
//     pending collectives fail (they see a remote error), as a process's closed sockets do;
//   - injected: an asynchronous error (CommState reports it, the stream stalls), a hang (the
//     stream stops before its next collective until the communicator is aborted), a call
//     that fails (FailNextCall), and a rank that never joins (the test simply does not
//     create it).
// A unit-test seam only: the real NCCL plane is what scripts/gpu_check.sh runs. Header-only.
#ifndef BRAID_TESTS_TESTING_FAKE_NCCL_H_
#define BRAID_TESTS_TESTING_FAKE_NCCL_H_

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "transport/communicator.h"
#include "transport/local_communicator.h"
#include "transport/nccl_api.h"

namespace braid::testing {

class FakeNccl final : public transport::NcclApi {
 public:
  using NcclProgress = transport::NcclProgress;
  using NcclUniqueId = transport::NcclUniqueId;

  FakeNccl() = default;
  FakeNccl(const FakeNccl&) = delete;
  FakeNccl& operator=(const FakeNccl&) = delete;
  ~FakeNccl() override {
    std::vector<Comm> comms;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : comms_) comms.push_back(c.get());
    }
    for (Comm c : comms) CommAbort(c);
    for (auto& s : streams_) s->Stop();
    for (auto& [thread, s] : default_streams_) s->Stop();
  }

  // A stream: its work runs in order on a thread of its own. Owned by the fake. (The null
  // stream works too: each calling thread's own.)
  Stream NewStream() {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(std::make_unique<FakeStream>());
    return streams_.back().get();
  }

  // CommState of `rank`'s communicator (of the newest id) reports `error` from now on, and
  // its stream stalls before its next collective (as after a failed kernel), until aborted.
  void InjectAsyncError(int rank, absl::Status error) {
    FakeComm* c = Find(rank);
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->async_error = std::move(error);
      c->hang = true;
    }
    c->cv.notify_all();
  }
  // `rank`'s stream stops before its next collective until the communicator is aborted.
  void InjectHang(int rank) {
    FakeComm* c = Find(rank);
    std::lock_guard<std::mutex> lock(c->mu);
    c->hang = true;
  }
  // How many times `rank`'s communicator was aborted (0 or 1).
  int aborts(int rank) {
    FakeComm* c = Find(rank);
    std::lock_guard<std::mutex> lock(c->mu);
    return c->aborted ? 1 : 0;
  }
  // The next call of `kind` ("Send", "Reduce", ...) on any rank fails with `error`.
  void FailNextCall(const std::string& kind, absl::Status error) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_[kind] = std::move(error);
  }
  // Groups started and not ended, over every thread (NCCL's group depth is the thread's).
  int open_groups() {
    std::lock_guard<std::mutex> lock(mu_);
    int open = 0;
    for (const auto& [thread, g] : groups_) open += g.depth;
    return open;
  }
  // Collectives `rank`'s stream has run to their end.
  int64_t completed(int rank) { return Find(rank)->completed; }
  // Calls of each kind (by name: "AllReduce", "Send", ...), over every rank.
  int64_t calls(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(kind);
    return it == calls_.end() ? 0 : it->second;
  }

  std::string Version() override { return "fake nccl"; }

  absl::StatusOr<NcclUniqueId> GetUniqueId() override {
    std::lock_guard<std::mutex> lock(mu_);
    NcclUniqueId id;
    const std::string text = absl::StrCat("fake-nccl-", ++ids_);
    std::memcpy(id.bytes.data(), text.data(), text.size());
    return id;
  }

  absl::StatusOr<NcclProgress> CommInitRank(Comm* comm, int nranks, const NcclUniqueId& id,
                                            int rank, int /*cuda_device*/) override {
    if (absl::Status e = Count("CommInitRank"); !e.ok()) return e;  // never joins
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key(id.bytes.data(), id.bytes.size());
    auto [it, made] = worlds_.try_emplace(key);
    World& w = it->second;
    if (made) {
      w.size = nranks;
      transport::CollectiveOptions o;
      o.timeout = absl::Seconds(600);  // the NCCL plane's watchdog decides, not this
      w.locals = transport::CreateLocalCommunicators(nranks, o);
    }
    if (w.size != nranks || rank < 0 || rank >= nranks || w.locals[rank] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("fake nccl: rank ", rank, " of ", nranks,
                                                     " cannot join (taken, or another size)"));
    }
    comms_.push_back(std::make_unique<FakeComm>());
    FakeComm* c = comms_.back().get();
    c->world = &w;
    c->rank = rank;
    c->local = std::move(w.locals[rank]);
    ++w.joined;
    newest_[rank] = c;
    *comm = c;
    return NcclProgress::kInProgress;
  }

  absl::StatusOr<NcclProgress> CommState(Comm comm) override {
    FakeComm* c = static_cast<FakeComm*>(comm);
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (!c->async_error.ok()) return c->async_error;
    }
    std::lock_guard<std::mutex> lock(mu_);
    return c->world->joined < c->world->size ? NcclProgress::kInProgress : NcclProgress::kDone;
  }

  void CommAbort(Comm comm) override {
    FakeComm* c = static_cast<FakeComm*>(comm);
    {
      std::unique_lock<std::mutex> lock(c->mu);
      if (c->aborted) return;
      c->aborted = true;
      c->cv.notify_all();
      if (c->local != nullptr) c->local->Abort(absl::CancelledError("fake nccl: aborted"));
      // The endpoint goes once no collective of this communicator is running on it; its
      // peers' pending requests then fail (Unavailable), as over a closed connection.
      c->cv.wait(lock, [c] { return c->running == 0; });
      c->local.reset();
    }
  }

  absl::StatusOr<NcclProgress> AllReduce(const void* send, void* recv, size_t count,
                                         DataType dtype, ReduceOp op, Comm comm,
                                         Stream stream) override {
    return Queue("AllReduce", comm, stream, [=](transport::Communicator& l) {
      return l.AllReduce(send, recv, count, dtype, op);
    });
  }
  absl::StatusOr<NcclProgress> ReduceScatter(const void* send, void* recv, size_t recv_count,
                                             DataType dtype, ReduceOp op, Comm comm,
                                             Stream stream) override {
    return Queue("ReduceScatter", comm, stream, [=](transport::Communicator& l) {
      std::vector<size_t> counts(l.size(), recv_count);
      return l.ReduceScatter(send, recv, counts, dtype, op);
    });
  }
  absl::StatusOr<NcclProgress> AllGather(const void* send, void* recv, size_t bytes, Comm comm,
                                         Stream stream) override {
    return Queue("AllGather", comm, stream, [=](transport::Communicator& l) {
      std::vector<size_t> blocks(l.size(), bytes);
      return l.AllGather(send, bytes, recv, blocks);
    });
  }
  absl::StatusOr<NcclProgress> Broadcast(const void* send, void* recv, size_t bytes, int root,
                                         Comm comm, Stream stream) override {
    return Queue("Broadcast", comm, stream, [=](transport::Communicator& l) {
      if (l.rank() == root && send != recv && bytes > 0) std::memmove(recv, send, bytes);
      return l.Broadcast(recv, bytes, root);
    });
  }
  absl::StatusOr<NcclProgress> Reduce(const void* send, void* recv, size_t count, DataType dtype,
                                      ReduceOp op, int root, Comm comm, Stream stream) override {
    return Queue("Reduce", comm, stream, [=](transport::Communicator& l) {
      std::vector<char> all(count * DataTypeSize(dtype));
      absl::Status s = l.AllReduce(send, all.data(), count, dtype, op);
      if (s.ok() && l.rank() == root && !all.empty()) std::memcpy(recv, all.data(), all.size());
      return s;
    });
  }
  absl::StatusOr<NcclProgress> Send(const void* send, size_t bytes, int peer, Comm comm,
                                    Stream stream) override {
    if (absl::Status e = Count("Send"); !e.ok()) return e;
    Group& g = ThisGroup();
    if (g.depth == 0) return absl::InvalidArgumentError("fake nccl: Send outside a group");
    g.Bind(comm, stream);
    g.sends.push_back({peer, const_cast<void*>(send), bytes});
    return NcclProgress::kDone;
  }
  absl::StatusOr<NcclProgress> Recv(void* recv, size_t bytes, int peer, Comm comm,
                                    Stream stream) override {
    if (absl::Status e = Count("Recv"); !e.ok()) return e;
    Group& g = ThisGroup();
    if (g.depth == 0) return absl::InvalidArgumentError("fake nccl: Recv outside a group");
    g.Bind(comm, stream);
    g.recvs.push_back({peer, recv, bytes});
    return NcclProgress::kDone;
  }
  absl::Status GroupStart() override {
    if (absl::Status e = Count("GroupStart"); !e.ok()) return e;
    ++ThisGroup().depth;
    return absl::OkStatus();
  }
  absl::StatusOr<NcclProgress> GroupEnd() override {
    const absl::Status injected = Count("GroupEnd");
    Group& g = ThisGroup();
    if (g.depth == 0) return absl::InvalidArgumentError("fake nccl: GroupEnd without a start");
    if (!injected.ok()) {  // the group ends all the same, its work dropped
      if (--g.depth == 0) g = Group{};
      return injected;
    }
    if (--g.depth > 0) return NcclProgress::kDone;
    Group done = std::move(g);
    g = Group{};
    // Collectives queued inside the group already went to the stream in order; the point
    // to point messages of the group run as one all-to-all (each peer's blocks in order).
    if (done.sends.empty() && done.recvs.empty()) return NcclProgress::kDone;
    return Queue("GroupedSendRecv", done.comm, done.stream, [done](transport::Communicator& l) {
      const int n = l.size();
      std::vector<size_t> send_bytes(n, 0), recv_bytes(n, 0);
      for (const Piece& p : done.sends) send_bytes[p.peer] += p.bytes;
      for (const Piece& p : done.recvs) recv_bytes[p.peer] += p.bytes;
      std::vector<char> out, in;
      std::vector<size_t> send_at(n + 1, 0), recv_at(n + 1, 0);
      for (int p = 0; p < n; ++p) {
        send_at[p + 1] = send_at[p] + send_bytes[p];
        recv_at[p + 1] = recv_at[p] + recv_bytes[p];
      }
      out.resize(send_at[n]);
      in.resize(recv_at[n]);
      std::vector<size_t> cursor(send_at.begin(), send_at.end() - 1);
      for (const Piece& p : done.sends) {
        if (p.bytes > 0) std::memcpy(out.data() + cursor[p.peer], p.data, p.bytes);
        cursor[p.peer] += p.bytes;
      }
      absl::Status s = l.AllToAll(out.data(), send_bytes, in.data(), recv_bytes);
      if (!s.ok()) return s;
      cursor.assign(recv_at.begin(), recv_at.end() - 1);
      for (const Piece& p : done.recvs) {
        if (p.bytes > 0) std::memcpy(p.data, in.data() + cursor[p.peer], p.bytes);
        cursor[p.peer] += p.bytes;
      }
      return absl::OkStatus();
    });
  }

  absl::StatusOr<Event> RecordEvent(Stream stream) override {
    auto done = std::make_shared<std::atomic<bool>>(false);
    StreamOf(stream)->Push([done] { done->store(true); });
    return static_cast<Event>(new std::shared_ptr<std::atomic<bool>>(done));
  }
  absl::StatusOr<bool> EventDone(Event event) override {
    return (*static_cast<std::shared_ptr<std::atomic<bool>>*>(event))->load();
  }
  void DestroyEvent(Event event) override {
    delete static_cast<std::shared_ptr<std::atomic<bool>>*>(event);
  }

 private:
  struct World {
    int size = 0;
    int joined = 0;
    std::vector<std::unique_ptr<transport::Communicator>> locals;
  };
  struct FakeComm {
    World* world = nullptr;
    int rank = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::unique_ptr<transport::Communicator> local;  // null once aborted
    absl::Status async_error;
    bool hang = false;
    bool aborted = false;
    int running = 0;  // collectives of this communicator running on its stream now
    std::atomic<int64_t> completed{0};
  };
  // A stream: a thread running its work in order.
  class FakeStream {
   public:
    FakeStream() : thread_([this] { Loop(); }) {}
    ~FakeStream() { Stop(); }
    void Push(std::function<void()> work) {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
      cv_.notify_all();
    }
    void Stop() {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        cv_.notify_all();
      }
      if (thread_.joinable()) thread_.join();
    }

   private:
    void Loop() {
      for (;;) {
        std::function<void()> work;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
          if (queue_.empty()) return;
          work = std::move(queue_.front());
          queue_.pop_front();
        }
        work();
      }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stop_ = false;
    std::thread thread_;
  };
  struct Piece {
    int peer;
    void* data;
    size_t bytes;
  };
  struct Group {
    int depth = 0;
    Comm comm = nullptr;
    Stream stream = nullptr;
    std::vector<Piece> sends, recvs;
    void Bind(Comm c, Stream s) {
      comm = c;
      stream = s;
    }
  };

  Group& ThisGroup() {
    std::lock_guard<std::mutex> lock(mu_);
    return groups_[std::this_thread::get_id()];
  }
  // Counts a call of `kind`; the error FailNextCall set for it, once.
  absl::Status Count(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[kind];
    auto it = fail_next_.find(kind);
    if (it == fail_next_.end()) return absl::OkStatus();
    absl::Status error = std::move(it->second);
    fail_next_.erase(it);
    return error;
  }
  // A stream's worker; the null stream (a device's default) is the calling thread's own, as
  // each rank of a job is a process with its own default stream.
  FakeStream* StreamOf(Stream stream) {
    if (stream != nullptr) return static_cast<FakeStream*>(stream);
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<FakeStream>& s = default_streams_[std::this_thread::get_id()];
    if (s == nullptr) s = std::make_unique<FakeStream>();
    return s.get();
  }
  FakeComm* Find(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return newest_.at(rank);
  }

  // Queues `op` on `stream`, to run on `comm`'s endpoint (Note [Nonblocking NCCL]: returns
  // kDone; its outcome goes to CommState).
  absl::StatusOr<NcclProgress> Queue(const std::string& kind, Comm comm, Stream stream,
                                     std::function<absl::Status(transport::Communicator&)> op) {
    if (absl::Status e = Count(kind); !e.ok()) return e;
    FakeComm* c = static_cast<FakeComm*>(comm);
    StreamOf(stream)->Push([c, op = std::move(op)] {
      transport::Communicator* local;
      {
        std::unique_lock<std::mutex> lock(c->mu);
        c->cv.wait(lock, [c] { return c->aborted || !c->hang; });
        if (c->aborted || c->local == nullptr) return;  // dropped, as NCCL's after an abort
        ++c->running;
        local = c->local.get();
      }
      const absl::Status s = op(*local);
      std::lock_guard<std::mutex> lock(c->mu);
      --c->running;
      c->cv.notify_all();
      if (s.ok()) {
        ++c->completed;
      } else if (!c->aborted && c->async_error.ok()) {
        // ncclRemoteError (a peer's connection closed) or an internal error.
        c->async_error = s.code() == absl::StatusCode::kUnavailable
                             ? absl::UnavailableError(absl::StrCat(
                                   "remote process exited or there was a network error (",
                                   s.message(), ")"))
                             : absl::InternalError(std::string(s.message()));
      }
    });
    return NcclProgress::kDone;
  }

  std::mutex mu_;
  uint64_t ids_ = 0;
  std::map<std::string, World> worlds_;
  std::vector<std::unique_ptr<FakeComm>> comms_;
  std::map<int, FakeComm*> newest_;
  std::vector<std::unique_ptr<FakeStream>> streams_;
  std::map<std::thread::id, std::unique_ptr<FakeStream>> default_streams_;
  std::map<std::thread::id, Group> groups_;
  std::map<std::string, int64_t> calls_;
  std::map<std::string, absl::Status> fail_next_;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_FAKE_NCCL_H_
