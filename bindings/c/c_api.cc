// The C API (bindings/c/include/braid/c_api.h) over braid::GlobalRuntime().
//
// This file only translates: C arguments -> CollectiveRequest, absl::Status -> error code
// + thread-local message (in exactly one place, ReturnStatus), braid::Handle -> an opaque
// braid_handle. No C++ exception crosses the C boundary (Guard).
#include "braid/c_api.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/limits.h"
#include "compression/compression_plan.h"
#include "control/process_sets.h"
#include "runtime/config.h"
#include "runtime/handle.h"
#include "runtime/runtime.h"

// The C enumerators are the C++ ones: never renumber either (common/dtype.h).
static_assert(BRAID_FLOAT32 == static_cast<int>(braid::DataType::kFloat32), "ABI");
static_assert(BRAID_FLOAT64 == static_cast<int>(braid::DataType::kFloat64), "ABI");
static_assert(BRAID_FLOAT16 == static_cast<int>(braid::DataType::kFloat16), "ABI");
static_assert(BRAID_BFLOAT16 == static_cast<int>(braid::DataType::kBFloat16), "ABI");
static_assert(BRAID_INT32 == static_cast<int>(braid::DataType::kInt32), "ABI");
static_assert(BRAID_INT64 == static_cast<int>(braid::DataType::kInt64), "ABI");
static_assert(BRAID_UINT8 == static_cast<int>(braid::DataType::kUInt8), "ABI");
static_assert(braid::kNumDataTypes == 7, "new DataType: add it to braid_dtype");
static_assert(BRAID_SUM == static_cast<int>(braid::ReduceOp::kSum), "ABI");
static_assert(BRAID_AVERAGE == static_cast<int>(braid::ReduceOp::kAverage), "ABI");
static_assert(BRAID_MIN == static_cast<int>(braid::ReduceOp::kMin), "ABI");
static_assert(BRAID_MAX == static_cast<int>(braid::ReduceOp::kMax), "ABI");
static_assert(BRAID_PRODUCT == static_cast<int>(braid::ReduceOp::kProduct), "ABI");
static_assert(braid::kNumReduceOps == 5, "new ReduceOp: add it to braid_reduce_op");
static_assert(BRAID_CANCELLED == static_cast<int>(absl::StatusCode::kCancelled), "ABI");
static_assert(BRAID_UNKNOWN == static_cast<int>(absl::StatusCode::kUnknown), "ABI");
static_assert(BRAID_INVALID_ARGUMENT == static_cast<int>(absl::StatusCode::kInvalidArgument),
              "ABI");
static_assert(BRAID_DEADLINE_EXCEEDED ==
                  static_cast<int>(absl::StatusCode::kDeadlineExceeded), "ABI");
static_assert(BRAID_ALREADY_EXISTS == static_cast<int>(absl::StatusCode::kAlreadyExists),
              "ABI");
static_assert(BRAID_FAILED_PRECONDITION ==
                  static_cast<int>(absl::StatusCode::kFailedPrecondition), "ABI");
static_assert(BRAID_INTERNAL == static_cast<int>(absl::StatusCode::kInternal), "ABI");
static_assert(BRAID_UNAVAILABLE == static_cast<int>(absl::StatusCode::kUnavailable), "ABI");
// c_api.h promises at most 31 process sets besides the world's, ids in [1, 31].
static_assert(braid::kMaxProcessSets == 31, "update the process set limit in c_api.h");
// Enums are stored in the options structs: they must keep the size of an int32.
static_assert(sizeof(braid_reduce_op) == 4 && sizeof(braid_dtype) == 4, "ABI");
// braid_compression_stat's layout is frozen (fields are only appended).
static_assert(offsetof(braid_compression_stat, method) == sizeof(size_t), "ABI");
static_assert(offsetof(braid_compression_stat, tensors) == sizeof(size_t) + 64 + 256, "ABI");
static_assert(offsetof(braid_compression_stat, reference_transport_bytes) ==
                  sizeof(size_t) + 64 + 256 + 5 * sizeof(uint64_t), "ABI");
static_assert(sizeof(braid_compression_stat) == sizeof(size_t) + 64 + 256 + 6 * sizeof(uint64_t),
              "ABI");

// The C handle: the runtime's handle plus what the C side needs to finish the call.
struct braid_handle {
  std::shared_ptr<braid::Handle> handle;
  braid::Collective collective = braid::Collective::kAllReduce;
  std::string name;
  size_t element_bytes = 0;
  // All-gather: the caller's output as given at enqueue time.
  void* output = nullptr;
  size_t output_capacity_bytes = 0;
  int64_t* output_first_dim = nullptr;
  // Set by the first wait that observes completion; later waits return the same.
  bool finished = false;
  absl::Status result;
  size_t result_bytes = 0;   // all-gather: bytes of the gathered tensor
  bool result_held = false;  // all-gather: the bytes are in handle->output(), not `output`
};

