// HTTP/1.1 and HTTP/2 sessions driven directly, without a socket: what a
// drain's shutdown() makes of the requests already read and of those still
// coming, and how client errors are counted.

#include "http/router.h"
#include "http/tcp_session.h"

#include "h2_frames.h"

#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

using namespace xdpq::http;

namespace {

// Everything a session has to write now.
std::string drain_output(TcpSession &session) {
  std::string all;
  for (int i = 0; i < 64; ++i) {
    std::vector<uint8_t> out;
    session.produce(out, 256 * 1024);
    if (out.empty()) break;
    all.append(out.begin(), out.end());
  }
  return all;
}

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

  std::string drain() { return drain_output(*session_); }

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

// A pipelining client that keeps sending while it reads its answers:
// the connection reads a chunk whenever the session is not paused, as
// TcpConnection's loop does. Each read was added to the unparsed input
// while only a queue's worth (32 requests) of it was parsed per round, so
// the held input grew by nearly every byte the client sent.
TEST_F(H1Drain, AKeptPipelineHoldsNoMoreThanOneRead) {
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string stream;
  while (stream.size() < (4u << 20)) stream += req;
  constexpr size_t READ = 16384;
  size_t fed = 0, answered = 0;
  for (int round = 0; round < 400 && fed + READ <= stream.size(); ++round) {
    if (!session_->input_paused()) {
      session_->on_input(reinterpret_cast<const uint8_t *>(stream.data() + fed), READ, now_);
      fed += READ;
    }
    while (session_->has_buffered_input()) session_->on_input(nullptr, 0, now_);
    answered += count(drain(), "HTTP/1.1 200 OK\r\n");
  }
  EXPECT_GT(answered, 0u);
  // What was read but not answered: at most a read and a request.
  EXPECT_LE(fed, answered * req.size() + READ + req.size())
      << "read " << fed << " bytes, answered " << answered << " requests";
}

namespace {

using xdpq::testing::h2_frame;

// The error codes of the GOAWAY frames in a server's output.
std::vector<uint32_t> goaway_codes(const std::string &out) {
  std::vector<uint32_t> codes;
  for (const auto &f : xdpq::testing::h2_frames(out)) {
    if (f.type == 7 && f.payload.size() >= 8) codes.push_back(f.word(4));
  }
  return codes;
}

// An HTTP/2 session on the default routes, and the client preface (with
// an empty SETTINGS) to start its input with.
struct H2Setup {
  TcpStats stats;
  MemoryBudget budget{8u << 20};
  SessionEnv env;
  std::unique_ptr<TcpSession> session;
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, "");
  H2Setup() {
    env.router = make_default_router(RouterConfig{"", 65536, {}});
    env.stats = &stats;
    env.budget = &budget;
    session = make_h2_session(env);
  }
  // Feeds the client's bytes; what the server writes in answer.
  std::string exchange(const std::string &in) {
    session->on_input(reinterpret_cast<const uint8_t *>(in.data()), in.size(), 1'000'000'000);
    return drain_output(*session);
  }
};

} // namespace

// A client's error on a stream is counted once against the connection's
// limit of protocol errors (100): nghttp2 reports the invalid frame and
// then sends its RST_STREAM, and both were counted, so the connection
// closed at the 50th.
TEST(H2Errors, AStreamErrorCountsOnce) {
  H2Setup h;
  auto &stats = h.stats;
  auto &session = h.session;
  std::string in = h.preface;
  // GET https / with :authority x; then a WINDOW_UPDATE that takes that
  // stream's window past 2^31-1 (a stream error, RFC 9113 6.9.1).
  const std::string head = std::string("\x82\x87\x84\x01\x01x", 6);
  for (uint32_t i = 0; i < 60; ++i) {
    const uint32_t sid = 1 + 2 * i;
    in += h2_frame(1, 5, sid, head);
    in += h2_frame(8, 0, sid, std::string("\x7f\xff\xff\xff", 4));
  }
  const std::string out = h.exchange(in);
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{});
  EXPECT_EQ(stats.protocol_error_closes, 0u);
  EXPECT_FALSE(session->finished());
}

