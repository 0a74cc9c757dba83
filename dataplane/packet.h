#pragma once
// The user-space Ethernet/IPv4/IPv6/UDP path: parse and validate a received
// frame in place, and build headers in front of a payload already written
// into a TX frame. No allocation, no copies of the payload.

#include "dataplane/datagram_port.h"

#include <array>
#include <cstddef>
#include <cstdint>

namespace xdpq::dataplane {

using Mac = std::array<uint8_t, 6>;

// Room a TX frame keeps in front of the payload: Ethernet + 802.1Q + IPv6 +
// UDP is 66 bytes; 128 keeps the payload cache-line aligned.
constexpr size_t TX_HEADROOM = 128;

enum class ParseStatus : uint8_t {
  ok,
  truncated,      // shorter than its headers claim
  not_ip,         // not IPv4/IPv6
  not_udp,        // IP, but not UDP (or IPv6 extension headers)
  bad_ip_header,  // version, IHL or IPv4 header checksum wrong
  bad_ip_len,     // total / payload length inconsistent with the frame
  bad_udp_len,    // UDP length inconsistent with IP
  fragment,       // IP fragment
  bad_address,    // source not unicast (or loopback), destination multicast or broadcast
  no_udp_checksum, // IPv6 UDP with a zero checksum (RFC 8200 8.1: receivers drop it)
  count_
};
const char *parse_status_name(ParseStatus s);

struct ParsedFrame {
  size_t payload_offset = 0; // UDP payload, from the frame start
  size_t payload_len = 0;
  Path path;                 // local = destination, remote = source
  uint8_t ecn = 0;
  Mac src_mac{};             // the peer's MAC: replies go back to it
  Mac dst_mac{};
  uint16_t vlan_tci = 0;     // 0: untagged
};

// Parses a frame as received. The UDP checksum is not checked: local
// senders through veth leave it partial (offload), and QUIC's AEAD
// authenticates the payload anyway. Trailing bytes past the IP length
// (Ethernet padding) are ignored.
ParseStatus parse_frame(const uint8_t *frame, size_t len, ParsedFrame &out);

// Writes Ethernet (with an 802.1Q tag when vlan_tci != 0), IPv4 or IPv6 and
// UDP headers in front of payload[0, payload_len), with full IPv4 header and
// UDP checksums and the ECN codepoint. Returns the header length; the frame
// starts at payload - header length. payload must have header room before it.
size_t build_headers(uint8_t *payload, size_t payload_len, const Path &path, uint8_t ecn,
                     const Mac &src_mac, const Mac &dst_mac, uint16_t vlan_tci);

size_t header_length(int family, bool vlan);

// Internet checksum helpers (RFC 1071).
uint32_t checksum_add(const uint8_t *data, size_t len, uint32_t sum = 0);
uint16_t checksum_fold(uint32_t sum);

} // namespace xdpq::dataplane