namespace {

thread_local std::string t_last_error;

// The one place where an absl::Status becomes a C error code (+ this thread's message).
int ReturnStatus(const absl::Status& s) {
  if (s.ok()) return BRAID_OK;
  switch (s.code()) {
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnavailable:
      t_last_error.assign(s.message().data(), s.message().size());
      return static_cast<int>(s.code());
    default:
      // Outside the C vocabulary: keep the detail in the message (codes stay generic; the message carries the domain detail).
      t_last_error = absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
      return BRAID_UNKNOWN;
  }
}

// Runs `f` (returning absl::Status) and converts its result; no exception escapes to C.
template <typename F>
int Guard(F&& f) noexcept {
  try {
    return ReturnStatus(f());
  } catch (const std::bad_alloc&) {
    return ReturnStatus(absl::ResourceExhaustedError("braid: out of memory"));
  } catch (const std::exception& e) {
    return ReturnStatus(absl::InternalError(absl::StrCat("braid: unexpected exception: ",
                                                         e.what())));
  } catch (...) {
    return ReturnStatus(absl::InternalError("braid: unexpected exception"));
  }
}

// braid_init / braid_finalize are serialised: Runtime::Init must not race with itself.
std::mutex& LifecycleMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

absl::Status NotNull(const void* p, const char* what, const char* fn) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(fn, ": ", what, " is NULL"));
}

// True when `Field` at `offset` with `size` lies inside the caller's struct_size.
bool HasField(size_t struct_size, size_t offset, size_t size) {
  return offset + size <= struct_size;
}
#define BRAID_HAS_FIELD(opts, type, field) \
  HasField((opts)->struct_size, offsetof(type, field), sizeof(((type*)nullptr)->field))

// Far beyond any struct this API will grow to: an uninitialised struct, whose tail must not
// be read (or, for output structs, written).
constexpr size_t kMaxStructSize = 4096;
// braid_barrier's one name (c_api.h).
constexpr char kBarrierName[] = "barrier";

// Checks an options struct's size prefix (see "ABI rules" in c_api.h): at least the prefix
// itself; any tail beyond what this library knows must be all zero (= defaults).
absl::Status CheckStructSize(const void* opts, size_t known_size, const char* type) {
  size_t struct_size = 0;
  std::memcpy(&struct_size, opts, sizeof(struct_size));
  if (struct_size < sizeof(size_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        type, ".struct_size is ", struct_size, ": initialise the struct with ", type,
        "_init() or the matching _INIT macro"));
  }
  if (struct_size > kMaxStructSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        type, ".struct_size is ", struct_size, ", more than any version of ", type,
        " (uninitialised?): initialise it with ", type, "_init() or the matching _INIT macro"));
  }
  const unsigned char* bytes = static_cast<const unsigned char*>(opts);
  for (size_t i = known_size; i < struct_size; ++i) {
    if (bytes[i] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          type, ".struct_size is ", struct_size, " but this libbraid_c knows ", known_size,
          " bytes and byte ", i,
          " is set: the program uses an option this library does not support (upgrade "
          "libbraid_c)"));
    }
  }
  return absl::OkStatus();
}

// A C caller may pass any int where an enum is declared (a C enum is an int), but in C++
// reading an enum object whose value lies outside its enumerators' range is undefined
// behaviour (UBSan reports it). So enum-typed inputs are read as their bytes, then checked.
template <typename E>
int EnumBits(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

absl::Status Dtype(int dtype, braid::DataType* out) {
  if (!braid::IsValidDataType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", dtype, " (valid: 0..", braid::kNumDataTypes - 1,
                     ", see braid_dtype)"));
  }
  *out = static_cast<braid::DataType>(dtype);
  return absl::OkStatus();
}

// The shape, checked before anything is computed from it: ndim within [0, kMaxDims],
// non-negative dimensions whose product and byte size stay within the limits of
// common/limits.h (overflow-checked), so no size derived from it can wrap.
absl::Status Shape(const int64_t* shape, int ndim, braid::DataType dtype,
                   std::vector<int64_t>* out) {
  if (ndim < 0) return absl::InvalidArgumentError(absl::StrCat("ndim is negative: ", ndim));
  if (ndim > braid::kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("ndim is ", ndim, ", more than the limit of ", braid::kMaxDims));
  }
  if (ndim > 0 && shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("shape is NULL but ndim is ", ndim));
  }
  out->assign(shape, shape + ndim);
  auto elements = braid::ShapeElements("shape", *out);
  if (!elements.ok()) return elements.status();
  return braid::TensorBytes("shape", *elements, braid::DataTypeSize(dtype)).status();
}

