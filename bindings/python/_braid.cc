// braid._braid: the pybind11 layer under the `braid` Python package.
//
// It is deliberately thin: it turns NumPy buffers (`enqueue`) or raw addresses of framework
// tensors (`enqueue_ptr`, used by braid.torch) into braid::CollectiveRequest, hands them to
// braid::GlobalRuntime(), and maps absl::Status onto the braid.BraidError hierarchy. Argument
// conversion (dtypes, contiguity, output allocation, names, copy-back for in-place calls on
// non-contiguous tensors) lives in braid/_ops.py and braid/torch/, which keep the arrays and
// tensors alive until the collective completes; nothing here holds a Python object beyond the
// call that received it, and the runtime's background thread never sees one.
//
// GIL: released around every call that can block (init, shutdown, enqueue, wait). Waiting is
// done in slices so that Ctrl-C (SIGINT) raises KeyboardInterrupt in the waiting thread.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/limits.h"
#include "device/device.h"
#include "glog/logging.h"
#include "runtime/config.h"
#include "runtime/handle.h"
#include "control/process_sets.h"
#include "coordinator/service.h"
#include "runtime/runtime.h"
#include "bindings/python/runtime_bridge.h"

namespace py = pybind11;

namespace {

// Exception classes, created once at import (module "braid" so tracebacks read
// braid.InvalidArgumentError).
struct Errors {
  PyObject* base = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* already_exists = nullptr;
  PyObject* failed_precondition = nullptr;
  PyObject* cancelled = nullptr;
  PyObject* deadline_exceeded = nullptr;
  PyObject* unavailable = nullptr;
  PyObject* internal = nullptr;
};
Errors g_errors;

PyObject* ErrorClassFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    // A wrong job secret: a setting that does not match the job's (docs/security.md: Who may join).
    case absl::StatusCode::kPermissionDenied:
      return g_errors.invalid_argument;
    case absl::StatusCode::kAlreadyExists: return g_errors.already_exists;
    case absl::StatusCode::kFailedPrecondition: return g_errors.failed_precondition;
    case absl::StatusCode::kCancelled: return g_errors.cancelled;
    case absl::StatusCode::kDeadlineExceeded: return g_errors.deadline_exceeded;
    case absl::StatusCode::kUnavailable: return g_errors.unavailable;
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
      return g_errors.internal;
    default: return g_errors.base;  // Unknown, Aborted, ...
  }
}

// Raises the braid.BraidError subclass named after the status code, with its message. The
// message is used verbatim; codes without a subclass of their own (Aborted, ...) raise
// BraidError with the code's name prefixed.
[[noreturn]] void Raise(const absl::Status& s) {
  PyObject* cls = ErrorClassFor(s.code());
  std::string msg(s.message());
  if (cls == g_errors.base) msg = absl::StatusCodeToString(s.code()) + ": " + msg;
  if (msg.empty()) msg = absl::StatusCodeToString(s.code());
  // By length, not as a C string: a message quoting a name or a state's bytes may hold a
  // NUL, which would cut it short; bytes that are not UTF-8 show as U+FFFD.
  PyObject* text = PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()),
                                        "replace");
  if (text == nullptr) throw py::error_already_set();
  PyErr_SetObject(cls, text);
  Py_DECREF(text);
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// Init and Shutdown are not safe to run concurrently with each other; serialise them.
std::mutex& LifecycleMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

void InitLogging() {
  // Debian's libtorch links the same system glog: never initialise it twice.
  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging("braid");
  }
}

// The native side of an asynchronous collective. The Python wrapper (braid._ops.Handle)
// holds the arrays; this holds the runtime's handle.
class NativeHandle {
 public:
  NativeHandle(std::shared_ptr<braid::Handle> h, std::string name, const void* input,
               const void* output)
      : h_(std::move(h)),
        name_(std::move(name)),
        input_address_(reinterpret_cast<uintptr_t>(input)),
        output_address_(reinterpret_cast<uintptr_t>(output)) {}

  const std::string& name() const { return name_; }
  // The addresses the runtime was handed (0: none). They let the bindings' tests check that
  // a contiguous tensor reaches the runtime without a staging copy.
  uintptr_t input_address() const { return input_address_; }
  uintptr_t output_address() const { return output_address_; }
  bool poll() const { return h_->Poll(); }

