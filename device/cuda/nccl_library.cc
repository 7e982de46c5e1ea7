// NCCL behind braid's NCCL interface (transport/nccl_api.h), opened on first use rather than
// linked, as cuBLAS is (compression/cuda/cublas.cc): a braid built with CUDA must load where
// NCCL is not installed, and only a job that runs the NCCL data plane needs it. The types come
// from the toolkit's nccl.h; no symbol of NCCL is linked. Events are the CUDA runtime's,
// recorded on the stream's own GPU.
#include "device/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/shared_library.h"

namespace braid::device {
namespace {

// The runtime's soname (Debian's libnccl2, NVIDIA's packages, the nvidia-nccl-cu13 wheel),
// then the development link.
constexpr const char* kLibraries[] = {"libnccl.so.2", "libnccl.so"};

struct Nccl {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  int version = 0;
};

ncclDataType_t NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAverage: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

class NcclLibrary final : public transport::NcclApi {
 public:
  explicit NcclLibrary(Nccl fns) : n_(fns) {}

  std::string Version() override {
    // 22809 -> 2.28.9 (NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9).
    return absl::StrCat("nccl ", n_.version / 10000, ".", n_.version / 100 % 100, ".",
                        n_.version % 100);
  }

  absl::StatusOr<transport::NcclUniqueId> GetUniqueId() override {
    ncclUniqueId raw;
    absl::Status s = Check(n_.get_unique_id(&raw), nullptr, "ncclGetUniqueId");
    if (!s.ok()) return s;
    transport::NcclUniqueId id;
    static_assert(sizeof(raw.internal) == transport::NcclUniqueId::kBytes);
    std::memcpy(id.bytes.data(), raw.internal, sizeof(raw.internal));
    return id;
  }

  absl::StatusOr<transport::NcclProgress> CommInitRank(Comm* comm, int nranks,
                                                       const transport::NcclUniqueId& id,
                                                       int rank, int cuda_device) override {
    int previous = -1;
    cudaGetDevice(&previous);
    if (cudaSetDevice(cuda_device) != cudaSuccess) {
      const cudaError_t e = cudaGetLastError();
      return absl::InternalError(absl::StrCat("cuda:", cuda_device, ": making it current: ",
                                              cudaGetErrorString(e)));
    }
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Note [Nonblocking NCCL]
    ncclComm_t c = nullptr;
    const ncclResult_t r = n_.init_rank_config(&c, nranks, raw, rank, &config);
    if (previous >= 0 && previous != cuda_device) cudaSetDevice(previous);
    *comm = c;
    return Progress(r, c, "ncclCommInitRankConfig");
  }

  absl::StatusOr<transport::NcclProgress> CommState(Comm comm) override {
    ncclResult_t state = ncclSuccess;
    absl::Status s = Check(n_.get_async_error(Raw(comm), &state), comm, "ncclCommGetAsyncError");
    if (!s.ok()) return s;
    return Progress(state, comm, "the communicator");
  }

  void CommAbort(Comm comm) override { n_.abort(Raw(comm)); }

  absl::StatusOr<transport::NcclProgress> AllReduce(const void* send, void* recv, size_t count,
                                                    DataType dtype, ReduceOp op, Comm comm,
                                                    Stream stream) override {
    return Progress(n_.all_reduce(send, recv, count, NcclType(dtype), NcclOp(op), Raw(comm),
                                  RawStream(stream)),
                    comm, "ncclAllReduce");
  }
  absl::StatusOr<transport::NcclProgress> ReduceScatter(const void* send, void* recv,
                                                        size_t recv_count, DataType dtype,
                                                        ReduceOp op, Comm comm,
                                                        Stream stream) override {
    return Progress(n_.reduce_scatter(send, recv, recv_count, NcclType(dtype), NcclOp(op),
                                      Raw(comm), RawStream(stream)),
                    comm, "ncclReduceScatter");
  }
  absl::StatusOr<transport::NcclProgress> AllGather(const void* send, void* recv, size_t bytes,
                                                    Comm comm, Stream stream) override {
    return Progress(n_.all_gather(send, recv, bytes, ncclUint8, Raw(comm), RawStream(stream)), comm,
                    "ncclAllGather");
  }
  absl::StatusOr<transport::NcclProgress> Broadcast(const void* send, void* recv, size_t bytes,
                                                    int root, Comm comm, Stream stream) override {
    return Progress(n_.broadcast(send, recv, bytes, ncclUint8, root, Raw(comm), RawStream(stream)),
                    comm, "ncclBroadcast");
  }
  absl::StatusOr<transport::NcclProgress> Reduce(const void* send, void* recv, size_t count,
                                                 DataType dtype, ReduceOp op, int root,
                                                 Comm comm, Stream stream) override {
    return Progress(n_.reduce(send, recv, count, NcclType(dtype), NcclOp(op), root, Raw(comm),
                              RawStream(stream)),
                    comm, "ncclReduce");
  }
  absl::StatusOr<transport::NcclProgress> Send(const void* send, size_t bytes, int peer,
                                               Comm comm, Stream stream) override {
    return Progress(n_.send(send, bytes, ncclUint8, peer, Raw(comm), RawStream(stream)), comm,
                    "ncclSend");
  }
  absl::StatusOr<transport::NcclProgress> Recv(void* recv, size_t bytes, int peer, Comm comm,
                                               Stream stream) override {
    return Progress(n_.recv(recv, bytes, ncclUint8, peer, Raw(comm), RawStream(stream)), comm,
                    "ncclRecv");
  }
  absl::Status GroupStart() override {
    return Check(n_.group_start(), nullptr, "ncclGroupStart");
  }
  absl::StatusOr<transport::NcclProgress> GroupEnd() override {
    return Progress(n_.group_end(), nullptr, "ncclGroupEnd");
  }