// Fills the fields every collective has; `kind` names it in messages.
absl::Status CommonRequest(braid::Collective kind, const char* name, const int64_t* shape,
                           int ndim, int dtype, braid::CollectiveRequest* r) {
  r->collective = kind;
  r->name = name;
  absl::Status s = braid::CheckName("name", r->name);
  if (s.ok()) s = Dtype(dtype, &r->dtype);
  if (s.ok()) s = Shape(shape, ndim, r->dtype, &r->shape);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("'", braid::Printable(braid::Truncated(r->name, 64)),
                                     "': ", s.message()));
  }
  return absl::OkStatus();
}

// The process_set_id of a collective's options struct as the request builder reads it (the
// ABI rules in c_api.h); 0 when the struct is absent, too old to have it, or refused (the
// builder then reports why).
template <typename Opts>
int32_t SetIdOf(const Opts* opts, const char* type) {
  if (opts == nullptr || !CheckStructSize(opts, sizeof(Opts), type).ok()) return 0;
  if (!BRAID_HAS_FIELD(opts, Opts, process_set_id)) return 0;
  return opts->process_set_id;
}

// Whether this rank is in process set `id` (Note [Process sets], control/process_sets.h):
// always for set 0; never for a set that does not exist or before braid_init.
bool InSet(int32_t id) {
  if (id == 0) return true;
  absl::StatusOr<int> rank = braid::GlobalRuntime().rank();
  absl::StatusOr<std::vector<int>> ranks = braid::GlobalRuntime().ProcessSetRanks(id);
  return rank.ok() && ranks.ok() && braid::SetRank(*ranks, *rank) >= 0;
}

// Counters for blocking calls without a name, per (collective, process set) (c_api.h): ranks
// that make a set's unnamed calls in the same order agree on their names, whatever else each
// of them runs. A call on a set this rank is not in (it fails) counts under -1, so the
// counters of its own sets do not move; a set's counters restart when it is added, so ids
// reused after a removal start at 0 on every rank.
class NameCounters {
 public:
  uint64_t Next(const char* kind, int32_t set) {
    std::lock_guard<std::mutex> lock(mu_);
    return next_[{kind, set}]++;
  }
  void Restart(int32_t set) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = next_.begin(); it != next_.end();) {
      it = it->first.second == set ? next_.erase(it) : std::next(it);
    }
  }

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, int32_t>, uint64_t> next_;
};
NameCounters& Counters() {
  static NameCounters* counters = new NameCounters();
  return *counters;
}

std::string AutoName(const char* name, const char* kind, int32_t set) {
  if (name != nullptr) return name;
  return absl::StrCat(kind, ".noname.", Counters().Next(kind, InSet(set) ? set : -1));
}

// A collective refused here, before the runtime saw it, is reported like the runtime's own
// refusals (Runtime::ReportFailure), so peers that submitted it fail at once naming this
// rank instead of waiting for it: under the name the job knows it by in its process set
// (QualifiedName), and only by a member of that set (the call of any other rank concerns no
// peer). Returns `s`.
absl::Status Reported(const std::string& name, int32_t set, absl::Status s) {
  if (!s.ok() && braid::GlobalRuntime().initialized() && InSet(set)) {
    // IgnoreError: a name that cannot travel.
    braid::GlobalRuntime().ReportFailure(braid::QualifiedName(set, name), s).IgnoreError();
  }
  return s;
}

// Runtime::ProcessSetRanks in the C API's vocabulary: a set that does not exist is
// INVALID_ARGUMENT, as it is for a collective naming it (NOT_FOUND is not a braid_error).
absl::StatusOr<std::vector<int>> SetRanks(int32_t id, const char* fn) {
  absl::StatusOr<std::vector<int>> ranks = braid::GlobalRuntime().ProcessSetRanks(id);
  if (ranks.status().code() == absl::StatusCode::kNotFound) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": ", ranks.status().message(),
                                                   " (never added, or removed)"));
  }
  return ranks;
}

absl::Status Enqueue(braid::CollectiveRequest req, std::unique_ptr<braid_handle>* out) {
  auto h = std::make_unique<braid_handle>();
  h->collective = req.collective;
  h->name = req.name;
  h->element_bytes = braid::DataTypeSize(req.dtype);
  h->output = req.output;
  h->output_capacity_bytes = req.output_capacity_bytes;
  auto handle = braid::GlobalRuntime().Enqueue(std::move(req));
  if (!handle.ok()) return handle.status();
  h->handle = *std::move(handle);
  *out = std::move(h);
  return absl::OkStatus();
}