namespace {
// An HPACK integer with an n-bit prefix (RFC 7541 5.1), first byte's high
// bits from `high`.
std::string hpack_int(uint8_t high, int n, size_t v) {
  std::string s;
  const size_t max = (size_t{1} << n) - 1;
  if (v < max) return std::string(1, static_cast<char>(high | v));
  s += static_cast<char>(high | max);
  v -= max;
  while (v >= 128) {
    s += static_cast<char>(0x80 | (v & 0x7f));
    v >>= 7;
  }
  s += static_cast<char>(v);
  return s;
}
} // namespace

// Regression (review): a 431 to a HEADERS frame that ended its stream was
// followed by RST_STREAM(NO_ERROR), meant for a request whose body is
// still coming: the stream had closed with the answer.
TEST(H2Errors, A431ToAWholeRequestIsNotFollowedByAReset) {
  H2Setup h;
  // GET https /healthz with :authority x and a 20,000-byte field (over the
  // 16 KiB head limit): HEADERS with END_STREAM, then CONTINUATION with
  // END_HEADERS (a frame holds 16 KiB).
  const std::string big(20000, 'b');
  const std::string head = std::string("\x82\x87\x04\x08/healthz\x01\x01x", 15) + std::string(1, '\0') +
                           hpack_int(0, 7, 5) + "x-big" + hpack_int(0, 7, big.size()) + big;
  const std::string out = h.exchange(h.preface + h2_frame(1, 1, 1, head.substr(0, 10000)) +
                                     h2_frame(9, 4, 1, head.substr(10000)));
  bool answered = false, reset = false;
  for (const auto &f : xdpq::testing::h2_frames(out)) {
    if (f.stream != 1) continue;
    answered |= f.type == 1;
    reset |= f.type == 3;
  }
  EXPECT_TRUE(answered);
  EXPECT_EQ(h.stats.header_limit_rejects, 1u);
  EXPECT_FALSE(reset);
}

// Regression: trailers were counted on top of the head and never acted
// on below four times the size limit: a request whose trailers held 200
// fields (over the 128 allowed) was answered as if they were fine. Like
// HTTP/3's, they are now a section of their own under the same limits,
// and over them the request gets 431.
TEST(H2Errors, TrailersOverTheHeaderLimitsGet431) {
  H2Setup h;
  // POST https /echo with :authority x; a byte of body; trailers of 200
  // literal fields "x-a: v", ending the stream.
  const std::string head("\x83\x87\x04\x05/echo\x01\x01x", 12);
  std::string trailers;
  for (int i = 0; i < 200; ++i) trailers += std::string("\x00\x03x-a\x01v", 7);
  h.exchange(h.preface + h2_frame(1, 4, 1, head) + h2_frame(0, 0, 1, "x") +
             h2_frame(1, 5, 1, trailers));
  EXPECT_EQ(h.stats.header_limit_rejects, 1u);
  EXPECT_EQ(h.stats.responses_4xx, 1u);
  EXPECT_EQ(h.stats.responses_2xx, 0u);
}

// Regression (review): nghttp2 allows 8 CONTINUATION frames by default,
// about 144 KiB of head: with --max-header-size set higher, a head larger
// than that closed the whole connection (GOAWAY) where HTTP/1.1 and
// HTTP/3 took it.
TEST(H2Limits, AHeadUpToTheConfiguredLimitFitsInContinuations) {
  H2Setup h;
  h.env.limits.max_header_size = 262144;
  h.session = make_h2_session(h.env);
  std::string head("\x82\x87\x04\x08/healthz\x01\x01x", 15); // GET https /healthz, :authority x
  const std::string value(50000, 'v');
  for (int i = 0; i < 4; ++i) { // 200 KB, each field under nghttp2's 64 KiB
    head += std::string(1, '\0') + hpack_int(0, 7, 3) + "x-" + std::to_string(i) +
            hpack_int(0, 7, value.size()) + value;
  }
  std::string in = h.preface;
  for (size_t at = 0; at < head.size(); at += 16384) {
    const bool first = at == 0, last = at + 16384 >= head.size();
    in += h2_frame(first ? 1 : 9, (first ? 1 : 0) | (last ? 4 : 0), 1, head.substr(at, 16384));
  }
  const std::string out = h.exchange(in);
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{});
  EXPECT_EQ(h.stats.responses_2xx, 1u);
}

