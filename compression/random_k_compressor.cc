// test_randomk: a deliberately harmful compressor, registered only with
// BRAID_TEST_COMPRESSORS=1. Every rank keeps a random fraction `keep` of its coordinates (its
// own choice), zeroes the rest, and all-reduces the dense result — without error feedback and
// without rescaling by 1/keep, so the update is biased towards zero by a factor ~keep. It
// exists to prove that the convergence harness (tools/convergence) can fail.
#include <vector>

#include "compression/four_bit.h"
#include "compression/methods.h"
#include "compression/quantize.h"

namespace braid::compression {
namespace {

class RandomKCompressor : public Compressor {
 public:
  RandomKCompressor(double keep, std::string spec) : keep_(keep), spec_(std::move(spec)) {}

  const std::string& spec() const override { return spec_; }

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    for (size_t t = 0; t < tensors.size(); ++t) {
      const TensorView& tv = tensors[t];
      const uint32_t seed = StreamSeed(ctx.seed, comm.rank(), tv.name,
                                       t < ctx.steps.size() ? ctx.steps[t] : 0, 3);
      uint64_t kept = 0;
      for (size_t i = 0; i < tv.count; ++i) {
        if (UniformDraw(seed, i) < keep_) {
          ++kept;
        } else {
          tv.f32()[i] = 0.0f;
        }
      }
      if (t < ctx.payload_bytes.size()) ctx.payload_bytes[t] = kept * (sizeof(float) + sizeof(uint32_t));
      absl::Status s = comm.AllReduce(tv.f32(), tv.f32(), tv.count, DataType::kFloat32, ctx.op);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  float keep_;
  std::string spec_;
};

}  // namespace

std::unique_ptr<Compressor> MakeRandomKCompressor(double keep, std::string spec) {
  return std::make_unique<RandomKCompressor>(keep, std::move(spec));
}

}  // namespace braid::compression