  // Waits until the collective completes or `timeout_s` (None: forever) passes. Returns
  // whether it completed. The GIL is released in slices of `slice_s`; between slices
  // pending signals run their Python handlers (Ctrl-C raises KeyboardInterrupt here).
  bool wait(std::optional<double> timeout_s, double slice_s) const {
    const absl::Duration slice = absl::Seconds(slice_s > 0 ? slice_s : 0.1);
    const absl::Time deadline = timeout_s.has_value()
                                    ? absl::Now() + absl::Seconds(std::max(0.0, *timeout_s))
                                    : absl::InfiniteFuture();
    while (true) {
      bool done;
      {
        py::gil_scoped_release release;
        const absl::Duration step = std::min(slice, deadline - absl::Now());
        done = h_->Wait(std::max(step, absl::ZeroDuration())).code() !=
                   absl::StatusCode::kDeadlineExceeded ||
               h_->Poll();
      }
      if (done) return true;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (absl::Now() >= deadline) return false;
    }
  }

  // Raises the collective's error; None when it succeeded. Call after completion.
  void check() const {
    if (!h_->Poll()) {
      Raise(absl::FailedPreconditionError("collective '" + name_ + "' has not completed yet"));
    }
    Check(h_->status());
  }

  // The runtime-owned result (all-gather, all-to-all) as an array of `dtype` and the
  // runtime's output shape, without a copy: the array keeps the handle (and so the bytes)
  // alive.
  py::array output(const py::dtype& dtype) const {
    check();
    const std::vector<int64_t>& shape = h_->output_shape();
    std::vector<py::ssize_t> dims(shape.begin(), shape.end());
    const std::vector<char>& bytes = h_->output();
    const absl::StatusOr<int64_t> elements = braid::ShapeElements("the result's shape", shape);
    if (!elements.ok()) {
      Raise(absl::InternalError("collective '" + name_ + "': " +
                                std::string(elements.status().message())));
    }
    const size_t n = static_cast<size_t>(*elements);
    if (n * static_cast<size_t>(dtype.itemsize()) != bytes.size()) {
      Raise(absl::InternalError("collective '" + name_ + "': result has " +
                                std::to_string(bytes.size()) + " bytes, expected " +
                                std::to_string(n * dtype.itemsize())));
    }
    if (bytes.empty()) return py::array(dtype, dims);
    auto* keep = new std::shared_ptr<braid::Handle>(h_);
    py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<braid::Handle>*>(p); });
    return py::array(dtype, dims, {}, const_cast<char*>(bytes.data()), owner);
  }

  // The runtime-owned result as a flat uint8 array over its bytes, without a copy (the
  // array keeps the handle alive). A framework binding views it in its own dtype, which
  // NumPy may not have (bfloat16).
  py::array output_bytes() const {
    check();
    const std::vector<char>& bytes = h_->output();
    const py::dtype u8 = py::dtype::of<uint8_t>();
    if (bytes.empty()) return py::array(u8, std::vector<py::ssize_t>{0});
    auto* keep = new std::shared_ptr<braid::Handle>(h_);
    py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<braid::Handle>*>(p); });
    return py::array(u8, std::vector<py::ssize_t>{static_cast<py::ssize_t>(bytes.size())}, {},
                     const_cast<char*>(bytes.data()), owner);
  }

  std::vector<int64_t> output_shape() const { return h_->output_shape(); }

 private:
  std::shared_ptr<braid::Handle> h_;
  std::string name_;
  uintptr_t input_address_;
  uintptr_t output_address_;
};

braid::DataType CheckedDataType(int dtype, const py::array& a, const char* what) {
  if (!braid::IsValidDataType(dtype)) {
    Raise(absl::InvalidArgumentError("unknown braid dtype code " + std::to_string(dtype)));
  }
  auto dt = static_cast<braid::DataType>(dtype);
  if (static_cast<size_t>(a.itemsize()) != braid::DataTypeSize(dt)) {
    Raise(absl::InvalidArgumentError(std::string(what) + " has " + std::to_string(a.itemsize()) +
                                     "-byte elements, but " +
                                     std::string(braid::DataTypeName(dt)) + " needs " +
                                     std::to_string(braid::DataTypeSize(dt))));
  }
  return dt;
}

