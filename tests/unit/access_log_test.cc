#include "http/access_log.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace xdpq;
using namespace xdpq::http;

namespace {

std::string read_all(const std::string &path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

dataplane::Address v6(const char *ip, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  inet_pton(AF_INET6, ip, &a.sin6_addr);
  return dataplane::Address::from(reinterpret_cast<sockaddr *>(&a), sizeof(a));
}

} // namespace

// A hostile target, Referer or User-Agent stays one line with its fields
// inside their quotes, and a huge one is cut.
TEST(AccessLog, ClientFieldsAreEscapedAndBounded) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("xdpq-access-" + std::to_string(getpid())))
          .string();
  {
    auto log = std::make_shared<AccessLog>(path);
    AccessLogBuffer buf(log);
    Request req;
    req.method = "GET";
    req.path = "/a\nb\" 200 1 \"-\" \"forged\r\n";
    req.headers.add("user-agent", std::string(5000, 'u'));
    req.headers.add("referer", "\xff\x01\\");
    const auto peer = v6("2001:db8::7", 443);
    buf.record(&peer, req, "HTTP/3", 200, 12345, 1'500'000);
    Request bare;
    buf.record(nullptr, bare, "HTTP/1.1", 0, 0, 0);
    const auto mapped = v6("::ffff:192.0.2.9", 443); // an IPv4 client of a [::] listener
    buf.record(&mapped, bare, "HTTP/2", 204, 0, 0);
    EXPECT_FALSE(buf.pending().empty()); // buffered until a flush
    EXPECT_EQ(read_all(path), "");
  } // the buffer flushes as it goes
  const std::string text = read_all(path);
  std::istringstream lines(text);
  std::string first, second, third, extra;
  ASSERT_TRUE(std::getline(lines, first));
  ASSERT_TRUE(std::getline(lines, second));
  ASSERT_TRUE(std::getline(lines, third));
  EXPECT_FALSE(std::getline(lines, extra)) << text;
  EXPECT_TRUE(third.starts_with("192.0.2.9 - - [")) << third;
  EXPECT_TRUE(first.starts_with("2001:db8::7 - - [")) << first;
  EXPECT_NE(first.find("\"GET /a\\x0ab\\x22 200 1 \\x22-\\x22 \\x22forged\\x0d\\x0a HTTP/3\" 200 "
                       "12345 \"\\xff\\x01\\x5c\" \""),
            std::string::npos)
      << first;
  EXPECT_NE(first.find(std::string(AccessLogBuffer::MAX_FIELD, 'u') + "...\" 0.001500"),
            std::string::npos);
  EXPECT_TRUE(second.starts_with("- - - [")) << second;
  EXPECT_TRUE(second.ends_with("\"- - HTTP/1.1\" 0 0 \"-\" \"-\" 0.000000")) << second;
  std::filesystem::remove(path);
}

// Regression: with the disk full, the write that ends a line cut short
// failed too, and the next line written once there was room again was
// glued to the fragment: two requests on one line, quotes unbalanced.
// A file size limit stands in for the full disk (EFBIG, SIGXFSZ ignored
// as xdpqd ignores it).
TEST(AccessLog, ALineCutByAFullDiskIsEndedByTheNextWrite) {
  const std::string path = "/tmp/xdpq-access-cut-" + std::to_string(getpid()) + ".log";
  std::filesystem::remove(path);
  {
    AccessLog log(path);
    const std::string first(59, 'a'), second(59, 'b');
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    auto previous = signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 100;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    const bool ok = log.write(first + "\n" + second + "\n"); // 60 + 40 of 60
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, previous);
    EXPECT_FALSE(ok);
    EXPECT_TRUE(log.write("after\n"));
  }
  const std::string text = read_all(path);
  std::filesystem::remove(path);
  EXPECT_EQ(text, std::string(59, 'a') + "\n" + std::string(40, 'b') + "\nafter\n");
}
