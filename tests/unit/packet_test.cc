#include "dataplane/packet.h"
#include "frames.h"

#include <gtest/gtest.h>

using namespace xdpq::dataplane;
using namespace xdpq::testing;

TEST(Packet, ParsesIpv4UdpWithEcnAndMac) {
  FrameSpec s;
  s.payload = quic_short(100);
  s.tos = 0x02; // ECT(0)
  auto f = make_frame(s);
  ParsedFrame pf;
  ASSERT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::ok);
  EXPECT_EQ(pf.payload_len, 100u);
  EXPECT_EQ(f[pf.payload_offset], 0x41);
  EXPECT_EQ(pf.path.remote.to_string(), "10.0.0.2:40000");
  EXPECT_EQ(pf.path.local.to_string(), "10.0.0.1:4433");
  EXPECT_EQ(pf.ecn, 2);
  EXPECT_EQ(pf.src_mac[5], 2);
  EXPECT_EQ(pf.vlan_tci, 0);
}

TEST(Packet, ParsesIpv6AndVlan) {
  FrameSpec s;
  s.ipv6 = true;
  s.vlan = true;
  s.src = "fd00::2";
  s.dst = "fd00::1";
  s.tos = 0x01;
  s.payload = quic_short(77);
  auto f = make_frame(s);
  f.resize(f.size() + 6, 0); // Ethernet padding after the IP packet is fine
  ParsedFrame pf;
  ASSERT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::ok);
  EXPECT_EQ(pf.payload_len, 77u);
  EXPECT_EQ(pf.path.remote.to_string(), "[fd00::2]:40000");
  EXPECT_EQ(pf.vlan_tci, 42);
  EXPECT_EQ(pf.ecn, 1);
  // An 802.1ad S-tag is not ours to answer (a reply would carry 802.1Q).
  s.vlan_tpid = 0x88a8;
  f = make_frame(s);
  EXPECT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::not_ip);
}

TEST(Packet, RejectsMalformedWithReason) {
  ParsedFrame pf;
  FrameSpec s;
  s.payload = quic_short(50);
  auto f = make_frame(s);
  EXPECT_EQ(parse_frame(f.data(), 10, pf), ParseStatus::truncated);
  EXPECT_EQ(parse_frame(f.data(), 14 + 12, pf), ParseStatus::truncated);
  auto bad_sum = f;
  bad_sum[14 + 8] ^= 1; // TTL changed, checksum now wrong
  EXPECT_EQ(parse_frame(bad_sum.data(), bad_sum.size(), pf), ParseStatus::bad_ip_header);
  FrameSpec l = s;
  l.tot_len_delta = 9;
  auto lf = make_frame(l);
  EXPECT_EQ(parse_frame(lf.data(), lf.size(), pf), ParseStatus::bad_ip_len);
  FrameSpec u = s;
  u.udp_len_delta = 3;
  auto uf = make_frame(u);
  EXPECT_EQ(parse_frame(uf.data(), uf.size(), pf), ParseStatus::bad_udp_len);
  FrameSpec fr = s;
  fr.frag_off = 0x2000;
  auto ff = make_frame(fr);
  EXPECT_EQ(parse_frame(ff.data(), ff.size(), pf), ParseStatus::fragment);
  FrameSpec tcp = s;
  tcp.proto = 6;
  auto tf = make_frame(tcp);
  EXPECT_EQ(parse_frame(tf.data(), tf.size(), pf), ParseStatus::not_udp);
}

// Regression: an IPv6 UDP datagram with a zero checksum (which RFC 8200
// 8.1 says receivers drop, and the kernel does) was answered on AF_XDP.
// Over IPv4 zero means no checksum, which is allowed.
TEST(Packet, Ipv6UdpWithoutAChecksumIsDropped) {
  ParsedFrame pf;
  FrameSpec s;
  s.payload = quic_short(50);
  s.ipv6 = true;
  s.src = "fd00::2";
  s.dst = "fd00::1";
  s.udp_checksum6 = 0;
  auto f = make_frame(s);
  EXPECT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::no_udp_checksum);
  s.udp_checksum6 = 0x1234;
  f = make_frame(s);
  EXPECT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::ok);
  s.ipv6 = false;
  s.src = "10.0.0.2";
  s.dst = "10.0.0.1";
  f = make_frame(s);
  EXPECT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::ok);
}