void RequireContiguous(const py::array& a, const char* what, bool writeable) {
  if (!(a.flags() & py::array::c_style)) {
    Raise(absl::InvalidArgumentError(std::string(what) + " must be C-contiguous"));
  }
  if (writeable && !a.writeable()) {
    Raise(absl::InvalidArgumentError(std::string(what) + " is read-only"));
  }
}

// Checks the codes every enqueue shares and fills them into a request.
braid::CollectiveRequest NewRequest(int collective, const std::string& name, int op,
                                    int root_rank, const std::vector<int64_t>& splits,
                                    const std::string& compression) {
  if (collective < 0 || collective > static_cast<int>(braid::Collective::kJoin)) {
    Raise(absl::InvalidArgumentError("unknown collective code " + std::to_string(collective)));
  }
  if (!braid::IsValidReduceOp(op)) {
    Raise(absl::InvalidArgumentError("unknown reduce op code " + std::to_string(op)));
  }
  // braid/_ops.py checks these first; here again so that no caller can hand the runtime a
  // name or size beyond the limits (common/limits.h).
  Check(braid::CheckName("the collective's name", name));
  braid::CollectiveRequest r;
  r.name = name;
  r.collective = static_cast<braid::Collective>(collective);
  r.op = static_cast<braid::ReduceOp>(op);
  r.root_rank = root_rank;
  r.splits = splits;
  r.compression = compression;  // "" = the job's default (BRAID_COMPRESSION)
  return r;
}

NativeHandle Submit(braid::CollectiveRequest r) {
  std::string name = r.name;
  const void* input = r.input;
  const void* output = r.output;
  absl::StatusOr<std::shared_ptr<braid::Handle>> h;
  {
    py::gil_scoped_release release;
    h = braid::GlobalRuntime().Enqueue(std::move(r));
  }
  return NativeHandle(Value(std::move(h)), std::move(name), input, output);
}

// Enqueues one collective. `input` must be C-contiguous with elements of `dtype`'s size;
// `output`, when given, C-contiguous and writeable (it may be `input` itself). The caller
// (braid._ops) must keep both arrays alive and unmodified until the handle completes.
NativeHandle Enqueue(int collective, const std::string& name, int dtype, const py::array& input,
                     std::optional<py::array> output, int op, int root_rank,
                     const std::vector<int64_t>& splits, const std::string& compression,
                     int process_set_id) {
  braid::CollectiveRequest r = NewRequest(collective, name, op, root_rank, splits, compression);
  r.process_set_id = process_set_id;
  r.dtype = CheckedDataType(dtype, input, "input");
  RequireContiguous(input, "input", false);
  r.shape.assign(input.shape(), input.shape() + input.ndim());
  r.input = input.data();
  if (output.has_value()) {
    RequireContiguous(*output, "output", true);
    if (output->itemsize() != input.itemsize()) {
      Raise(absl::InvalidArgumentError("output and input element sizes differ"));
    }
    r.output = output->mutable_data();
    r.output_capacity_bytes = static_cast<size_t>(output->nbytes());
  }
  return Submit(std::move(r));
}

// Enqueues one collective on host memory given by address: how braid.torch hands a
// contiguous tensor's storage (tensor.data_ptr()) to the runtime without a copy. `shape` is
// the input's, in elements of `dtype`; `output` (0: none) holds `output_capacity` bytes and may
// equal `input` (in place). The caller keeps both tensors alive and the input unmodified until
// the handle completes. Device memory (a CUDA tensor's) comes with `device_type` (1: cuda),
// `device_id` and `stream`, the caller's cudaStream_t (0: the default stream): braid's work
// on it waits for what that stream queued before the call (Note [Devices], device/device.h).
// `compression_pattern`: the plan pattern that chose `compression`, for the statistics
// (CollectiveRequest::compression_pattern).
NativeHandle EnqueuePtr(int collective, const std::string& name, int dtype, uintptr_t input,
                        const std::vector<int64_t>& shape, uintptr_t output,
                        size_t output_capacity, int op, int root_rank,
                        const std::vector<int64_t>& splits, const std::string& compression,
                        int process_set_id, int device_type, int device_id, uintptr_t stream,
                        const std::string& compression_pattern) {
  braid::CollectiveRequest r = NewRequest(collective, name, op, root_rank, splits, compression);
  r.process_set_id = process_set_id;
  r.compression_pattern = compression_pattern;  // a plan's, matched by braid.torch
  if (!braid::IsValidDataType(dtype)) {
    Raise(absl::InvalidArgumentError("unknown braid dtype code " + std::to_string(dtype)));
  }
  r.dtype = static_cast<braid::DataType>(dtype);
  auto elements = braid::ShapeElements("shape", shape);
  if (!elements.ok()) Raise(elements.status());
  Check(braid::TensorBytes("shape", *elements, braid::DataTypeSize(r.dtype)).status());
  r.shape = shape;
  r.input = reinterpret_cast<const void*>(input);
  r.output = reinterpret_cast<void*>(output);
  r.output_capacity_bytes = output == 0 ? 0 : output_capacity;
  r.device = braid::DeviceRef{static_cast<braid::DeviceType>(device_type), device_id};
  r.stream = reinterpret_cast<void*>(stream);
  return Submit(std::move(r));
}

