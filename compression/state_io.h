// Little-endian writer and bounds-checked reader for the compression state formats
// (stage.h, powersgd.h, error_feedback.h), and the stable hash their digests use. Hand-rolled
// rather than protobuf: the state is a handful of integers, length-prefixed strings and raw
// float32 arrays (residuals as large as the model), which a byte layout stores without
// copies, and the compression library then needs no generated code of its own (proto/ is the
// coordinator's wire contract).
#ifndef BRAID_COMPRESSION_STATE_IO_H_
#define BRAID_COMPRESSION_STATE_IO_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace braid::compression {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the state formats are little-endian and written with memcpy");

class StateWriter {
 public:
  explicit StateWriter(std::string* out) : out_(out) {}
  void Bytes(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }
  void U32(uint32_t v) { Bytes(&v, sizeof v); }
  void U64(uint64_t v) { Bytes(&v, sizeof v); }
  void I64(int64_t v) { Bytes(&v, sizeof v); }
  void String(absl::string_view s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  void Floats(const std::vector<float>& v) {
    U64(v.size());
    Bytes(v.data(), v.size() * sizeof(float));
  }

 private:
  std::string* out_;
};

// Every read checks the remaining length; the first failure sticks (status()), later reads
// return zeros, so a parser can read a whole record and check once.
class StateReader {
 public:
  StateReader(absl::string_view data, std::string what) : data_(data), what_(std::move(what)) {}

  bool Bytes(void* p, size_t n) {
    if (!status_.ok()) return false;
    if (n > data_.size()) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          what_, ": truncated at byte ", consumed_, " (", n, " more bytes expected, ",
          data_.size(), " left)"));
      std::memset(p, 0, n);
      return false;
    }
    if (n > 0) std::memcpy(p, data_.data(), n);  // an empty array's data() may be null
    data_.remove_prefix(n);
    consumed_ += n;
    return true;
  }
  uint32_t U32() { uint32_t v = 0; Bytes(&v, sizeof v); return v; }
  uint64_t U64() { uint64_t v = 0; Bytes(&v, sizeof v); return v; }
  int64_t I64() { int64_t v = 0; Bytes(&v, sizeof v); return v; }
  // `what` names the field in the error.
  std::string String(absl::string_view what = "string") {
    const uint64_t n = U64();
    if (!Check(n <= data_.size(), absl::StrCat(what, " of ", n, " bytes past the end (",
                                               data_.size(), " left)"))) {
      return {};
    }
    std::string s(data_.substr(0, n));
    data_.remove_prefix(n);
    consumed_ += n;
    return s;
  }
  std::vector<float> Floats(absl::string_view what = "float array") {
    const uint64_t n = U64();
    if (!Check(n <= data_.size() / sizeof(float),
               absl::StrCat(what, " of ", n, " float32 values past the end (", data_.size(),
                            " bytes left)"))) {
      return {};
    }
    std::vector<float> v(n);
    Bytes(v.data(), n * sizeof(float));
    return v;
  }
  // A count of records that take at least `min_bytes` each: refused, naming `what`, when the
  // bytes left cannot hold that many, so no caller sizes anything from an unchecked count (a
  // few crafted bytes must not make a loader allocate gigabytes). Returns 0 after a failure.
  uint32_t Count(absl::string_view what, size_t min_bytes) {
    const uint32_t n = U32();
    if (!Check(n <= data_.size() / min_bytes,
               absl::StrCat(what, " ", n, " declared, but the ", data_.size(),
                            " bytes left hold at most ", data_.size() / min_bytes))) {
      return 0;
    }
    return n;
  }
  // Records `problem` (with the byte offset) unless `ok`; returns ok.
  bool Check(bool ok, absl::string_view problem) {
    if (!ok && status_.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat(what_, ": ", problem, " (at byte ",
                                                        consumed_, ")"));
    }
    return ok && status_.ok();
  }
  bool done() const { return data_.empty(); }
  size_t left() const { return data_.size(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::string_view data_;
  std::string what_;
  size_t consumed_ = 0;
  absl::Status status_;
};

// FNV-1a over bytes, continuing from `h`: the state digests must be the same in every process
// and every run, which absl::Hash (salted per process) is not.
inline uint64_t StableHash(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace braid::compression

#endif  // BRAID_COMPRESSION_STATE_IO_H_
