// One agreed bucket (Note [Execution step]), on braid-loop: all-reduces through the
// pipeline (allreduce_pipeline.h), every other collective straight on the communicator, and
// each handle completed exactly once.
#include <cctype>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/runtime_impl.h"

namespace braid {
namespace {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Elements per row of dim 0 (the product of the trailing dimensions).
int64_t RowElements(const std::vector<int64_t>& shape) {
  return shape.empty() ? 1 : NumElements({shape.begin() + 1, shape.end()});
}

// Rows of dim 0 each rank gets in a reduce-scatter: even, the first rows % size one more.
std::vector<int64_t> EvenRows(int64_t rows, int size) {
  std::vector<int64_t> out(size, rows / size);
  for (int r = 0; r < rows % size; ++r) ++out[r];
  return out;
}

std::string Upper(absl::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

void Runtime::Impl::Execute(const Bucket& bucket) {
  if (!bucket.error.ok()) {
    FinishBucket(bucket.names, bucket.error);
    return;
  }
  std::vector<Entry*> entries;
  entries.reserve(bucket.names.size());
  for (const std::string& name : bucket.names) {
    Entry* e = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = table_.find(name);
      if (it != table_.end()) e = &it->second;  // stays put: only this thread erases
    }
    if (e == nullptr) {
      LOG(ERROR) << "rank " << rank_ << ": coordinator scheduled '" << name
                 << "', which this rank did not submit";
      AbortJob(absl::InternalError(absl::StrCat("rank ", rank_, " was told to run '", name,
                                                "', which it never submitted")));
      return;
    }
    entries.push_back(e);
  }
  // One timeline for the whole bucket, even if StartTimeline / StopTimeline swap it meanwhile.
  const std::shared_ptr<Timeline> timeline = this->timeline();
  if (timeline) {
    for (const std::string& name : bucket.names) timeline->End(name, "QUEUE");
  }
  absl::Status s;
  if (bucket.collective == Collective::kAllReduce) {
    pipeline_->set_timeline(timeline.get());
    s = RunAllReduce(bucket, entries);
    pipeline_->set_timeline(nullptr);
  } else {
    const std::string phase = Upper(CollectiveName(bucket.collective));
    const CollectiveRequest& r = entries[0]->req;
    if (timeline) {
      timeline->Begin(r.name, phase,
                       absl::StrCat("\"bucket\": ", bucket.id, ", \"tensors\": 1, \"bytes\": ",
                                    NumElements(r.shape) * DataTypeSize(r.dtype)));
    }
    s = RunCollective(*entries[0], bucket);
    if (timeline) timeline->End(r.name, phase);
  }
  FinishBucket(bucket.names, s);
}

absl::Status Runtime::Impl::RunAllReduce(const Bucket& bucket,
                                         const std::vector<Entry*>& entries) {
  const CollectiveRequest& first = entries[0]->req;
  std::vector<AllReduceTensor> tensors;
  tensors.reserve(entries.size());
  for (const Entry* e : entries) {
    // The coordinator fuses only requests that agree on these; anything else is a bug there.
    if (e->method != entries[0]->method || e->req.dtype != first.dtype || e->req.op != first.op) {
      return absl::InternalError(absl::StrCat("bucket ", bucket.id, " mixes '", first.name,
                                              "' and '", e->req.name, "', which do not fuse"));
    }
    tensors.push_back({e->req.name, e->req.shape, e->req.input, e->req.output});
  }
  return pipeline_->Run(bucket.id, *entries[0]->method, first.dtype, first.op, tensors, *comm_);
}

absl::Status Runtime::Impl::RunCollective(Entry& e, const Bucket& bucket) {
  const CollectiveRequest& r = e.req;
  const size_t elem = DataTypeSize(r.dtype);
  const int64_t n = NumElements(r.shape);
  Handle& h = *e.handle;
  // Output the caller sized, or one the handle owns when the caller gave none (or too little).
  auto output_for = [&](size_t bytes, std::vector<int64_t> shape, bool caller_sized) -> void* {
    h.set_output_shape(std::move(shape));
    if (r.output != nullptr && (caller_sized || r.output_capacity_bytes >= bytes)) return r.output;
    h.mutable_output().resize(bytes);
    return h.mutable_output().data();
  };
  const int64_t row = RowElements(r.shape);
  std::vector<int64_t> shape = r.shape;
  switch (r.collective) {
    case Collective::kBroadcast:
      if (rank_ == bucket.root_rank && r.output != r.input && n > 0) {
        std::memcpy(r.output, r.input, n * elem);
      }
      return comm_->Broadcast(r.output, n * elem, bucket.root_rank);
    case Collective::kBarrier:
      return comm_->Barrier();
    case Collective::kAllGather: {
      std::vector<size_t> bytes(size_);
      shape[0] = 0;
      for (int p = 0; p < size_; ++p) {
        bytes[p] = bucket.first_dims[p] * row * elem;
        shape[0] += bucket.first_dims[p];
      }
      void* out = output_for(shape[0] * row * elem, shape, false);
      return comm_->AllGather(r.input, bytes[rank_], out, bytes);
    }
    case Collective::kReduceScatter: {
      std::vector<int64_t> rows = EvenRows(r.shape[0], size_);
      std::vector<size_t> counts(size_);
      for (int p = 0; p < size_; ++p) counts[p] = rows[p] * row;
      shape[0] = rows[rank_];
      void* out = output_for(counts[rank_] * elem, shape, r.output != nullptr);
      return comm_->ReduceScatter(r.input, out, counts, r.dtype, r.op);
    }
    case Collective::kAllToAll: {
      std::vector<int64_t> send_rows = r.splits.empty() ? EvenRows(r.shape[0], size_) : r.splits;
      std::vector<int64_t> recv_rows(size_);
      std::vector<size_t> eight(size_, sizeof(int64_t));
      BRAID_RETURN_IF_ERROR(comm_->AllToAll(send_rows.data(), eight, recv_rows.data(), eight));
      std::vector<size_t> sb(size_), rb(size_);
      shape[0] = 0;
      for (int p = 0; p < size_; ++p) {
        sb[p] = send_rows[p] * row * elem;
        rb[p] = recv_rows[p] * row * elem;
        shape[0] += recv_rows[p];
      }
      void* out = output_for(shape[0] * row * elem, shape, false);
      return comm_->AllToAll(r.input, sb, out, rb);
    }
    case Collective::kAllReduce:
      break;  // the pipeline's
  }
  return absl::InternalError(absl::StrCat("'", r.name, "': no direct execution for ",
                                          CollectiveName(r.collective)));
}

void Runtime::Impl::FinishBucket(const std::vector<std::string>& names, const absl::Status& s) {
  transport::TransportStats stats = comm_->stats();  // comm_ is this thread's
  absl::MutexLock lock(&mu_);
  stats_ = stats;
  for (const std::string& name : names) {
    auto it = table_.find(name);
    if (it == table_.end()) continue;  // failed already by an abort
    it->second.handle->Complete(s);
    table_.erase(it);
  }
}

}  // namespace braid