// Regression (review): a request answered before its body ended with an
// error (431 here) had the rest of its body read and credited until the
// answer was out, with no limit: a client whose window keeps the answer in
// could upload without end. And a body past the limit on a stream
// answered at its head was reset with NO_ERROR at once, cutting an answer
// not yet out. Now past the limit the stream's credit stops, and the reset
// waits for the answer's end.
TEST(H2Limits, ABodyAfterItsAnswerIsBoundedAndTheAnswerEndsWhole) {
  H2Setup h;
  h.env.limits.max_request_body = 64 * 1024;
  h.session = make_h2_session(h.env);
  const std::string window0("\x00\x04\x00\x00\x00\x00", 6); // INITIAL_WINDOW_SIZE 0
  std::string out = h.exchange("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, window0) +
                               h2_frame(4, 1, 0, ""));
  // POST https /echo with :authority x and a 20,000-byte field: 431, its
  // body held in by the window; no END_STREAM.
  const std::string big(20000, 'b');
  const std::string head = std::string("\x83\x87\x04\x05/echo\x01\x01x", 12) +
                           std::string(1, '\0') + hpack_int(0, 7, 5) + "x-big" +
                           hpack_int(0, 7, big.size()) + big;
  out = h.exchange(h2_frame(1, 0, 1, head.substr(0, 10000)) + h2_frame(9, 4, 1, head.substr(10000)));
  EXPECT_EQ(h.stats.header_limit_rejects, 1u);
  int64_t credit = 1 << 20; // the server's stream window
  uint64_t sent = 0;
  const std::string chunk(16384, 'd');
  auto reset = [](const std::string &o) {
    for (const auto &f : xdpq::testing::h2_frames(o)) {
      if (f.type == 3 && f.stream == 1) return true;
    }
    return false;
  };
  bool was_reset = false;
  while (credit >= static_cast<int64_t>(chunk.size()) && sent < (8u << 20)) {
    out = h.exchange(h2_frame(0, 0, 1, chunk));
    sent += chunk.size();
    credit -= static_cast<int64_t>(chunk.size());
    for (const auto &f : xdpq::testing::h2_frames(out)) {
      if (f.type == 8 && f.stream == 1) credit += f.word();
    }
    was_reset |= reset(out);
  }
  EXPECT_LE(sent, 64u * 1024 + (1u << 20) + chunk.size()) << "credited without limit";
  EXPECT_FALSE(was_reset) << "reset before the answer went out";
  // The client lets the answer out: it ends whole, and then the stream is
  // reset (NO_ERROR).
  out = h.exchange(h2_frame(8, 0, 1, std::string("\x00\x01\x00\x00", 4)));
  bool ended = false;
  uint32_t code = 99;
  for (const auto &f : xdpq::testing::h2_frames(out)) {
    if (f.stream != 1) continue;
    if (f.type == 0 && (f.flags & 1)) ended = true;
    if (f.type == 3) {
      EXPECT_TRUE(ended) << "reset before the answer's end";
      code = f.word();
    }
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(code, 0u);
}

// Regression (review): every field of an HTTP/2 head counted against the
// limit of 128, the four pseudo-header fields and each cookie crumb too (a
// browser splits its Cookie line into one field per cookie, RFC 9113
// 8.2.3). A browser holding 130 cookies got 431 where its HTTP/1.1 request
// (one Cookie line) was served.
TEST(H2Limits, CookieCrumbsCountAsTheOneLineTheyAre) {
  H2Setup h;
  std::string head("\x82\x87\x04\x08/healthz\x01\x01x", 15); // GET https /healthz, :authority x
  for (int i = 0; i < 130; ++i) {
    const std::string crumb = "c" + std::to_string(i) + "=v";
    head += std::string(1, '\0') + hpack_int(0, 7, 6) + "cookie" + hpack_int(0, 7, crumb.size()) +
            crumb;
  }
  h.exchange(h.preface + h2_frame(1, 5, 1, head));
  EXPECT_EQ(h.stats.header_limit_rejects, 0u);
  EXPECT_EQ(h.stats.responses_2xx, 1u);
  // Other fields still count: 130 of them are over the limit.
  std::string many("\x82\x87\x04\x08/healthz\x01\x01x", 15);
  for (int i = 0; i < 130; ++i) many += std::string("\x00\x03x-a\x01v", 7);
  h.exchange(h2_frame(1, 5, 3, many));
  EXPECT_EQ(h.stats.header_limit_rejects, 1u);
}

// Regression: each of a connection's stream slots kept, for the
// connection's life, the buffers its largest request head needed (up to
// 16 KiB of fields, lines and body each): a client that opened 100
// streams with 12 KiB heads once left about 1.2 MiB behind per idle
// connection, counted nowhere. Now a slot keeps 4 KiB freely and a
// connection's slots 128 KiB beyond that in all; the rest is given back as
// they close. Ordinary requests, however many streams, keep reusing
// everything.
TEST(H2Slots, ManyStreamsWithLargeHeadsLeaveLittleBehind) {
  H2Setup h;
  auto &stats = h.stats;
  auto &session = h.session;
  std::string in = h.preface;
  h.exchange(in);
  // GET https /healthz with :authority x and a 12,000-byte field, literal
  // (not indexed), on 100 streams at once.
  const std::string big(12000, 'b');
  const std::string head = std::string("\x82\x87\x04\x08/healthz\x01\x01x", 15) + std::string(1, '\0') +
                           hpack_int(0, 7, 5) + "x-big" + hpack_int(0, 7, big.size()) + big;
  in.clear();
  for (uint32_t i = 0; i < 100; ++i) in += h2_frame(1, 5, 1 + 2 * i, head);
  const std::string out = h.exchange(in);
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{});
  EXPECT_EQ(stats.requests, 100u);
  EXPECT_LE(session->idle_slot_bytes(), 256u * 1024); // about 1.2 MiB before

  // Rounds of 100 ordinary streams each: once the slots have grown to the
  // shapes of the fields (the first rounds), a round reuses what the last
  // left (nothing is given back, nothing grows).
  H2Setup o;
  in = o.preface;
  // GET https /healthz (a short answer: the connection's window, never
  // extended here, holds all of them) with :authority x and a user-agent.
  const std::string plain = std::string("\x82\x87\x04\x08/healthz\x01\x01x", 15) +
                            std::string(1, '\0') + hpack_int(0, 7, 10) + "user-agent" +
                            hpack_int(0, 7, 40) + std::string(40, 'u');
  size_t idle[3];
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 0; i < 100; ++i) in += h2_frame(1, 5, 1 + 2 * (100 * round + i), plain);
    o.exchange(in);
    in.clear();
    idle[round] = o.session->idle_slot_bytes();
  }
  EXPECT_EQ(o.stats.requests, 300u);
  EXPECT_GT(idle[0], 0u);
  EXPECT_GE(idle[1], idle[0]);
  EXPECT_EQ(idle[2], idle[1]);
}

