// braid.torch.process_group: the `braid` torch.distributed backend, a c10d::ProcessGroup whose
// collectives run on braid's coordinator and data plane.
//
// braid.torch.distributed registers it (torch.distributed.Backend.register_backend), so
// `dist.init_process_group("braid")` makes every torch.distributed collective, and
// DistributedDataParallel on top, a braid collective. This module links PyTorch (libtorch,
// libtorch_python) but not braid's runtime: it reaches the runtime that braid._braid holds
// through the capsule of runtime_bridge.h.
//
// Note [Names of the backend's collectives]
// torch.distributed's collectives have no names; braid pairs collectives across ranks by
// name. Every collective of a group takes the name "c10d.<group>.<n>", n counting the
// group's calls from 0, as gloo and NCCL count theirs: ranks that make the same calls in
// the same order (what torch.distributed requires) agree. The counter advances at the very
// start of every call, also of one this rank then refuses (a CPU-only dtype check, ...);
// the refusal is reported to the coordinator under that name (Runtime::ReportFailure), so
// the other ranks fail at once with this rank's reason, and every rank's counter stays
// aligned: an error never shifts the names of the calls after it. A barrier is named
// "c10d.<group>.barrier" on every call (no counter), as braid's own unnamed barrier, so that
// barriers pair in order; it is braid's barrier, at which the calls some ranks made before
// it and others did not fail; and after it an all-reduce (max) of the ranks' counters
// (Realign) sets every rank's counter alike, so ranks that made different numbers of calls
// pair their calls again after a barrier.
//
// Completion: the runtime completes each collective on its own thread; here one thread per
// process group waits for the group's collectives in the order they were made (each for at
// most the group's timeout), and a CallbackRunner's thread copies results that the runtime
// allocated (all-gather, all-to-all) into torch's output tensors, then completes the Future
// (on which DDP and comm hooks chain their callbacks, as on gloo's threads) and the
// c10d::Work. Errors come as torch's backends raise them: work.wait() and the
// future raise RuntimeError with braid's message, prefixed with braid's error class.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings/python/runtime_bridge.h"

namespace py = pybind11;

namespace braid::c10d_backend {
namespace {

// Wire codes (common/dtype.h); never renumbered.
enum Collective { kAllReduce = 0, kAllGather = 1, kBroadcast = 2, kReduceScatter = 3,
                  kAllToAll = 4, kBarrier = 5 };
enum DType { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3, kInt32 = 4, kInt64 = 5,
             kUInt8 = 6 };
enum Op { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };

// absl::StatusCode names of the codes braid's errors carry, as braid's Python classes.
std::string ErrorClass(int code) {
  switch (code) {
    case 3: case 11: case 7: return "InvalidArgumentError";  // invalid, out of range, denied
    case 6: return "AlreadyExistsError";
    case 9: return "FailedPreconditionError";
    case 1: return "CancelledError";
    case 4: return "DeadlineExceededError";
    case 14: return "UnavailableError";
    case 13: case 15: return "InternalError";
    default: return "BraidError";
  }
}

std::string Describe(const bridge::Status& s) {
  return "braid." + ErrorClass(s.code) + ": " + s.message;
}

bridge::Runtime* TheRuntime() {
  static bridge::Runtime* runtime = [] {
    py::gil_scoped_acquire gil;
    py::object capsule = py::module_::import("braid._braid").attr("_runtime_bridge");
    auto* r = static_cast<bridge::Runtime*>(
        PyCapsule_GetPointer(capsule.ptr(), bridge::kCapsuleName));
    if (r == nullptr) throw py::error_already_set();
    return r;
  }();
  return runtime;
}

// A collective of this backend: c10d's Work, completed by the group's completion thread.
class BraidWork : public c10d::Work {
 public:
  BraidWork(int rank, c10d::OpType type, std::vector<at::Tensor> results)
      : c10d::Work(rank, type),
        results_(std::move(results)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return results_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // wait() returns once the future holds the result too, so that a caller who waited may
  // read either.
  bool wait(std::chrono::milliseconds timeout) override {
    const bool done = c10d::Work::wait(timeout);
    future_->wait();
    return done;
  }

  // Completes the work, then the future, whose callbacks run here, on this thread (the
  // future is marked before they run, so wait() does not wait for them).
  void Complete(std::exception_ptr error) {
    finish(error);
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(results_));
    }
  }

