#include "compression/error_feedback.h"

#include "glog/logging.h"

namespace braid::compression {

std::vector<float>& ErrorFeedback::Slot(absl::string_view name, size_t count) {
  auto it = residuals_.find(name);
  if (it == residuals_.end()) {
    it = residuals_.emplace(std::string(name), std::vector<float>(count, 0.0f)).first;
  } else if (it->second.size() != count) {
    LOG(WARNING) << "tensor '" << name << "' changed size from " << it->second.size() << " to "
                 << count << " elements: its error-feedback residual starts again from zero";
    it->second.assign(count, 0.0f);
  }
  return it->second;
}

void ErrorFeedback::Apply(absl::string_view name, float* g, size_t count) {
  const std::vector<float>& e = Slot(name, count);
  for (size_t i = 0; i < count; ++i) g[i] += e[i];
}

void ErrorFeedback::Update(absl::string_view name, const float* p, const float* sent,
                           size_t count) {
  std::vector<float>& e = Slot(name, count);
  const float keep = 1.0f - beta_;
  size_t nonfinite = 0;
  for (size_t i = 0; i < count; ++i) {
    const float d = p[i] - sent[i];
    // A NaN or infinity (an overflowing step, as loss scaling produces routinely) shows in
    // this step's result; kept in the residual it would poison every later step, so the
    // residual of that element starts again from zero.
    const bool finite = d - d == 0.0f;
    nonfinite += finite ? 0 : 1;
    const float next = beta_ == 1.0f ? d : keep * e[i] + beta_ * d;
    e[i] = finite ? next : 0.0f;
  }
  if (nonfinite > 0) {
    LOG(WARNING) << "tensor '" << name << "': " << nonfinite
                 << " non-finite elements this step; their error-feedback residual restarts "
                    "from zero";
  }
}

const std::vector<float>& ErrorFeedback::residual(absl::string_view name) const {
  static const std::vector<float> kEmpty;
  auto it = residuals_.find(name);
  return it == residuals_.end() ? kEmpty : it->second;
}

void ErrorFeedback::Reset(absl::string_view name) {
  auto it = residuals_.find(name);
  if (it != residuals_.end()) residuals_.erase(it);
}

}  // namespace braid::compression
