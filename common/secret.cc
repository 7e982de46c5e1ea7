#include "common/secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid {
namespace {

std::string Errno() { return std::strerror(errno); }

// Closes a descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(Errno());
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RandomSecret() {
  unsigned char bytes[32];
  // RAND_bytes draws from the operating system's generator; it fails only when that cannot
  // be read at all, and a secret must never be made without it.
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::fprintf(stderr, "braid: the random generator failed: cannot make a secret\n");
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

bool SecretsEqual(absl::string_view presented, absl::string_view expected) {
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(presented.data()), presented.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

std::string HmacSha256(absl::string_view key, absl::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string DataPlaneTagKey(absl::string_view job_secret) {
  return HmacSha256(job_secret, "braid data-plane tags v1");
}

uint32_t KeyedPairTag(absl::string_view key, int source, int destination) {
  const uint32_t s = static_cast<uint32_t>(source);
  uint32_t left = s >> 16, right = s & 0xffff;
  for (uint32_t round = 0; round < 4; ++round) {
    // The round function's input, fixed-width and little-endian: destination, round, half.
    unsigned char in[12];
    const uint32_t fields[3] = {static_cast<uint32_t>(destination), round, right};
    for (int f = 0; f < 3; ++f) {
      for (int b = 0; b < 4; ++b) in[4 * f + b] = static_cast<unsigned char>(fields[f] >> (8 * b));
    }
    const std::string mac =
        HmacSha256(key, absl::string_view(reinterpret_cast<const char*>(in), sizeof(in)));
    const uint32_t f = (static_cast<uint32_t>(static_cast<unsigned char>(mac[0])) << 8) |
                       static_cast<unsigned char>(mac[1]);
    const uint32_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << 16) | right;
}

absl::Status CheckSecret(absl::string_view what, absl::string_view secret) {
  if (secret.empty() || secret.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a secret must be 1 to 4096 "
                                                   "characters long, got ", secret.size()));
  }
  for (char c : secret) {
    if (c < ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": a secret must be printable ASCII (it travels in call metadata)"));
    }
  }
  const int bits = SecretStrengthBits(secret);
  const size_t distinct = std::set<char>(secret.begin(), secret.end()).size();
  if (bits < kMinSecretBits || distinct < static_cast<size_t>(kMinSecretDistinct)) {
    // Never the secret itself: an error message may end up in a log others read.
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the secret is too weak: a secret must hold at least ", kMinSecretBits,
        " bits (32 hex digits, or 22 characters of mixed-case letters and digits) with at "
        "least ", kMinSecretDistinct, " different characters; this one has ", secret.size(),
        " characters, ", distinct, " different, about ", bits,
        " bits. Make one with `openssl rand -hex 16`, or leave it unset and braid makes one"));
  }
  return absl::OkStatus();
}

int SecretStrengthBits(absl::string_view secret) {
  bool digit = false, lower = false, upper = false, other = false, hex = true;
  for (char c : secret) {
    digit |= absl::ascii_isdigit(c);
    lower |= absl::ascii_islower(c);
    upper |= absl::ascii_isupper(c);
    other |= !absl::ascii_isalnum(c);
    hex &= absl::ascii_isxdigit(c);
  }
  int alphabet = 10 * digit + 26 * lower + 26 * upper + 33 * other;
  if (hex) alphabet = std::min(alphabet, 16);
  if (alphabet <= 1) return 0;
  return static_cast<int>(static_cast<double>(secret.size()) * std::log2(alphabet));
}

absl::StatusOr<std::string> ReadPrivateFile(absl::string_view what, const std::string& path) {
  // O_NOFOLLOW: the checks below are of the file itself, never of a link's target chosen by
  // someone else; fstat on the open descriptor: no window between the check and the read.
  Fd f{open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot open '", path, "': ", Errno()));
  }
  struct stat st;
  if (fstat(f.fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot stat '", path, "': ", Errno()));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' is not a regular file"));
  }
  if (st.st_uid != geteuid()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' belongs to uid ",
                                                   st.st_uid, ", not to this user (uid ",
                                                   geteuid(), ")"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: '%s' has mode %04o: other users could read or change it; it must be 0600 "
        "(chmod 600 '%s')",
        what, path, st.st_mode & 07777, path));
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' is larger than ",
                                                   kMaxSecretFileBytes, " bytes"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = read(f.fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "': ", Errno()));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

absl::StatusOr<std::string> ReadSecretFile(absl::string_view what, const std::string& path) {
  auto data = ReadPrivateFile(what, path);
  if (!data.ok()) return data.status();
  std::string secret(absl::StripTrailingAsciiWhitespace(*data));
  if (secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' is empty"));
  }
  if (absl::Status s = CheckSecret(absl::StrCat(what, " '", path, "'"), secret); !s.ok()) return s;
  return secret;
}

absl::StatusOr<std::string> ReadOrCreateSecretFile(absl::string_view what,
                                                   const std::string& path) {
  if (access(path.c_str(), F_OK) == 0 || errno != ENOENT) return ReadSecretFile(what, path);
  // Written in full under a temporary name, then linked into place: link() fails when the
  // name exists, so of two processes creating it at once one wins and both read its secret.
  std::string tmp = path + ".XXXXXX";
  Fd f{mkstemp(tmp.data())};  // mode 0600
  if (f.fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot create '", path, "': ", Errno()));
  }
  absl::Status s = WriteAll(f.fd, RandomSecret() + "\n");
  if (s.ok() && fsync(f.fd) != 0) s = absl::InternalError(Errno());
  if (s.ok() && link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    s = absl::InternalError(Errno());
  }
  unlink(tmp.c_str());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot create '", path, "': ", s.message()));
  }
  return ReadSecretFile(what, path);
}

}  // namespace braid
