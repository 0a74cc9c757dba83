#include "base/log.h"

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
