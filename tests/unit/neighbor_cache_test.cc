#include "dataplane/neighbor_cache.h"

#include <gtest/gtest.h>

#include <string>

using namespace xdpq::dataplane;

namespace {
Address ip(const std::string &text) { return *parse_address(text + ":1"); }
} // namespace

TEST(NeighborCache, PacksMacAndVlan) {
  Mac m{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}, out{};
  uint16_t vlan = 0;
  unpack_link(pack_link(m, 42), out, vlan);
  EXPECT_EQ(out, m);
  EXPECT_EQ(vlan, 42);
}

// Regression: a weak learn (a handshake packet, which anyone on the link
// can forge with any source address) filled in an unknown peer, and the
// peer's own handshake packets, as weak, could not replace it: one forged
// Initial sent the victim's handshake replies to the forger. Weak learns
// also evicted proven peers. Now only proof is learned.
TEST(NeighborCache, OnlyProofIsLearned) {
  NeighborCache c;
  EXPECT_EQ(c.lookup(ip("10.0.0.2")), 0u);
  c.learn(ip("10.0.0.2"), 0x666, false); // a forged Initial with the peer's address
  EXPECT_EQ(c.lookup(ip("10.0.0.2")), 0u);
  c.learn(ip("10.0.0.2"), 0x111, true); // the peer's 1-RTT packet
  EXPECT_EQ(c.lookup(ip("10.0.0.2")), 0x111u);
  c.learn(ip("10.0.0.2"), 0x666, false);
  EXPECT_EQ(c.lookup(ip("10.0.0.2")), 0x111u);
  c.learn(ip("10.0.0.2"), 0x222, true); // 1-RTT: the peer moved
  EXPECT_EQ(c.lookup(ip("10.0.0.2")), 0x222u);
  // The port does not matter, the family does.
  EXPECT_EQ(c.lookup(*parse_address("10.0.0.2:999")), 0x222u);
  EXPECT_EQ(c.lookup(ip("[::ffff:10.0.0.3]")), 0u);
  c.learn(ip("[fd00::2]"), 0x333, true);
  EXPECT_EQ(c.lookup(ip("[fd00::2]")), 0x333u);
  EXPECT_EQ(c.size(), 2u);
  // A flood of forgeries evicts no proven peer.
  NeighborCache one(1); // 1 bucket x 4 ways
  for (int i = 0; i < 4; ++i) one.learn(ip("10.2.0." + std::to_string(i)), 0x10 + i, true);
  for (int i = 0; i < 100; ++i) one.learn(ip("10.3.0." + std::to_string(i)), 0x666, false);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(one.lookup(ip("10.2.0." + std::to_string(i))), 0x10u + i);
  EXPECT_EQ(one.evictions(), 0u);
}

TEST(NeighborCache, BoundedWithLeastRecentlyUsedEviction) {
  NeighborCache c(4); // 4 buckets x 4 ways
  for (int i = 0; i < 1000; ++i) {
    c.learn(ip("10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250)), 0x100 + i, true);
  }
  EXPECT_EQ(c.size(), 16u);
  EXPECT_EQ(c.evictions(), 1000u - 16u);
  // The most recent entry survives; a full table still learns.
  EXPECT_EQ(c.lookup(ip("10.1.3.249")), 0x100u + 999);
}
