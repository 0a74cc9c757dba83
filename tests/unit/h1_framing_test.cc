#include "http/h1_framing.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

using xdpq::http::H1FramingCheck;

namespace {

enum class Body { none, length, chunked };

// Runs the check over wire the way the HTTP/1.1 session does, in pieces of
// `step` bytes, telling it each head's framing where the head ends.
// Returns how many bytes passed; failed set if the check refused a byte.
size_t run(std::string_view wire, Body body, uint64_t length = 0, size_t step = 1 << 20,
           bool *failed = nullptr) {
  H1FramingCheck check;
  const auto *p = reinterpret_cast<const uint8_t *>(wire.data());
  size_t at = 0;
  while (at < wire.size()) {
    const size_t n = std::min(step, wire.size() - at);
    const size_t ok = check.allow(p + at, n);
    if (ok == 0) {
      if (check.awaiting_body()) {
        // The parser, having read the head, says how the body is framed.
        switch (body) {
        case Body::none: check.body_none(); break;
        case Body::length: check.body_length(length); break;
        case Body::chunked: check.body_chunked(); break;
        }
        check.take(p + at, 0);
        if (!check.awaiting_body()) continue;
      }
      if (failed) *failed = true;
      return at;
    }
    check.take(p + at, ok);
    at += ok;
  }
  if (failed) *failed = check.failed();
  return at;
}

bool accepted(std::string_view wire, Body body, uint64_t length = 0) {
  for (size_t step : {size_t{1}, size_t{3}, size_t{1} << 20}) {
    bool failed = false;
    if (run(wire, body, length, step, &failed) != wire.size() || failed) return false;
  }
  return true;
}

constexpr std::string_view HEAD = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

std::string chunked(std::string_view body) { return std::string(HEAD) + std::string(body); }

} // namespace

TEST(H1FramingCheck, WellFramedMessagesPass) {
  EXPECT_TRUE(accepted("GET / HTTP/1.1\r\nHost: x\r\n\r\n", Body::none));
  EXPECT_TRUE(accepted("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", Body::none)); // empty lines first
  EXPECT_TRUE(accepted("GET / HTTP/1.1\nHost: x\n\n", Body::none));               // bare LF ends a head line
  EXPECT_TRUE(accepted("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", Body::length, 5));
  EXPECT_TRUE(accepted(chunked("5\r\nhello\r\n0\r\n\r\n"), Body::chunked));
  EXPECT_TRUE(accepted(chunked("5;name=\"v a\"\r\nhello\r\nA\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n"),
                       Body::chunked));
  EXPECT_TRUE(accepted(chunked("5 ;e\r\nhello\r\n000\r\n\r\n"), Body::chunked));
  // Two pipelined requests, the second after a chunked body.
  EXPECT_TRUE(accepted(chunked("1\r\na\r\n0\r\n\r\n") + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                       Body::chunked));
}

TEST(H1FramingCheck, LooseFramingStopsWhereItBreaks) {
  // The cases Debian's http-parser (built without its strict checks) takes:
  const std::string bad[] = {
      chunked("5\r\nhelloXY0\r\n\r\n"),              // no CRLF after the data
      chunked("5\r\nhello\n0\r\n\r\n"),              // LF alone after the data
      chunked("5\rX\nhello\r\n0\r\n\r\n"),           // a CR and another byte ends the size line
      chunked("5;a\nb\r\nhello\r\n0\r\n\r\n"),        // a LF inside the extension
      chunked("5\n\r\nhello\r\n0\r\n\r\n"),           // LF alone ends the size line
      chunked("0\r\nx-t: 1\n\r\n"),                  // LF alone in the trailers
      chunked("\r\nhello\r\n0\r\n\r\n"),              // no size
      chunked("10000000000000000\r\n"),              // past 64 bits
      chunked(std::string("5;") + '\x01' + "\r\nhello\r\n0\r\n\r\n"), // a control byte in the extension
      "GET / HTTP/1.1\r\nHost: x\rX-Smuggled: 1\r\n\r\n", // a bare CR in the head
      "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", // obs-fold
      "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n", // obs-fold with a tab
  };
  for (const auto &wire : bad) {
    for (size_t step : {size_t{1}, size_t{2}, size_t{1} << 20}) {
      bool failed = false;
      const size_t passed = run(wire, Body::chunked, 0, step, &failed);
      EXPECT_TRUE(failed) << wire;
      EXPECT_LT(passed, wire.size()) << wire;
    }
  }
  // The parser stops at the byte that breaks the framing: the data before
  // it passed, nothing after it.
  bool failed = false;
  const std::string wire = chunked("5\r\nhelloXY0\r\n\r\n");
  EXPECT_EQ(run(wire, Body::chunked, 0, 1 << 20, &failed), HEAD.size() + 8);
  EXPECT_TRUE(failed);
}