 private:
  std::vector<at::Tensor> results_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

// One collective in flight: the runtime's operation, what must stay alive until it
// completes, and what to do with its result.
struct Pending {
  std::string name;
  std::chrono::steady_clock::time_point start;
  c10::intrusive_ptr<BraidWork> work;
  std::unique_ptr<bridge::Operation> op;  // null: completed at once (nothing to send)
  std::vector<at::Tensor> keep_alive;
  std::function<void(const bridge::Operation*)> finish;  // may throw
};

// Runs the completions of a group's collectives (the futures' callbacks: DDP's, a comm
// hook's) off the thread that waits for the runtime, each on a thread that is free at the
// time: a callback may wait for another collective of the same group (torch's own
// powerSGD_hook does, inside its callbacks), which only a thread other than the blocked one
// can complete, and a slow callback must not hold back the completions queued after it.
// Threads are started when every running one is busy (in practice one or two per group)
// and stop with the group. (c10's own thread pools have a fixed size, which a chain of
// callbacks that wait on each other could exhaust.)
//
// A callback may hold the group's last reference (a Python closure that outlives
// destroy_process_group(): torch's powerSGD_hook's do), so the group may be destroyed on
// one of these threads. That thread cannot be joined by itself (std::thread::join throws
// "Resource deadlock avoided" and the process aborts): Stop() detaches it instead, and the
// state the threads share lives on the heap, held by each thread, so that the detached one
// finishes its loop after the group, and this runner, are gone. What a completion runs
// (BraidWork::Complete) holds its own references and never touches the group.
class CallbackRunner {
 public:
  CallbackRunner() : state_(std::make_shared<State>()) {}
  ~CallbackRunner() { Stop(); }

  // Runs what is queued, then ends the threads; the calling thread, if it is one of them,
  // is detached and ends once the queue is empty. Idempotent.
  void Stop() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stop = true;
      threads.swap(threads_);
    }
    state_->cv.notify_all();
    for (std::thread& t : threads) {
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();
      } else if (t.joinable()) {
        t.join();
      }
    }
  }

  // Waits up to `timeout_s` until nothing is queued or running; whether that happened.
  bool WaitIdle(double timeout_s) {
    State& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    return s.cv_idle.wait_for(lock, std::chrono::duration<double>(timeout_s),
                              [&s] { return s.Idle(); });
  }

  void Post(std::function<void()> fn) {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(std::move(fn));
    if (s.queue.size() > s.idle) {
      ++s.threads;
      threads_.emplace_back([state = state_] { Loop(*state); });
    } else {
      s.cv.notify_one();
    }
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::condition_variable cv_idle;
    std::deque<std::function<void()>> queue;
    size_t idle = 0;     // threads waiting for work
    size_t threads = 0;  // threads started and not ended
    bool stop = false;

    bool Idle() const { return queue.empty() && idle == threads; }
  };

  static void Loop(State& s) {
    std::unique_lock<std::mutex> lock(s.mu);
    while (true) {
      ++s.idle;
      if (s.Idle()) s.cv_idle.notify_all();
      s.cv.wait(lock, [&s] { return s.stop || !s.queue.empty(); });
      --s.idle;
      if (s.queue.empty()) break;  // stopping, nothing left
      {
        std::function<void()> fn = std::move(s.queue.front());
        s.queue.pop_front();
        lock.unlock();
        fn();  // may destroy the group, and this runner with it (see above)
      }  // fn's captures (which may hold the group's last reference) go before relocking
      lock.lock();
    }
    --s.threads;
  }

  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;  // guarded by state_->mu
};

// This rank refused its call before the runtime saw it: braid's InvalidArgumentError, whose
// class comes first in the message, as in the runtime's own.
class Refusal : public std::runtime_error {
 public:
  explicit Refusal(const std::string& why)
      : std::runtime_error("braid.InvalidArgumentError: " + why), why_(why) {}
  const std::string& why() const { return why_; }

 private:
  std::string why_;
};

// The runtime refused the request; it has told the other ranks itself.
class RuntimeRefusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string Seconds(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

std::string ReduceOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return std::to_string(static_cast<int>(op));
  }
}

int DTypeCode(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kFloat32;
    case at::kDouble: return kFloat64;
    case at::kHalf: return kFloat16;
    case at::kBFloat16: return kBFloat16;
    case at::kInt: return kInt32;
    case at::kLong: return kInt64;
    case at::kByte: return kUInt8;
    default: return -1;
  }
}

class ProcessGroupBraid : public c10d::ProcessGroup {
 public:
  // `refusal` non-empty: a group braid cannot run (a subset of the job); every call raises
  // it. Refusing at creation instead would leave the ranks outside the group waiting in
  // torch's store-based barrier of new_group() until its timeout.
  // `timeout_s`: init_process_group's timeout (<= 0: none), after which a collective that has
  // not completed fails on this rank (see CompleteInOrder).
  // `process_set_id`: the braid process set a subgroup runs in (new_group; 0: the whole
  // job), whose ranks of the job are `ranks` in the group's rank order (empty: 0..size-1).
  ProcessGroupBraid(int rank, int size, std::string group, std::string compression,
                    std::string refusal, double timeout_s, int process_set_id = 0,
                    std::vector<int> ranks = {})
      : c10d::ProcessGroup(rank, size),
        runtime_(TheRuntime()),
        group_(std::move(group)),
        compression_(std::move(compression)),
        refusal_(std::move(refusal)),
        timeout_s_(timeout_s),
        process_set_id_(process_set_id),
        ranks_(std::move(ranks)) {
    completer_ = std::thread([this] { CompleteInOrder(); });
  }