// The compression methods the registry knows (with BRAID_TEST_COMPRESSORS's test-only ones
// when `test_methods`), in the registry's order.
std::vector<std::string> CompressionMethods(bool test_methods) {
  return braid::CompressionMethods(test_methods);
}

// The canonical form of a compression spec, or InvalidArgumentError naming what is wrong.
std::string CanonicalCompression(const std::string& spec, bool test_methods) {
  return Value(braid::CanonicalCompression(spec, test_methods));
}

// What a compression plan gives one tensor (runtime.h's CompressionPlanFor): (spec, the
// pattern that matched or "").
py::tuple CompressionPlanSpec(const std::string& plan, const std::string& name,
                              const std::vector<int64_t>& shape, int dtype, int op,
                              bool test_methods) {
  if (!braid::IsValidDataType(dtype) || !braid::IsValidReduceOp(op)) {
    Raise(absl::InvalidArgumentError("compression_plan_spec: unknown dtype " +
                                     std::to_string(dtype) + " or op " + std::to_string(op)));
  }
  braid::CompressionPlanChoice c =
      Value(braid::CompressionPlanFor(plan, name, shape, static_cast<braid::DataType>(dtype),
                                      static_cast<braid::ReduceOp>(op), test_methods));
  return py::make_tuple(c.spec, c.pattern);
}

// One counter set as a dict of ints (bytes, except `reductions`); see runtime/statistics.h.
py::dict ByteStatsDict(const braid::ByteStats& b) {
  py::dict d;
  d["reductions"] = b.reductions;
  d["uncompressed_bytes"] = b.uncompressed_bytes;
  d["payload_bytes"] = b.payload_bytes;
  d["transport_bytes"] = b.transport_bytes;
  d["reference_transport_bytes"] = b.reference_transport_bytes;
  return d;
}

// The runtime's fusion counters (FusionStats, runtime/statistics.h) as a dict.
py::dict FusionReport() {
  const braid::FusionStats f = Value(braid::GlobalRuntime().compression_report()).fusion;
  py::dict d;
  d["buckets"] = f.buckets;
  d["packed_buckets"] = f.packed_buckets;
  d["packed_bytes"] = f.packed_bytes;
  d["in_place_bytes"] = f.in_place_bytes;
  return d;
}

// The runtime's CompressionReport as plain lists of dicts: (methods, tensors, groups), sorted
// by method, by (name, method, pattern) and by (method, pattern). braid's compression_stats
// shapes it for users.
py::tuple CompressionReport() {
  braid::CompressionReport r = Value(braid::GlobalRuntime().compression_report());
  py::list methods, tensors, groups;
  for (const auto& m : r.methods) {
    py::dict d = ByteStatsDict(m.bytes);
    d["method"] = m.method;
    d["tensors"] = m.tensors;
    methods.append(d);
  }
  for (const auto& t : r.tensors) {
    py::dict d = ByteStatsDict(t.bytes);
    d["name"] = t.name;
    d["method"] = t.method;
    d["pattern"] = t.pattern;
    tensors.append(d);
  }
  for (const auto& g : r.groups) {
    py::dict d = ByteStatsDict(g.bytes);
    d["method"] = g.method;
    d["pattern"] = g.pattern;
    d["tensors"] = g.tensors;
    groups.append(d);
  }
  return py::make_tuple(methods, tensors, groups);
}