TEST(Packet, BuildThenParseRoundTripsWithValidChecksums) {
  for (bool v6 : {false, true}) {
    for (bool vlan : {false, true}) {
      std::vector<uint8_t> buf(TX_HEADROOM + 1500);
      uint8_t *payload = buf.data() + TX_HEADROOM;
      for (size_t i = 0; i < 1001; ++i) payload[i] = static_cast<uint8_t>(i * 7);
      Path p;
      p.local = *parse_address(v6 ? "[fd00::1]:4433" : "10.0.0.1:4433");
      p.remote = *parse_address(v6 ? "[fd00::2]:50000" : "10.0.0.2:50000");
      Mac src{2, 0, 0, 0, 0, 1}, dst{2, 0, 0, 0, 0, 2};
      size_t h = build_headers(payload, 1001, p, 3, src, dst, vlan ? 7 : 0);
      EXPECT_EQ(h, header_length(v6 ? AF_INET6 : AF_INET, vlan));
      const uint8_t *frame = payload - h;
      ParsedFrame pf;
      ASSERT_EQ(parse_frame(frame, h + 1001, pf), ParseStatus::ok);
      EXPECT_EQ(pf.payload_len, 1001u);
      EXPECT_EQ(pf.path.local, p.remote); // as the peer sees it
      EXPECT_EQ(pf.path.remote, p.local);
      EXPECT_EQ(pf.ecn, 3);
      EXPECT_EQ(pf.src_mac, src);
      EXPECT_EQ(pf.vlan_tci, vlan ? 7 : 0);
      // The UDP checksum over pseudo-header + UDP verifies to zero.
      size_t udp_off = pf.payload_offset - 8;
      uint32_t sum = 0;
      if (v6) {
        sum = checksum_add(frame + udp_off - 32, 32);
      } else {
        sum = checksum_add(frame + udp_off - 8, 8);
      }
      sum += 17 + 8 + 1001;
      sum = checksum_add(frame + udp_off, 8 + 1001, sum);
      EXPECT_EQ(checksum_fold(sum), 0) << "v6=" << v6 << " vlan=" << vlan;
    }
  }
}

// Regression: replies must only ever go to a unicast host, and a
// packet to a group address is not a QUIC client talking to us.
TEST(Packet, RejectsNonUnicastSourcesAndGroupDestinations) {
  ParsedFrame pf;
  auto status = [&](const char *src, const char *dst, bool v6) {
    FrameSpec s;
    s.ipv6 = v6;
    s.src = src;
    s.dst = dst;
    s.payload = quic_short(50);
    auto f = make_frame(s);
    return parse_frame(f.data(), f.size(), pf);
  };
  EXPECT_EQ(status("10.0.0.2", "10.0.0.1", false), ParseStatus::ok);
  for (const char *bad_src : {"0.0.0.0", "127.0.0.1", "224.0.0.5", "255.255.255.255"}) {
    EXPECT_EQ(status(bad_src, "10.0.0.1", false), ParseStatus::bad_address) << bad_src;
  }
  for (const char *bad_dst : {"239.1.2.3", "255.255.255.255", "0.0.0.0"}) {
    EXPECT_EQ(status("10.0.0.2", bad_dst, false), ParseStatus::bad_address) << bad_dst;
  }
  EXPECT_EQ(status("fd00::2", "fd00::1", true), ParseStatus::ok);
  for (const char *bad_src : {"::", "::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.2"}) {
    EXPECT_EQ(status(bad_src, "fd00::1", true), ParseStatus::bad_address) << bad_src;
  }
  for (const char *bad_dst : {"ff02::1", "::ffff:224.0.0.1", "::ffff:10.0.0.1"}) {
    EXPECT_EQ(status("fd00::2", bad_dst, true), ParseStatus::bad_address) << bad_dst;
  }
  // A source that is the destination itself (forged: the kernel drops
  // such a martian), which a reply would send back into this host.
  EXPECT_EQ(status("10.0.0.1", "10.0.0.1", false), ParseStatus::bad_address);
  EXPECT_EQ(status("fd00::1", "fd00::1", true), ParseStatus::bad_address);
  // A group MAC address as the Ethernet source.
  FrameSpec s;
  s.payload = quic_short(50);
  auto f = make_frame(s);
  f[6] |= 1;
  EXPECT_EQ(parse_frame(f.data(), f.size(), pf), ParseStatus::bad_address);
}

namespace {
// RFC 1071's definition, word by word in network order: the reference.
uint32_t reference_sum(const uint8_t *d, size_t len, uint32_t sum) {
  uint64_t acc = sum;
  for (size_t i = 0; i + 1 < len; i += 2) acc += static_cast<uint32_t>(d[i]) << 8 | d[i + 1];
  if (len & 1) acc += static_cast<uint32_t>(d[len - 1]) << 8;
  while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
  return static_cast<uint32_t>(acc);
}
} // namespace

TEST(Checksum, MatchesTheDefinitionForEveryLengthAndAlignment) {
  // RFC 1071 section 3's example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
  const uint8_t rfc[] = {0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7};
  EXPECT_EQ(checksum_fold(checksum_add(rfc, sizeof(rfc))), static_cast<uint16_t>(~0xddf2));
  std::vector<uint8_t> buf(1600);
  uint32_t x = 12345;
  for (auto &c : buf) c = static_cast<uint8_t>((x = x * 1103515245 + 12345) >> 16);
  std::fill(buf.begin() + 200, buf.begin() + 400, 0xff); // carries everywhere
  for (size_t off = 0; off < 8; ++off) {
    for (size_t len = 0; len <= 1500; len += (len < 80 ? 1 : 37)) {
      for (uint32_t seed : {0u, 0xfffeu, 0x1234u}) {
        uint16_t want = checksum_fold(reference_sum(buf.data() + off, len, seed));
        uint16_t got = checksum_fold(checksum_add(buf.data() + off, len, seed));
        ASSERT_EQ(got, want) << "off=" << off << " len=" << len << " seed=" << seed;
      }
    }
  }
}
