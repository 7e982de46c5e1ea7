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
  if (beta_ == 1.0f) {
    for (size_t i = 0; i < count; ++i) e[i] = p[i] - sent[i];
  } else {
    const float keep = 1.0f - beta_;
    for (size_t i = 0; i < count; ++i) e[i] = keep * e[i] + beta_ * (p[i] - sent[i]);
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
