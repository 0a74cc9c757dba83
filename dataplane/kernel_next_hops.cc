#include "dataplane/kernel_next_hops.h"

#include "base/clock.h"

#include "dataplane/neighbor_cache.h"
#include "dataplane/rtnetlink.h"

#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>

namespace xdpq::dataplane {

namespace {

constexpr uint64_t ASK_INTERVAL_NS = 1'000'000'000; // re-ask an unanswered query after this

// Room for a request: header, family message and two address attributes.
struct Request {
  nlmsghdr nh;
  union {
    rtmsg rt;
    ndmsg nd;
  } body;
  alignas(NLMSG_ALIGNTO) uint8_t attrs[64];
};

void add_attr(Request &r, uint16_t type, const void *data, size_t len) {
  auto *a = reinterpret_cast<rtattr *>(reinterpret_cast<uint8_t *>(&r) + NLMSG_ALIGN(r.nh.nlmsg_len));
  a->rta_type = type;
  a->rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
  std::memcpy(RTA_DATA(a), data, len);
  r.nh.nlmsg_len = static_cast<uint32_t>(NLMSG_ALIGN(r.nh.nlmsg_len) + RTA_ALIGN(a->rta_len));
}

// The address bytes of a (4 or 16) and their length.
const void *addr_bytes(const Address &a, size_t &len) {
  if (a.family() == AF_INET) {
    len = 4;
    return &a.u.in.sin_addr;
  }
  len = 16;
  return &a.u.in6.sin6_addr;
}

// The table key: the address without port (or scope).
Address key_of(const Address &a) {
  Address k;
  size_t len;
  const void *b = addr_bytes(a, len);
  rtnl::addr_from(a.family(), b, len, k);
  return k;
}

} // namespace

size_t KernelNextHops::AddrHash::operator()(const Address &a) const {
  uint8_t in[16] = {};
  size_t len;
  const void *b = addr_bytes(a, len);
  std::memcpy(in, b, len);
  if (len == 4) in[15] = 4; // IPv4 apart from IPv6 ::a.b.c.d
  return static_cast<size_t>(h(in));
}

KernelNextHops::KernelNextHops(int ifindex, size_t max_entries)
    : ifindex_(ifindex), max_entries_(max_entries ? max_entries : 1), buf_(64 * 1024) {
  fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd_ < 0) throw std::runtime_error(std::string("rtnetlink socket: ") + strerror(errno));
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;
  int one = 1;
  // Tells multicast changes (group != 0) from answers to our queries.
  if (setsockopt(fd_, SOL_NETLINK, NETLINK_PKTINFO, &one, sizeof(one)) != 0 ||
      bind(fd_, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0) {
    int err = errno;
    close(fd_);
    throw std::runtime_error(std::string("rtnetlink bind: ") + strerror(err));
  }
  int rcvbuf = 1 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  dump_neighbors();
}

KernelNextHops::~KernelNextHops() {
  if (fd_ >= 0) close(fd_);
}

void KernelNextHops::send_request(const void *msg, size_t len) {
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  // Non-blocking: a request that does not fit now is asked again later.
  [[maybe_unused]] auto n = sendto(fd_, msg, len, MSG_DONTWAIT,
                                   reinterpret_cast<sockaddr *>(&kernel), sizeof(kernel));
}

void KernelNextHops::dump_neighbors() {
  Request r{};
  r.nh.nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
  r.nh.nlmsg_type = RTM_GETNEIGH;
  r.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  r.nh.nlmsg_seq = ++seq_;
  r.body.nd.ndm_family = AF_UNSPEC;
  send_request(&r, r.nh.nlmsg_len);
}

void KernelNextHops::ask_route(const Address &dst) {
  Request r{};
  r.nh.nlmsg_len = NLMSG_LENGTH(sizeof(rtmsg));
  r.nh.nlmsg_type = RTM_GETROUTE;
  r.nh.nlmsg_flags = NLM_F_REQUEST;
  r.nh.nlmsg_seq = ++seq_;
  size_t len;
  const void *b = addr_bytes(dst, len);
  r.body.rt.rtm_family = static_cast<uint8_t>(dst.family());
  r.body.rt.rtm_dst_len = static_cast<uint8_t>(len * 8);
  add_attr(r, RTA_DST, b, len);
  send_request(&r, r.nh.nlmsg_len);
  stats_.nh_route_queries += 1;
}

void KernelNextHops::ask_resolution(const Address &ip) {
  // As if the kernel itself had a packet for ip: it creates the entry if
  // needed and sends ARP / neighbour solicitations; the answer comes back
  // as a neighbour change.
  Request r{};
  r.nh.nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
  r.nh.nlmsg_type = RTM_NEWNEIGH;
  r.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE;
  r.nh.nlmsg_seq = ++seq_;
  r.body.nd.ndm_family = static_cast<uint8_t>(ip.family());
  r.body.nd.ndm_ifindex = ifindex_;
  r.body.nd.ndm_state = NUD_NONE;
  r.body.nd.ndm_flags = NTF_USE;
  size_t len;
  const void *b = addr_bytes(ip, len);
  add_attr(r, NDA_DST, b, len);
  send_request(&r, r.nh.nlmsg_len);
  stats_.nh_solicits += 1;
}

bool KernelNextHops::may_ask(uint64_t now_ns) {
  if (now_ns - ask_window_ >= ASK_INTERVAL_NS) {
    ask_window_ = now_ns;
    asks_in_window_ = 0;
  }
  if (asks_in_window_ >= MAX_ASKS_PER_SECOND) {
    stats_.nh_asks_deferred += 1;
    return false;
  }
  asks_in_window_ += 1;
  return true;
}

KernelNextHops::Hop KernelNextHops::route(const Address &dst) {
  stats_.nh_lookups += 1;
  Address k = key_of(dst);
  auto it = routes_.find(k);
  if (it == routes_.end()) {
    // An entry only for a destination asked about: one put off costs no
    // room, so a flood of forged sources fills the table no faster than
    // the allowance, and empties it (answers included) that seldom.
    stats_.nh_route_misses += 1;
    const uint64_t now_ns = monotonic_ns();
    if (!may_ask(now_ns)) return Hop{};
    if (routes_.size() >= max_entries_) routes_.clear(); // bounded; refilled on demand
    it = routes_.emplace(k, Route{}).first;
    it->second.asked_at = now_ns;
    ask_route(k);
    return it->second.hop;
  }
  Route &r = it->second;
  if (r.hop.kind == Hop::Kind::unknown) {
    stats_.nh_route_misses += 1;
    const uint64_t now_ns = monotonic_ns();
    if (now_ns - r.asked_at >= ASK_INTERVAL_NS && may_ask(now_ns)) {
      r.asked_at = now_ns;
      ask_route(k);
    }
  } else if (r.hop.kind == Hop::Kind::elsewhere) {
    stats_.nh_route_elsewhere += 1;
  } else if (r.hop.kind == Hop::Kind::unreachable) {
    stats_.nh_route_unreachable += 1;
  }
  return r.hop;
}

uint64_t KernelNextHops::neighbor(const Address &ip) {
  Address k = key_of(ip);
  auto it = neigh_.find(k);
  if (it == neigh_.end() || it->second.link == 0) {
    stats_.nh_neigh_misses += 1;
    const uint64_t now_ns = monotonic_ns();
    if (it != neigh_.end() && now_ns - it->second.solicited_at < ASK_INTERVAL_NS) return 0;
    if (!may_ask(now_ns)) return 0; // as for routes: no entry until asked
    if (it == neigh_.end()) {
      if (neigh_.size() >= max_entries_) neigh_.clear();
      it = neigh_.emplace(k, Neigh{}).first;
    }
    it->second.solicited_at = now_ns;
    ask_resolution(k);
  }
  return it->second.link;
}

void KernelNextHops::on_readable() {
  for (int round = 0; round < 64; ++round) {
    sockaddr_nl from{};
    iovec iov{buf_.data(), buf_.size()};
    alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(nl_pktinfo))];
    msghdr msg{};
    msg.msg_name = &from;
    msg.msg_namelen = sizeof(from);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == ENOBUFS) {
        // The kernel dropped messages for us: start over.
        rtnl::discard_queued(fd_);
        resync();
        continue;
      }
      return; // EAGAIN (drained) or a transient error
    }
    if (from.nl_pid != 0 || (msg.msg_flags & MSG_TRUNC)) continue; // not the kernel, or cut
    group_ = 0;
    for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_NETLINK && c->cmsg_type == NETLINK_PKTINFO) {
        nl_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        group_ = pi.group;
      }
    }
    rtnl::for_each_message(buf_.data(), static_cast<size_t>(n),
                           [&](const nlmsghdr *h) { handle(h); });
  }
}