  ~ProcessGroupBraid() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    // Without the GIL (the last reference may drop in Python): the group's threads free
    // tensors that have Python objects, which takes the GIL.
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      Stop();
    } else {
      Stop();
    }
  }

  // The thread drains what is pending first: the runtime may still write into those
  // tensors, and completes every collective within its own deadlines (or at shutdown).
  // Then the runner's threads finish the completions handed to them.
  void Stop() {
    if (completer_.joinable()) completer_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (realign_ != nullptr) {
        while (!realign_->Wait(0.1)) {
        }
        realign_.reset();
      }
    }
    runner_.Stop();
  }

  const std::string getBackendName() const override { return "braid"; }
  const std::string& group() const { return group_; }
  const std::string& compression() const { return compression_; }
  int64_t calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_;
  }

  // Waits up to `timeout_s` until every collective made so far has completed and its
  // callbacks have run; whether that happened. braid.torch.distributed calls it at
  // interpreter exit, after braid's shutdown has completed what was pending, so that no
  // callback (a Python one: DDP's, a hook's) still runs on this group's threads while the
  // interpreter finalizes.
  bool Drain(double timeout_s) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_drained_.wait_until(lock, deadline, [this] { return in_flight_ == 0; })) {
        return false;
      }
    }
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    return runner_.WaitIdle(std::max(0.0, left));
  }

  // --- collectives ---------------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor t = Single(name, "allreduce", tensors);
      const int op = ReduceOpCode(name, "allreduce", opts.reduceOp, t);
      return Reduce(name, c10d::OpType::ALLREDUCE, t, op, {t});
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      if (tensors.empty()) throw Refusal(Say(name, "allreduce_coalesced", "no tensors"));
      for (const at::Tensor& t : tensors) {
        CheckTensor(name, "allreduce_coalesced", t);
        if (t.scalar_type() != tensors[0].scalar_type()) {
          throw Refusal(Say(name, "allreduce_coalesced", "the tensors' dtypes differ"));
        }
      }
      const int op = ReduceOpCode(name, "allreduce_coalesced", opts.reduceOp, tensors[0]);
      std::vector<at::Tensor> flat;
      for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
      at::Tensor buffer = at::cat(flat);
      std::vector<at::Tensor> outs = tensors;
      return Enqueue(name, c10d::OpType::ALLREDUCE_COALESCED, outs,
                     Request(kAllReduce, name, buffer, buffer.data_ptr(), op), {buffer},
                     [outs, buffer](const bridge::Operation*) mutable {
                       int64_t at = 0;
                       for (at::Tensor& t : outs) {
                         t.copy_(buffer.narrow(0, at, t.numel()).view(t.sizes()));
                         at += t.numel();
                       }
                     });
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor t = Single(name, "reduce", tensors);
      CheckRoot(name, "reduce", opts.rootRank);
      const int op = ReduceOpCode(name, "reduce", opts.reduceOp, t);
      // An all-reduce whose result only the root keeps: the others' tensors stay as they were.
      if (opts.rootRank == getRank()) return Reduce(name, c10d::OpType::REDUCE, t, op, {t});
      at::Tensor scratch = t.contiguous().clone();
      return Enqueue(name, c10d::OpType::REDUCE, {t},
                     Request(kAllReduce, name, scratch, scratch.data_ptr(), op), {scratch},
                     nullptr);
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor t = Single(name, "broadcast", tensors);
      CheckRoot(name, "broadcast", opts.rootRank);
      at::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
      bridge::Request r = Request(kBroadcast, name, buffer, buffer.data_ptr(), kSum);
      r.root_rank = JobRank(opts.rootRank);
      return Enqueue(name, c10d::OpType::BROADCAST, {t}, std::move(r), {buffer},
                     CopyBackIfStaged(t, buffer));
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor t = Single(name, "allgather", inputs);
      if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize())) {
        throw Refusal(Say(name, "allgather", "takes one list of world-size (" +
                                                 std::to_string(getSize()) + ") output tensors"));
      }
      std::vector<at::Tensor> outs = outputs[0];
      for (const at::Tensor& o : outs) CheckOutput(name, "allgather", o, t, t.numel());
      return Gather(name, c10d::OpType::ALLGATHER, t, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      CheckTensor(name, "_allgather_base", input);
      CheckOutput(name, "_allgather_base", output, input, input.numel() * getSize());
      std::vector<at::Tensor> outs{output};
      return Gather(name, c10d::OpType::_ALLGATHER_BASE, input, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor t = Single(name, "gather", inputs);
      CheckRoot(name, "gather", opts.rootRank);
      std::vector<at::Tensor> outs;
      if (opts.rootRank == getRank()) {
        if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize())) {
          throw Refusal(Say(name, "gather", "the root takes one list of world-size (" +
                                                std::to_string(getSize()) + ") output tensors"));
        }
        outs = outputs[0];
        for (const at::Tensor& o : outs) CheckOutput(name, "gather", o, t, t.numel());
      } else if (!outputs.empty() && !outputs[0].empty()) {
        throw Refusal(Say(name, "gather", "only the root rank passes output tensors"));
      }
      // An all-gather whose result only the root keeps.
      return Gather(name, c10d::OpType::GATHER, t, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor out = Single(name, "scatter", outputs);
      CheckRoot(name, "scatter", opts.rootRank);
      const int64_t n = out.numel();
      at::Tensor buffer;
      if (opts.rootRank == getRank()) {
        if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize())) {
          throw Refusal(Say(name, "scatter", "the root takes one list of world-size (" +
                                                 std::to_string(getSize()) + ") input tensors"));
        }
        std::vector<at::Tensor> flat;
        for (const at::Tensor& i : inputs[0]) {
          CheckOutput(name, "scatter", i, out, n);
          flat.push_back(i.reshape({-1}));
        }
        buffer = at::cat(flat);
      } else {
        if (!inputs.empty() && !inputs[0].empty()) {
          throw Refusal(Say(name, "scatter", "only the root rank passes input tensors"));
        }
        buffer = at::empty({n * getSize()}, out.options());
      }
      // A broadcast of the root's concatenated inputs; each rank keeps its own part.
      bridge::Request r = Request(kBroadcast, name, buffer, buffer.data_ptr(), kSum);
      r.root_rank = JobRank(opts.rootRank);
      const int64_t at = n * getRank();
      return Enqueue(name, c10d::OpType::SCATTER, {out}, std::move(r), {buffer},
                     [out, buffer, at, n](const bridge::Operation*) mutable {
                       out.copy_(buffer.narrow(0, at, n).view(out.sizes()));
                     });
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      at::Tensor out = Single(name, "reduce_scatter", outputs);
      if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize())) {
        throw Refusal(Say(name, "reduce_scatter", "takes one list of world-size (" +
                                                      std::to_string(getSize()) + ") input tensors"));
      }
      std::vector<at::Tensor> flat;
      for (const at::Tensor& i : inputs[0]) {
        CheckOutput(name, "reduce_scatter", i, out, out.numel());
        flat.push_back(i.reshape({-1}));
      }
      return ReduceScatter(name, c10d::OpType::REDUCE_SCATTER, at::cat(flat), out, opts);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      CheckTensor(name, "_reduce_scatter_base", output);
      CheckOutput(name, "_reduce_scatter_base", input, output, output.numel() * getSize());
      return ReduceScatter(name, c10d::OpType::_REDUCE_SCATTER_BASE, input.reshape({-1}),
                           output, opts);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      CheckTensor(name, "alltoall_base", input);
      CheckTensor(name, "alltoall_base", output);
      if (input.dim() == 0 || output.dim() == 0) {
        throw Refusal(Say(name, "alltoall_base", "takes tensors of at least one dimension"));
      }
      CheckSplits(name, "alltoall_base", "input_split_sizes", input_splits, input.size(0));
      CheckSplits(name, "alltoall_base", "output_split_sizes", output_splits, output.size(0));
      return AllToAll(name, c10d::OpType::ALLTOALL_BASE, input, input_splits, {output});
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const std::string name = NextName();
    return Guard(name, [&] {
      if (inputs.size() != static_cast<size_t>(getSize()) ||
          outputs.size() != static_cast<size_t>(getSize())) {
        throw Refusal(Say(name, "alltoall", "takes world-size (" + std::to_string(getSize()) +
                                                ") input and output tensors"));
      }
      std::vector<at::Tensor> flat;
      std::vector<int64_t> splits;
      for (const at::Tensor& i : inputs) {
        CheckTensor(name, "alltoall", i);
        if (i.scalar_type() != inputs[0].scalar_type()) {
          throw Refusal(Say(name, "alltoall", "the input tensors' dtypes differ"));
        }
        flat.push_back(i.reshape({-1}));
        splits.push_back(i.numel());
      }
      for (const at::Tensor& o : outputs) CheckOutput(name, "alltoall", o, inputs[0], o.numel());
      return AllToAll(name, c10d::OpType::ALLTOALL, at::cat(flat), splits, outputs);
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    RefuseIfUnsupported();
    // Note [Names of the backend's collectives]: one name for every barrier of the group, and
    // after it the ranks' counters agree again.
    const std::string name = "c10d." + group_ + ".barrier";
    return Guard(name, [&] {
      at::Tensor empty = at::empty({0}, at::kByte);
      c10::intrusive_ptr<c10d::Work> work =
          Enqueue(name, c10d::OpType::BARRIER, {},
                  Request(kBarrier, name, empty, nullptr, kSum), {empty}, nullptr);
      Realign();
      return work;
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override {
    return Unsupported("send");
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    return Unsupported("recv");
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    return Unsupported("recv (from any source)");
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
      const c10d::AllgatherOptions&) override {
    return Unsupported("allgather_coalesced");
  }

 private:
  // --- naming and refusals --------------------------------------------------------------------

  std::string NextName() {
    RefuseIfUnsupported();
    std::lock_guard<std::mutex> lock(mu_);
    FinishRealign();
    return "c10d." + group_ + "." + std::to_string(next_++);
  }

  // After a barrier (Note [Names of the backend's collectives]): an all-reduce (max) of the
  // ranks' counters, which the runtime sends once the barrier has completed; the next call
  // takes its number from the result, on every rank, so a group whose ranks made different
  // numbers of calls before the barrier (an error, a call on some ranks only) pairs its
  // calls again after it.
  void Realign() {
    std::lock_guard<std::mutex> lock(mu_);
    FinishRealign();
    realign_counter_ = at::full({1}, next_, at::kLong);
    bridge::Request r = Request(kAllReduce, "c10d." + group_ + ".realign", realign_counter_,
                                realign_counter_.data_ptr(), kMax);
    std::unique_ptr<bridge::Operation> op;
    if (runtime_->Enqueue(std::move(r), &op).ok()) realign_ = std::move(op);
  }

  // Waits for the realignment a barrier started, if any (called with mu_ held).
  void FinishRealign() {
    if (realign_ == nullptr) return;
    while (!realign_->Wait(0.1)) {
    }
    // On an error (a lost rank...) the counter stays: the calls that follow fail anyway.
    if (realign_->status().ok()) next_ = std::max(next_, realign_counter_.item<int64_t>());
    realign_.reset();
  }

  void RefuseIfUnsupported() const { TORCH_CHECK(refusal_.empty(), refusal_); }

  std::string Say(const std::string& name, const char* what, const std::string& why) const {
    return std::string("braid backend: ") + what + " (collective '" + name + "', rank " +
           std::to_string(getRank()) + "): " + why;
  }

  // Runs `make`; a refusal it throws before the runtime saw the call is reported under
  // `name` (Note [Names of the backend's collectives]), so the other ranks learn why now, and
  // raised to the caller as RuntimeError.
  template <typename Make>
  c10::intrusive_ptr<c10d::Work> Guard(const std::string& name, Make make) {
    try {
      return make();
    } catch (const RuntimeRefusal&) {
      throw;
    } catch (const Refusal& e) {
      // The runtime adds the class. A subgroup's names are its process set's.
      (void)runtime_->ReportFailure(bridge::QualifiedName(process_set_id_, name),
                                    {3, e.why()});
      throw;
    } catch (const std::exception& e) {
      (void)runtime_->ReportFailure(bridge::QualifiedName(process_set_id_, name),
                                    {3, e.what()});
      throw;
    }
  }

  // The job's rank of the group's rank `group_rank` (torch passes group ranks; braid's
  // broadcast root is a rank of the job).
  int JobRank(int64_t group_rank) const {
    return ranks_.empty() ? static_cast<int>(group_rank) : ranks_[group_rank];
  }

  c10::intrusive_ptr<c10d::Work> Unsupported(const char* what) {
    // Point-to-point calls take no part in the group's collective sequence: no name is used.
    TORCH_CHECK(false, "braid backend: ", what,
                " is not supported: braid offers collectives only (all-reduce, broadcast, "
                "all-gather, gather, scatter, reduce, reduce-scatter, all-to-all, barrier); "
                "use a gloo group for point-to-point traffic");
  }

  void CheckTensor(const std::string& name, const char* what, const at::Tensor& t) const {
    if (!t.defined()) throw Refusal(Say(name, what, "an undefined tensor"));
    if (!t.device().is_cpu()) {
      throw Refusal(Say(name, what, "tensors must be on the CPU (got " + t.device().str() +
                                        "): braid's data plane takes host memory"));
    }
    if (t.is_sparse()) throw Refusal(Say(name, what, "sparse tensors are not supported"));
  }

  at::Tensor Single(const std::string& name, const char* what,
                    const std::vector<at::Tensor>& tensors) const {
    if (tensors.size() != 1) {
      throw Refusal(Say(name, what, "takes exactly one tensor per call (got " +
                                        std::to_string(tensors.size()) + ")"));
    }
    CheckTensor(name, what, tensors[0]);
    return tensors[0];
  }

  // An output (or a list entry) of `expected` elements of `like`'s dtype.
  void CheckOutput(const std::string& name, const char* what, const at::Tensor& o,
                   const at::Tensor& like, int64_t expected) const {
    CheckTensor(name, what, o);
    if (o.scalar_type() != like.scalar_type()) {
      throw Refusal(Say(name, what, std::string("dtypes differ: ") +
                                        c10::toString(o.scalar_type()) + " and " +
                                        c10::toString(like.scalar_type())));
    }
    if (o.numel() != expected) {
      throw Refusal(Say(name, what, "a tensor has " + std::to_string(o.numel()) +
                                        " elements where " + std::to_string(expected) +
                                        " are needed"));
    }
  }

  void CheckRoot(const std::string& name, const char* what, int64_t root) const {
    if (root < 0 || root >= getSize()) {
      throw Refusal(Say(name, what, "root rank " + std::to_string(root) +
                                        " is outside the group of " + std::to_string(getSize())));
    }
  }

  void CheckSplits(const std::string& name, const char* what, const char* which,
                   const std::vector<int64_t>& splits, int64_t rows) const {
    if (splits.empty()) {
      if (rows % getSize() != 0) {
        throw Refusal(Say(name, what, std::to_string(rows) + " rows do not split evenly over " +
                                          std::to_string(getSize()) + " ranks; pass " + which));
      }
      return;
    }
    int64_t sum = 0;
    for (int64_t s : splits) sum += s;
    if (splits.size() != static_cast<size_t>(getSize()) || sum != rows) {
      throw Refusal(Say(name, what, std::string(which) + " must have " +
                                        std::to_string(getSize()) + " entries summing to " +
                                        std::to_string(rows)));
    }
  }

  int ReduceOpCode(const std::string& name, const char* what, const c10d::ReduceOp& op,
                   const at::Tensor& t) const {
    if (DTypeCode(t.scalar_type()) < 0) {
      throw Refusal(Say(name, what, std::string("dtype ") + c10::toString(t.scalar_type()) +
                                        " cannot be reduced (float32/64, float16, bfloat16, "
                                        "int32, int64, uint8 can)"));
    }
    switch (op.op_) {
      case c10d::ReduceOp::SUM: return kSum;
      case c10d::ReduceOp::AVG: return kAverage;
      case c10d::ReduceOp::MIN: return kMin;
      case c10d::ReduceOp::MAX: return kMax;
      case c10d::ReduceOp::PRODUCT: return kProduct;
      default:
        throw Refusal(Say(name, what, "reduce op " + ReduceOpName(op.op_) +
                                          " is not supported (SUM, AVG, MIN, MAX, PRODUCT are)"));
    }
  }

  // --- requests -------------------------------------------------------------------------------

  // A request over the bytes of `t` (contiguous): in braid's dtype when braid has it, else as
  // raw bytes (data movement only).
  bridge::Request Request(int collective, const std::string& name, const at::Tensor& t,
                          void* output, int op) const {
    bridge::Request r;
    r.collective = collective;
    r.name = name;
    r.op = op;
    r.process_set_id = process_set_id_;
    const int code = DTypeCode(t.scalar_type());
    if (code >= 0) {
      r.dtype = code;
      r.shape.assign(t.sizes().begin(), t.sizes().end());
    } else {
      r.dtype = kUInt8;
      r.shape = {t.numel() * static_cast<int64_t>(t.element_size())};
    }
    const int64_t units = t.numel() * UnitsPerElement(t);
    if (collective == kAllGather) {
      // One row per rank: the runtime refuses, on every rank, ranks whose rows differ in
      // length (torch's all-gathers take equal sizes), where a flat concatenation of unequal
      // parts would be cut at the wrong places without an error on some ranks.
      r.shape = {1, units};
    } else if (collective == kAllToAll) {
      r.shape = {units};  // the splits count elements (or bytes) of the flat run
    }
    r.input = t.data_ptr();
    r.output = output;
    r.output_capacity = output == nullptr ? 0 : t.numel() * t.element_size();
    // The group's method applies to floating-point sums and averages; every other
    // all-reduce (integers, min/max/product: DDP's own bookkeeping, metrics) is exact.
    const bool floating = code == kFloat32 || code == kFloat64 || code == kFloat16 ||
                          code == kBFloat16;
    r.compression = collective == kAllReduce && floating && (op == kSum || op == kAverage)
                        ? compression_
                        : "none";
    return r;
  }

  // An all-reduce of `t` in place (through a contiguous copy when it is not contiguous).
  c10::intrusive_ptr<c10d::Work> Reduce(const std::string& name, c10d::OpType type, at::Tensor t,
                                        int op, std::vector<at::Tensor> results) {
    at::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
    return Enqueue(name, type, std::move(results),
                   Request(kAllReduce, name, buffer, buffer.data_ptr(), op), {buffer},
                   CopyBackIfStaged(t, buffer));
  }

  // An all-gather of `t` into `outs` (one tensor of every rank's part, or one per rank, in
  // rank order; none: the result is not kept).
  c10::intrusive_ptr<c10d::Work> Gather(const std::string& name, c10d::OpType type,
                                        const at::Tensor& t, std::vector<at::Tensor> outs) {
    at::Tensor buffer = t.contiguous();
    const int64_t part_bytes = t.numel() * static_cast<int64_t>(t.element_size());
    const int world = getSize();
    return Enqueue(
        name, type, outs, Request(kAllGather, name, buffer, nullptr, kSum), {buffer},
        [outs, part_bytes, world, name](const bridge::Operation* op) mutable {
          const std::vector<char>& bytes = op->output();
          if (static_cast<int64_t>(bytes.size()) != part_bytes * world) {
            throw std::runtime_error("braid backend: all-gather '" + name + "' gathered " +
                                     std::to_string(bytes.size()) + " bytes where " +
                                     std::to_string(part_bytes * world) +
                                     " were expected: the ranks' tensors differ in size");
          }
          CopyOut(bytes.data(), outs);
        });
  }

  c10::intrusive_ptr<c10d::Work> ReduceScatter(const std::string& name, c10d::OpType type,
                                               at::Tensor flat, at::Tensor out,
                                               const c10d::ReduceScatterOptions& opts) {
    const int op = ReduceOpCode(name, "reduce_scatter", opts.reduceOp, out);
    // Dim 0 of (world, n) splits evenly: rank r receives row r.
    at::Tensor input = flat.contiguous().view({getSize(), out.numel()});
    at::Tensor target = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    bridge::Request r = Request(kReduceScatter, name, input, target.data_ptr(), op);
    r.output_capacity = target.numel() * target.element_size();
    return Enqueue(name, type, {out}, std::move(r), {input, target},
                   CopyBackIfStaged(out, target));
  }

  c10::intrusive_ptr<c10d::Work> AllToAll(const std::string& name, c10d::OpType type,
                                          const at::Tensor& input, std::vector<int64_t> splits,
                                          std::vector<at::Tensor> outs) {
    at::Tensor buffer = input.contiguous();
    // Splits count rows of dim 0; the request sends the tensor as a flat run of elements.
    const int64_t row = input.dim() > 1 ? buffer.numel() / std::max<int64_t>(1, input.size(0)) : 1;
    const int64_t scale = UnitsPerElement(input);
    if (type == c10d::OpType::ALLTOALL_BASE && splits.empty()) {
      splits.assign(getSize(), input.size(0) / getSize());
    }
    bridge::Request r = Request(kAllToAll, name, buffer, nullptr, kSum);
    for (int64_t& s : splits) s *= (type == c10d::OpType::ALLTOALL_BASE ? row : 1) * scale;
    r.splits = splits;
    int64_t expected = 0;
    for (const at::Tensor& o : outs) expected += o.numel() * static_cast<int64_t>(o.element_size());
    return Enqueue(name, type, outs, std::move(r), {buffer},
                   [outs, expected, name](const bridge::Operation* op) mutable {
                     const std::vector<char>& bytes = op->output();
                     if (static_cast<int64_t>(bytes.size()) != expected) {
                       throw std::runtime_error(
                           "braid backend: all-to-all '" + name + "' received " +
                           std::to_string(bytes.size()) + " bytes where the output tensors hold " +
                           std::to_string(expected) + ": the ranks' splits disagree");
                     }
                     CopyOut(bytes.data(), outs);
                   });
  }

  // What completes a collective that ran on `buffer`, a contiguous copy of `t` (nothing when
  // it ran on `t` itself): the result copied back into `t`.
  static std::function<void(const bridge::Operation*)> CopyBackIfStaged(at::Tensor t,
                                                                        at::Tensor buffer) {
    if (buffer.is_same(t)) return nullptr;
    return [t, buffer](const bridge::Operation*) mutable { t.copy_(buffer); };
  }

  // Copies the bytes at `src` into `outs`, one tensor after another.
  static void CopyOut(const char* src, std::vector<at::Tensor>& outs) {
    for (at::Tensor& o : outs) {
      const size_t n = static_cast<size_t>(o.numel()) * o.element_size();
      if (n == 0) continue;
      if (o.is_contiguous()) {
        std::memcpy(o.data_ptr(), src, n);
      } else {
        at::Tensor tmp = at::empty_like(o, at::MemoryFormat::Contiguous);
        std::memcpy(tmp.data_ptr(), src, n);
        o.copy_(tmp);
      }
      src += n;
    }
  }

  // How many of a request's elements one element of `t` takes: 1 in a dtype braid has, else
  // its bytes (Request sends other dtypes as bytes).
  static int64_t UnitsPerElement(const at::Tensor& t) {
    return DTypeCode(t.scalar_type()) >= 0 ? 1 : static_cast<int64_t>(t.element_size());
  }

  // Hands `r` to the runtime and queues the work for completion.
  c10::intrusive_ptr<c10d::Work> Enqueue(const std::string& name, c10d::OpType type,
                                         std::vector<at::Tensor> results, bridge::Request r,
                                         std::vector<at::Tensor> keep_alive,
                                         std::function<void(const bridge::Operation*)> finish) {
    Pending p;
    p.name = name;
    p.start = std::chrono::steady_clock::now();
    p.work = c10::make_intrusive<BraidWork>(getRank(), type, std::move(results));
    p.keep_alive = std::move(keep_alive);
    p.finish = std::move(finish);
    bridge::Status s;
    {
      // The GIL is not held here (torch releases it around collectives); enqueue may block
      // briefly on the runtime's locks.
      s = runtime_->Enqueue(std::move(r), &p.op);
    }
    if (!s.ok()) throw RuntimeRefusal(Describe(s));
    c10::intrusive_ptr<c10d::Work> work = p.work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(std::move(p));
      ++in_flight_;
    }
    cv_.notify_all();
    return work;
  }

  // Waits for the group's collectives in the order they were made and hands each
  // completion to the callback runner. A collective still running after the group's timeout
  // fails here, on this rank (as gloo's do), and is kept, with its tensors, until the runtime
  // completes it (when the other ranks call it, or at braid's own deadlines).
  void CompleteInOrder() {
    std::vector<Pending> late;
    while (true) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
        if (pending_.empty()) break;  // stopping, nothing left
        p = std::move(pending_.front());
        pending_.pop_front();
      }
      std::exception_ptr error;
      if (p.op != nullptr) {
        const auto deadline = p.start + std::chrono::duration<double>(timeout_s_);
        bool done = false;
        while (!(done = p.op->Wait(0.1))) {
          ReleaseCompleted(&late);
          if (timeout_s_ > 0 && std::chrono::steady_clock::now() >= deadline) break;
        }
        if (!done) {
          error = std::make_exception_ptr(std::runtime_error(
              "braid.DeadlineExceededError: braid backend: collective '" + p.name +
              "' did not complete within the process group's timeout (" +
              Seconds(timeout_s_) + " s, init_process_group(timeout=...)) on rank " +
              std::to_string(getRank()) + ": a rank has not called it"));
          runner_.Post([work = p.work, error] { work->Complete(error); });
          late.push_back(std::move(p));
          Posted();
          continue;
        }
        const bridge::Status s = p.op->status();
        if (!s.ok()) error = std::make_exception_ptr(std::runtime_error(Describe(s)));
      }
      runner_.Post([p = std::make_shared<Pending>(std::move(p)), error]() mutable {
        if (!error && p->finish) {
          try {
            p->finish(p->op.get());
          } catch (...) {
            error = std::current_exception();
          }
        }
        p->op.reset();
        p->keep_alive.clear();
        p->work->Complete(error);
      });
      Posted();
    }
    for (Pending& p : late) {
      while (!p.op->Wait(0.1)) {
      }
    }
  }

  // One collective's completion was handed to the runner.
  void Posted() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0) cv_drained_.notify_all();
  }

  static void ReleaseCompleted(std::vector<Pending>* late) {
    late->erase(std::remove_if(late->begin(), late->end(),
                               [](Pending& p) { return p.op->Wait(0); }),
                late->end());
  }

  bridge::Runtime* const runtime_;
  const std::string group_;
  const std::string compression_;
  const std::string refusal_;
  const double timeout_s_;
  const int process_set_id_;
  const std::vector<int> ranks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  int64_t next_ = 0;
  int64_t in_flight_ = 0;  // enqueued, completion not yet handed to the runner
  std::condition_variable cv_drained_;
  bool stop_ = false;
  // The realignment a barrier started (Realign), and the counter it reduces.
  std::unique_ptr<bridge::Operation> realign_;
  at::Tensor realign_counter_;
  CallbackRunner runner_;  // declared before completer_: joined after it
  std::thread completer_;
};

}  // namespace
}  // namespace braid::c10d_backend

