#include "base/log.h"
#include "base/utf8.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace {

// What the logger writes to stderr while f runs.
template <typename F> std::string captured(F f) {
  char path[] = "/tmp/xdpq-log-test-XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  unlink(path);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  f();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  char buf[65536];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

} // namespace

TEST(Log, ALongLineIsWrittenWhole) {
  // Longer than the logger's stack buffer (the exit statistics of a worker
  // with upstreams and AF_XDP rings are): one line, the whole message.
  std::string text = "{";
  while (text.size() < 10000) text += "\"counter_" + std::to_string(text.size()) + "\":0,";
  text += "\"end\":1}";
  std::string out = captured([&] { LOG_INFO("stats %s", text.c_str()); });
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1); // one line
  EXPECT_NE(out.find("stats " + text + "\n"), std::string::npos);
}

TEST(Log, AHugeLineIsCutAtTheJournalLimit) {
  std::string text(100000, 'x');
  std::string out = captured([&] { LOG_WARN("%s", text.c_str()); });
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.find('\n'), out.size() - 1);
  EXPECT_LT(out.size(), 49u * 1024);
  EXPECT_GT(out.size(), 48u * 1024);
}

TEST(Log, AShortLineIsUnchanged) {
  std::string out = captured([] { LOG_ERROR("plain %d", 42); });
  EXPECT_EQ(out.find('\n'), out.size() - 1);
  EXPECT_NE(out.find("error: plain 42\n"), std::string::npos);
}

TEST(Utf8, WellFormedSequencesOnly) {
  using xdpq::utf8_sequence;
  EXPECT_EQ(utf8_sequence("a"), 1u);
  EXPECT_EQ(utf8_sequence("\xc3\xa9"), 2u);         // é
  EXPECT_EQ(utf8_sequence("\xe2\x82\xac"), 3u);     // €
  EXPECT_EQ(utf8_sequence("\xf0\x9f\x98\x80"), 4u); // U+1F600
  EXPECT_EQ(utf8_sequence("\xff"), 0u);
  EXPECT_EQ(utf8_sequence("\x80"), 0u);             // a continuation byte alone
  EXPECT_EQ(utf8_sequence("\xc0\xaf"), 0u);         // overlong '/'
  EXPECT_EQ(utf8_sequence("\xe0\x80\xaf"), 0u);     // overlong '/'
  EXPECT_EQ(utf8_sequence("\xed\xa0\x80"), 0u);     // a surrogate
  EXPECT_EQ(utf8_sequence("\xf4\x90\x80\x80"), 0u); // past U+10FFFF
  EXPECT_EQ(utf8_sequence("\xe2\x82"), 0u);         // cut short
  EXPECT_EQ(utf8_sequence("\xe2\x28\xac"), 0u);     // not a continuation
  std::string out;
  xdpq::append_utf8(out, "a\xff\xc3\xa9\"", [](std::string &o, char c) {
    if (c == '"') o += "\\\"";
    else o += c;
  });
  EXPECT_EQ(out, "a\xef\xbf\xbd\xc3\xa9\\\"");
}
