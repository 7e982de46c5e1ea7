#include "common/limits.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace braid {

absl::StatusOr<int64_t> ShapeElements(absl::string_view field, absl::Span<const int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", shape.size(),
                                                   " dimensions, more than the limit of ",
                                                   kMaxDims));
  }
  bool zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is negative: ", shape[i]));
    }
    zero = zero || shape[i] == 0;
  }
  if (zero) return int64_t{0};  // whatever the other dimensions multiply to
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(elements, d, &elements) || elements > kMaxTensorBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the product of ", field, " overflows: more than ", kMaxTensorBytes,
          " elements (the limit of a tensor is 2^48 bytes)"));
    }
  }
  return elements;
}

absl::StatusOr<int64_t> TensorBytes(absl::string_view field, int64_t elements,
                                    size_t element_bytes) {
  int64_t bytes = 0;
  if (elements < 0 ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(element_bytes), &bytes) ||
      bytes > kMaxTensorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", elements, " elements of ", element_bytes,
                     " bytes exceed the limit of a tensor, 2^48 bytes"));
  }
  return bytes;
}

absl::StatusOr<int64_t> CheckedSum(absl::string_view field, absl::Span<const int64_t> values,
                                   int64_t max) {
  int64_t sum = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is negative: ", values[i]));
    }
    if (__builtin_add_overflow(sum, values[i], &sum) || sum > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("the sum of ", field, " exceeds ", max));
    }
  }
  return sum;
}

absl::Status CheckName(absl::string_view field, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", name.size(), " bytes long, more than the limit of ", kMaxNameBytes,
        " (it starts '", Printable(Truncated(name, 64)), "')"));
  }
  if (const size_t bad = InvalidUtf8Offset(name); bad < name.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is not valid UTF-8: byte 0x",
        absl::Hex(static_cast<unsigned char>(name[bad]), absl::kZeroPad2), " at offset ", bad,
        " of '", Printable(Truncated(name, 64)), "' (names travel as UTF-8 text)"));
  }
  return absl::OkStatus();
}

size_t InvalidUtf8Offset(absl::string_view text) {
  // Neither Abseil nor the C++ library has a UTF-8 validator (codecvt is deprecated, mbrtowc
  // depends on the process's locale), so this follows RFC 3629's table: the lead byte gives
  // the length and the range of the second byte (which excludes overlong forms, surrogates
  // and code points past U+10FFFF).
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + len > text.size()) return i;
    for (int k = 1; k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(text[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) return i;
    }
    i += len;
  }
  return text.size();
}

std::string Printable(absl::string_view name) {
  return InvalidUtf8Offset(name) == name.size() ? std::string(name) : absl::CHexEscape(name);
}

std::string Truncated(absl::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  size_t cut = max;
  // Back up over UTF-8 continuation bytes (10xxxxxx) so no character is split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), "...");
}

}  // namespace braid
