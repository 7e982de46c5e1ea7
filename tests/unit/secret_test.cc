// Job secrets (common/secret.h): generation, constant-time comparison, HMAC against the RFC's
// vectors, and the checks on secret files (owner, mode, kind, size).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "common/secret.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string t = std::string(base != nullptr ? base : "/tmp") + "/secret_test.XXXXXX";
  return mkdtemp(t.data()) != nullptr ? t : "";
}

std::string Write(const std::string& dir, const std::string& name, const std::string& data,
                  mode_t mode) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << data;
  chmod(path.c_str(), mode);
  return path;
}

TEST(SecretTest, RandomSecretsAreLongHexAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    std::string s = RandomSecret();
    ASSERT_EQ(s.size(), 64u);
    EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos) << s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SecretTest, SecretsEqualComparesWholeValues) {
  EXPECT_TRUE(SecretsEqual("s3cret", "s3cret"));
  EXPECT_FALSE(SecretsEqual("s3cret", "s3creT"));
  EXPECT_FALSE(SecretsEqual("s3cre", "s3cret"));  // a prefix is not the secret
  EXPECT_FALSE(SecretsEqual("s3cret\n", "s3cret"));
  EXPECT_FALSE(SecretsEqual("", "s3cret"));
  EXPECT_TRUE(SecretsEqual(std::string("a\0b", 3), std::string("a\0b", 3)));
  EXPECT_FALSE(SecretsEqual(std::string("a\0b", 3), std::string("a\0c", 3)));
}

