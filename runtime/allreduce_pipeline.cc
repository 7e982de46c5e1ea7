#include "runtime/allreduce_pipeline.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"

namespace braid {
namespace {

using compression::TensorPlan;
using compression::TensorView;

constexpr size_t kAlignment = 64;         // a cache line: every packed bucket starts on one
constexpr size_t kGrowthQuantum = 1 << 16;  // the buffer grows in whole 64 KiB steps

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The largest fusion buffer asked of the allocator: half of the address space, in whole
// growth steps, so that doubling and rounding a capacity never wraps.
constexpr size_t kMaxCapacity =
    std::numeric_limits<size_t>::max() / 2 / kGrowthQuantum * kGrowthQuantum;

}  // namespace

// What the pipeline knows of the bucket it is running, passed from step to step
// (Note [One pipeline]); the spans view the pipeline's scratch.
struct AllReducePipeline::BucketRun {
  int64_t id = 0;
  const compression::CompressionMethod* method = nullptr;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  absl::Span<const AllReduceTensor> tensors;
  Timeline* timeline = nullptr;
  size_t bytes = 0;  // the tensors' own, as the caller holds them
  std::string args;  // the timeline arguments of its phases
  // Set by Describe: the tensors as the stage sees them (their element counts).
  absl::Span<const compression::BucketTensor> described;
  // Set by Pack: each tensor's view, laid out as planned.
  absl::Span<compression::TensorView> views;
  device::Device* device = nullptr;  // where the tensors are (Note [Devices])
  device::Stream stream = nullptr;
  absl::Duration timeout;
  bool packed = false;      // the views lie in the fusion buffer (else where the tensors lie)
  bool gathered = false;    // packed, by the compressor as it reduces (Note [Pipelined copy])
  size_t packed_bytes = 0;  // written into the fusion buffer
  // Note [Host staging]: the device's memory is not the host's; the packed bucket is
  // reduced in a copy in the host's fusion buffer, `staged` there.
  bool staging = false;
  char* staged = nullptr;
  char* packed_base = nullptr;  // the fusion buffer the bucket was packed into
};

FusionBuffer::FusionBuffer(device::Device* device)
    : device_(device != nullptr ? device : &device::HostDevice()) {}

absl::StatusOr<char*> FusionBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_.data() != nullptr) return data();
  if (bytes > kMaxCapacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a fusion buffer of ", bytes, " bytes: more than half the address space"));
  }
  // At least double: buckets vary in size with timing (fusion), and every growth costs a
  // fresh allocation whose pages fault in again as they are first written. Pages the
  // buckets never reach are never touched.
  const size_t capacity = RoundUp(
      std::max<size_t>({bytes, std::min(2 * capacity_, kMaxCapacity), 1}), kGrowthQuantum);
  absl::StatusOr<device::DeviceMemory> memory = device_->Allocate(capacity, kAlignment);
  if (!memory.ok()) {
    const DeviceRef where = device_->ref();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a fusion buffer of ", capacity, " bytes",
        where.type == DeviceType::kCPU ? "" : absl::StrCat(" on ", DeviceName(where)), " (",
        bytes, " needed, ", capacity_, " held)"));
  }
  data_ = *std::move(memory);
  capacity_ = capacity;
  return data();
}

absl::Status AllReducePipeline::Run(int64_t bucket_id,
                                    const compression::CompressionMethod& method,
                                    DataType dtype, ReduceOp op,
                                    absl::Span<const AllReduceTensor> tensors,
                                    transport::Communicator& comm, Timeline* timeline,
                                    const BucketPlace& place) {
  BucketRun run;
  run.device = place.device != nullptr ? place.device : &device::HostDevice();
  run.stream = place.stream;
  run.timeout = place.timeout;
  run.staging = !run.device->host_accessible() && !place.device_plane;
  run.id = bucket_id;
  run.method = &method;
  run.dtype = dtype;
  run.op = op;
  run.tensors = tensors;
  run.timeline = timeline;
  BRAID_RETURN_IF_ERROR(Describe(run));
  if (timeline != nullptr) {
    run.args = absl::StrCat("\"bucket\": ", bucket_id, ", \"tensors\": ", tensors.size(),
                            ", \"bytes\": ", run.bytes);
    if (!method.is_none()) {
      absl::StrAppend(&run.args, ", \"compression\": \"", method.spec(), "\"");
    }
  }
  const absl::Status s = Reduce(run, comm);
  absl::Status unpacked;
  if (run.packed && !run.gathered) {
    Phase(run, "MEMCPY_OUT_FUSION_BUFFER", true, run.args);
    if (s.ok()) unpacked = Unpack(run);
    // The handle completes on the host: the results must be where they go.
    if (unpacked.ok()) unpacked = run.device->Synchronize(run.stream, run.timeout);
    Phase(run, "MEMCPY_OUT_FUSION_BUFFER", false);
  }
  if (!s.ok()) return s;
  BRAID_RETURN_IF_ERROR(unpacked);
  Book(run, comm.size());
  ledger_->RecordBucket(run.packed, run.packed_bytes, run.bytes);
  return absl::OkStatus();
}

