// none: the uncompressed all-reduce, a Compressor like the others so that every bucket takes
// the same path (pack, Reduce, unpack). It takes every dtype and every reduce op as they are
// and sends the tensor's own bytes: payload = count · element size.
#include <vector>

#include "compression/methods.h"

namespace braid::compression {
namespace {

class NoneCompressor : public Compressor {
 public:
  NoneCompressor() = default;

  const std::string& spec() const override { return spec_; }
  bool TakesNatively(DataType) const override { return true; }
  bool ReadsSeparateInput() const override { return true; }

  bool WritesSeparateOutput() const override { return true; }

  // One all-reduce per run of tensors that lie back to back in one dtype, their inputs too
  // when they are read out of place: one for a packed bucket (the runtime's fusion buffer),
  // one for a bucket or a tensor reduced where it lies. A run of gathered views (their
  // `output` set: Note [Gathered all-reduce], transport/gather.h) is one gathered
  // all-reduce through their scratch, wherever their inputs and outputs lie.
  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    for (size_t i = 0; i < tensors.size() && i < ctx.payload_bytes.size(); ++i) {
      ctx.payload_bytes[i] = tensors[i].bytes();
    }
    size_t first = 0;
    while (first < tensors.size()) {
      const TensorView& head = tensors[first];
      size_t last = first + 1, count = head.count;
      while (last < tensors.size() && Follows(tensors[last - 1], tensors[last])) {
        count += tensors[last++].count;
      }
      if (count > 0) {
        absl::Status s;
        if (head.output != nullptr) {
          pieces_.clear();
          for (size_t i = first; i < last; ++i) {
            const TensorView& v = tensors[i];
            if (v.count > 0) pieces_.push_back({v.input, v.output, v.bytes()});
          }
          s = comm.AllReduceGathered(pieces_, head.data, count, head.dtype, ctx.op);
        } else {
          const void* in = head.input != nullptr ? head.input : head.data;
          s = comm.AllReduce(in, head.data, count, head.dtype, ctx.op);
        }
        if (!s.ok()) return s;
      }
      first = last;
    }
    return absl::OkStatus();
  }

 private:
  // Whether b continues a's run: right after it, and gathered as a is, or read in place as
  // a is, or out of place right after a's input.
  static bool Follows(const TensorView& a, const TensorView& b) {
    if (b.dtype != a.dtype || static_cast<const char*>(a.data) + a.bytes() != b.data) {
      return false;
    }
    if ((a.output == nullptr) != (b.output == nullptr)) return false;
    if (a.output != nullptr) return true;  // gathered: inputs and outputs lie anywhere
    if (a.input == nullptr || b.input == nullptr) return a.input == b.input;
    return static_cast<const char*>(a.input) + a.bytes() == b.input;
  }

  std::vector<transport::GatheredPiece> pieces_;  // reused: the steady state allocates nothing
  const std::string spec_ = "none";
};

}  // namespace

std::unique_ptr<Compressor> MakeNoneCompressor() { return std::make_unique<NoneCompressor>(); }

}  // namespace braid::compression
