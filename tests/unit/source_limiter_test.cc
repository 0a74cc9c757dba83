#include "dataplane/source_limiter.h"

#include <gtest/gtest.h>

using namespace xdpq::dataplane;

namespace {
Address addr(const char *text) { return *parse_address(text); }
constexpr uint64_t SEC = 1'000'000'000ull;
} // namespace

TEST(SourceLimiter, CapsConnectionsPerSourceAndGivesThemBack) {
  SourceLimiter lim({3, 0, 0});
  uint32_t slots[4];
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lim.admit(addr("192.0.2.7:1000"), SEC, &slots[i]), SourceLimiter::Verdict::ok);
  }
  // Another port of the same address is the same source.
  EXPECT_EQ(lim.admit(addr("192.0.2.7:2000"), SEC, &slots[3]),
            SourceLimiter::Verdict::too_many_connections);
  EXPECT_EQ(lim.connections(addr("192.0.2.7:1")), 3u);
  lim.release(slots[0]);
  EXPECT_EQ(lim.admit(addr("192.0.2.7:2000"), SEC, &slots[3]), SourceLimiter::Verdict::ok);
  // Releasing what was never admitted changes nothing.
  lim.release(SourceLimiter::NONE);
  EXPECT_EQ(lim.connections(addr("192.0.2.7:1")), 3u);
}

// Regression: Initials forged in a victim's name (each held for the
// handshake timeout) filled its connection cap, and the victim was refused
// even with a token proving its address.
TEST(SourceLimiter, ForgedConnectionsLeaveRoomForProvenOnes) {
  SourceLimiter lim({2, 0, 0});
  const auto v = addr("192.0.2.9:1000");
  uint32_t f1, f2, s;
  EXPECT_EQ(lim.admit(v, SEC, &f1), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(v, SEC, &f2), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(v, SEC, &s), SourceLimiter::Verdict::too_many_connections);
  uint32_t p1, p2;
  EXPECT_EQ(lim.admit(v, SEC, &p1, SourceLimiter::Proof::validated), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(v, SEC, &p2, SourceLimiter::Proof::validated), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(v, SEC, &s, SourceLimiter::Proof::validated),
            SourceLimiter::Verdict::too_many_connections);
  // A connection admitted without proof that completes its handshake is
  // proven from then on; the others leave as unproven.
  lim.proven(f1);
  lim.release(p1);
  EXPECT_EQ(lim.admit(v, SEC, &s, SourceLimiter::Proof::validated),
            SourceLimiter::Verdict::too_many_connections); // f1 and p2
  lim.release(f2, true);
  lim.release(f1);
  EXPECT_EQ(lim.connections(v), 1u);
  EXPECT_EQ(lim.admit(v, SEC, &s, SourceLimiter::Proof::validated), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(v, SEC, &s), SourceLimiter::Verdict::too_many_connections);
}

TEST(SourceLimiter, Ipv6SourcesAreSlash64) {
  SourceLimiter lim({1, 0, 0}, 1u << 20); // many slots: no collisions in this test
  uint32_t s;
  EXPECT_EQ(lim.admit(addr("[2001:db8:1:2::1]:1"), SEC, &s), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(addr("[2001:db8:1:2:ffff::9]:1"), SEC, &s),
            SourceLimiter::Verdict::too_many_connections);
  EXPECT_EQ(lim.admit(addr("[2001:db8:1:3::1]:1"), SEC, &s), SourceLimiter::Verdict::ok);
  // An IPv4-mapped address is its IPv4 source.
  EXPECT_EQ(lim.admit(addr("198.51.100.1:1"), SEC, &s), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(addr("[::ffff:198.51.100.1]:1"), SEC, &s),
            SourceLimiter::Verdict::too_many_connections);
}

TEST(SourceLimiter, RateLimitsNewConnectionsWithABurst) {
  SourceLimiter lim({0, 10, 20});
  uint32_t s;
  int ok = 0;
  for (int i = 0; i < 100; ++i) {
    ok += lim.admit(addr("203.0.113.5:1"), SEC, &s) == SourceLimiter::Verdict::ok;
  }
  EXPECT_EQ(ok, 20);
  // Half a second later: five more.
  ok = 0;
  for (int i = 0; i < 100; ++i) {
    ok += lim.admit(addr("203.0.113.5:1"), SEC + SEC / 2, &s) == SourceLimiter::Verdict::ok;
  }
  EXPECT_EQ(ok, 5);
  // Another source is not affected.
  EXPECT_EQ(lim.admit(addr("203.0.113.6:1"), SEC, &s), SourceLimiter::Verdict::ok);
}

TEST(SourceLimiter, ProvenSourcesDrawOnTheirOwnRate) {
  SourceLimiter lim({0, 1, 1, 10});
  using P = SourceLimiter::Proof;
  uint32_t s;
  auto src = addr("203.0.113.5:1");
  EXPECT_EQ(lim.admit(src, SEC, &s), SourceLimiter::Verdict::ok);
  EXPECT_EQ(lim.admit(src, SEC, &s), SourceLimiter::Verdict::too_fast);
  // The unvalidated bucket is empty; the validated one is full (twice the rate).
  int ok = 0;
  for (int i = 0; i < 100; ++i) ok += lim.admit(src, SEC, &s, P::validated) == SourceLimiter::Verdict::ok;
  EXPECT_EQ(ok, 20);
  EXPECT_EQ(lim.admit(src, SEC, &s), SourceLimiter::Verdict::too_fast);
  // Validated connections alone: no unvalidated limit applies.
  SourceLimiter tcp({0, 0, 0, 5});
  ok = 0;
  for (int i = 0; i < 100; ++i) ok += tcp.admit(src, SEC, &s, P::validated) == SourceLimiter::Verdict::ok;
  EXPECT_EQ(ok, 10);
}

TEST(SourceLimiter, OffByDefault) {
  SourceLimiter lim({});
  uint32_t s;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(lim.admit(addr("203.0.113.5:1"), SEC, &s), SourceLimiter::Verdict::ok);
  }
  EXPECT_EQ(s, SourceLimiter::NONE);
}