absl::Status AllReducePipeline::Describe(BucketRun& run) {
  bucket_.clear();
  for (const AllReduceTensor& t : run.tensors) {
    // Checked where the shape entered (enqueue, the coordinator's validation); a shape that
    // fails here fails alike on every rank, since the ranks agreed on it.
    auto count = ShapeElements("shape", t.shape);
    if (!count.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", run.id, ", tensor '",
                                                     Printable(t.name), "': ",
                                                     count.status().message()));
    }
    bucket_.push_back({t.name, t.shape, run.dtype, static_cast<size_t>(*count)});
    run.bytes += bucket_.back().count * DataTypeSize(run.dtype);
  }
  run.described = bucket_;
  bytes_.assign(run.tensors.size(), compression::TensorBytes{});
  return absl::OkStatus();
}

absl::Status AllReducePipeline::Reduce(BucketRun& run, transport::Communicator& comm) {
  // The stage's state stays locked from the plan to the end of the reduction (Note [Bucket
  // reduction], compression/stage.h). A staged bucket is compressed on the host, its
  // compression state kept there (Note [Host staging]).
  BRAID_ASSIGN_OR_RETURN(
      compression::PlannedBucket planned,
      stage_->Plan(*run.method, run.described,
                   run.staging ? &device::HostDevice() : run.device));
  absl::Status packed = Pack(run, planned.plans());
  if (packed.ok() && run.staging) packed = StageToHost(run);
  // The compressor reads the views from the host: the device's copies must be done. (The
  // NCCL plane's collectives would follow them on the same stream; it is waited for all the
  // same, so that a stall of this rank's own stream is not reported as NCCL's.)
  if (packed.ok()) packed = run.device->Synchronize(run.stream, run.timeout);
  if (!packed.ok()) {
    comm.Abort(packed);  // Note [Allocation failure]
    return packed;
  }
  if (run.staging) Rebase(run, run.staged);
  // The collectives start now (and the copies, for a gathered bucket).
  Phase(run, "ALLREDUCE", /*begin=*/true,
        run.gathered ? absl::StrCat(run.args, ", \"pipelined_copy\": true") : run.args);
  absl::Status s =
      stage_->Reduce(std::move(planned), run.views, run.op, comm, absl::MakeSpan(bytes_));
  Phase(run, "ALLREDUCE", /*begin=*/false);
  if (run.staging) {
    Rebase(run, run.packed_base);
    if (s.ok()) {
      Phase(run, "MEMCPY_HOST_TO_DEVICE", true, run.args);
      s = run.device->CopyFromHost(run.packed_base, run.staged, run.packed_bytes, run.stream);
      Phase(run, "MEMCPY_HOST_TO_DEVICE", false);
    }
  }
  return s;
}

absl::Status AllReducePipeline::StageToHost(BucketRun& run) {
  absl::StatusOr<char*> staged = BufferOf(&device::HostDevice()).Reserve(run.packed_bytes);
  if (!staged.ok()) return CannotPack(run, run.packed_bytes, staged.status());
  run.staged = *staged;
  Phase(run, "MEMCPY_DEVICE_TO_HOST", true, run.args);
  absl::Status s = run.packed_bytes == 0 ? absl::OkStatus()
                                         : run.device->CopyToHost(run.staged, run.packed_base,
                                                                  run.packed_bytes, run.stream);
  Phase(run, "MEMCPY_DEVICE_TO_HOST", false);
  return s;
}

void AllReducePipeline::Rebase(BucketRun& run, char* base) {
  for (size_t i = 0; i < run.views.size(); ++i) run.views[i].data = base + offsets_[i];
}

