// Compression specs and the registry that turns them into Compressors.
//
// A spec is "method" or "method:option=value,option=value", e.g. "fp16", "fp4:chunk=64,ef=1",
// "int4:start_step=100". Methods and their options:
//   none                      plain all-reduce in the tensor's own dtype, any reduce op
//   fp16, bf16                cast to 16 bits, all-reduce, cast back
//   fp4, int4                 4-bit all-reduce (see four_bit.h); chunk=N (elements per
//                             scale, >= 2, default 128), ef=0|1 (error feedback, default 0),
//                             beta=B (its low-pass filter, (0, 1], default 1; needs ef=1)
//   powersgd                  low-rank P·Qᵀ (see powersgd.h): rank=R (>= 1, default 1),
//                             min_compression_rate=X (>= 1, default 2), ef=0|1 (default 1),
//                             warm_start=0|1 (default 1), orthogonalization_epsilon=E (>= 0,
//                             default 0)
//   scalecomp, topk, randomk  sparsifiers (see sparse.h); ratio=R (dense size / k, >= 1,
//                             default 100), beta=B (memory filter, default 1),
//                             granularity=bucket|tensor (default bucket); scalecomp also
//                             leader=cyclic|RANK (default cyclic)
//   auto                      the runtime chooses per bucket from the link and the step it
//                             measures (Note [Auto compression], runtime/auto_compression.h)
// Every method except none and auto also takes start_step=N (default 0): the first N reductions of
// each tensor run as a plain float32 all-reduce (warm-up).
// With RegistryOptions::test_methods (BRAID_TEST_COMPRESSORS=1) the registry also knows
// deliberately harmful methods that exist only to prove the convergence harness can fail:
//   test_randomk:keep=F       every rank keeps a random fraction F of coordinates, no error
//                             feedback, no rescaling (default keep=0.01)
#ifndef BRAID_COMPRESSION_REGISTRY_H_
#define BRAID_COMPRESSION_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "compression/compressor.h"

namespace braid::compression {

struct RegistryOptions {
  bool test_methods = false;
};

struct CompressionSpec {
  std::string method;                          // "fp4"
  std::map<std::string, std::string> options;  // every option, defaults filled in, normalised
  // method plus the options that differ from their defaults, sorted: "fp4:ef=1". Two specs
  // that mean the same thing have the same canonical form ("fp4" == "fp4:chunk=128").
  std::string canonical;
  int64_t start_step = 0;

  int64_t IntOption(const std::string& key) const;
  double FloatOption(const std::string& key) const;
};

// Parses and validates `spec` ("" means "none"). InvalidArgument for an unknown method (the
// message lists the valid ones), an unknown option (lists the method's options) or a bad value.
absl::StatusOr<CompressionSpec> ParseCompressionSpec(absl::string_view spec,
                                                     const RegistryOptions& options = {});

// The method names the registry knows, in a stable order.
std::vector<std::string> CompressionMethods(const RegistryOptions& options = {});

// Whether `spec`'s method reduces all-reduces of `dtype` with `op`: none every dtype and op,
// every other method floating-point (float16, bfloat16, float32, float64) sum or average.
bool MethodApplies(const CompressionSpec& spec, DataType dtype, ReduceOp op);

// A new Compressor for a parsed spec, "none" included. FailedPrecondition when a method's
// library is missing (powersgd: OpenBLAS).
absl::StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const CompressionSpec& spec);

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_REGISTRY_H_
