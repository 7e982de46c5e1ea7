#include "compression/error_feedback.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/state_io.h"
#include "glog/logging.h"

namespace braid::compression {

absl::StatusOr<StateArray*> ErrorFeedback::Prepare(absl::string_view name, size_t count) {
  auto it = residuals_.find(name);
  if (it != residuals_.end() && it->second.size() != count) {
    LOG(WARNING) << "tensor '" << name << "' changed size from " << it->second.size() << " to "
                 << count << " elements: its error-feedback residual starts again from zero";
  }
  // A new residual joins the map only once it is there.
  StateArray fresh;
  StateArray& e = it != residuals_.end() ? it->second : fresh;
  absl::StatusOr<bool> placed = e.PlaceOn(*device_, count);
  if (!placed.ok()) {
    return absl::Status(placed.status().code(),
                        absl::StrCat("tensor '", name, "': its error-feedback residual: ",
                                     placed.status().message()));
  }
  if (it == residuals_.end()) {
    it = residuals_.emplace(std::string(name), std::move(fresh)).first;
  }
  return &it->second;
}

absl::Status ErrorFeedback::Place(device::Device& device,
                                  absl::Span<const TensorView> tensors) {
  device_ = &device;
  for (const TensorView& t : tensors) {
    absl::StatusOr<StateArray*> placed = Prepare(t.name, t.count);
    if (!placed.ok()) return placed.status();
  }
  return absl::OkStatus();
}

StateArray& ErrorFeedback::Slot(absl::string_view name, size_t count) {
  auto it = residuals_.find(name);
  if (it != residuals_.end() && it->second.size() == count && it->second.device() == device_) {
    return it->second;  // placed
  }
  absl::StatusOr<StateArray*> prepared = Prepare(name, count);
  CHECK(prepared.ok()) << prepared.status();
  return **prepared;
}

void ErrorFeedback::Apply(absl::string_view name, float* g, size_t count) {
  const float* e = Slot(name, count).data();
  for (size_t i = 0; i < count; ++i) g[i] += e[i];
}

void ErrorFeedback::Update(absl::string_view name, const float* p, const float* sent,
                           size_t count) {
  float* e = Slot(name, count).data();
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

std::vector<float> ErrorFeedback::residual(absl::string_view name) const {
  auto it = residuals_.find(name);
  if (it == residuals_.end()) return {};
  absl::StatusOr<std::vector<float>> host = it->second.ToHost();
  CHECK(host.ok()) << "tensor '" << name << "': error-feedback residual: " << host.status();
  return *std::move(host);
}

void ErrorFeedback::Reset(absl::string_view name) {
  auto it = residuals_.find(name);
  if (it != residuals_.end()) residuals_.erase(it);
}

namespace {
constexpr char kMagic[4] = {'E', 'F', 'B', 'K'};
constexpr uint32_t kVersion = 1;
// The least a tensor takes in the format: an empty name and an empty residual.
constexpr size_t kMinTensorBytes = 2 * sizeof(uint64_t);
}  // namespace

absl::Status ErrorFeedback::Save(std::string* out) const {
  std::string saved;
  StateWriter w(&saved);
  w.Bytes(kMagic, sizeof kMagic);
  w.U32(kVersion);
  w.U32(static_cast<uint32_t>(residuals_.size()));
  for (const auto& [name, e] : residuals_) {
    absl::StatusOr<std::vector<float>> host = e.ToHost();
    if (!host.ok()) {
      return absl::Status(host.status().code(),
                          absl::StrCat("tensor '", name, "': copying its error-feedback "
                                       "residual to the host: ", host.status().message()));
    }
    w.String(name);
    w.Floats(*host);
  }
  out->append(saved);
  return absl::OkStatus();
}

absl::Status ErrorFeedback::Load(absl::string_view state, absl::string_view what) {
  StateReader in(state, absl::StrCat(what, ": error-feedback state"));
  char magic[sizeof kMagic];
  in.Bytes(magic, sizeof magic);
  in.Check(std::memcmp(magic, kMagic, sizeof magic) == 0, "does not start with \"EFBK\"");
  const uint32_t version = in.U32();
  in.Check(version == kVersion,
           absl::StrCat("version ", version, ", this braid reads version ", kVersion));
  const uint32_t count = in.Count("tensor count", kMinTensorBytes);
  std::map<std::string, StateArray, std::less<>> loaded;
  for (uint32_t i = 0; i < count && in.status().ok(); ++i) {
    std::string name = in.String("tensor name");
    std::vector<float> e = in.Floats(absl::StrCat("tensor '", name, "': residual"));
    if (!in.status().ok()) break;
    bool finite = true;
    for (float v : e) finite &= std::isfinite(v);
    in.Check(finite, absl::StrCat("tensor '", name, "': non-finite residual values"));
    in.Check(loaded.count(name) == 0, absl::StrCat("tensor '", name, "' appears twice"));
    if (!in.status().ok()) break;
    // In host memory until Place moves it to its tensor's device.
    absl::StatusOr<StateArray> host = StateArray::FromHost(device::HostDevice(), e);
    if (!host.ok()) return host.status();
    loaded.emplace(std::move(name), *std::move(host));
  }
  in.Check(in.done(), "bytes left over after the last tensor");
  if (!in.status().ok()) return in.status();
  residuals_ = std::move(loaded);
  return absl::OkStatus();
}

void ErrorFeedback::Describe(std::vector<SharedStateField>* out) const {
  for (const auto& [name, e] : residuals_) out->push_back({name, "residual length", e.size()});
}

}  // namespace braid::compression
