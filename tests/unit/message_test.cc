#include "http/message.h"
#include "http/response_head.h"

#include <gtest/gtest.h>

#include <regex>

using xdpq::http::Header;
using xdpq::http::HeaderList;
using xdpq::http::Request;
using xdpq::http::Response;
using xdpq::http::ResponseHead;
using xdpq::http::valid_host_field;

TEST(HeaderList, ClearKeepsSlotsAndTheirStrings) {
  HeaderList h;
  h.add("content-type", "application/octet-stream; with a long tail");
  h.add("etag", "\"0123456789abcdef-42\"");
  ASSERT_EQ(h.size(), 2u);
  const char *value_buf = h.begin()[0].value.data();
  h.clear();
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h.begin(), h.end());
  EXPECT_EQ(h.find("etag"), nullptr); // cleared slots are not found
  h.add("content-type", "text/plain");
  EXPECT_EQ(h.begin()[0].value.data(), value_buf); // same storage reused
  ASSERT_NE(h.find("content-type"), nullptr);
  EXPECT_EQ(*h.find("content-type"), "text/plain");
  EXPECT_EQ(h.size(), 1u);
}

TEST(HeaderList, FindReturnsTheFirstMatch) {
  HeaderList h{{"a", "1"}, {"b", "2"}, {"a", "3"}};
  ASSERT_NE(h.find("a"), nullptr);
  EXPECT_EQ(*h.find("a"), "1");
  EXPECT_EQ(h.find("c"), nullptr);
}

TEST(HeaderList, ResetFreesHugeFieldsInsteadOfKeepingThem) {
  Request r;
  r.headers.add("x-big", std::string(100000, 'x'));
  r.reset();
  r.headers.add("x-small", "1");
  // The slot holding 100 KB was released, not reused.
  EXPECT_LT(r.headers.begin()[0].value.capacity(), 100000u);

  Response resp;
  resp.add_header("etag", "\"0123456789abcdef-0001\"");
  const char *value_buf = resp.headers.begin()[0].value.data();
  resp.reset();
  resp.add_header("etag", "\"0123456789abcdef-0002\"");
  EXPECT_EQ(resp.headers.begin()[0].value.data(), value_buf); // no allocation
}

// What a spare list kept for reuse holds on the heap: counted so that a pool
// of them can be bounded in bytes, whatever fields an upstream sent.
TEST(HeaderList, RetainedBytesCountsEverySlotAndTrimFreesOutsizedOnes) {
  HeaderList h;
  h.add("date", "Thu, 26 Nov 2026 06:00:00 GMT"); // value past the small-string buffer
  h.add("etag", "\"1\"");                          // both in the small-string buffer
  const size_t two = h.retained_bytes();
  EXPECT_GE(two, 2 * sizeof(Header) + 30);
  h.trim();
  EXPECT_EQ(h.slots(), 2u);                // kept, emptied
  EXPECT_EQ(h.retained_bytes(), two);      // and still counted
  h.add("x-big", std::string(20000, 'x'));
  EXPECT_GT(h.retained_bytes(), 20000u); // slot 0 grew to hold it
  h.trim();                                // over what is worth keeping
  EXPECT_EQ(h.slots(), 0u);
  EXPECT_EQ(h.retained_bytes(), 0u);
}

// Regression (review): a pooled stream slot kept every field slot any
// earlier request on it had filled, each up to 1 KiB of name and value, and
// trim() looked only at the last request's fields. A client sending heads
// of 128 fields of 1000 bytes (cheap with HPACK or QPACK references), then
// small ones, made each of a connection's 100 slots keep about 256 KiB.
// What a list keeps is now bounded as a whole, and so are the request
// line's strings.
TEST(HeaderList, WhatAPooledSlotKeepsIsBoundedAsAWhole) {
  Request req;
  for (int i = 0; i < 128; ++i) req.headers.add("x-" + std::to_string(i), std::string(1000, 'v'));
  req.path.assign(10000, '/');
  req.authority.assign(5000, 'a');
  req.reset();
  for (int i = 0; i < 5; ++i) req.headers.add("x-" + std::to_string(i), "small");
  req.reset();
  EXPECT_LE(req.headers.retained_bytes(), 16u * 1024);
  EXPECT_LE(req.path.capacity(), 1024u);
  EXPECT_LE(req.authority.capacity(), 1024u);
  // An ordinary head is kept for reuse, with no allocation the next time.
  req.headers.add("user-agent", std::string(100, 'u'));
  const char *kept = req.headers.begin()[0].value.data();
  req.reset();
  req.headers.add("user-agent", std::string(90, 'w'));
  EXPECT_EQ(req.headers.begin()[0].value.data(), kept);
}

TEST(HostField, HostAndPortOnly) {
  for (const char *ok : {"example.com", "example.com:443", "a_b.c-d", "1.2.3.4:80", "[::1]",
                         "[::1]:8443", "[2001:db8::1.2.3.4]", "", "h:", "%41"}) {
    EXPECT_TRUE(valid_host_field(ok)) << ok;
  }
  for (const char *bad : {"a/b", "a b", "u@a", "a:1:2", "h:8x", "[::1", "[::1]x", "[]", "[g::1]",
                          "a\tb", "a?b", "a#b"}) {
    EXPECT_FALSE(valid_host_field(bad)) << bad;
  }
}

// Regression: no response carried Date, which an origin server with a
// clock must send (RFC 9110 6.6.1); caches then guess a response's age.
TEST(ResponseHead, CarriesTheDateOnceInHttpDateForm) {
  Response r;
  r.set(200, "text/plain", nullptr);
  ResponseHead head;
  head.build(r);
  size_t dates = 0;
  std::string value;
  for (const auto &f : head.fields()) {
    if (f.name == "date") {
      ++dates;
      value = std::string(f.value);
    }
  }
  ASSERT_EQ(dates, 1u);
  EXPECT_TRUE(std::regex_match(
      value, std::regex("(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-3][0-9] "
                        "(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) 20[0-9]{2} "
                        "[0-2][0-9]:[0-5][0-9]:[0-6][0-9] GMT")))
      << value;
  std::string text;
  head.append_http1(text, false);
  EXPECT_NE(text.find("\r\ndate: " + value + "\r\n"), std::string::npos) << text;
  // A proxied upstream's own Date goes through, alone.
  r.add_header("date", "Thu, 01 Jan 2026 00:00:00 GMT");
  head.build(r);
  dates = 0;
  for (const auto &f : head.fields()) {
    if (f.name == "date") {
      ++dates;
      EXPECT_EQ(f.value, "Thu, 01 Jan 2026 00:00:00 GMT");
    }
  }
  EXPECT_EQ(dates, 1u);
}