// The result of a completed collective, with the all-gather checks the C API adds. Runs once.
void Finish(braid_handle* h) {
  if (h->finished) return;
  h->finished = true;
  h->result = h->handle->status();
  if (!h->result.ok() || h->collective != braid::Collective::kAllGather) return;
  const std::vector<int64_t>& shape = h->handle->output_shape();
  const absl::StatusOr<int64_t> elements = braid::ShapeElements("the result's shape", shape);
  if (!elements.ok()) {  // a bug: the runtime's shape comes from sizes checked already
    h->result = absl::InternalError(absl::StrCat("allgather '", h->name, "': ",
                                                 elements.status().message()));
    return;
  }
  const int64_t first_dim = shape.empty() ? 0 : shape[0];
  if (h->output_first_dim != nullptr) *h->output_first_dim = first_dim;
  h->result_bytes = static_cast<size_t>(*elements) * h->element_bytes;
  // The runtime writes into the caller's buffer when it is large enough, and into the
  // handle's own otherwise (runtime.cc, output_for).
  h->result_held = h->output == nullptr || h->result_bytes > h->output_capacity_bytes;
  if (h->output != nullptr && h->result_held) {
    h->result = absl::InvalidArgumentError(absl::StrCat(
        "allgather '", h->name, "': the result needs ", h->result_bytes, " bytes (first dim ",
        first_dim, ") but the output buffer holds ", h->output_capacity_bytes,
        " bytes; the result is kept in the handle (braid_handle_copy_output)"));
  }
}

absl::Status Wait(braid_handle* h, absl::Duration timeout) {
  if (!h->finished) {
    absl::Status s = h->handle->Wait(timeout);
    if (!h->handle->Poll()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "'", h->name, "' is still running after the wait's timeout of ",
          absl::FormatDuration(timeout), "; the handle stays valid"));
    }
    (void)s;  // the final status is read again in Finish, race-free now that it is done
    Finish(h);
  }
  return h->result;
}

// Enqueues, then waits forever (the runtime's own timeouts bound it).
absl::Status RunBlocking(braid::CollectiveRequest req, int64_t* output_first_dim = nullptr) {
  const bool gather = req.collective == braid::Collective::kAllGather;
  const bool no_output = req.output == nullptr;
  std::unique_ptr<braid_handle> h;
  absl::Status s = Enqueue(std::move(req), &h);
  if (!s.ok()) return s;
  h->output_first_dim = output_first_dim;
  s = Wait(h.get(), absl::InfiniteDuration());
  if (s.ok() && gather && no_output && h->result_bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allgather '", h->name, "': output is NULL but the result needs ", h->result_bytes,
        " bytes"));
  }
  return s;
}

absl::Status StoreHandle(std::unique_ptr<braid_handle> h, braid_handle** out) {
  *out = h.release();
  return absl::OkStatus();
}

// --- per-collective request builders (shared by the blocking and async forms) ---

// The device fields of options whose struct size CheckStructSize accepted; the runtime
// checks the values (a device type it does not know is InvalidArgument).
template <typename Opts>
void SetDevice(const Opts* opts, braid::CollectiveRequest* r) {
  if (opts == nullptr) return;
  if (BRAID_HAS_FIELD(opts, Opts, stream)) r->stream = opts->stream;
  if (BRAID_HAS_FIELD(opts, Opts, device_type)) {
    r->device.type = static_cast<braid::DeviceType>(opts->device_type);
  }
  if (BRAID_HAS_FIELD(opts, Opts, device_id)) r->device.id = opts->device_id;
}

absl::Status AllReduceRequest(const char* fn, const std::string& name, const void* input,
                              void* output, const int64_t* shape, int ndim, int dtype,
                              const braid_allreduce_opts* opts, braid::CollectiveRequest* r) {
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  int op = EnumBits(o.op);
  if (opts != nullptr) {
    absl::Status s = CheckStructSize(opts, sizeof(o), "braid_allreduce_opts");
    if (!s.ok()) return s;
    if (BRAID_HAS_FIELD(opts, braid_allreduce_opts, op)) op = EnumBits(opts->op);
    if (BRAID_HAS_FIELD(opts, braid_allreduce_opts, compression)) {
      o.compression = opts->compression;
    }
    if (BRAID_HAS_FIELD(opts, braid_allreduce_opts, process_set_id)) {
      o.process_set_id = opts->process_set_id;
    }
  }
  absl::Status s = CommonRequest(braid::Collective::kAllReduce, name.c_str(), shape, ndim,
                                 dtype, r);
  if (!s.ok()) return s;
  if (!braid::IsValidReduceOp(op)) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, " '", name, "': unknown reduce op ", op, " (valid: 0..",
        braid::kNumReduceOps - 1, ", see braid_reduce_op)"));
  }
  r->input = input;
  r->output = output;
  r->op = static_cast<braid::ReduceOp>(op);
  r->compression = o.compression != nullptr ? o.compression : "";
  // A plan (a JSON object of name patterns to specs) is resolved on this rank: longer.
  if (const size_t limit = braid::compression::MaxCompressionBytes(r->compression);
      r->compression.size() > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, " '", braid::Truncated(name, 64), "': compression is ", r->compression.size(),
        " bytes long, more than the limit of ", limit));
  }
  r->process_set_id = o.process_set_id;
  SetDevice(opts, r);
  return absl::OkStatus();
}