PYBIND11_MODULE(process_group, m) {
  using braid::c10d_backend::ProcessGroupBraid;
  m.doc() = "The `braid` torch.distributed backend; import braid.torch.distributed instead.";
  py::module_::import("torch.distributed");  // registers c10d::ProcessGroup's Python type
  py::class_<ProcessGroupBraid, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupBraid>>(
      m, "ProcessGroupBraid")
      .def(py::init([](int rank, int size, const std::string& group,
                       const std::string& compression, const std::string& refusal,
                       double timeout_s, int process_set_id, std::vector<int> ranks) {
             return c10::make_intrusive<ProcessGroupBraid>(rank, size, group, compression,
                                                           refusal, timeout_s, process_set_id,
                                                           std::move(ranks));
           }),
           py::arg("rank"), py::arg("size"), py::arg("group"), py::arg("compression"),
           py::arg("refusal") = "", py::arg("timeout_s") = 0.0, py::arg("process_set_id") = 0,
           py::arg("ranks") = std::vector<int>{})
      .def_property_readonly("group_name", &ProcessGroupBraid::group)
      .def_property_readonly("compression", &ProcessGroupBraid::compression)
      .def_property_readonly("calls", &ProcessGroupBraid::calls)
      .def("drain", &ProcessGroupBraid::Drain, py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>());
  m.attr("RUNTIME_BRIDGE_VERSION") = braid::bridge::kVersion;
}
