#include "dataplane/packet.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <netinet/in.h>

#include <cstring>

namespace xdpq::dataplane {

namespace {

constexpr size_t ETH_LEN = 14;
constexpr size_t VLAN_LEN = 4;
constexpr size_t IP4_LEN = 20;
constexpr size_t IP6_LEN = 40;
constexpr size_t UDP_LEN = 8;

uint16_t rd16(const uint8_t *p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
void wr16(uint8_t *p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

// A source a reply could go to: unicast, not loopback, not unspecified.
bool good_source4(const uint8_t *a) {
  return a[0] != 0 && a[0] != 127 && a[0] < 224;
}
// A destination that is one host: not multicast, broadcast or unspecified.
bool good_destination4(const uint8_t *a) { return a[0] != 0 && a[0] < 224; }
bool good_source6(const uint8_t *a) {
  static constexpr uint8_t ZERO[16] = {};
  return a[0] != 0xff && std::memcmp(a, ZERO, 16) != 0 && !ipv6_loopback(a) && !ipv6_mapped(a);
}
bool good_destination6(const uint8_t *a) {
  static constexpr uint8_t ZERO[16] = {};
  return a[0] != 0xff && std::memcmp(a, ZERO, 16) != 0 && !ipv6_mapped(a);
}

} // namespace

const char *parse_status_name(ParseStatus s) {
  switch (s) {
  case ParseStatus::ok: return "ok";
  case ParseStatus::truncated: return "truncated";
  case ParseStatus::not_ip: return "not_ip";
  case ParseStatus::not_udp: return "not_udp";
  case ParseStatus::bad_ip_header: return "bad_ip_header";
  case ParseStatus::bad_ip_len: return "bad_ip_len";
  case ParseStatus::bad_udp_len: return "bad_udp_len";
  case ParseStatus::fragment: return "fragment";
  case ParseStatus::bad_address: return "bad_address";
  case ParseStatus::no_udp_checksum: return "no_udp_checksum";
  case ParseStatus::count_: break;
  }
  return "?";
}

uint32_t checksum_add(const uint8_t *data, size_t len, uint32_t sum) {
  // The one's-complement sum does not depend on byte order (RFC 1071 2.B):
  // add native 64-bit loads as two 32-bit halves in two independent
  // accumulators (no byte swap per word), fold, and swap the 16-bit result
  // once into network order. The sums stay far below 2^64 for any datagram.
  uint64_t a = 0, b = 0;
  while (len >= 16) {
    uint64_t w0, w1;
    std::memcpy(&w0, data, 8);
    std::memcpy(&w1, data + 8, 8);
    a += (w0 & 0xffffffffu) + (w0 >> 32);
    b += (w1 & 0xffffffffu) + (w1 >> 32);
    data += 16;
    len -= 16;
  }
  a += b;
  if (len >= 8) {
    uint64_t w;
    std::memcpy(&w, data, 8);
    a += (w & 0xffffffffu) + (w >> 32);
    data += 8;
    len -= 8;
  }
  if (len >= 4) {
    uint32_t w;
    std::memcpy(&w, data, 4);
    a += w;
    data += 4;
    len -= 4;
  }
  if (len >= 2) {
    uint16_t w;
    std::memcpy(&w, data, 2);
    a += w;
    data += 2;
    len -= 2;
  }
  if (len) {
    // A last odd byte is the high byte of a network-order word.
    uint8_t pad[2] = {data[0], 0};
    uint16_t w;
    std::memcpy(&w, pad, 2);
    a += w;
  }
  while (a >> 16) a = (a & 0xffff) + (a >> 16);
  uint16_t folded = static_cast<uint16_t>(a);
  uint32_t s = sum + ntohs(folded);
  return (s & 0xffff) + (s >> 16);
}

uint16_t checksum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum & 0xffff);
}

ParseStatus parse_frame(const uint8_t *f, size_t len, ParsedFrame &out) {
  if (len < ETH_LEN) return ParseStatus::truncated;
  std::memcpy(out.dst_mac.data(), f, 6);
  std::memcpy(out.src_mac.data(), f + 6, 6);
  if (out.src_mac[0] & 1) return ParseStatus::bad_address; // a group address as source
  uint16_t proto = rd16(f + 12);
  size_t off = ETH_LEN;
  out.vlan_tci = 0;
  // One 802.1Q tag, as the XDP program steers (a reply carries the same).
  if (proto == ETH_P_8021Q) {
    if (len < off + VLAN_LEN) return ParseStatus::truncated;
    out.vlan_tci = rd16(f + off);
    proto = rd16(f + off + 2);
    off += VLAN_LEN;
  }
  const uint8_t *ip = f + off;
  size_t left = len - off;
  const uint8_t *udp;
  size_t ip_payload;
  if (proto == ETH_P_IP) {
    if (left < IP4_LEN) return ParseStatus::truncated;
    if ((ip[0] >> 4) != 4) return ParseStatus::bad_ip_header;
    size_t ihl = static_cast<size_t>(ip[0] & 0x0f) * 4;
    if (ihl < IP4_LEN) return ParseStatus::bad_ip_header;
    if (left < ihl) return ParseStatus::truncated;
    size_t tot = rd16(ip + 2);
    if (tot < ihl || tot > left) return ParseStatus::bad_ip_len;
    if (checksum_fold(checksum_add(ip, ihl)) != 0) return ParseStatus::bad_ip_header;
    if (rd16(ip + 6) & 0x3fff) return ParseStatus::fragment; // MF or offset
    if (ip[9] != IPPROTO_UDP) return ParseStatus::not_udp;
    // A source that is the destination itself: forged (the kernel drops
    // such a "martian"); a reply would go back to this host.
    if (!good_source4(ip + 12) || !good_destination4(ip + 16) ||
        std::memcmp(ip + 12, ip + 16, 4) == 0) {
      return ParseStatus::bad_address;
    }
    out.ecn = ip[1] & 0x3;
    auto &l = out.path.local;
    auto &r = out.path.remote;
    l = Address{};
    r = Address{};
    l.u.in.sin_family = r.u.in.sin_family = AF_INET;
    l.len = r.len = sizeof(sockaddr_in);
    std::memcpy(&r.u.in.sin_addr, ip + 12, 4);
    std::memcpy(&l.u.in.sin_addr, ip + 16, 4);
    udp = ip + ihl;
    ip_payload = tot - ihl;
  } else if (proto == ETH_P_IPV6) {
    if (left < IP6_LEN) return ParseStatus::truncated;
    if ((ip[0] >> 4) != 6) return ParseStatus::bad_ip_header;
    size_t plen = rd16(ip + 4);
    if (plen > left - IP6_LEN) return ParseStatus::bad_ip_len;
    if (ip[6] == 44) return ParseStatus::fragment;
    if (ip[6] != IPPROTO_UDP) return ParseStatus::not_udp;
    if (!good_source6(ip + 8) || !good_destination6(ip + 24) ||
        std::memcmp(ip + 8, ip + 24, 16) == 0) {
      return ParseStatus::bad_address;
    }
    out.ecn = static_cast<uint8_t>((rd16(ip) >> 4) & 0x3);
    auto &l = out.path.local;
    auto &r = out.path.remote;
    l = Address{};
    r = Address{};
    l.u.in6.sin6_family = r.u.in6.sin6_family = AF_INET6;
    l.len = r.len = sizeof(sockaddr_in6);
    std::memcpy(&r.u.in6.sin6_addr, ip + 8, 16);
    std::memcpy(&l.u.in6.sin6_addr, ip + 24, 16);
    udp = ip + IP6_LEN;
    ip_payload = plen;
  } else {
    return ParseStatus::not_ip;
  }
  if (ip_payload < UDP_LEN) return ParseStatus::bad_ip_len;
  size_t ulen = rd16(udp + 4);
  if (ulen < UDP_LEN || ulen > ip_payload) return ParseStatus::bad_udp_len;
  // The checksum is not verified (veth hands over checksums the sender
  // left to offload), but IPv6 makes it mandatory: the kernel drops a zero.
  if (proto == ETH_P_IPV6 && rd16(udp + 6) == 0) return ParseStatus::no_udp_checksum;
  std::memcpy(&out.path.remote.u.in.sin_port, udp, 2); // same offset for in6
  std::memcpy(&out.path.local.u.in.sin_port, udp + 2, 2);
  out.payload_offset = static_cast<size_t>(udp + UDP_LEN - f);
  out.payload_len = ulen - UDP_LEN;
  return ParseStatus::ok;
}

size_t header_length(int family, bool vlan) {
  return ETH_LEN + (vlan ? VLAN_LEN : 0) + (family == AF_INET ? IP4_LEN : IP6_LEN) + UDP_LEN;
}

size_t build_headers(uint8_t *payload, size_t payload_len, const Path &path, uint8_t ecn,
                     const Mac &src_mac, const Mac &dst_mac, uint16_t vlan_tci) {
  const bool v4 = path.local.family() == AF_INET;
  const size_t hlen = header_length(path.local.family(), vlan_tci != 0);
  // The headers are put together here and copied in front of the payload
  // at the end: the frame's header bytes are written once and never read
  // back. (Summing bytes just stored one by one defeats store forwarding,
  // and the load waits for the frame's cache line to arrive; that read was
  // nine tenths of this function's samples.) The checksums are summed from
  // the values, in host order, as checksum_add() keeps them.
  alignas(8) uint8_t h[ETH_LEN + VLAN_LEN + IP6_LEN + UDP_LEN];
  std::memcpy(h, dst_mac.data(), 6);
  std::memcpy(h + 6, src_mac.data(), 6);
  size_t off = 12;
  if (vlan_tci) {
    wr16(h + off, ETH_P_8021Q);
    wr16(h + off + 2, vlan_tci);
    off += 4;
  }
  wr16(h + off, v4 ? ETH_P_IP : ETH_P_IPV6);
  off += 2;
  uint8_t *ip = h + off;
  uint8_t *udp;
  const uint32_t ulen = static_cast<uint32_t>(UDP_LEN + payload_len);
  uint32_t pseudo;
  if (v4) {
    const uint32_t src = ntohl(path.local.u.in.sin_addr.s_addr);
    const uint32_t dst = ntohl(path.remote.u.in.sin_addr.s_addr);
    const uint32_t addrs = (src >> 16) + (src & 0xffff) + (dst >> 16) + (dst & 0xffff);
    const uint32_t tos = ecn & 0x3u;
    ip[0] = 0x45;
    ip[1] = static_cast<uint8_t>(tos);
    wr16(ip + 2, static_cast<uint16_t>(IP4_LEN + ulen));
    wr16(ip + 4, 0);      // id: DF is set, so no fragment ever needs it
    wr16(ip + 6, 0x4000); // DF
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    std::memcpy(ip + 12, &path.local.u.in.sin_addr, 4);
    std::memcpy(ip + 16, &path.remote.u.in.sin_addr, 4);
    wr16(ip + 10, checksum_fold((0x45u << 8 | tos) + static_cast<uint32_t>(IP4_LEN) + ulen +
                                0x4000u + (64u << 8 | IPPROTO_UDP) + addrs));
    pseudo = addrs;
    udp = ip + IP4_LEN;
  } else {
    uint32_t vtf = 6u << 28 | static_cast<uint32_t>(ecn & 0x3) << 20;
    uint32_t be = htonl(vtf);
    std::memcpy(ip, &be, 4);
    wr16(ip + 4, static_cast<uint16_t>(ulen));
    ip[6] = IPPROTO_UDP;
    ip[7] = 64;
    std::memcpy(ip + 8, &path.local.u.in6.sin6_addr, 16);
    std::memcpy(ip + 24, &path.remote.u.in6.sin6_addr, 16);
    pseudo = checksum_add(reinterpret_cast<const uint8_t *>(&path.local.u.in6.sin6_addr), 16);
    pseudo = checksum_add(reinterpret_cast<const uint8_t *>(&path.remote.u.in6.sin6_addr), 16,
                          pseudo);
    udp = ip + IP6_LEN;
  }
  const uint16_t sport = ntohs(path.local.u.in.sin_port);
  const uint16_t dport = ntohs(path.remote.u.in.sin_port);
  wr16(udp, sport);
  wr16(udp + 2, dport);
  wr16(udp + 4, static_cast<uint16_t>(ulen));
  // Pseudo-header (addresses, protocol, length), then the UDP header with
  // a zero checksum (the length counts twice), then the payload.
  uint32_t sum = pseudo + IPPROTO_UDP + ulen + sport + dport + ulen;
  sum = checksum_add(payload, payload_len, sum);
  const uint16_t c = checksum_fold(sum);
  wr16(udp + 6, c == 0 ? 0xffff : c); // 0 means "no checksum" in UDP
  std::memcpy(payload - hlen, h, hlen);
  return hlen;
}

} // namespace xdpq::dataplane