TEST(H1FramingCheck, BoundsWhatItReadsWithoutProgress) {
  std::string line = chunked("5;");
  line.append(H1FramingCheck::MAX_CHUNK_LINE, 'a');
  bool failed = false;
  run(line, Body::chunked, 0, 1 << 20, &failed);
  EXPECT_TRUE(failed);
  std::string trailers = chunked("0\r\n");
  while (trailers.size() < HEAD.size() + H1FramingCheck::MAX_TRAILERS + 64) trailers += "x-t: 1\r\n";
  failed = false;
  run(trailers, Body::chunked, 0, 1 << 20, &failed);
  EXPECT_TRUE(failed);
}

TEST(H1FramingCheck, WaitsForTheFramingAtTheHeadsEnd) {
  H1FramingCheck check;
  const std::string wire = "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nokGET";
  const auto *p = reinterpret_cast<const uint8_t *>(wire.data());
  const size_t head = wire.find("\r\n\r\n") + 4;
  EXPECT_EQ(check.allow(p, wire.size()), head);
  // The parser took the head and said its body has 2 bytes.
  check.body_length(2);
  check.take(p, head);
  EXPECT_FALSE(check.awaiting_body());
  EXPECT_EQ(check.allow(p + head, wire.size() - head), wire.size() - head);
  // A parser that takes more than it was allowed: the check no longer
  // knows where the message is.
  H1FramingCheck other;
  other.take(p, wire.size());
  EXPECT_TRUE(other.failed());
  EXPECT_EQ(other.allow(p + head, 2), 0u);
}

// take() of exactly what allow() gave reuses its scan; anything else is
// scanned again, and a scan that stopped at a bad byte is never reused for
// the bytes before it.
TEST(H1FramingCheck, TakeAgreesWithAllowHoweverMuchTheParserTook) {
  const std::string wire = "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nok";
  const auto *p = reinterpret_cast<const uint8_t *>(wire.data());
  const size_t head = wire.size() - 2;
  H1FramingCheck check;
  EXPECT_EQ(check.allow(p, wire.size()), head);
  check.take(p, 10); // the parser paused after 10 bytes
  EXPECT_FALSE(check.awaiting_body());
  EXPECT_EQ(check.allow(p + 10, wire.size() - 10), head - 10);
  check.body_length(2);
  check.take(p + 10, head - 10);
  EXPECT_FALSE(check.awaiting_body());
  EXPECT_FALSE(check.failed());
  EXPECT_EQ(check.allow(p + head, 2), 2u);
  check.take(p + head, 2);
  EXPECT_TRUE(check.idle());

  const std::string bad = "HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n";
  const auto *q = reinterpret_cast<const uint8_t *>(bad.data());
  H1FramingCheck strict;
  const size_t ok = strict.allow(q, bad.size());
  EXPECT_EQ(ok, bad.find("\rc") + 1);
  strict.take(q, ok); // what came before the bad byte is fine
  EXPECT_FALSE(strict.failed());
  EXPECT_EQ(strict.allow(q + ok, bad.size() - ok), 0u);
}