absl::Status AllReducePipeline::Pack(BucketRun& run, absl::Span<const TensorPlan> plans) {
  views_.assign(run.tensors.size(), TensorView{});
  run.views = absl::MakeSpan(views_);
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    TensorView& v = views_[i];
    v.name = run.tensors[i].name;
    v.shape = run.tensors[i].shape;
    v.count = run.described[i].count;
    v.dtype = plans[i].work_dtype;
  }
  // A staged bucket is always packed: the copy to the host is then one span.
  if (!run.staging && run.tensors.size() == 1 && plans[0].work_dtype == run.dtype &&
      !run.tensors[0].joined) {
    return ViewLone(run, plans[0]);
  }
  if (!run.staging && ViewInPlace(run, plans)) return absl::OkStatus();
  // Each view starts at a multiple of its element size, so tensors of one work dtype lie
  // back to back (one collective for all of them).
  size_t total = 0;
  offsets_.clear();
  for (const TensorView& v : views_) {
    total = RoundUp(total, DataTypeSize(v.dtype));
    offsets_.push_back(total);
    total += v.bytes();
  }
  absl::StatusOr<char*> base = BufferOf(run.device).Reserve(total);
  if (!base.ok()) return CannotPack(run, total, base.status());
  run.packed = true;
  run.packed_bytes = total;
  run.packed_base = *base;
  // Gathered copies are the host data plane's memcpys (transport/gather.h): host memory only.
  if (pipelined_copy_ && run.device == &device::HostDevice() && ViewGathered(run, plans, *base)) {
    return absl::OkStatus();
  }
  Phase(run, "MEMCPY_IN_FUSION_BUFFER", true,
        absl::StrCat("\"tensors\": ", run.tensors.size(), ", \"bytes\": ", total));
  absl::Status s;
  for (size_t i = 0; i < views_.size() && s.ok(); ++i) {
    TensorView& v = views_[i];
    v.data = *base + offsets_[i];
    if (v.count == 0) continue;
    // Copied as it is, or converted to float32 (the same call); a joined rank's is the op's
    // identity in the work dtype.
    s = run.tensors[i].joined
            ? run.device->FillIdentity(v.data, v.count, v.dtype, run.op, run.stream)
            : run.device->Convert(v.data, v.dtype, run.tensors[i].input, run.dtype, v.count,
                                  run.stream);
  }
  Phase(run, "MEMCPY_IN_FUSION_BUFFER", false);
  return s;
}

absl::Status AllReducePipeline::ViewLone(BucketRun& run, const TensorPlan& plan) {
  const AllReduceTensor& t = run.tensors[0];
  views_[0].data = t.output;
  if (t.input != t.output) {
    if (plan.separate_input) {
      views_[0].input = t.input;
    } else if (views_[0].count > 0) {
      return run.device->Copy(t.output, t.input, views_[0].bytes(), run.stream);
    }
  }
  return absl::OkStatus();
}

absl::Status AllReducePipeline::CannotPack(const BucketRun& run, size_t bytes,
                                           const absl::Status& s) {
  constexpr size_t kNamed = 3;
  std::string names;
  for (size_t i = 0; i < run.tensors.size() && i < kNamed; ++i) {
    absl::StrAppend(&names, i == 0 ? "'" : ", '", Printable(run.tensors[i].name), "'");
  }
  if (run.tensors.size() > kNamed) {
    absl::StrAppend(&names, " and ", run.tensors.size() - kNamed, " more");
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("all-reduce bucket ", run.id, " (", run.tensors.size(), " tensors: ", names,
                   ") needs ", bytes, " bytes of fusion buffer: ", s.message()));
}

bool AllReducePipeline::ViewInPlace(BucketRun& run, absl::Span<const TensorPlan> plans) {
  const absl::Span<const AllReduceTensor> tensors = run.tensors;
  const absl::Span<TensorView> views = run.views;
  const size_t element = DataTypeSize(run.dtype);
  char* const out = static_cast<char*>(tensors[0].output);
  const char* const in = static_cast<const char*>(tensors[0].input);
  if (out == nullptr || reinterpret_cast<uintptr_t>(out) % element != 0) return false;
  const bool in_place = in == out;
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AllReduceTensor& t = tensors[i];
    if (t.joined || plans[i].work_dtype != run.dtype) return false;
    if (!in_place && !plans[i].separate_input) return false;
    // An empty tensor occupies no bytes: wherever its pointers are, it is in line.
    if (views[i].count == 0) continue;
    if (t.output != out + offset || t.input != (in_place ? out : in) + offset) return false;
    offset += views[i].bytes();
  }
  // Packing reads every input before it writes any output; reading out of place over
  // outputs that overlap the inputs would not.
  if (!in_place && in < out + offset && out < in + offset) return false;
  offset = 0;
  for (TensorView& v : views) {
    v.data = out + offset;
    if (!in_place) v.input = in + offset;
    offset += v.bytes();
  }
  return true;
}

