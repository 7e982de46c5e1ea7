// Bulk float32 <-> float16 / bfloat16 conversions of the fp16 / bf16 compressors, round to
// nearest even, bit-identical to the scalar reference in common/half.h (NaN payloads too).
// Own file because it is built with -O3 -fno-trapping-math (see compression/CMakeLists.txt).
#ifndef BRAID_COMPRESSION_HALF_CONVERT_H_
#define BRAID_COMPRESSION_HALF_CONVERT_H_

#include <cstddef>
#include <cstdint>

namespace braid::compression {

// out[i] = half(in[i] / divisor): bfloat16 when `bf16`, else IEEE float16.
void ToHalf(const float* in, size_t n, float divisor, bool bf16, uint16_t* out);
// out[i] = float(in[i]) (exact).
void FromHalf(const uint16_t* in, size_t n, bool bf16, float* out);
// out[i] = half(float(in[i]) / divisor) between the two 16-bit formats (`in_bf16`, `out_bf16`
// say which each is): bit-identical to FromHalf then ToHalf, without a full-size float32
// copy. `out` may equal `in`.
void HalfToHalf(const uint16_t* in, bool in_bf16, size_t n, float divisor, bool out_bf16,
                uint16_t* out);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_HALF_CONVERT_H_
