#include "dataplane/udp_send_control.h"

#include <netinet/udp.h>

#include <cstring>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

namespace xdpq::dataplane {

namespace {
template <typename T> cmsghdr *put(msghdr &h, cmsghdr *c, size_t &used, int level, int type,
                                   const T &value) {
  c->cmsg_level = level;
  c->cmsg_type = type;
  c->cmsg_len = CMSG_LEN(sizeof(T));
  std::memcpy(CMSG_DATA(c), &value, sizeof(T));
  used += CMSG_SPACE(sizeof(T));
  return CMSG_NXTHDR(&h, c);
}
} // namespace

void set_send_control(msghdr &h, uint8_t *buf, const Address &source, bool set_source, uint8_t ecn,
                      uint16_t gso_segment) {
  std::memset(buf, 0, UDP_SEND_CONTROL_SPACE);
  h.msg_control = buf;
  h.msg_controllen = UDP_SEND_CONTROL_SPACE;
  const bool v4 = source.family() == AF_INET;
  size_t used = 0;
  cmsghdr *c = CMSG_FIRSTHDR(&h);
  if (set_source) { // the address the peer knows us by
    if (v4) {
      in_pktinfo pi{};
      pi.ipi_spec_dst = source.u.in.sin_addr;
      c = put(h, c, used, IPPROTO_IP, IP_PKTINFO, pi);
    } else {
      in6_pktinfo pi{};
      pi.ipi6_addr = source.u.in6.sin6_addr;
      c = put(h, c, used, IPPROTO_IPV6, IPV6_PKTINFO, pi);
    }
  }
  if (ecn != 0) {
    int tos = ecn;
    c = put(h, c, used, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_TOS : IPV6_TCLASS, tos);
  }
  if (gso_segment != 0) put(h, c, used, IPPROTO_UDP, UDP_SEGMENT, gso_segment);
  h.msg_controllen = used;
  if (used == 0) h.msg_control = nullptr;
}

} // namespace xdpq::dataplane