bool AllReducePipeline::ViewGathered(BucketRun& run, absl::Span<const TensorPlan> plans,
                                     char* base) {
  spans_.clear();
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    const AllReduceTensor& t = run.tensors[i];
    if (t.joined || plans[i].work_dtype != run.dtype || !plans[i].separate_input ||
        !plans[i].separate_output) {
      return false;
    }
    const size_t bytes = run.views[i].bytes();
    if (bytes == 0) continue;
    const auto in = reinterpret_cast<uintptr_t>(t.input);
    const auto out = reinterpret_cast<uintptr_t>(t.output);
    spans_.emplace_back(out, out + bytes);
    if (in != out) spans_.emplace_back(in, in + bytes);
  }
  // Pairwise apart (an input shared by two tensors too: rare, and then packed as before).
  std::sort(spans_.begin(), spans_.end());
  for (size_t k = 1; k < spans_.size(); ++k) {
    if (spans_[k].first < spans_[k - 1].second) return false;
  }
  run.gathered = true;
  for (size_t i = 0; i < run.views.size(); ++i) {
    TensorView& v = run.views[i];
    v.data = base + offsets_[i];
    // An empty tensor's pointers may be null (PyTorch's are): it points at its place in the
    // buffer instead, so that every view of the bucket is gathered and the compressor runs
    // one collective for all of them, as over the packed bucket (a rank that packs it must
    // see the same collectives).
    v.input = v.count == 0 ? v.data : run.tensors[i].input;
    v.output = v.count == 0 ? v.data : run.tensors[i].output;
  }
  return true;
}

absl::Status AllReducePipeline::Unpack(const BucketRun& run) {
  for (size_t i = 0; i < run.views.size(); ++i) {
    const TensorView& v = run.views[i];
    const AllReduceTensor& t = run.tensors[i];
    if (v.count == 0 || t.joined) continue;
    BRAID_RETURN_IF_ERROR(
        run.device->Convert(t.output, run.dtype, v.data, v.dtype, v.count, run.stream));
  }
  return absl::OkStatus();
}

FusionBuffer& AllReducePipeline::BufferOf(device::Device* device) {
  auto it = buffers_.find(device);
  if (it == buffers_.end()) it = buffers_.emplace(device, FusionBuffer(device)).first;
  return it->second;
}

const FusionBuffer& AllReducePipeline::buffer(device::Device* device) const {
  static const FusionBuffer* const kEmpty = new FusionBuffer;
  auto it = buffers_.find(device != nullptr ? device : &device::HostDevice());
  return it == buffers_.end() ? *kEmpty : it->second;
}

void AllReducePipeline::Book(const BucketRun& run, int world_size) {
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    const compression::TensorBytes& b = bytes_[i];
    ByteStats s;
    s.reductions = 1;
    s.uncompressed_bytes = run.described[i].count * DataTypeSize(run.dtype);
    // A warm-up step counts under its method at the tensor's size (runtime/statistics.h).
    s.payload_bytes = b.warm_up ? s.uncompressed_bytes : b.payload_bytes;
    s.transport_bytes = b.transport_bytes;
    s.reference_transport_bytes = ReferenceTransportBytes(s.uncompressed_bytes, world_size);
    ledger_->Record(run.tensors[i].name, run.method->spec(), run.tensors[i].pattern, s);
  }
}

void AllReducePipeline::Phase(const BucketRun& run, const char* phase, bool begin,
                              const std::string& args) {
  if (run.timeline == nullptr) return;
  for (const AllReduceTensor& t : run.tensors) {
    const std::string name(t.name);
    if (begin) {
      run.timeline->Begin(name, phase, args);
    } else {
      run.timeline->End(name, phase);
    }
  }
}

}  // namespace braid