// Regression: a stream the server reset because its file shrank under the
// download (INTERNAL_ERROR rather than a short body) counted as a protocol
// error of the client's; a client downloading a file being rewritten was
// closed with ENHANCE_YOUR_CALM at the limit (100; 3 here).
TEST(H2Errors, AFileThatShrinksIsNoErrorOfTheClients) {
  char dir[] = "/tmp/xdpq-h2-shrink-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/big.bin";
  auto write_file = [&](size_t n) {
    FILE *f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string data(n, 'z');
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  };
  write_file(256 * 1024); // read on demand, not held in memory
  H2Setup h;
  RouterConfig rc;
  rc.docroot = dir;
  h.env.router = make_default_router(rc);
  h.env.limits.max_protocol_errors = 3;
  h.session = make_h2_session(h.env);
  std::string in = h.preface;
  std::string out = h.exchange(in);
  // GET https /big.bin with :authority x, five times, the file cut short
  // under each before its body goes out.
  const std::string get = std::string("\x82\x87\x04\x08/big.bin\x01\x01x", 15);
  for (uint32_t i = 0; i < 5; ++i) {
    in = h2_frame(1, 5, 1 + 2 * i, get);
    h.session->on_input(reinterpret_cast<const uint8_t *>(in.data()), in.size(), 1'000'000'000);
    truncate(file.c_str(), 0);
    out += drain_output(*h.session);
    write_file(256 * 1024);
  }
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{});
  EXPECT_EQ(h.stats.protocol_error_closes, 0u);
  EXPECT_FALSE(h.session->finished());
  std::remove(file.c_str());
  rmdir(dir);
}

