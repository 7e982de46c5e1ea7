// Fuzz target: the compression state's loader (CompressionStage::ParseState and, under it,
// every compressor's LoadState: PowerSGD's format, the error-feedback memory of the others)
// and the reports ranks exchange when they restore a state (DecodeLoadReport), driven by
// arbitrary bytes. What must hold, whatever the input:
//   - no crash, no undefined behaviour, no leak;
//   - nothing is sized from a count the input cannot back: no single allocation reaches
//     kAllocationLimit (the inputs are a few hundred bytes; a few bytes declaring 2^32
//     records would ask for gigabytes);
//   - a state that parses applies, and what the stage then saves parses and saves again to
//     the same bytes (saving is a fixpoint after one load), with the same summary.
// The first input byte picks the parser (even: a state; odd: a report), the rest is its input.
// It runs as the replay of tests/fuzz/state_corpus (replay_main.cc) in the gcc builds only:
// clang, which alone has libFuzzer here, cannot build the compression library (GCC
// target_clones on function templates). So each saved input also runs mutated the ways a
// hostile state would be: cut at every length, and with each 32-bit window replaced by a
// huge count.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "compression/stage.h"
#include "compression/state_summary.h"
#include "glog/logging.h"

namespace {
constexpr size_t kAllocationLimit = size_t{64} << 20;
}  // namespace

// GCC cannot see that these replace the global pair together, and warns that free() meets
// a pointer from operator new.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (n >= kAllocationLimit) {
    std::fprintf(stderr, "compression_state_fuzz: invariant broken: an allocation of %zu bytes\n",
                 n);
    std::abort();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace braid::compression {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "compression_state_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

void FuzzState(const std::string& input) {
  CompressionStage stage(StageOptions{});
  auto parsed = stage.ParseState(input);
  if (!parsed.ok()) return;
  const int rank = (*parsed)->saved_rank, size = (*parsed)->saved_world_size;
  const StateSummary summary = stage.Summarize(parsed->get());
  stage.ApplyState(*std::move(parsed));
  Check(SummaryDigest(stage.Summarize()) == SummaryDigest(summary),
        "the applied state's summary is the parsed one's");
  const std::string saved = stage.SaveState(rank, size).value();
  CompressionStage again(StageOptions{});
  auto reparsed = again.ParseState(saved);
  Check(reparsed.ok(), "a saved state parses");
  again.ApplyState(*std::move(reparsed));
  Check(again.SaveState(rank, size).value() == saved, "saving is a fixpoint after one load");
  Check(SummaryDigest(again.Summarize()) == SummaryDigest(summary), "the summary survives");
}

void FuzzReport(const std::string& input) {
  auto report = DecodeLoadReport(input);
  if (!report.ok()) return;
  auto back = DecodeLoadReport(EncodeLoadReport(*report));
  Check(back.ok() && SummaryDigest(back->summary) == SummaryDigest(report->summary) &&
            back->refused == report->refused,
        "a report decodes to what it encoded");
}

void FuzzOne(const std::string& input) {
  if (input.empty()) return;
  const std::string rest = input.substr(1);
  if (input[0] % 2 == 0) {
    FuzzState(rest);
  } else {
    FuzzReport(rest);
  }
}

}  // namespace
}  // namespace braid::compression

// Refused states are the fuzzer's daily bread: their warnings would drown its own output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = google::GLOG_ERROR;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  braid::compression::FuzzOne(input);
  for (size_t n = 1; n < input.size(); ++n) braid::compression::FuzzOne(input.substr(0, n));
  for (size_t at = 1; at + 4 <= input.size(); ++at) {
    for (uint32_t huge : {0xffffffffu, 0x80000000u, 0x01000000u}) {
      std::string mutated = input;
      std::memcpy(&mutated[at], &huge, sizeof huge);
      braid::compression::FuzzOne(mutated);
    }
  }
  return 0;
}
