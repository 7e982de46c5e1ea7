#include <algorithm>
#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "common/status_macros.h"
#include "compression/error_feedback.h"
#include "compression/four_bit.h"
#include "compression/methods.h"
#include "compression/quantize.h"

namespace braid::compression {

FourBitLayout PlanFourBit(absl::Span<const size_t> counts, size_t chunk, int ranks) {
  FourBitLayout L;
  L.tensor_payload_bytes.assign(counts.size(), 0);
  size_t total = 0;
  for (size_t c : counts) total += c;
  size_t chunks = 0;
  for (size_t c : counts) chunks += (c + chunk - 1) / chunk;
  L.chunks.reserve(chunks);
  size_t global = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    for (size_t begin = 0; begin < counts[t]; begin += chunk) {
      FourBitChunk c;
      c.tensor = t;
      c.begin = begin;
      c.count = std::min(chunk, counts[t] - begin);
      // Monotone in the chunk's global position, so each shard is a contiguous run.
      c.shard = static_cast<int>(std::min<size_t>(ranks - 1, global * ranks / total));
      global += c.count;
      L.tensor_payload_bytes[t] += sizeof(float) + PackedBytes(c.count);
      L.chunks.push_back(c);
    }
  }
  L.shard_first_chunk.assign(ranks + 1, L.chunks.size());
  L.shard_bytes.assign(ranks, 0);
  for (size_t i = L.chunks.size(); i-- > 0;) L.shard_first_chunk[L.chunks[i].shard] = i;
  for (int p = ranks - 1; p >= 0; --p) {
    // A shard with no chunks starts where the next one does.
    L.shard_first_chunk[p] = std::min(L.shard_first_chunk[p], L.shard_first_chunk[p + 1]);
  }
  for (int p = 0; p < ranks; ++p) {
    const size_t first = L.shard_first_chunk[p], last = L.shard_first_chunk[p + 1];
    size_t code = (last - first) * sizeof(float);
    for (size_t i = first; i < last; ++i) {
      L.chunks[i].scale_index = i - first;
      L.chunks[i].code_offset = code;
      code += PackedBytes(L.chunks[i].count);
    }
    L.shard_bytes[p] = code;
  }
  L.shard_offset.assign(ranks + 1, 0);
  for (int p = 0; p < ranks; ++p) L.shard_offset[p + 1] = L.shard_offset[p] + L.shard_bytes[p];
  return L;
}

uint32_t StreamSeed(uint64_t job_seed, int rank, absl::string_view name, int64_t step, int stage) {
  uint64_t h = Mix64(job_seed);
  h = Mix64(h ^ NameHash(name));
  h = Mix64(h ^ static_cast<uint64_t>(step));
  h = Mix64(h ^ (static_cast<uint64_t>(rank) << 8) ^ static_cast<uint64_t>(stage));
  return static_cast<uint32_t>(h ^ (h >> 32));
}

namespace {

constexpr int kAnyRank = -1;  // stage-2 seeds: the same whichever rank re-quantizes

inline float LoadScale(const uint8_t* block, size_t index) {
  float s;
  std::memcpy(&s, block + index * sizeof(float), sizeof(float));
  return s;
}
inline void StoreScale(uint8_t* block, size_t index, float s) {
  std::memcpy(block + index * sizeof(float), &s, sizeof(float));
}

class FourBitCompressor : public Compressor {
 public:
  FourBitCompressor(const FourBitOptions& o, std::string spec)
      : o_(o), spec_(std::move(spec)), ef_(o.beta) {}

  const std::string& spec() const override { return spec_; }

  void Reset(absl::string_view name) override { ef_.Reset(name); }

  // With ef=1 the residuals (error_feedback.h's format); without, nothing: the stochastic
  // rounding streams follow the stage's step counters.
  absl::Status SaveState(std::string* out) const override {
    return o_.error_feedback ? ef_.Save(out) : absl::OkStatus();
  }
  absl::Status LoadState(absl::string_view state) override {
    if (!o_.error_feedback) return Compressor::LoadState(state);
    if (state.empty()) {  // the first state format (version 1) kept no residuals here
      ef_ = ErrorFeedback(o_.beta);
      return absl::OkStatus();
    }
    return ef_.Load(state, "compression '" + spec_ + "'");
  }
  void DescribeSharedState(std::vector<SharedStateField>* out) const override {
    ef_.Describe(out);
  }

