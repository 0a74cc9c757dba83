#pragma once
// Reading rtnetlink messages (routes, neighbours, addresses): bounds-checked
// walks over a datagram's messages and a message's attributes, and
// addresses from attribute payloads.

#include "dataplane/address.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace xdpq::dataplane::rtnl {

// An Address (port 0) from an attribute's payload, if it has the length of
// family's addresses.
inline bool addr_from(int family, const void *data, size_t len, Address &out) {
  out = Address{};
  if (family == AF_INET && len == 4) {
    out.u.in.sin_family = AF_INET;
    std::memcpy(&out.u.in.sin_addr, data, 4);
    out.len = sizeof(sockaddr_in);
    return true;
  }
  if (family == AF_INET6 && len == 16) {
    out.u.in6.sin6_family = AF_INET6;
    std::memcpy(&out.u.in6.sin6_addr, data, 16);
    out.len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

// Walks the attributes after a family message of fixed size; f(type, data,
// len) for each well-formed one. (Not RTA_OK/RTA_NEXT: bounds in size_t,
// no casts that drop alignment.)
template <typename F> void for_each_attr(const nlmsghdr *h, size_t fixed, F &&f) {
  const size_t start = NLMSG_LENGTH(NLMSG_ALIGN(fixed));
  if (h->nlmsg_len < start) return;
  const auto *p = reinterpret_cast<const uint8_t *>(h) + start;
  size_t left = h->nlmsg_len - start;
  while (left >= sizeof(rtattr)) {
    const auto *a = reinterpret_cast<const rtattr *>(p);
    if (a->rta_len < sizeof(rtattr) || a->rta_len > left) return;
    f(a->rta_type, p + RTA_LENGTH(0), a->rta_len - RTA_LENGTH(0));
    const size_t step = RTA_ALIGN(a->rta_len);
    if (step >= left) return;
    p += step;
    left -= step;
  }
}

// Walks the messages of one datagram of n bytes at p (NLMSG_ALIGNTO-aligned:
// a malloc'd buffer); f(h) for each whole one.
template <typename F> void for_each_message(const uint8_t *p, size_t n, F &&f) {
  size_t left = n;
  while (left >= sizeof(nlmsghdr)) {
    const auto *h = reinterpret_cast<const nlmsghdr *>(p);
    if (h->nlmsg_len < sizeof(nlmsghdr) || h->nlmsg_len > left) return;
    f(h);
    const size_t step = NLMSG_ALIGN(h->nlmsg_len);
    if (step >= left) return;
    p += step;
    left -= step;
  }
}

// After ENOBUFS on a notification socket (the kernel dropped messages for
// it): what is still queued is older than what was dropped (the error is
// reported before queued messages), so applied after a fresh list it would
// undo it (an address added, then its removal dropped: added back). Reads
// the queue away, up to a bound, before the caller lists afresh.
inline void discard_queued(int fd) {
  uint8_t scrap[4096];
  for (int i = 0; i < 65536; ++i) {
    if (recv(fd, scrap, sizeof(scrap), MSG_DONTWAIT | MSG_TRUNC) < 0 && errno != ENOBUFS) return;
  }
}

} // namespace xdpq::dataplane::rtnl