absl::Status BroadcastRequest(const std::string& name, void* buffer, const int64_t* shape,
                              int ndim, int dtype, const braid_broadcast_opts* opts,
                              braid::CollectiveRequest* r) {
  braid_broadcast_opts o = BRAID_BROADCAST_OPTS_INIT;
  if (opts != nullptr) {
    absl::Status s = CheckStructSize(opts, sizeof(o), "braid_broadcast_opts");
    if (!s.ok()) return s;
    if (BRAID_HAS_FIELD(opts, braid_broadcast_opts, root_rank)) o.root_rank = opts->root_rank;
    if (BRAID_HAS_FIELD(opts, braid_broadcast_opts, process_set_id)) {
      o.process_set_id = opts->process_set_id;
    }
  }
  absl::Status s = CommonRequest(braid::Collective::kBroadcast, name.c_str(), shape, ndim,
                                 dtype, r);
  if (!s.ok()) return s;
  r->input = buffer;
  r->output = buffer;
  r->root_rank = o.root_rank;
  r->process_set_id = o.process_set_id;
  SetDevice(opts, r);
  return absl::OkStatus();
}

absl::Status AllGatherRequest(const std::string& name, const void* input,
                              const int64_t* shape, int ndim, int dtype, void* output,
                              size_t capacity, const braid_allgather_opts* opts,
                              braid::CollectiveRequest* r) {
  braid_allgather_opts o = BRAID_ALLGATHER_OPTS_INIT;
  if (opts != nullptr) {
    absl::Status s = CheckStructSize(opts, sizeof(o), "braid_allgather_opts");
    if (!s.ok()) return s;
    if (BRAID_HAS_FIELD(opts, braid_allgather_opts, process_set_id)) {
      o.process_set_id = opts->process_set_id;
    }
  }
  absl::Status s = CommonRequest(braid::Collective::kAllGather, name.c_str(), shape, ndim,
                                 dtype, r);
  if (!s.ok()) return s;
  r->input = input;
  r->output = output;
  r->output_capacity_bytes = output == nullptr ? 0 : capacity;
  r->process_set_id = o.process_set_id;
  SetDevice(opts, r);
  return absl::OkStatus();
}

// Copies `src` into the fixed-size C string `dst`, truncating, always NUL-terminated.
template <size_t N>
void CopyCString(const std::string& src, char (&dst)[N]) {
  const size_t n = std::min(src.size(), N - 1);
  std::memcpy(dst, src.data(), n);
  std::memset(dst + n, 0, N - n);
}

braid_compression_stat ToCStat(const std::string& method, const std::string& name,
                               uint64_t tensors, const braid::ByteStats& b) {
  braid_compression_stat c = BRAID_COMPRESSION_STAT_INIT;
  CopyCString(method, c.method);
  CopyCString(name, c.name);
  c.tensors = tensors;
  c.reductions = b.reductions;
  c.uncompressed_bytes = b.uncompressed_bytes;
  c.payload_bytes = b.payload_bytes;
  c.transport_bytes = b.transport_bytes;
  c.reference_transport_bytes = b.reference_transport_bytes;
  return c;
}

absl::Status NeedName(const char* name, const char* fn) {
  if (name != nullptr && *name != '\0') return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      fn, ": a name is required for asynchronous collectives (the same on every rank)"));
}

}  // namespace

extern "C" {

const char* braid_last_error(void) { return t_last_error.c_str(); }

const char* braid_error_name(int code) {
  switch (code) {
    case BRAID_OK: return "OK";
    case BRAID_CANCELLED: return "CANCELLED";
    case BRAID_UNKNOWN: return "UNKNOWN";
    case BRAID_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case BRAID_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case BRAID_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case BRAID_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case BRAID_INTERNAL: return "INTERNAL";
    case BRAID_UNAVAILABLE: return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

size_t braid_dtype_size(int dtype) {
  if (!braid::IsValidDataType(dtype)) return 0;
  return braid::DataTypeSize(static_cast<braid::DataType>(dtype));
}

int braid_init(void) {
  return Guard([] {
    std::lock_guard<std::mutex> lock(LifecycleMutex());
    auto config = braid::ConfigFromProcessEnv();
    if (!config.ok()) return config.status();
    return braid::GlobalRuntime().Init(*config);
  });
}

int braid_finalize(void) {
  return Guard([] {
    std::lock_guard<std::mutex> lock(LifecycleMutex());
    return braid::GlobalRuntime().Shutdown();
  });
}

int braid_start_timeline(const char* path) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(path, "path", "braid_start_timeline");
    if (!s.ok()) return s;
    return braid::GlobalRuntime().StartTimeline(path);
  });
}

int braid_stop_timeline(void) {
  return Guard([] { return braid::GlobalRuntime().StopTimeline(); });
}