// RFC 4231, test cases 1 and 2.
TEST(SecretTest, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(absl::BytesToHexString(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(absl::BytesToHexString(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// 32 hex digits (128 bits): the shortest hex secret braid accepts.
constexpr char kHex128[] = "0123456789abcdef0123456789abcdef";

TEST(SecretTest, SecretsArePrintableAsciiOfBoundedLength) {
  EXPECT_TRUE(CheckSecret("S", "a b~!Quite long, with 8+ symbols").ok());
  EXPECT_EQ(CheckSecret("S", "").message(), "S: a secret must be 1 to 4096 characters long, got 0");
  EXPECT_FALSE(CheckSecret("S", std::string(4097, 'x')).ok());
  EXPECT_EQ(CheckSecret("S", "tab\there").message(),
            "S: a secret must be printable ASCII (it travels in call metadata)");
  EXPECT_FALSE(CheckSecret("S", "caf\xc3\xa9").ok());
}

// Note [Secret strength]: length times log2 of the alphabet the secret draws on.
TEST(SecretTest, StrengthIsLengthTimesTheAlphabetsBits) {
  EXPECT_EQ(SecretStrengthBits(kHex128), 128);
  EXPECT_EQ(SecretStrengthBits("0123456789ABCDEF0123456789abcdef"), 128);  // hex of any case
  EXPECT_EQ(SecretStrengthBits(RandomSecret()), 256);
  EXPECT_EQ(SecretStrengthBits("x"), 4);                        // 26 letters: 4.7 bits
  EXPECT_EQ(SecretStrengthBits("1234567890"), 33);              // 10 digits: 3.3 bits each
  EXPECT_EQ(SecretStrengthBits("aZ3kQ9pL0xT7mW2rB5nV8y"), 130);  // 22 of 62: 5.95 bits each
  EXPECT_EQ(SecretStrengthBits("aZ3kQ9pL0xT7mW2rB5nV8"), 125);
  EXPECT_EQ(SecretStrengthBits("++++"), 20);                    // 33 other characters
  EXPECT_EQ(SecretStrengthBits(""), 0);
}

// The brute force that guessed BRAID_JOB_SECRET=x in 34 tries: such secrets are refused,
// naming the minimum, and never echoed.
TEST(SecretTest, WeakSecretsAreRefusedNamingTheMinimum) {
  EXPECT_EQ(CheckSecret("BRAID_JOB_SECRET", "x").message(),
            "BRAID_JOB_SECRET: the secret is too weak: a secret must hold at least 128 bits (32 "
            "hex digits, or 22 characters of mixed-case letters and digits) with at least 8 "
            "different characters; this one has 1 characters, 1 different, about 4 bits. Make "
            "one with `openssl rand -hex 16`, or leave it unset and braid makes one");
  EXPECT_TRUE(CheckSecret("S", kHex128).ok());
  EXPECT_FALSE(CheckSecret("S", std::string(kHex128).substr(1)).ok());  // 124 bits
  EXPECT_TRUE(CheckSecret("S", "aZ3kQ9pL0xT7mW2rB5nV8y").ok());
  EXPECT_FALSE(CheckSecret("S", "aZ3kQ9pL0xT7mW2rB5nV8").ok());
  EXPECT_TRUE(CheckSecret("S", RandomSecret()).ok());
  // Long enough but all one character, or seven: refused whatever the length.
  EXPECT_TRUE(absl::StrContains(CheckSecret("S", std::string(100, 'a')).message(),
                                "this one has 100 characters, 1 different, about 400 bits"));
  EXPECT_FALSE(CheckSecret("S", "abcdefgabcdefgabcdefgabcdefgabcdefg").ok());
  EXPECT_TRUE(CheckSecret("S", "abcdefghabcdefghabcdefghabcdefgh").ok());
}

// The data plane's keyed tags: a permutation of the sources at every destination (no two
// sources share a value there), different for another destination and for another key.
TEST(SecretTest, KeyedPairTagsAreAKeyedPermutationOfTheSources) {
  const std::string key = DataPlaneTagKey("the job's secret");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_NE(key, DataPlaneTagKey("another secret"));
  const std::string other = DataPlaneTagKey("another secret");
  std::set<uint32_t> at_zero;
  int same_elsewhere = 0, same_other_key = 0, identity = 0;
  for (int s = 0; s < 4096; ++s) {
    const uint32_t t = KeyedPairTag(key, s, 0);
    EXPECT_EQ(t, KeyedPairTag(key, s, 0));  // every rank computes the same value
    at_zero.insert(t);
    same_elsewhere += t == KeyedPairTag(key, s, 1);
    same_other_key += t == KeyedPairTag(other, s, 0);
    identity += t == static_cast<uint32_t>(s);
  }
  EXPECT_EQ(at_zero.size(), 4096u);
  // Each would be a 1 in 2^32 coincidence per pair.
  EXPECT_EQ(same_elsewhere, 0);
  EXPECT_EQ(same_other_key, 0);
  EXPECT_EQ(identity, 0);
  // Known answers, so the function never changes silently (ranks built apart must agree).
  EXPECT_EQ(KeyedPairTag(DataPlaneTagKey("s3cret"), 0, 1), 0x2f956be9u);
  EXPECT_EQ(KeyedPairTag(DataPlaneTagKey("s3cret"), 1, 0), 0x812c645eu);
}

TEST(SecretTest, ASecretFileMustBePrivateToItsOwner) {
  const std::string dir = TempDir();
  const std::string good = Write(dir, "good", std::string(kHex128) + "\n", 0600);
  EXPECT_EQ(*ReadSecretFile("--secret-file", good), kHex128);
  EXPECT_EQ(*ReadSecretFile("--secret-file", Write(dir, "ro", kHex128, 0400)), kHex128);
  // A one-byte secret file is as weak as BRAID_JOB_SECRET=x.
  const std::string weak = Write(dir, "weak", "x\n", 0600);
  EXPECT_TRUE(absl::StartsWith(ReadSecretFile("--secret-file", weak).status().message(),
                               "--secret-file '" + weak + "': the secret is too weak: a "
                               "secret must hold at least 128 bits"))
      << ReadSecretFile("--secret-file", weak).status();
  const std::string open = Write(dir, "open", "abc", 0644);
  EXPECT_EQ(ReadSecretFile("--secret-file", open).status().message(),
            "--secret-file: '" + open + "' has mode 0644: other users could read or change "
            "it; it must be 0600 (chmod 600 '" + open + "')");
  EXPECT_FALSE(ReadSecretFile("X", Write(dir, "group", "abc", 0640)).ok());
  EXPECT_FALSE(ReadSecretFile("X", Write(dir, "gw", "abc", 0620)).ok());
  EXPECT_EQ(ReadSecretFile("X", Write(dir, "empty", " \n", 0600)).status().message(),
            "X: '" + dir + "/empty' is empty");
  EXPECT_EQ(ReadSecretFile("X", dir).status().message(), "X: '" + dir + "' is not a regular file");
  const std::string link = dir + "/link";
  ASSERT_EQ(symlink(good.c_str(), link.c_str()), 0);
  EXPECT_EQ(ReadSecretFile("X", link).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile("X", dir + "/missing").status().message(),
            "X: cannot open '" + dir + "/missing': No such file or directory");
  const std::string big = Write(dir, "big", std::string(kMaxSecretFileBytes + 1, 'x'), 0600);
  EXPECT_EQ(ReadSecretFile("X", big).status().message(),
            "X: '" + big + "' is larger than 65536 bytes");
}

TEST(SecretTest, ReadOrCreateMakesOnePrivateSecretEvenWhenRacing) {
  const std::string dir = TempDir();
  const std::string path = dir + "/made";
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      auto s = ReadOrCreateSecretFile("key", path);
      got[i] = s.ok() ? *s : s.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& s : got) EXPECT_EQ(s, got[0]);
  EXPECT_EQ(got[0].size(), 64u) << got[0];
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*ReadOrCreateSecretFile("key", path), got[0]);  // read back, not remade
  // Only the secret is left in the directory: no temporary files.
  EXPECT_EQ(system(("test $(ls -A '" + dir + "' | wc -l) -eq 1").c_str()), 0);
}

}  // namespace
}  // namespace braid
