// One agreed bucket (Note [Execution step]), on braid-loop: all-reduces through the
// pipeline (allreduce_pipeline.h), every other collective straight on the communicator, and
// each handle completed exactly once.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/runtime_impl.h"

namespace braid {
namespace {

// Elements per row of dim 0 (the product of the trailing dimensions).
absl::StatusOr<int64_t> RowElements(absl::Span<const int64_t> shape) {
  if (shape.empty()) return 1;
  return ShapeElements("shape", shape.subspan(1));
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
    if (e == nullptr && JoinedIn(bucket)) {
      entries.push_back(nullptr);  // this rank takes part with the identity (Note [Join])
      continue;
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
    for (const Entry* e : entries) {
      if (e != nullptr) timeline->End(e->req.name, "QUEUE");
    }
  }
  absl::Status s;
  if (bucket.collective == Collective::kAllReduce) {
    s = RunAllReduce(bucket, entries, timeline.get());
  } else if (entries[0] == nullptr) {
    s = RunJoined(bucket);
  } else {
    const std::string phase = Upper(CollectiveName(bucket.collective));
    const CollectiveRequest& r = entries[0]->req;
    if (timeline) {
      timeline->Begin(r.name, phase,
                       absl::StrCat("\"bucket\": ", bucket.id, ", \"tensors\": 1, \"bytes\": ",
                                    // Checked at enqueue: the 0 is never taken.
                                    ShapeElements("shape", r.shape).value_or(0) *
                                        DataTypeSize(r.dtype)));
    }
    s = RunCollective(*entries[0], bucket);
    if (timeline) timeline->End(r.name, phase);
  }
  if (s.code() == absl::StatusCode::kDeadlineExceeded) s = DataPlaneTimeout(bucket, s);
  FinishBucket(bucket.names, s);
}

absl::Status Runtime::Impl::DataPlaneTimeout(const Bucket& bucket, const absl::Status& s) {
  // The communicator is poisoned from here on and repeats its first error: every later
  // bucket gets the error that names the tensors the data plane stopped at.
  if (!data_plane_timeout_.ok()) return data_plane_timeout_;
  constexpr size_t kNamed = 5;
  std::vector<std::string> quoted;
  for (size_t i = 0; i < bucket.names.size() && i < kNamed; ++i) {
    quoted.push_back(absl::StrCat("'", bucket.names[i], "'"));
  }
  std::string names = absl::StrJoin(quoted, ", ");
  if (bucket.names.size() > kNamed) {
    absl::StrAppend(&names, " and ", bucket.names.size() - kNamed, " more");
  }
  data_plane_timeout_ = absl::DeadlineExceededError(absl::StrCat(
      CollectiveName(bucket.collective), " of ", bucket.names.size() == 1 ? "tensor " : "tensors ",
      names, " (bucket ", bucket.id, ") timed out on the data plane: ", s.message()));
  return data_plane_timeout_;
}

bool Runtime::Impl::JoinedIn(const Bucket& bucket) const {
  return std::find(bucket.joined_ranks.begin(), bucket.joined_ranks.end(), rank_) !=
         bucket.joined_ranks.end();
}

absl::Status Runtime::Impl::RunAllReduce(const Bucket& bucket, const std::vector<Entry*>& entries,
                                         Timeline* timeline) {
  // The bucket's kind: from this rank's own requests, else (this rank joined and submitted
  // none of them, Note [Join]) from the response.
  const compression::CompressionMethod* method = nullptr;
  DataType dtype = bucket.dtype;
  ReduceOp op = bucket.op;
  const Entry* own = nullptr;
  for (const Entry* e : entries) own = own != nullptr ? own : e;
  if (own != nullptr) {
    method = own->method;
    dtype = own->req.dtype;
    op = own->req.op;
  } else {
    auto resolved = stage_->Resolve(bucket.compression.empty() ? "none" : bucket.compression);
    if (!resolved.ok()) return resolved.status();
    method = *resolved;
  }
  std::vector<AllReduceTensor> tensors;
  tensors.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry* e = entries[i];
    if (e == nullptr) {
      if (i >= bucket.shapes.size()) {
        return absl::InternalError(absl::StrCat("bucket ", bucket.id, ": no shape for '",
                                                bucket.names[i], "', which rank ", rank_,
                                                " joined without submitting"));
      }
      AllReduceTensor t{bucket.names[i], bucket.shapes[i], nullptr, nullptr};
      t.joined = true;  // the pipeline packs the op's identity
      tensors.push_back(t);
      continue;
    }
    // The coordinator fuses only requests that agree on these; anything else is a bug there.
    if (e->method != method || e->req.dtype != dtype || e->req.op != op) {
      return absl::InternalError(absl::StrCat("bucket ", bucket.id, " mixes '", own->req.name,
                                              "' and '", e->req.name, "', which do not fuse"));
    }
    tensors.push_back({e->req.name, e->req.shape, e->req.input, e->req.output});
  }
  return pipeline_->Run(bucket.id, *method, dtype, op, tensors, *comm_, timeline);
}

absl::Status Runtime::Impl::RunJoined(const Bucket& bucket) {
  // The coordinator gives a joined rank only all-reduces and barriers (Note [Join]).
  if (bucket.collective == Collective::kBarrier) return comm_->Barrier();
  return absl::InternalError(absl::StrCat("rank ", rank_, " has joined and was told to run ",
                                          CollectiveName(bucket.collective), " '",
                                          bucket.names[0], "', which it never submitted"));
}

absl::Status Runtime::Impl::RunCollective(Entry& e, const Bucket& bucket) {
  const CollectiveRequest& r = e.req;
  const size_t elem = DataTypeSize(r.dtype);
  BRAID_ASSIGN_OR_RETURN(const int64_t n, ShapeElements("shape", r.shape));
  Handle& h = *e.handle;
  // Output the caller sized, or one the handle owns when the caller gave none (or too little).
  auto output_for = [&](size_t bytes, std::vector<int64_t> shape, bool caller_sized) -> void* {
    h.set_output_shape(std::move(shape));
    if (r.output != nullptr && (caller_sized || r.output_capacity_bytes >= bytes)) return r.output;
    h.mutable_output().resize(bytes);
    return h.mutable_output().data();
  };
  BRAID_ASSIGN_OR_RETURN(const int64_t row, RowElements(r.shape));
  std::vector<int64_t> shape = r.shape;
  switch (r.collective) {
    case Collective::kBroadcast:
      if (rank_ == bucket.root_rank && r.output != r.input && n > 0) {
        std::memcpy(r.output, r.input, n * elem);
      }
      return comm_->Broadcast(r.output, n * elem, bucket.root_rank);
    case Collective::kBarrier:
      return comm_->Barrier();
    case Collective::kJoin: {
      // Every rank has joined (Note [Join]): the result is the rank that joined last.
      const int32_t last = bucket.last_joined_rank;
      h.set_output_shape({});
      h.mutable_output().resize(sizeof(last));
      std::memcpy(h.mutable_output().data(), &last, sizeof(last));
      return absl::OkStatus();
    }
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
