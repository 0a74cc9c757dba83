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
           bool *failed = nullptr, bool request_line = false) {
  H1FramingCheck check;
  if (request_line) check.check_request_line();
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

bool accepted(std::string_view wire, Body body, uint64_t length = 0, bool request_line = false) {
  for (size_t step : {size_t{1}, size_t{3}, size_t{1} << 20}) {
    bool failed = false;
    if (run(wire, body, length, step, &failed, request_line) != wire.size() || failed)
      return false;
  }
  return true;
}

// Where a request (checked as one) stops passing, in pieces of 1, 3 and
// all bytes: the same offset each way, or SIZE_MAX if they differ.
size_t request_stops_at(std::string_view wire) {
  size_t at = SIZE_MAX;
  for (size_t step : {size_t{1}, size_t{3}, size_t{1} << 20}) {
    bool failed = false;
    const size_t n = run(wire, Body::none, 0, step, &failed, true);
    if (!failed) return wire.size();
    if (at != SIZE_MAX && at != n) return SIZE_MAX;
    at = n;
  }
  return at;
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
  EXPECT_TRUE(accepted(chunked("5  \r\nhello\r\n0 ; a = b\r\n\r\n"), Body::chunked));
  // Two pipelined requests, the second after a chunked body.
  EXPECT_TRUE(accepted(chunked("1\r\na\r\n0\r\n\r\n") + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                       Body::chunked));
}

// Regression (review): Debian's http-parser takes any four bytes for the
// "HTTP" of a request line, and a line without a version as HTTP/0.9 (no
// Host needed): a hop that reads the line strictly sees another request.
TEST(H1FramingCheck, ARequestLineEndsInAnHttpVersion) {
  for (std::string_view ok : {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET / HTTP/1.0\n\n",
                              "\r\nGET /a%20b HTTP/1.1\r\nHost: x\r\n\r\n",
                              "GET / HTTP/2.0\r\n\r\n" /* the parser's to refuse (505) */}) {
    EXPECT_TRUE(accepted(ok, Body::none, 0, true)) << ok;
  }
  const std::string nul = "GET / H" + std::string(4, '\0') + "1.1\r\nHost: x\r\n\r\n";
  const std::string_view bad[] = {
      nul,
      "GET / H\nXX/1.1\r\nHost: x\r\n\r\n", // a bare LF where the version would be
      "GET /\r\n\r\n",                      // HTTP/0.9's form
      "GET / HTTP/1.1x\r\n\r\n",
      "GET / HTTP/1\r\n\r\n",
      "GET /HTTP/1.1\r\n\r\n",
      "GET / http/1.1\r\n\r\n",
  };
  for (std::string_view b : bad) {
    const size_t line_end = b.find('\n');
    EXPECT_EQ(request_stops_at(b), line_end) << b; // none of the line's end
  }
  // Not checked unless asked (an upstream's status line).
  EXPECT_TRUE(accepted("GET /\r\n\r\n", Body::none));
  // Only the first line of each request.
  EXPECT_TRUE(accepted("GET / HTTP/1.1\r\nX: HTTP\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
                       Body::none, 0, true));
}

TEST(H1FramingCheck, LooseFramingStopsWhereItBreaks) {
  // The cases Debian's http-parser (built without its strict checks) takes:
  const std::string bad[] = {
      chunked("5\r\nhelloXY0\r\n\r\n"),              // no CRLF after the data
      chunked("5\r\nhello\n0\r\n\r\n"),              // LF alone after the data
      chunked("5\rX\nhello\r\n0\r\n\r\n"),           // a CR and another byte ends the size line
      chunked("5;a\nb\r\nhello\r\n0\r\n\r\n"),        // a LF inside the extension
      chunked("5 e\r\nhello\r\n0\r\n\r\n"),            // whitespace, then no ';'
      chunked("5\t\tx;e\r\nhello\r\n0\r\n\r\n"),       // likewise
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