// Checkpointing of the compression state (Runtime::compression_state); may wait for a bucket
// being reduced, so without the GIL.
py::bytes CompressionState() {
  absl::StatusOr<std::string> state;
  {
    py::gil_scoped_release release;
    state = braid::GlobalRuntime().compression_state();
  }
  return py::bytes(Value(std::move(state)));
}

void LoadCompressionState(const py::bytes& state) {
  std::string bytes = state;  // copied with the GIL held
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = braid::GlobalRuntime().LoadCompressionState(bytes);
  }
  Check(s);
}

// load_compression_state() of an argument that is not bytes: still collective (Runtime::
// RefuseCompressionState), so the other ranks fail at once with this rank's reason.
void RefuseCompressionState(const std::string& why) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = braid::GlobalRuntime().RefuseCompressionState(absl::InvalidArgumentError(why));
  }
  Check(s);
}

int ForgetCompressionState(const std::vector<std::string>& names) {
  absl::StatusOr<int> forgotten;
  {
    py::gil_scoped_release release;  // may wait for a bucket being reduced
    forgotten = braid::GlobalRuntime().ForgetCompressionState(names);
  }
  return Value(std::move(forgotten));
}

// braid.init(): Runtime::Init runs on a helper thread while this one waits in 100 ms slices
// without the GIL, running pending signal handlers in between, so that Ctrl-C during the
// wait for the other ranks raises KeyboardInterrupt: Init is then cancelled
// (Runtime::CancelInit) and waited for, so no Init outlives the call.
void Init() {
  InitLogging();
  struct Outcome {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto outcome = std::make_shared<Outcome>();
  std::thread worker([outcome] {
    absl::Status s;
    {
      std::lock_guard<std::mutex> lock(LifecycleMutex());
      auto config = braid::ConfigFromProcessEnv();
      s = config.ok() ? braid::GlobalRuntime().Init(*config) : config.status();
    }
    absl::MutexLock lock(&outcome->mu);
    outcome->status = s;
    outcome->done = true;
  });
  // Waits up to a slice for Init to finish (without the GIL); whether it has.
  auto finished = [&outcome](bool cancel) {
    py::gil_scoped_release release;
    // Repeated on every slice: a cancel that came before Init started is reset by it.
    if (cancel) braid::GlobalRuntime().CancelInit();
    absl::MutexLock lock(&outcome->mu);
    return outcome->mu.AwaitWithTimeout(absl::Condition(&outcome->done),
                                        absl::Milliseconds(100));
  };
  while (!finished(false)) {
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set interrupted;  // takes the pending KeyboardInterrupt (or other)
      while (!finished(true)) {
      }
      worker.join();
      throw interrupted;
    }
  }
  worker.join();
  absl::Status s;
  {
    absl::MutexLock lock(&outcome->mu);
    s = outcome->status;
  }
  Check(s);
}

// The runtime for braid/torch/process_group.so (the torch.distributed backend): runtime_bridge.h.
class HandleOperation final : public braid::bridge::Operation {
 public:
  explicit HandleOperation(std::shared_ptr<braid::Handle> h) : h_(std::move(h)) {}
  bool Wait(double timeout_s) override {
    (void)h_->Wait(absl::Seconds(std::max(0.0, timeout_s)));
    return h_->Poll();
  }
  braid::bridge::Status status() const override { return ToBridge(h_->status()); }
  const std::vector<char>& output() const override { return h_->output(); }
  std::vector<int64_t> output_shape() const override { return h_->output_shape(); }

  static braid::bridge::Status ToBridge(const absl::Status& s) {
    return {static_cast<int>(s.code()), std::string(s.message())};
  }

 private:
  std::shared_ptr<braid::Handle> h_;
};

class RuntimeBridge final : public braid::bridge::Runtime {
 public:
  int version() const override { return braid::bridge::kVersion; }
  bool initialized() const override { return braid::GlobalRuntime().initialized(); }
  int rank() const override { return braid::GlobalRuntime().rank().value_or(-1); }
  int size() const override { return braid::GlobalRuntime().size().value_or(-1); }

