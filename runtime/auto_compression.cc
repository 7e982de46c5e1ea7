// Compression `auto` on a rank (Note [Auto compression], auto_compression.h).
#include "runtime/auto_compression.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "compression/compression_plan.h"
#include "glog/logging.h"

namespace braid {

AutoCompression::AutoCompression(compression::CompressionStage* stage)
    : stage_(stage), chosen_(&stage->none()), wire_(AutoLadder().size(), 0) {
  for (const std::string& spec : AutoLadder()) {
    absl::StatusOr<compression::CompressionSpec> parsed = compression::ParseCompressionSpec(spec);
    // The ladder is braid's own, in canonical form (the samples name its methods by place).
    CHECK(parsed.ok() && parsed->canonical == spec) << spec;
    ladder_.push_back(*std::move(parsed));
  }
}

absl::StatusOr<const compression::CompressionMethod*> AutoCompression::ForBucket(
    absl::Span<const AllReduceTensor> tensors, DataType dtype, ReduceOp op) {
  const double bits = 8.0 * static_cast<double>(DataTypeSize(dtype));
  int64_t elements = 0;
  // Each tensor's dense bytes, counted once for every ladder method below.
  std::vector<double> tensor_bytes;
  tensor_bytes.reserve(tensors.size());
  for (const AllReduceTensor& t : tensors) {
    BRAID_ASSIGN_OR_RETURN(int64_t n, ShapeElements(t.name, t.shape));
    elements += n;
    tensor_bytes.push_back(static_cast<double>(n) * bits / 8.0);
  }
  const double dense = static_cast<double>(elements) * bits / 8.0;
  bytes_ += static_cast<int64_t>(dense);
  bool chosen_pays = false;
  for (size_t i = 0; i < ladder_.size(); ++i) {
    const compression::CompressionSpec& spec = ladder_[i];
    // The plans' rule, over the bucket: its bytes under the method, summed per tensor.
    double sent = dense;
    if (spec.method != "none" && compression::MethodApplies(spec, dtype, op) &&
        elements >= compression::CompressionPlan::kDefaultMinElements) {
      double under = 0;
      for (size_t k = 0; k < tensors.size(); ++k) {
        under += tensor_bytes[k] / compression::EstimatedRate(spec, tensors[k].shape, dtype);
      }
      if (under > 0 &&
          dense / under >= compression::CompressionPlan::kDefaultMinCompressionRate) {
        sent = under;
      }
    }
    wire_[i] += static_cast<int64_t>(std::ceil(sent));
    if (spec.canonical == chosen_spec_) chosen_pays = sent < dense;  // none: never
  }
  started_ = absl::Now();
  return chosen_pays ? chosen_ : &stage_->none();
}

bool AutoCompression::TakeStep(proto::TuningSample* sample) {
  if (bytes_ == 0) return false;
  sample->set_auto_bytes(bytes_);
  sample->set_auto_micros(micros_);
  for (int64_t w : wire_) sample->add_auto_wire_bytes(w);
  bytes_ = 0;
  micros_ = 0;
  std::fill(wire_.begin(), wire_.end(), 0);
  return true;
}

absl::Status AutoCompression::Apply(const std::string& spec) {
  if (spec.empty()) return absl::OkStatus();
  if (std::find(AutoLadder().begin(), AutoLadder().end(), spec) == AutoLadder().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression auto: '", spec, "' is not one of its methods"));
  }
  BRAID_ASSIGN_OR_RETURN(chosen_, stage_->Resolve(spec));
  chosen_spec_ = spec;
  return absl::OkStatus();
}

}  // namespace braid
