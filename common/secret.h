// Job secrets: how braid makes them, reads them from files, compares them and derives keys
// from them (Note [Who may join] in coordinator/service.h says what they protect).
//
// The cryptography is OpenSSL's libcrypto (RAND_bytes, HMAC-SHA256, CRYPTO_memcmp), which
// gRPC already links: a keyed hash and a constant-time comparison are easy to get subtly
// wrong by hand, and a well-kept library's are not.
#ifndef BRAID_COMMON_SECRET_H_
#define BRAID_COMMON_SECRET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid {

// Longest secret (or TLS key) file braid reads, in bytes.
inline constexpr size_t kMaxSecretFileBytes = 64 * 1024;

// 32 random bytes from the operating system's generator, as 64 lowercase hex digits.
std::string RandomSecret();

// Whether `presented` equals `expected`, in time that depends on neither's contents (only on
// their lengths being hashed: both are reduced to SHA-256 digests, then compared with
// CRYPTO_memcmp), so a caller cannot learn a secret byte by byte from response times.
bool SecretsEqual(absl::string_view presented, absl::string_view expected);

// HMAC-SHA256(key, message): 32 raw bytes.
std::string HmacSha256(absl::string_view key, absl::string_view message);

// Note [Secret strength]
// A secret must hold at least kMinSecretBits bits, so that guessing it does not pay even at
// the coordinator's full speed (and admissions are slowed besides, coordinator/admission.h).
// braid cannot tell a random secret from a chosen one, so it estimates what the text could
// hold at best: its length times log2 of the alphabet it draws on, where the alphabet is the
// 16 hex digits when the secret is hex, else the union of the classes it uses
// (10 digits, 26 lowercase letters, 26 uppercase letters, 33 other printable characters).
// So 32 hex digits (16 random bytes: `openssl rand -hex 16`) are the least that passes, and
// 22 characters of mixed case letters and digits (base64 of 16 random bytes). A secret with
// fewer than kMinSecretDistinct different characters ("aaaa...") is refused whatever its
// length; 32 random hex digits have that few with a chance below 1 in 10^7. The secrets
// braid makes itself (RandomSecret, derived ones) are 64 hex digits: 256 bits.
inline constexpr int kMinSecretBits = 128;
inline constexpr int kMinSecretDistinct = 8;

// The estimate of Note [Secret strength], in bits (rounded down).
int SecretStrengthBits(absl::string_view secret);

// A secret travels in call metadata, which holds printable ASCII only: OK when `secret` is
// 1 to 4096 characters between ' ' and '~' and strong enough (Note [Secret strength]); else
// InvalidArgument naming `what` and, for a weak one, the minimum.
absl::Status CheckSecret(absl::string_view what, absl::string_view secret);

// ---- Keyed tags of the data plane (transport/tag.h, Note [Tag layout]) ----

// The key of a job's data-plane tags: HMAC-SHA256(job secret, "braid data-plane tags v1"),
// so the secret itself is never used twice for different purposes.
std::string DataPlaneTagKey(absl::string_view job_secret);

// The 32-bit pair field of the tags on messages from rank `source` to rank `destination`,
// keyed by `key` (DataPlaneTagKey): only holders of the key can compute it, so a process that
// learned a rank's UCX address but not the job secret cannot produce a tag the rank matches.
// It is a keyed permutation of the source rank for each destination, so two sources never
// share a value at one destination (the tag layout requires it; 32 bits of a single HMAC
// could collide): a 4-round Feistel network (Luby-Rackoff) on the 32-bit source rank, whose
// round function is 16 bits of HMAC-SHA256(key, destination, round, half). 4 HMACs per call:
// each rank computes its 2(n-1) values once, when it connects.
uint32_t KeyedPairTag(absl::string_view key, int source, int destination);

// Checks that `path` is a regular file owned by this user that nobody else may read or write
// (mode 0600 or 0400), and returns its contents. `what` names it in errors ("--secret-file",
// "BRAID_JOB_SECRET_FILE"). InvalidArgument when it is missing, not a regular file, owned by
// another user, readable or writable by group or others, or larger than kMaxSecretFileBytes.
absl::StatusOr<std::string> ReadPrivateFile(absl::string_view what, const std::string& path);

// A secret file: ReadPrivateFile, trailing whitespace (a newline an editor added) removed;
// InvalidArgument also when nothing is left or the rest fails CheckSecret.
absl::StatusOr<std::string> ReadSecretFile(absl::string_view what, const std::string& path);

// The secret in `path`, or, when no file is there, a new RandomSecret() written to it with
// mode 0600 (atomically: a concurrent caller reads the same secret, never half of one).
absl::StatusOr<std::string> ReadOrCreateSecretFile(absl::string_view what, const std::string& path);

}  // namespace braid

#endif  // BRAID_COMMON_SECRET_H_