int braid_is_initialized(void) {
  try {
    return braid::GlobalRuntime().initialized() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

#define BRAID_TOPOLOGY_GETTER(fn, method)                         \
  int fn(int* out) {                                              \
    return Guard([&]() -> absl::Status {                          \
      absl::Status s = NotNull(out, "out", #fn);                  \
      if (!s.ok()) return s;                                      \
      absl::StatusOr<int> v = braid::GlobalRuntime().method();    \
      if (!v.ok()) return v.status();                             \
      *out = *v;                                                  \
      return absl::OkStatus();                                    \
    });                                                           \
  }
BRAID_TOPOLOGY_GETTER(braid_rank, rank)
BRAID_TOPOLOGY_GETTER(braid_size, size)
BRAID_TOPOLOGY_GETTER(braid_local_rank, local_rank)
BRAID_TOPOLOGY_GETTER(braid_local_size, local_size)
#undef BRAID_TOPOLOGY_GETTER

void braid_allreduce_opts_init(braid_allreduce_opts* opts) {
  if (opts != nullptr) *opts = braid_allreduce_opts BRAID_ALLREDUCE_OPTS_INIT;
}
void braid_broadcast_opts_init(braid_broadcast_opts* opts) {
  if (opts != nullptr) *opts = braid_broadcast_opts BRAID_BROADCAST_OPTS_INIT;
}
void braid_allgather_opts_init(braid_allgather_opts* opts) {
  if (opts != nullptr) *opts = braid_allgather_opts BRAID_ALLGATHER_OPTS_INIT;
}

int braid_allreduce(const char* name, const void* input, void* output, const int64_t* shape,
                    int ndim, braid_dtype dtype, const braid_allreduce_opts* opts) {
  return Guard([&]() -> absl::Status {
    braid::CollectiveRequest r;
    const int32_t set = SetIdOf(opts, "braid_allreduce_opts");
    const std::string n = AutoName(name, "allreduce", set);
    absl::Status s = AllReduceRequest("allreduce", n,
                                      input, output, shape, ndim, EnumBits(dtype), opts, &r);
    if (!s.ok()) return Reported(n, set, s);
    return RunBlocking(std::move(r));
  });
}

int braid_allreduce_async(const char* name, const void* input, void* output,
                          const int64_t* shape, int ndim, braid_dtype dtype,
                          const braid_allreduce_opts* opts, braid_handle** handle) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(handle, "handle", "braid_allreduce_async");
    if (s.ok()) s = NeedName(name, "braid_allreduce_async");
    if (!s.ok()) return s;
    braid::CollectiveRequest r;
    s = AllReduceRequest("allreduce", name, input, output, shape, ndim, EnumBits(dtype), opts, &r);
    if (!s.ok()) return Reported(name, SetIdOf(opts, "braid_allreduce_opts"), s);
    std::unique_ptr<braid_handle> h;
    s = Enqueue(std::move(r), &h);
    if (!s.ok()) return s;
    return StoreHandle(std::move(h), handle);
  });
}

int braid_broadcast(const char* name, void* buffer, const int64_t* shape, int ndim,
                    braid_dtype dtype, const braid_broadcast_opts* opts) {
  return Guard([&]() -> absl::Status {
    braid::CollectiveRequest r;
    const int32_t set = SetIdOf(opts, "braid_broadcast_opts");
    const std::string n = AutoName(name, "broadcast", set);
    absl::Status s = BroadcastRequest(n, buffer,
                                      shape, ndim, EnumBits(dtype), opts, &r);
    if (!s.ok()) return Reported(n, set, s);
    return RunBlocking(std::move(r));
  });
}

int braid_broadcast_async(const char* name, void* buffer, const int64_t* shape, int ndim,
                          braid_dtype dtype, const braid_broadcast_opts* opts,
                          braid_handle** handle) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(handle, "handle", "braid_broadcast_async");
    if (s.ok()) s = NeedName(name, "braid_broadcast_async");
    if (!s.ok()) return s;
    braid::CollectiveRequest r;
    s = BroadcastRequest(name, buffer, shape, ndim, EnumBits(dtype), opts, &r);
    if (!s.ok()) return Reported(name, SetIdOf(opts, "braid_broadcast_opts"), s);
    std::unique_ptr<braid_handle> h;
    s = Enqueue(std::move(r), &h);
    if (!s.ok()) return s;
    return StoreHandle(std::move(h), handle);
  });
}

int braid_allgather(const char* name, const void* input, const int64_t* shape, int ndim,
                    braid_dtype dtype, void* output, size_t output_capacity_bytes,
                    int64_t* output_first_dim, const braid_allgather_opts* opts) {
  return Guard([&]() -> absl::Status {
    braid::CollectiveRequest r;
    const int32_t set = SetIdOf(opts, "braid_allgather_opts");
    const std::string n = AutoName(name, "allgather", set);
    absl::Status s = AllGatherRequest(n, input,
                                      shape, ndim, EnumBits(dtype), output, output_capacity_bytes, opts,
                                      &r);
    if (!s.ok()) return Reported(n, set, s);
    return RunBlocking(std::move(r), output_first_dim);
  });
}