class H1Head : public H1Drain {};

// Regression (review): http-parser stops a head at 80 KiB of its own, and
// that error was answered 400: a limit configured above it was never
// reached (HTTP/2 and HTTP/3 served the same request), and a head past it
// got 400 where the configured limit says 431.
TEST_F(H1Head, TheConfiguredHeadLimitIsTheOneThatHolds) {
  env_.limits.max_header_size = 200'000;
  session_ = make_h1_session(env_);
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100'000, 'a') + "\r\n\r\n");
  std::string out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 200 OK\r\n")) << out.substr(0, 200);

  env_.limits.max_header_size = 16384;
  session_ = make_h1_session(env_);
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(90'000, 'a') + "\r\n\r\n");
  out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 431 ")) << out.substr(0, 200);
  EXPECT_EQ(stats_.header_limit_rejects, 1u);
}

// A head over the limit is answered as soon as it is over, not once it
// ends: a client that never ends it was read up to the parser's own cap.
TEST_F(H1Head, AHeadOverTheLimitIsAnsweredBeforeItEnds) {
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20'000, 'a'));
  std::string out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 431 ")) << out.substr(0, 200);
  EXPECT_TRUE(session_->finished());
  EXPECT_EQ(stats_.header_limit_rejects, 1u);
  EXPECT_EQ(stats_.requests, 1u);

  // Too many fields, likewise.
  session_ = make_h1_session(env_);
  std::string many = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 200; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  feed(many);
  out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 431 ")) << out.substr(0, 200);
  EXPECT_EQ(stats_.header_limit_rejects, 2u);
}

// Regression (review): a request line with junk for its "HTTP", or none
// (HTTP/0.9's form, served without a Host), or version 0.x was served.
TEST_F(H1Head, ARequestLineWithoutAnHttp1VersionIsRefused) {
  const std::pair<std::string, const char *> cases[] = {
      {"GET / H" + std::string(4, '\0') + "1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400 "},
      {"GET /healthz\r\n\r\n", "HTTP/1.1 400 "},
      {"GET /healthz HTTP/0.5\r\n\r\n", "HTTP/1.1 505 "},
  };
  for (const auto &[request, status] : cases) {
    session_ = make_h1_session(env_);
    feed(request);
    const std::string out = drain();
    EXPECT_TRUE(out.starts_with(status)) << out.substr(0, 200);
    EXPECT_TRUE(session_->finished());
  }
}

// Regression (review): the head limit counted only what the parser's
// callbacks see, and whitespace around a value or the target is not:
// with http-parser's own cap raised, a megabyte of it was served. The
// framing check bounds a head's wire bytes too.
TEST_F(H1Head, WhitespaceTheParserSkipsCountsTowardsTheHeadLimit) {
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\nX:" + std::string(100'000, ' ') + "v\r\n\r\n");
  const std::string out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 431 ")) << out.substr(0, 200);
  EXPECT_EQ(stats_.header_limit_rejects, 1u);
}

// Regression (review): frames that ask work and carry no request (SETTINGS,
// whose every INITIAL_WINDOW_SIZE entry walks all the streams nghttp2
// keeps; PING; PRIORITY; empty DATA) were unlimited for a client that
// reads the replies (nghttp2 1.52 bounds only the unread ones).
TEST(H2Limits, AFloodOfControlFramesIsCalmedDown) {
  H2Setup h;
  std::string out = h.exchange(h.preface);
  std::string pings;
  for (int i = 0; i < 100; ++i) pings += h2_frame(6, 0, 0, std::string(8, 'p'));
  out = h.exchange(pings); // a client's ordinary share: answered
  EXPECT_EQ(xdpq::testing::h2_frames(out).size(), 100u);
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{});
  std::string entries;
  for (int k = 0; k < 6; ++k) {
    entries += k % 2 ? std::string("\x00\x04\x00\x00\xff\xff", 6)
                     : std::string("\x00\x04\x00\x01\x00\x00", 6);
  }
  int rounds = 0;
  for (; rounds < 50 && goaway_codes(out).empty(); ++rounds) {
    std::string burst;
    for (int i = 0; i < 10; ++i) burst += h2_frame(4, 0, 0, entries);
    out = h.exchange(burst); // each one acknowledged, and read
  }
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{11}); // ENHANCE_YOUR_CALM
  EXPECT_GT(rounds, 5);
  EXPECT_EQ(h.stats.protocol_error_closes, 1u);
}