void KernelNextHops::handle(const nlmsghdr *h) {
  switch (h->nlmsg_type) {
  case RTM_NEWROUTE:
  case RTM_DELROUTE:
    on_route(h);
    break;
  case RTM_NEWNEIGH:
  case RTM_DELNEIGH:
    on_neigh(h);
    break;
  case NLMSG_ERROR:
    on_error(h);
    break;
  default:
    break;
  }
}

void KernelNextHops::on_error(const nlmsghdr *h) {
  // A route query the kernel refused because the route to that
  // destination is a blackhole (EINVAL), unreachable (EHOSTUNREACH) or
  // prohibit (EACCES): the kernel itself would send nothing there, and
  // neither do we. Any other error (no route at all, a shortage) leaves it
  // unknown, asked again later, as before. The error carries our request,
  // whose RTA_DST names the destination. (A failed resolution request
  // shows as a neighbour that never resolves.)
  if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) return;
  const auto *e = static_cast<const nlmsgerr *>(NLMSG_DATA(h));
  if (e->msg.nlmsg_type != RTM_GETROUTE) return;
  if (e->error != -EINVAL && e->error != -EHOSTUNREACH && e->error != -EACCES) return;
  const size_t room = h->nlmsg_len - NLMSG_LENGTH(0) - offsetof(nlmsgerr, msg);
  if (e->msg.nlmsg_len < NLMSG_LENGTH(sizeof(rtmsg)) || e->msg.nlmsg_len > room) return;
  const auto *rt = static_cast<const rtmsg *>(NLMSG_DATA(&e->msg));
  Address dst;
  bool have_dst = false;
  rtnl::for_each_attr(&e->msg, sizeof(rtmsg), [&](uint16_t type, const void *data, size_t len) {
    if (type == RTA_DST) have_dst = rtnl::addr_from(rt->rtm_family, data, len, dst);
  });
  if (!have_dst) return;
  auto it = routes_.find(dst);
  if (it == routes_.end()) return; // flushed since we asked
  it->second.hop.kind = Hop::Kind::unreachable;
  it->second.hop.via = dst;
  ++generation_;
}