int braid_allgather_async(const char* name, const void* input, const int64_t* shape,
                          int ndim, braid_dtype dtype, void* output,
                          size_t output_capacity_bytes, int64_t* output_first_dim,
                          const braid_allgather_opts* opts, braid_handle** handle) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(handle, "handle", "braid_allgather_async");
    if (s.ok()) s = NeedName(name, "braid_allgather_async");
    if (!s.ok()) return s;
    braid::CollectiveRequest r;
    s = AllGatherRequest(name, input, shape, ndim, EnumBits(dtype), output, output_capacity_bytes, opts,
                         &r);
    if (!s.ok()) return Reported(name, SetIdOf(opts, "braid_allgather_opts"), s);
    std::unique_ptr<braid_handle> h;
    s = Enqueue(std::move(r), &h);
    if (!s.ok()) return s;
    h->output_first_dim = output_first_dim;
    return StoreHandle(std::move(h), handle);
  });
}

int braid_barrier(void) {
  return Guard([]() -> absl::Status {
    braid::CollectiveRequest r;
    r.collective = braid::Collective::kBarrier;
    // One name: barriers pair in call order, whatever failed before (c_api.h).
    r.name = kBarrierName;
    return RunBlocking(std::move(r));
  });
}

int braid_add_process_set(const int32_t* ranks, int32_t count, int32_t* process_set_id) {
  return Guard([&]() -> absl::Status {
    constexpr const char* fn = "braid_add_process_set";
    absl::Status s = NotNull(ranks, "ranks", fn);
    if (s.ok()) s = NotNull(process_set_id, "process_set_id", fn);
    if (!s.ok()) return s;
    if (count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": count is ", count, ": a process set needs at least one rank"));
    }
    absl::StatusOr<int> size = braid::GlobalRuntime().size();
    if (!size.ok()) return size.status();
    // Before the array is read: more ranks than the world has cannot be distinct ranks.
    if (count > *size) {
      return absl::InvalidArgumentError(absl::StrCat(
          fn, ": count is ", count, ", more ranks than the world's ", *size));
    }
    absl::StatusOr<int32_t> id =
        braid::GlobalRuntime().AddProcessSet(std::vector<int>(ranks, ranks + count));
    if (!id.ok()) return id.status();
    Counters().Restart(*id);  // every rank adds it at the same point (c_api.h)
    *process_set_id = *id;
    return absl::OkStatus();
  });
}

int braid_remove_process_set(int32_t process_set_id) {
  // Set 0 and sets that do not exist are refused by the coordinator, on every rank alike.
  return Guard([&] { return braid::GlobalRuntime().RemoveProcessSet(process_set_id); });
}

int braid_process_set_size(int32_t process_set_id, int32_t* size) {
  return Guard([&]() -> absl::Status {
    constexpr const char* fn = "braid_process_set_size";
    absl::Status s = NotNull(size, "size", fn);
    if (!s.ok()) return s;
    absl::StatusOr<std::vector<int>> ranks = SetRanks(process_set_id, fn);
    if (!ranks.ok()) return ranks.status();
    *size = static_cast<int32_t>(ranks->size());
    return absl::OkStatus();
  });
}

int braid_process_set_rank(int32_t process_set_id, int32_t* rank) {
  return Guard([&]() -> absl::Status {
    constexpr const char* fn = "braid_process_set_rank";
    absl::Status s = NotNull(rank, "rank", fn);
    if (!s.ok()) return s;
    absl::StatusOr<int> me = braid::GlobalRuntime().rank();
    if (!me.ok()) return me.status();
    absl::StatusOr<std::vector<int>> ranks = SetRanks(process_set_id, fn);
    if (!ranks.ok()) return ranks.status();
    *rank = braid::SetRank(*ranks, *me);
    return absl::OkStatus();
  });
}

int braid_process_set_ranks(int32_t process_set_id, int32_t* ranks, int32_t capacity,
                            int32_t* count) {
  return Guard([&]() -> absl::Status {
    constexpr const char* fn = "braid_process_set_ranks";
    absl::Status s = NotNull(ranks, "ranks", fn);
    if (s.ok()) s = NotNull(count, "count", fn);
    if (!s.ok()) return s;
    absl::StatusOr<std::vector<int>> members = SetRanks(process_set_id, fn);
    if (!members.ok()) return members.status();
    const int32_t n = static_cast<int32_t>(members->size());
    if (capacity < n) {
      return absl::InvalidArgumentError(absl::StrCat(
          fn, ": process set ", process_set_id, " has ", n, " ranks but capacity is ",
          capacity));
    }
    std::copy(members->begin(), members->end(), ranks);
    *count = n;
    return absl::OkStatus();
  });
}