  absl::Status Reduce(absl::Span<const TensorView> tensors, transport::Communicator& comm,
                      StepContext& ctx) override {
    const int n = comm.size(), rank = comm.rank();
    if (o_.error_feedback) {
      BRAID_RETURN_IF_ERROR(FailBeforeCollectives(comm, ef_.Place(*ctx.device, tensors)));
    }
    counts_.clear();
    for (const TensorView& t : tensors) counts_.push_back(t.count);
    const FourBitLayout L = PlanFourBit(counts_, o_.chunk, n);
    for (size_t t = 0; t < tensors.size() && t < ctx.payload_bytes.size(); ++t) {
      ctx.payload_bytes[t] = L.tensor_payload_bytes[t];
    }
    if (L.chunks.empty()) return absl::OkStatus();
    auto step = [&](size_t t) { return t < ctx.steps.size() ? ctx.steps[t] : 0; };

    // 1. Quantize every chunk into the block of the shard that owns it.
    send_.resize(L.shard_offset[n]);
    size_t ci = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const TensorView& tv = tensors[t];
      if (tv.count == 0) continue;
      if (o_.error_feedback) ef_.Apply(tv.name, tv.f32(), tv.count);
      const uint32_t seed = StreamSeed(ctx.seed, rank, tv.name, step(t), 1);
      if (o_.error_feedback) sent_.resize(tv.count);
      for (; ci < L.chunks.size() && L.chunks[ci].tensor == t; ++ci) {
        const FourBitChunk& c = L.chunks[ci];
        uint8_t* block = send_.data() + L.shard_offset[c.shard];
        const float* x = tv.f32() + c.begin;
        const float s = ChunkScale(o_.format, x, c.count);
        StoreScale(block, c.scale_index, s);
        Encode(o_.format, x, c.count, s, seed, c.begin, block + c.code_offset);
        if (o_.error_feedback) {
          Decode(o_.format, block + c.code_offset, c.count, s, sent_.data() + c.begin);
        }
      }
      if (o_.error_feedback) ef_.Update(tv.name, tv.f32(), sent_.data(), tv.count);
    }

    // 2. All-to-all: shard p's block goes to rank p.
    const size_t mine = L.shard_bytes[rank];
    recv_.resize(mine * n);
    std::vector<size_t> recv_bytes(n, mine);
    absl::Status s = comm.AllToAll(send_.data(), L.shard_bytes, recv_.data(), recv_bytes);
    if (!s.ok()) return s;

    // 3+4. Per chunk of this rank's shard, while it sits in L1: decode and sum every rank's
    // codes in rank order (each divided by n to average), re-quantize. The re-quantization's seed depends
    // on the tensor, not on which rank owns the shard: which ranks own which chunks depends
    // on the bucket the tensor landed in (timing decides fusion), and the result must not.
    const size_t first = L.shard_first_chunk[rank], last = L.shard_first_chunk[rank + 1];
    acc_.resize(o_.chunk);
    gather_send_.resize(mine);
    const float divisor = ctx.op == ReduceOp::kAverage ? static_cast<float>(n) : 1.0f;
    size_t seed_tensor = SIZE_MAX;
    uint32_t seed2 = 0;
    for (size_t i = first; i < last; ++i) {
      const FourBitChunk& c = L.chunks[i];
      if (c.tensor != seed_tensor) {
        seed_tensor = c.tensor;
        seed2 = StreamSeed(ctx.seed, kAnyRank, tensors[c.tensor].name, step(c.tensor), 2);
      }
      float* acc = acc_.data();
      for (int p = 0; p < n; ++p) {
        const uint8_t* block = recv_.data() + static_cast<size_t>(p) * mine;
        // Averaging divides each rank's scale by n (one division per chunk, folded into the
        // decode table) instead of every element of the sum.
        const float scale = LoadScale(block, c.scale_index) / divisor;
        if (p == 0) {  // the first rank's values initialise the sum
          Decode(o_.format, block + c.code_offset, c.count, scale, acc);
        } else {
          DecodeAdd(o_.format, block + c.code_offset, c.count, scale, acc);
        }
      }
      const float sc = ChunkScale(o_.format, acc, c.count);
      StoreScale(gather_send_.data(), c.scale_index, sc);
      Encode(o_.format, acc, c.count, sc, seed2, c.begin, gather_send_.data() + c.code_offset);
    }

    // 5. All-gather the shards and decode all of them (this rank's too: bit-identical).
    gather_recv_.resize(L.shard_offset[n]);
    s = comm.AllGather(gather_send_.data(), mine, gather_recv_.data(), L.shard_bytes);
    if (!s.ok()) return s;
    for (const FourBitChunk& c : L.chunks) {
      const uint8_t* block = gather_recv_.data() + L.shard_offset[c.shard];
      Decode(o_.format, block + c.code_offset, c.count, LoadScale(block, c.scale_index),
             tensors[c.tensor].f32() + c.begin);
    }
    return absl::OkStatus();
  }

 private:
  FourBitOptions o_;
  std::string spec_;
  ErrorFeedback ef_;
  // Scratch, reused across steps (no allocation per step in steady state).
  std::vector<size_t> counts_;
  std::vector<uint8_t> send_, recv_, gather_send_, gather_recv_;
  std::vector<float> acc_, sent_;
};

}  // namespace

std::unique_ptr<Compressor> MakeFourBitCompressor(const FourBitOptions& options,
                                                  std::string spec) {
  return std::make_unique<FourBitCompressor>(options, std::move(spec));
}

}  // namespace braid::compression
