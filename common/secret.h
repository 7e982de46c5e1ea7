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

// A secret travels in call metadata, which holds printable ASCII only: OK when `secret` is
// 1 to 4096 characters between ' ' and '~'; else InvalidArgument naming `what`.
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
