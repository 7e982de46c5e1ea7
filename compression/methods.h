// Factories of the built-in compressors, for the registry (internal: build them from specs
// with CreateCompressor).
#ifndef BRAID_COMPRESSION_METHODS_H_
#define BRAID_COMPRESSION_METHODS_H_

#include <memory>
#include <string>

#include "common/dtype.h"
#include "compression/compressor.h"
#include "compression/quantize.h"

namespace braid::compression {

// none: the uncompressed all-reduce of any dtype and op.
std::unique_ptr<Compressor> MakeNoneCompressor();

// fp16 / bf16: `wire` is kFloat16 or kBFloat16.
std::unique_ptr<Compressor> MakeCastCompressor(DataType wire, std::string spec);

// fp4 / int4: the 4-bit all-reduce.
struct FourBitOptions {
  FourBitFormat format = FourBitFormat::kFp4;
  size_t chunk = 128;
  bool error_feedback = false;
  float beta = 1.0f;  // error feedback's low-pass filter (error_feedback.h), in (0, 1]
};
std::unique_ptr<Compressor> MakeFourBitCompressor(const FourBitOptions& options,
                                                  std::string spec);

// test_randomk: deliberately harmful (see registry.h).
std::unique_ptr<Compressor> MakeRandomKCompressor(double keep, std::string spec);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_METHODS_H_