  // The checks NewRequest makes for the Python callers, as a status instead of an exception
  // (this runs without the GIL, on whichever thread torch calls the backend from).
  braid::bridge::Status Enqueue(braid::bridge::Request b,
                                std::unique_ptr<braid::bridge::Operation>* op) override {
    if (b.collective < 0 || b.collective > static_cast<int>(braid::Collective::kJoin) ||
        !braid::IsValidReduceOp(b.op) || !braid::IsValidDataType(b.dtype)) {
      return {static_cast<int>(absl::StatusCode::kInvalidArgument),
              "collective '" + b.name + "': unknown collective, reduce op or dtype code"};
    }
    absl::Status s = braid::CheckName("the collective's name", b.name);
    if (!s.ok()) return HandleOperation::ToBridge(s);
    braid::CollectiveRequest r;
    r.name = std::move(b.name);
    r.collective = static_cast<braid::Collective>(b.collective);
    r.op = static_cast<braid::ReduceOp>(b.op);
    r.dtype = static_cast<braid::DataType>(b.dtype);
    r.root_rank = b.root_rank;
    r.splits = std::move(b.splits);
    r.compression = std::move(b.compression);
    r.process_set_id = b.process_set_id;
    r.shape = std::move(b.shape);
    r.input = b.input;
    r.output = b.output;
    r.output_capacity_bytes = b.output == nullptr ? 0 : b.output_capacity;
    absl::StatusOr<std::shared_ptr<braid::Handle>> h = braid::GlobalRuntime().Enqueue(std::move(r));
    if (!h.ok()) return HandleOperation::ToBridge(h.status());
    *op = std::make_unique<HandleOperation>(*std::move(h));
    return {};
  }

  braid::bridge::Status ReportFailure(const std::string& name,
                                      const braid::bridge::Status& cause) override {
    return HandleOperation::ToBridge(braid::GlobalRuntime().ReportFailure(
        name, absl::Status(static_cast<absl::StatusCode>(cause.code), cause.message)));
  }
};

PyObject* NewError(py::module_& m, const char* name, PyObject* base, const char* doc) {
  std::string full = std::string("braid.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, base, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // the module holds the reference from here on
  return cls;
}

}  // namespace

