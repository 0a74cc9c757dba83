#pragma once
// The control messages of one UDP send, shared by the socket dataplane and
// the AF_XDP port's hybrid TX: the source address (when the socket is bound
// to a wildcard), the ECN bits, and the GSO segment size of a train.

#include "dataplane/address.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

namespace xdpq::dataplane {

// Room for every control message set_send_control() may write.
constexpr size_t UDP_SEND_CONTROL_SPACE =
    CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t));

// Fills h.msg_control/msg_controllen from buf (at least
// UDP_SEND_CONTROL_SPACE bytes, aligned for cmsghdr): IP_PKTINFO /
// IPV6_PKTINFO with source when set_source, IP_TOS / IPV6_TCLASS when ecn is
// non-zero, UDP_SEGMENT when gso_segment is non-zero. No control message:
// msg_control is null.
void set_send_control(msghdr &h, uint8_t *buf, const Address &source, bool set_source, uint8_t ecn,
                      uint16_t gso_segment);

} // namespace xdpq::dataplane
