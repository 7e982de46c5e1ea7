// Names as the wire carries them (common/limits.h): proto3 strings, which must be UTF-8, so a
// name that is not is refused where it enters, naming the byte, and quoted escaped.
#include <string>

#include "common/limits.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

TEST(Utf8Test, FirstInvalidByteFollowsRfc3629) {
  EXPECT_EQ(InvalidUtf8Offset(""), 0u);
  EXPECT_EQ(InvalidUtf8Offset("grad.weight"), 11u);
  EXPECT_EQ(InvalidUtf8Offset("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), 14u);  // é € 😀
  EXPECT_EQ(InvalidUtf8Offset("g\x80"), 1u);                   // a stray continuation byte
  EXPECT_EQ(InvalidUtf8Offset("g\xc3"), 1u);                   // truncated
  EXPECT_EQ(InvalidUtf8Offset("\xc0\xaf"), 0u);                // overlong '/'
  EXPECT_EQ(InvalidUtf8Offset("\xe0\x80\xaf"), 0u);            // overlong, 3 bytes
  EXPECT_EQ(InvalidUtf8Offset("ab\xed\xb2\x80"), 2u);          // the surrogate U+DC80
  EXPECT_EQ(InvalidUtf8Offset("\xf4\x90\x80\x80"), 0u);        // past U+10FFFF
  EXPECT_EQ(InvalidUtf8Offset("\xef\xbf\xbf\xf4\x8f\xbf\xbf"), 7u);  // U+FFFF, U+10FFFF
  EXPECT_EQ(InvalidUtf8Offset("x\xff"), 1u);
}

TEST(Utf8Test, ANameThatIsNotUtf8IsRefusedAndQuotedEscaped) {
  EXPECT_TRUE(CheckName("name", "caf\xc3\xa9").ok());
  EXPECT_EQ(CheckName("name", "g\x80").message(),
            "name is not valid UTF-8: byte 0x80 at offset 1 of 'g\\x80' (names travel as UTF-8 "
            "text)");
  EXPECT_EQ(CheckName("the name", "ab\xed\xb2\x80").message(),
            "the name is not valid UTF-8: byte 0xed at offset 2 of 'ab\\xed\\xb2\\x80' (names "
            "travel as UTF-8 text)");
  EXPECT_EQ(Printable("grad"), "grad");
  EXPECT_EQ(Printable("g\x80"), "g\\x80");
}

}  // namespace
}  // namespace braid
