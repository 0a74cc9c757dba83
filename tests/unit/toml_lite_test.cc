#include "control/toml_lite.h"

#include <gtest/gtest.h>

using namespace xdpq::control;

namespace {
std::string error_of(std::string_view text) {
  try {
    parse_toml(text);
  } catch (const TomlError &e) {
    return e.what();
  }
  return "";
}
} // namespace

TEST(TomlLite, ParsesTheSubsetWeUse) {
  auto doc = parse_toml("# comment\n"
                        "[server]\r\n"
                        "listen = [\"0.0.0.0:443\", # first\n"
                        "  '[::]:443',  # literal\n"
                        "]\n"
                        "workers = 1_000\n"
                        "neg = -5\n"
                        "busy = true   # trailing\n"
                        "[tls]\n"
                        "cert = \"/etc/x\\u00e9\\t\\\"q\\\"\"\n"
                        "empty = \"\"");
  ASSERT_EQ(doc.sections.size(), 2u);
  EXPECT_EQ(doc.sections[1].name, "tls");
  EXPECT_EQ(doc.sections[1].line, 9);
  ASSERT_EQ(doc.entries.size(), 6u);
  const auto &listen = doc.entries[0].value;
  ASSERT_EQ(listen.type, TomlValue::Type::array);
  ASSERT_EQ(listen.array.size(), 2u);
  EXPECT_EQ(listen.array[1].str, "[::]:443");
  EXPECT_EQ(doc.entries[1].value.integer, 1000);
  EXPECT_EQ(doc.entries[2].value.integer, -5);
  EXPECT_TRUE(doc.entries[3].value.boolean);
  EXPECT_EQ(doc.entries[4].section, "tls");
  EXPECT_EQ(doc.entries[4].value.str, "/etc/x\xc3\xa9\t\"q\"");
  EXPECT_EQ(doc.entries[4].line, 10);
  EXPECT_EQ(doc.entries[5].value.str, "");
}

// Regression (found by fuzz_config): Debian's toml11 read past a heap
// buffer on this 4-byte file; now it is a syntax error like any other.
TEST(TomlLite, BadInputIsAnErrorWithAPlace) {
  EXPECT_NE(error_of("'\xbc'["), "");
  struct Case {
    const char *text;
    const char *message;
  } cases[] = {
      {"[a]\nx = 1\nx = 2\n", "line 3"},
      {"[a]\n[a]\n", "defined twice"},
      {"a.b = 1\n", "dotted keys"},
      {"[a.b]\n", "nested tables"},
      {"[[a]]\n", "arrays of tables"},
      {"x = 1.5\n", "floats"},
      {"x = 1979-05-27\n", "dates"},
      {"x = 0x10\n", "decimal"},
      {"x = 012\n", "leading zeros"},
      {"x = 99999999999999999999\n", "out of range"},
      {"x = \"open\n", "unterminated"},
      {"x = \"\\q\"\n", "escape"},
      {"x = \"\xff\"\n", "UTF-8"},
      {"x = \"\xc0\xaf\"\n", "UTF-8"},
      {"x = \"\xed\xa0\x80\"\n", "UTF-8"},
      {"x = 'a\x01b'\n", "control character"},
      {"x = [1, [2]]\n", "nested arrays"},
      {"x = [1 2]\n", "expected ','"},
      {"x = [1,\n", "unterminated array"},
      {"x = {a = 1}\n", "inline tables"},
      {"x = \"\"\"multi\"\"\"\n", "multi-line"},
      {"x = truex\n", "after the value"},
      {"x = 1 y = 2\n", "end of the line"},
      {"\"quoted\" = 1\n", "quoted keys"},
      {"= 1\n", "expected a key"},
      {"x 1\n", "expected '='"},
      {"x =\n", "expected a value"},
  };
  for (const auto &c : cases) {
    std::string e = error_of(c.text);
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << " -> " << e;
    EXPECT_NE(e.find("line "), std::string::npos) << c.text;
  }
}