PYBIND11_MODULE(_braid, m) {
  m.doc() = "braid's native layer; use the `braid` package instead.";

  g_errors.base = NewError(m, "BraidError", PyExc_Exception,
                           "Base class of every error braid raises; the message comes from the "
                           "runtime and names the tensor and the ranks involved.");
  g_errors.invalid_argument = NewError(
      m, "InvalidArgumentError", g_errors.base,
      "Bad input: unsupported dtype, bad shape or splits, or a mismatch across ranks "
      "(dtype, shape, op, root rank) reported by the coordinator.");
  g_errors.already_exists = NewError(
      m, "AlreadyExistsError", g_errors.base,
      "A collective with this name is already in flight on this rank.");
  g_errors.failed_precondition = NewError(
      m, "FailedPreconditionError", g_errors.base,
      "braid is not initialized (call braid.init() first) or has been shut down.");
  g_errors.cancelled = NewError(m, "CancelledError", g_errors.base,
                                "braid was shut down before the collective completed.");
  g_errors.deadline_exceeded = NewError(
      m, "DeadlineExceededError", g_errors.base,
      "A wait, a rendezvous or a collective ran out of time (BRAID_TIMEOUT_S, stalls).");
  g_errors.unavailable = NewError(m, "UnavailableError", g_errors.base,
                                  "A peer rank or the coordinator was lost.");
  g_errors.internal = NewError(m, "InternalError", g_errors.base, "A bug in braid.");

  m.def("init", &Init,
        "Joins the job described by the environment (BRAID_*). OK if already initialized.");
  m.def(
      "shutdown",
      []() {
        absl::Status s;
        {
          py::gil_scoped_release release;
          std::lock_guard<std::mutex> lock(LifecycleMutex());
          s = braid::GlobalRuntime().Shutdown();
        }
        Check(s);
      },
      "Fails pending collectives with CancelledError and leaves the job.");
  m.def("is_initialized", []() { return braid::GlobalRuntime().initialized(); });
  m.def("rank", []() { return Value(braid::GlobalRuntime().rank()); });
  m.def("size", []() { return Value(braid::GlobalRuntime().size()); });
  m.def("local_rank", []() { return Value(braid::GlobalRuntime().local_rank()); });
  m.def("local_size", []() { return Value(braid::GlobalRuntime().local_size()); });
  m.def("is_homogeneous", []() { return Value(braid::GlobalRuntime().is_homogeneous()); });
  m.def("ranks_waiting", []() { return Value(braid::GlobalRuntime().ranks_waiting()); });
  // Note [Elastic membership]: how a drained process's refused registration begins.
  m.attr("ELASTIC_LEAVE") = braid::coordinator::kElasticLeave;
  m.def("ranks_leaving", []() { return Value(braid::GlobalRuntime().ranks_leaving()); });
  m.def("transport_description",
        []() { return Value(braid::GlobalRuntime().transport_description()); });

  m.def("enqueue", &Enqueue, py::arg("collective"), py::arg("name"), py::arg("dtype"),
        py::arg("input"), py::arg("output"), py::arg("op"), py::arg("root_rank"),
        py::arg("splits"), py::arg("compression") = "", py::arg("process_set_id") = 0);
  m.def("enqueue_ptr", &EnqueuePtr, py::arg("collective"), py::arg("name"), py::arg("dtype"),
        py::arg("input"), py::arg("shape"), py::arg("output"), py::arg("output_capacity"),
        py::arg("op"), py::arg("root_rank"), py::arg("splits"), py::arg("compression") = "",
        py::arg("process_set_id") = 0, py::arg("device_type") = 0, py::arg("device_id") = 0,
        py::arg("stream") = 0, py::arg("compression_pattern") = "");
  // Whether this braid has a CUDA device path (built with CUDA: Note [Devices]); NCCL, opened
  // at run time, comes with it.
  m.def("cuda_built", [] {
    return braid::device::MakeDefaultDevices(/*allow_unverified_cuda=*/true)
        ->Has(braid::DeviceType::kCUDA);
  });
  // Note [Process sets] (control/process_sets.h): Runtime::AddProcessSet and friends.
  m.def(
      "add_process_set",
      [](std::vector<int> ranks, bool members_only) {
        absl::StatusOr<int32_t> id;
        {
          py::gil_scoped_release release;
          id = braid::GlobalRuntime().AddProcessSet(std::move(ranks), members_only);
        }
        return Value(std::move(id));
      },
      py::arg("ranks"), py::arg("members_only") = false,
      "Adds a process set of `ranks` once every rank agreed (collective); its id.");
  m.def(
      "remove_process_set",
      [](int32_t id) {
        absl::Status s;
        {
          py::gil_scoped_release release;
          s = braid::GlobalRuntime().RemoveProcessSet(id);
        }
        Check(s);
      },
      py::arg("process_set_id"), "Removes a process set once every rank agreed (collective).");
  m.def(
      "process_set_ranks",
      [](int32_t id) { return Value(braid::GlobalRuntime().ProcessSetRanks(id)); },
      py::arg("process_set_id"), "The ranks of a process set, ascending (NotFoundError: none).");
  m.def("qualified_name", &braid::QualifiedName, py::arg("process_set_id"), py::arg("name"),
        "The name the job knows a process set's tensor by (QualifiedName).");
  m.def(
      "process_sets", []() { return Value(braid::GlobalRuntime().ProcessSets()); },
      "Every process set but the whole world's: {id: ranks}.");
  m.def(
      "start_timeline",
      [](const std::string& path) {
        absl::Status s;
        {
          py::gil_scoped_release release;
          s = braid::GlobalRuntime().StartTimeline(path);
        }
        Check(s);
      },
      py::arg("file_path"), "Starts recording this rank's timeline into file_path.");
  m.def(
      "stop_timeline",
      []() {
        absl::Status s;
        {
          py::gil_scoped_release release;
          s = braid::GlobalRuntime().StopTimeline();
        }
        Check(s);
      },
      "Stops recording the timeline and closes its file.");
  m.def(
      "report_failure",
      [](const std::string& name, int code, const std::string& message) {
        if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
          code = static_cast<int>(absl::StatusCode::kUnknown);
        }
        Check(braid::GlobalRuntime().ReportFailure(
            name, absl::Status(static_cast<absl::StatusCode>(code), message)));
      },
      py::arg("name"), py::arg("code"), py::arg("message"),
      "Reports that this rank's call of collective `name` failed before enqueue: the "
      "coordinator fails the tensor on every rank, naming this rank and the message.");
  m.def(
      "begin_group",
      []() {
        py::gil_scoped_release release;
        braid::GlobalRuntime().BeginGroup();
      },
      "Holds this rank's new collectives until the matching end_group (Runtime::BeginGroup).");
  m.def(
      "end_group",
      []() {
        absl::Status s;
        {
          py::gil_scoped_release release;
          s = braid::GlobalRuntime().EndGroup();
        }
        Check(s);
      },
      "Sends the collectives held since begin_group together (Runtime::EndGroup).");
  m.def("compression_methods", &CompressionMethods, py::arg("test_methods") = false,
        "The compression methods the registry knows, in its order.");
  m.def("canonical_compression", &CanonicalCompression, py::arg("spec"),
        py::arg("test_methods") = false,
        "The canonical form of a compression spec; InvalidArgumentError when it is invalid.");

  m.def("compression_plan_spec", &CompressionPlanSpec, py::arg("plan"), py::arg("name"),
        py::arg("shape"), py::arg("dtype"), py::arg("op"), py::arg("test_methods") = false,
        "(spec, pattern) a compression plan gives a tensor; InvalidArgumentError for a "
        "bad plan.");
  m.def("compression_report", &CompressionReport,
        "This rank's compression byte counters: (per-method dicts, per-tensor dicts, "
        "per-group dicts).");
  m.def("fusion_report", &FusionReport,
        "This rank's fusion counters: buckets, packed_buckets, packed_bytes, in_place_bytes.");
  m.def("compression_state", &CompressionState, "This rank's compression state (bytes).");
  m.def("load_compression_state", &LoadCompressionState, py::arg("state"),
        "Restores a compression_state() result.");
  m.def("refuse_compression_state", &RefuseCompressionState, py::arg("why"),
        "Takes part in load_compression_state() with a refusal (every rank fails with it).");
  m.def("forget_compression_state", &ForgetCompressionState, py::arg("names"),
        "Forgets this rank's compression state of the tensors `names`; returns the entries "
        "forgotten.");

  py::class_<NativeHandle>(m, "NativeHandle")
      .def_property_readonly("name", &NativeHandle::name)
      .def_property_readonly("input_address", &NativeHandle::input_address)
      .def_property_readonly("output_address", &NativeHandle::output_address)
      .def("poll", &NativeHandle::poll)
      .def("wait", &NativeHandle::wait, py::arg("timeout") = py::none(),
           py::arg("slice") = 0.1)
      .def("check", &NativeHandle::check)
      .def("output", &NativeHandle::output, py::arg("dtype"))
      .def("output_bytes", &NativeHandle::output_bytes)
      .def("output_shape", &NativeHandle::output_shape);

  // Codes shared with the C++ enums (never renumbered: they are part of the wire protocol).
  py::dict dtypes;
  for (int d = 0; d < braid::kNumDataTypes; ++d) {
    dtypes[py::str(std::string(braid::DataTypeName(static_cast<braid::DataType>(d))))] = d;
  }
  m.attr("DTYPES") = dtypes;
  py::dict collectives;
  collectives["allreduce"] = static_cast<int>(braid::Collective::kAllReduce);
  collectives["allgather"] = static_cast<int>(braid::Collective::kAllGather);
  collectives["broadcast"] = static_cast<int>(braid::Collective::kBroadcast);
  collectives["reducescatter"] = static_cast<int>(braid::Collective::kReduceScatter);
  collectives["alltoall"] = static_cast<int>(braid::Collective::kAllToAll);
  collectives["barrier"] = static_cast<int>(braid::Collective::kBarrier);
  collectives["join"] = static_cast<int>(braid::Collective::kJoin);
  m.attr("COLLECTIVES") = collectives;
  py::dict ops;
  for (int o = 0; o < braid::kNumReduceOps; ++o) {
    ops[py::str(std::string(braid::ReduceOpName(static_cast<braid::ReduceOp>(o))))] = o;
  }
  m.attr("REDUCE_OPS") = ops;

  // For braid/torch/process_group.so; never freed (the runtime outlives every process group).
  static RuntimeBridge* bridge = new RuntimeBridge();
  m.attr("_runtime_bridge") =
      py::capsule(static_cast<braid::bridge::Runtime*>(bridge), braid::bridge::kCapsuleName);
  m.attr("_RUNTIME_BRIDGE_VERSION") = braid::bridge::kVersion;
}