  absl::StatusOr<Event> RecordEvent(Stream stream) override {
    int device = 0;
    cudaError_t e = cudaStreamGetDevice(RawStream(stream), &device);
    int previous = -1;
    if (e == cudaSuccess) e = cudaGetDevice(&previous);
    if (e == cudaSuccess && previous != device) e = cudaSetDevice(device);
    cudaEvent_t event = nullptr;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(event, RawStream(stream));
    if (previous >= 0 && previous != device) cudaSetDevice(previous);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (event != nullptr) cudaEventDestroy(event);
      return absl::InternalError(absl::StrCat("recording an event after the NCCL call: ",
                                              cudaGetErrorName(e), " (", cudaGetErrorString(e),
                                              ")"));
    }
    return static_cast<Event>(event);
  }
  absl::StatusOr<bool> EventDone(Event event) override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("the NCCL call's stream failed: ",
                                            cudaGetErrorName(e), " (", cudaGetErrorString(e),
                                            ")"));
  }
  void DestroyEvent(Event event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 private:
  static ncclComm_t Raw(Comm c) { return static_cast<ncclComm_t>(c); }
  static cudaStream_t RawStream(Stream s) { return static_cast<cudaStream_t>(s); }

  // A result as braid's status (transport/nccl_api.h), with NCCL's own message.
  absl::Status Check(ncclResult_t r, Comm comm, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    const char* last = n_.last_error(Raw(comm));
    const std::string message = absl::StrCat(what, ": ", n_.error_string(r),
                                             last != nullptr && *last ? absl::StrCat(" (", last, ")")
                                                                     : "");
    switch (r) {
      case ncclRemoteError: return absl::UnavailableError(message);
      case ncclInvalidArgument:
      case ncclInvalidUsage: return absl::InvalidArgumentError(message);
      default: return absl::InternalError(message);
    }
  }
  absl::StatusOr<transport::NcclProgress> Progress(ncclResult_t r, Comm comm, const char* what) {
    absl::Status s = Check(r, comm, what);
    if (!s.ok()) return s;
    return r == ncclInProgress ? transport::NcclProgress::kInProgress
                               : transport::NcclProgress::kDone;
  }

  const Nccl n_;
};

}  // namespace

absl::StatusOr<transport::NcclApi*> DefaultNccl() {
  static absl::StatusOr<transport::NcclApi*>* const opened = [] {
    Nccl n;
    std::string errors;
    const void* lib = OpenFirstLibrary(
        kLibraries,
        [&n](void* lib) {
          const bool bound =
              BindSymbol(lib, "ncclGetVersion", &n.get_version) &&
              BindSymbol(lib, "ncclGetUniqueId", &n.get_unique_id) &&
              BindSymbol(lib, "ncclCommInitRankConfig", &n.init_rank_config) &&
              BindSymbol(lib, "ncclCommGetAsyncError", &n.get_async_error) &&
              BindSymbol(lib, "ncclCommAbort", &n.abort) &&
              BindSymbol(lib, "ncclAllReduce", &n.all_reduce) &&
              BindSymbol(lib, "ncclReduceScatter", &n.reduce_scatter) &&
              BindSymbol(lib, "ncclAllGather", &n.all_gather) &&
              BindSymbol(lib, "ncclBroadcast", &n.broadcast) &&
              BindSymbol(lib, "ncclReduce", &n.reduce) && BindSymbol(lib, "ncclSend", &n.send) &&
              BindSymbol(lib, "ncclRecv", &n.recv) &&
              BindSymbol(lib, "ncclGroupStart", &n.group_start) &&
              BindSymbol(lib, "ncclGroupEnd", &n.group_end) &&
              BindSymbol(lib, "ncclGetErrorString", &n.error_string) &&
              BindSymbol(lib, "ncclGetLastError", &n.last_error);
          if (!bound) return absl::NotFoundError("lacks an NCCL function");
          n.get_version(&n.version);
          // ncclAvg and the nonblocking config (blocking = 0) need 2.14.
          if (n.version < 21400) {
            return absl::FailedPreconditionError(
                absl::StrCat("is NCCL ", n.version, ", older than 2.14"));
          }
          return absl::OkStatus();
        },
        &errors);
    if (lib != nullptr) return new absl::StatusOr<transport::NcclApi*>(new NcclLibrary(n));
    return new absl::StatusOr<transport::NcclApi*>(absl::FailedPreconditionError(absl::StrCat(
        "the NCCL data plane needs NCCL 2.14 or newer (", kLibraries[0],
        ": NVIDIA's libnccl2 package, NCCL installed beside CUDA, or the nvidia-nccl-cu13 "
        "Python package's lib folder on LD_LIBRARY_PATH): ", errors)));
  }();
  return *opened;
}

}  // namespace braid::device