// Regression (review): an empty DATA frame cost the flood limit only when
// its frame length was 0. One padded with nothing (the PADDED flag and a
// pad length of 0: one byte on the wire, no data) cost nothing, and the
// limit let a client send such frames without end.
TEST(H2Limits, PaddedEmptyDataFramesAreCalmedDownToo) {
  H2Setup h;
  const std::string post = std::string("\x83\x87\x84\x01\x01x", 6); // POST https / x
  std::string out = h.exchange(h.preface + h2_frame(1, 4, 1, post));
  int rounds = 0;
  for (; rounds < 50 && goaway_codes(out).empty(); ++rounds) {
    std::string burst;
    for (int i = 0; i < 100; ++i) burst += h2_frame(0, 0x8, 1, std::string(1, '\0')); // PADDED
    out = h.exchange(burst);
  }
  EXPECT_EQ(goaway_codes(out), std::vector<uint32_t>{11}); // ENHANCE_YOUR_CALM
  EXPECT_GT(rounds, 5);
  EXPECT_EQ(h.stats.protocol_error_closes, 1u);
}

// Regression (review): Debian's http-parser checks a field value's bytes
// but not its first: a control byte there was taken, and went on to a
// proxied upstream as it was.
TEST_F(H1Head, AControlByteFirstInAValueIsA400) {
  feed("GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: \x01" "b\r\n\r\n");
  const std::string out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 400 ")) << out.substr(0, 200);
}

// Regression (review): a malformed head followed, in the same read, by
// more than the head limit was answered 431 (the framing check had looked
// that far) where the parser had stopped at the malformed byte: 400.
TEST_F(H1Head, AMalformedHeadIsA400HoweverMuchFollowsIt) {
  std::string in = "GET /healthz HTTP/1.1\r\nHost: x\r\nBad\x01Name: v\r\n";
  for (int i = 0; i < 400; ++i) in += "X-" + std::to_string(i) + ": " + std::string(60, 'v') + "\r\n";
  feed(in);
  const std::string out = drain();
  EXPECT_TRUE(out.starts_with("HTTP/1.1 400 ")) << out.substr(0, 200);
  EXPECT_EQ(stats_.header_limit_rejects, 0u);
}

// Regression (review): a trailer block left open (no END_HEADERS) was not
// a head in progress: the connection ran on the write deadline (30 s),
// not the header deadline (10 s).
TEST(H2Errors, AnOpenTrailerBlockIsTimedLikeAHead) {
  H2Setup h;
  const std::string post = std::string("\x83\x87\x84\x01\x01x", 6); // POST https / x
  h.exchange(h.preface + h2_frame(1, 4, 1, post) + h2_frame(0, 0, 1, "abc"));
  EXPECT_EQ(h.session->headers_started(), 0u); // the head is whole, the body coming
  const std::string trailer = std::string("\x00\x03x-t\x01\x31", 7);
  h.exchange(h2_frame(1, 1, 1, trailer)); // END_STREAM, no END_HEADERS
  EXPECT_NE(h.session->headers_started(), 0u);
  h.exchange(h2_frame(9, 4, 1, "")); // CONTINUATION, END_HEADERS: whole
  EXPECT_EQ(h.session->headers_started(), 0u);
}