void KernelNextHops::on_route(const nlmsghdr *h) {
  if (group_ != 0) {
    // The routing changed somewhere: every cached answer may be stale.
    if (!routes_.empty()) {
      routes_.clear();
      stats_.nh_route_flushes += 1;
      ++generation_;
    }
    return;
  }
  if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(rtmsg))) return;
  const auto *rt = static_cast<const rtmsg *>(NLMSG_DATA(h));
  Address dst, gw;
  bool have_dst = false, have_gw = false;
  int oif = 0;
  rtnl::for_each_attr(h, sizeof(rtmsg), [&](uint16_t type, const void *data, size_t len) {
    if (type == RTA_DST) {
      have_dst = rtnl::addr_from(rt->rtm_family, data, len, dst);
    } else if (type == RTA_GATEWAY) {
      have_gw = rtnl::addr_from(rt->rtm_family, data, len, gw);
    } else if (type == RTA_VIA && len >= sizeof(rtvia)) {
      // An IPv6 route through an IPv4 gateway (or the other way round).
      const auto *via = static_cast<const rtvia *>(data);
      have_gw = rtnl::addr_from(via->rtvia_family, via->rtvia_addr, len - sizeof(rtvia), gw);
    } else if (type == RTA_OIF && len == sizeof(int)) {
      std::memcpy(&oif, data, sizeof(int));
    }
  });
  if (!have_dst) return;
  auto it = routes_.find(dst);
  if (it == routes_.end()) return; // flushed since we asked
  Hop &hop = it->second.hop;
  if (rt->rtm_type == RTN_LOCAL) {
    hop.kind = Hop::Kind::local;
    hop.via = dst;
  } else if (rt->rtm_type == RTN_BLACKHOLE || rt->rtm_type == RTN_UNREACHABLE ||
             rt->rtm_type == RTN_PROHIBIT) {
    hop.kind = Hop::Kind::unreachable;
    hop.via = dst;
  } else if (rt->rtm_type != RTN_UNICAST || oif != ifindex_) {
    hop.kind = Hop::Kind::elsewhere; // unreachable, or another interface
    hop.via = dst;
  } else if (have_gw) {
    hop.kind = Hop::Kind::gateway;
    hop.via = gw;
  } else {
    hop.kind = Hop::Kind::onlink;
    hop.via = dst;
  }
  ++generation_;
}

void KernelNextHops::on_neigh(const nlmsghdr *h) {
  if (h->nlmsg_len < NLMSG_LENGTH(sizeof(ndmsg))) return;
  const auto *nd = static_cast<const ndmsg *>(NLMSG_DATA(h));
  if (nd->ndm_ifindex != ifindex_) return;
  Address ip;
  bool have_ip = false;
  Mac mac{};
  bool have_mac = false;
  rtnl::for_each_attr(h, sizeof(ndmsg), [&](uint16_t type, const void *data, size_t len) {
    if (type == NDA_DST) {
      have_ip = rtnl::addr_from(nd->ndm_family, data, len, ip);
    } else if (type == NDA_LLADDR && len == mac.size()) {
      std::memcpy(mac.data(), data, mac.size());
      have_mac = true;
    }
  });
  if (!have_ip) return;
  constexpr uint16_t USABLE =
      NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP;
  uint64_t link = h->nlmsg_type == RTM_NEWNEIGH && have_mac && (nd->ndm_state & USABLE)
                      ? pack_link(mac, 0)
                      : 0;
  auto it = neigh_.find(ip);
  if (link == 0) {
    // Gone or not (yet) resolved: forget it, but keep when we last asked.
    if (it != neigh_.end() && it->second.link != 0) {
      it->second.link = 0;
      ++generation_;
    }
    return;
  }
  if (it == neigh_.end()) {
    if (neigh_.size() >= max_entries_) neigh_.clear();
    it = neigh_.emplace(ip, Neigh{}).first;
  }
  if (it->second.link != link) {
    it->second.link = link;
    stats_.nh_neigh_updates += 1;
    ++generation_;
  }
}

void KernelNextHops::resync() {
  routes_.clear();
  neigh_.clear();
  stats_.nh_resyncs += 1;
  ++generation_;
  dump_neighbors();
}

} // namespace xdpq::dataplane
