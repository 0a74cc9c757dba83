// HTTP/1.1 sessions driven directly: what a drain's shutdown() makes of
// the requests already read and of those still coming.

#include "http/router.h"
#include "http/tcp_session.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

using namespace xdpq::http;

namespace {

class H1Drain : public ::testing::Test {
protected:
  void SetUp() override {
    env_.router = make_default_router(RouterConfig{"", 65536, {}});
    env_.stats = &stats_;
    env_.budget = &budget_;
    session_ = make_h1_session(env_);
  }

  void feed(std::string_view in) {
    now_ += 1'000'000;
    session_->on_input(reinterpret_cast<const uint8_t *>(in.data()), in.size(), now_);
    while (session_->has_buffered_input()) session_->on_input(nullptr, 0, now_);
  }

  // Everything the session has to write now.
  std::string drain() {
    std::string all;
    for (int i = 0; i < 64; ++i) {
      std::vector<uint8_t> out;
      session_->produce(out, 256 * 1024);
      if (out.empty()) break;
      all.append(out.begin(), out.end());
    }
    return all;
  }

  static size_t count(const std::string &s, std::string_view what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  }

  TcpStats stats_;
  MemoryBudget budget_{8u << 20};
  SessionEnv env_;
  std::unique_ptr<TcpSession> session_;
  uint64_t now_ = 1'000'000'000;
};

} // namespace

// Before, the answers already queued went out as keep-alive ones and the
// connection closed after them unannounced (or, in a hand-over, sat idle),
// so a client's next request raced the close; and a request read after
// the shutdown was still served.
TEST_F(H1Drain, TheLastAnswerToARequestReadBeforeTheShutdownSaysClose) {
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /bytes/5 HTTP/1.1\r\nHost: x\r\n\r\n");
  session_->shutdown();
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); // after it: not served
  const std::string out = drain();
  EXPECT_EQ(count(out, "HTTP/1.1 200 OK\r\n"), 2u) << out;
  EXPECT_EQ(count(out, "connection: close\r\n"), 1u) << out;
  EXPECT_LT(out.find("HTTP/1.1 200", out.find("HTTP/1.1 200") + 1), out.find("connection: close"));
  EXPECT_TRUE(out.ends_with("abcde")) << out;
  EXPECT_TRUE(session_->finished());
}

TEST_F(H1Drain, ARequestWhoseBodyIsStillComingIsAnsweredWholeWithClose) {
  feed("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello");
  session_->shutdown();
  feed("world");
  const std::string out = drain();
  EXPECT_EQ(count(out, "HTTP/1.1 200 OK\r\n"), 1u) << out;
  EXPECT_EQ(count(out, "connection: close\r\n"), 1u) << out;
  EXPECT_TRUE(out.ends_with("helloworld")) << out;
  EXPECT_TRUE(session_->finished());
}

TEST_F(H1Drain, AnIdleConnectionEndsAtOnce) {
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(count(drain(), "HTTP/1.1 200 OK\r\n"), 1u);
  session_->shutdown();
  EXPECT_TRUE(session_->finished());
}