int braid_wait(braid_handle* handle, double timeout_seconds) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(handle, "handle", "braid_wait");
    if (!s.ok()) return s;
    if (std::isnan(timeout_seconds)) {
      return absl::InvalidArgumentError("braid_wait: timeout_seconds is NaN");
    }
    absl::Duration timeout = timeout_seconds < 0 || std::isinf(timeout_seconds)
                                 ? absl::InfiniteDuration()
                                 : absl::Seconds(timeout_seconds);
    return Wait(handle, timeout);
  });
}

int braid_poll(braid_handle* handle, int* done) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(handle, "handle", "braid_poll");
    if (s.ok()) s = NotNull(done, "done", "braid_poll");
    if (!s.ok()) return s;
    *done = handle->handle->Poll() ? 1 : 0;
    return absl::OkStatus();
  });
}

int braid_handle_copy_output(braid_handle* handle, void* output, size_t output_capacity_bytes,
                             size_t* needed_bytes) {
  return Guard([&]() -> absl::Status {
    absl::Status s = NotNull(handle, "handle", "braid_handle_copy_output");
    if (!s.ok()) return s;
    if (!handle->finished && handle->handle->Poll()) Finish(handle);
    if (!handle->finished) {
      return absl::FailedPreconditionError(absl::StrCat(
          "braid_handle_copy_output: '", handle->name, "' has not completed: wait for it"));
    }
    if (!handle->result_held) {
      return absl::FailedPreconditionError(absl::StrCat(
          "braid_handle_copy_output: '", handle->name,
          "' is not an all-gather whose result the handle keeps (",
          handle->result.ok() ? "it is in the output buffer" : "it failed", ")"));
    }
    if (needed_bytes != nullptr) *needed_bytes = handle->result_bytes;
    if (handle->result_bytes == 0) return absl::OkStatus();
    if (output == nullptr || output_capacity_bytes < handle->result_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "braid_handle_copy_output: '", handle->name, "' needs ", handle->result_bytes,
          " bytes, the output ", output == nullptr ? "is NULL" : "holds ",
          output == nullptr ? "" : absl::StrCat(output_capacity_bytes, " bytes")));
    }
    std::memcpy(output, handle->handle->output().data(), handle->result_bytes);
    return absl::OkStatus();
  });
}

void braid_handle_free(braid_handle* handle) { delete handle; }

void braid_compression_stat_init(braid_compression_stat* stat) {
  if (stat != nullptr) *stat = braid_compression_stat BRAID_COMPRESSION_STAT_INIT;
}

int braid_compression_stats(int kind, braid_compression_stat* out, size_t capacity,
                            size_t* count) {
  return Guard([&]() -> absl::Status {
    constexpr const char* fn = "braid_compression_stats";
    absl::Status s = NotNull(count, "count", fn);
    if (s.ok() && capacity > 0) s = NotNull(out, "out", fn);
    if (!s.ok()) return s;
    if (kind != BRAID_COMPRESSION_STATS_BY_METHOD && kind != BRAID_COMPRESSION_STATS_BY_TENSOR) {
      return absl::InvalidArgumentError(absl::StrCat(
          fn, ": unknown kind ", kind, " (valid: BRAID_COMPRESSION_STATS_BY_METHOD = 0, ",
          "BRAID_COMPRESSION_STATS_BY_TENSOR = 1)"));
    }
    size_t stride = 0;
    if (capacity > 0) {
      std::memcpy(&stride, out, sizeof(stride));
      // An output struct: only the size bounds matter (its tail is ours to zero-fill).
      if (stride < sizeof(size_t) || stride > kMaxStructSize) {
        return absl::InvalidArgumentError(absl::StrCat(
            fn, ": out[0].struct_size is ", stride,
            ": initialise it with BRAID_COMPRESSION_STAT_INIT or braid_compression_stat_init()"));
      }
    }
    auto report = braid::GlobalRuntime().compression_report();
    if (!report.ok()) return report.status();
    std::vector<braid_compression_stat> stats;
    if (kind == BRAID_COMPRESSION_STATS_BY_METHOD) {
      stats.reserve(report->methods.size());
      for (const auto& m : report->methods) {
        stats.push_back(ToCStat(m.method, "", m.tensors, m.bytes));
      }
    } else {
      stats.reserve(report->tensors.size());
      for (const auto& t : report->tensors) {
        stats.push_back(ToCStat(t.method, t.name, 1, t.bytes));
      }
    }
    const size_t n = std::min(capacity, stats.size());
    for (size_t i = 0; i < n; ++i) {
      // The caller's element i starts at i * stride; copy the fields it has room for.
      unsigned char* dst = reinterpret_cast<unsigned char*>(out) + i * stride;
      std::memcpy(dst, &stats[i], std::min(stride, sizeof(braid_compression_stat)));
      if (stride > sizeof(braid_compression_stat)) {
        std::memset(dst + sizeof(braid_compression_stat), 0,
                    stride - sizeof(braid_compression_stat));
      }
      std::memcpy(dst, &stride, sizeof(stride));
    }
    *count = stats.size();
    return absl::OkStatus();
  });
}

}  // extern "C"
