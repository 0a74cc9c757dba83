#pragma once
// Builds raw Ethernet frames for tests of the XDP program and the
// user-space parser: IPv4/IPv6, optional VLAN tag, UDP or other protocols.

#include <arpa/inet.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace xdpq::testing {

struct FrameSpec {
  bool ipv6 = false;
  bool vlan = false;
  uint16_t vlan_tpid = 0x8100; // 0x88a8: an 802.1ad S-tag
  uint8_t proto = 17; // UDP
  std::string src = "10.0.0.2";
  std::string dst = "10.0.0.1";
  uint16_t sport = 40000;
  uint16_t dport = 4433;
  std::vector<uint8_t> payload;
  uint16_t frag_off = 0;        // IPv4 flags+offset field (host order)
  bool v6_fragment_header = false;
  // IPv6 extension headers of 8 bytes each, of these types, in this order,
  // before the fragment header (if any; after it with v6_fragment_first)
  // and the UDP header.
  std::vector<uint8_t> v6_ext;
  bool v6_fragment_first = false;
  int tot_len_delta = 0;        // corrupts the IP length
  int udp_len_delta = 0;        // corrupts the UDP length
  uint8_t tos = 0;
  uint16_t udp_checksum6 = 0xffff; // IPv6 UDP must carry one (its value is not checked)
};

inline void put16(std::vector<uint8_t> &v, uint16_t x) {
  v.push_back(static_cast<uint8_t>(x >> 8));
  v.push_back(static_cast<uint8_t>(x));
}

inline std::vector<uint8_t> make_frame(const FrameSpec &s) {
  std::vector<uint8_t> f = {0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2};
  if (s.vlan) {
    put16(f, s.vlan_tpid);
    put16(f, 42);
  }
  put16(f, s.ipv6 ? 0x86dd : 0x0800);
  std::vector<uint8_t> l4;
  if (s.proto == 17) {
    put16(l4, s.sport);
    put16(l4, s.dport);
    put16(l4, static_cast<uint16_t>(8 + s.payload.size() + s.udp_len_delta));
    put16(l4, s.ipv6 ? s.udp_checksum6 : 0);
    l4.insert(l4.end(), s.payload.begin(), s.payload.end());
  } else {
    l4.assign(20, 0); // a TCP-sized header of zeros
  }
  if (!s.ipv6) {
    std::vector<uint8_t> ip = {0x45, s.tos};
    put16(ip, static_cast<uint16_t>(20 + l4.size() + s.tot_len_delta));
    put16(ip, 0);
    put16(ip, s.frag_off);
    ip.push_back(64);
    ip.push_back(s.proto);
    put16(ip, 0);
    in_addr a;
    inet_pton(AF_INET, s.src.c_str(), &a);
    ip.insert(ip.end(), reinterpret_cast<uint8_t *>(&a), reinterpret_cast<uint8_t *>(&a) + 4);
    inet_pton(AF_INET, s.dst.c_str(), &a);
    ip.insert(ip.end(), reinterpret_cast<uint8_t *>(&a), reinterpret_cast<uint8_t *>(&a) + 4);
    uint32_t sum = 0;
    for (size_t i = 0; i < 20; i += 2) sum += static_cast<uint32_t>(ip[i] << 8 | ip[i + 1]);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    uint16_t c = static_cast<uint16_t>(~sum);
    ip[10] = static_cast<uint8_t>(c >> 8);
    ip[11] = static_cast<uint8_t>(c);
    f.insert(f.end(), ip.begin(), ip.end());
  } else {
    std::vector<uint8_t> ip = {static_cast<uint8_t>(0x60 | (s.tos >> 4)),
                               static_cast<uint8_t>((s.tos & 0xf) << 4), 0, 0};
    size_t plen = l4.size() + (s.v6_fragment_header ? 8 : 0) + 8 * s.v6_ext.size();
    put16(ip, static_cast<uint16_t>(plen + s.tot_len_delta));
    // The chain: [fragment] extension headers [fragment], then proto.
    const bool frag_first = s.v6_fragment_header && s.v6_fragment_first;
    const bool frag_last = s.v6_fragment_header && !s.v6_fragment_first;
    const uint8_t after_ext = frag_last ? 44 : s.proto;
    const uint8_t after_frag = s.v6_ext.empty() ? s.proto : s.v6_ext[0];
    ip.push_back(frag_first ? 44 : s.v6_ext.empty() ? after_ext : s.v6_ext[0]);
    ip.push_back(64);
    in6_addr a;
    inet_pton(AF_INET6, s.src.c_str(), &a);
    ip.insert(ip.end(), a.s6_addr, a.s6_addr + 16);
    inet_pton(AF_INET6, s.dst.c_str(), &a);
    ip.insert(ip.end(), a.s6_addr, a.s6_addr + 16);
    if (frag_first) ip.insert(ip.end(), {after_frag, 0, 0, 1, 0, 0, 0, 7}); // offset 0, M=1
    for (size_t i = 0; i < s.v6_ext.size(); ++i) {
      const uint8_t next = i + 1 < s.v6_ext.size() ? s.v6_ext[i + 1] : after_ext;
      ip.insert(ip.end(), {next, 0, 1, 4, 0, 0, 0, 0}); // a PadN option
    }
    if (frag_last) ip.insert(ip.end(), {s.proto, 0, 0, 1, 0, 0, 0, 7});
    f.insert(f.end(), ip.begin(), ip.end());
  }
  f.insert(f.end(), l4.begin(), l4.end());
  return f;
}

// A QUIC v1 Initial long header followed by padding, n bytes in all.
inline std::vector<uint8_t> quic_initial(size_t n) {
  std::vector<uint8_t> p = {0xc3, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0};
  p.resize(n, 0);
  return p;
}

// A QUIC short header packet of n bytes.
inline std::vector<uint8_t> quic_short(size_t n) {
  std::vector<uint8_t> p(n, 0x5a);
  p[0] = 0x41;
  return p;
}

} // namespace xdpq::testing
