#include "dataplane/local_addresses.h"

#include "dataplane/rtnetlink.h"

#include <linux/if_addr.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xdpq::dataplane {

namespace {

std::string key_of(const Address &a) {
  if (a.family() == AF_INET) {
    return std::string(1, '4') + std::string(reinterpret_cast<const char *>(&a.u.in.sin_addr), 4);
  }
  return std::string(1, '6') + std::string(reinterpret_cast<const char *>(&a.u.in6.sin6_addr), 16);
}

Address address_of(const std::string &key) {
  Address a;
  rtnl::addr_from(key[0] == '4' ? AF_INET : AF_INET6, key.data() + 1, key.size() - 1, a);
  return a;
}

// Never on the wire: 127/8, ::1, ::ffff:0:0/96.
bool on_the_wire(const Address &a) {
  if (a.family() == AF_INET) return (ntohl(a.u.in.sin_addr.s_addr) >> 24) != 127;
  const auto *b = a.u.in6.sin6_addr.s6_addr;
  return !ipv6_loopback(b) && !ipv6_mapped(b);
}

int netlink_socket(uint32_t groups, int flags) {
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | flags, NETLINK_ROUTE);
  if (fd < 0) throw std::runtime_error(std::string("rtnetlink socket: ") + strerror(errno));
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = groups;
  if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0) {
    int err = errno;
    close(fd);
    throw std::runtime_error(std::string("rtnetlink bind: ") + strerror(err));
  }
  return fd;
}

} // namespace

LocalAddresses::LocalAddresses(Change change) : change_(std::move(change)), buf_(64 * 1024) {
  // Subscribed before the first list: a change between the two is seen.
  fd_ = netlink_socket(RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR, SOCK_NONBLOCK);
  int rcvbuf = 1 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  try {
    resync();
  } catch (...) {
    close(fd_);
    throw;
  }
  resyncs_ = 0;
}

LocalAddresses::~LocalAddresses() {
  if (fd_ >= 0) close(fd_);
}

bool LocalAddresses::contains(const Address &a) const { return present_.count(key_of(a)) > 0; }

void LocalAddresses::apply(const nlmsghdr *h, Table &t,
                           std::vector<std::pair<std::string, bool>> *events) {
  if ((h->nlmsg_type != RTM_NEWADDR && h->nlmsg_type != RTM_DELADDR) ||
      h->nlmsg_len < NLMSG_LENGTH(sizeof(ifaddrmsg))) {
    return;
  }
  ifaddrmsg ifa;
  std::memcpy(&ifa, NLMSG_DATA(h), sizeof(ifa));
  // IPv4's own address is IFA_LOCAL (IFA_ADDRESS is the peer's on a
  // point-to-point link); IPv6 has IFA_ADDRESS only, unless point-to-point.
  Address local, address;
  bool have_local = false, have_address = false;
  rtnl::for_each_attr(h, sizeof(ifaddrmsg), [&](uint16_t type, const void *data, size_t len) {
    if (type == IFA_LOCAL) have_local = rtnl::addr_from(ifa.ifa_family, data, len, local);
    if (type == IFA_ADDRESS) have_address = rtnl::addr_from(ifa.ifa_family, data, len, address);
  });
  if (!have_local && !have_address) return;
  const Address &a = have_local ? local : address;
  if (!on_the_wire(a)) return;
  const std::string key = key_of(a);
  // What the kernel tells one entry from another by (a notification for an
  // entry it has already is an update: the same entry again): IPv4 by
  // interface, prefix length and peer; IPv6 by interface alone (a change
  // of its prefix or peer rewrites the one entry in place).
  std::string entry = std::to_string(ifa.ifa_index);
  if (ifa.ifa_family == AF_INET) {
    entry += "/" + std::to_string(ifa.ifa_prefixlen);
    if (have_local && have_address) entry += "/" + key_of(address);
  }
  if (h->nlmsg_type == RTM_NEWADDR) {
    auto &entries = t[key];
    if (entries.empty() && events) events->emplace_back(key, true);
    entries.insert(std::move(entry));
  } else {
    auto it = t.find(key);
    if (it == t.end()) return;
    it->second.erase(entry);
    if (it->second.empty()) {
      t.erase(it);
      if (events) events->emplace_back(key, false);
    }
  }
}

void LocalAddresses::report(const std::string &key, bool present) {
  change_(address_of(key), present);
}

void LocalAddresses::resync() {
  resyncs_ += 1;
  int fd = netlink_socket(0, 0);
  timeval tv{2, 0}; // a kernel that does not answer is an error, not a hang
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  Table fresh;
  bool done = false;
  for (int attempt = 0; attempt < 3 && !done; ++attempt) {
    struct {
      nlmsghdr nh;
      ifaddrmsg ifa;
    } req{};
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(ifaddrmsg));
    req.nh.nlmsg_type = RTM_GETADDR;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.nh.nlmsg_seq = static_cast<uint32_t>(attempt + 1);
    req.ifa.ifa_family = AF_UNSPEC;
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (sendto(fd, &req, req.nh.nlmsg_len, 0, reinterpret_cast<sockaddr *>(&kernel),
               sizeof(kernel)) < 0) {
      break;
    }
    fresh.clear();
    bool interrupted = false, end = false, failed = false;
    while (!end && !failed) {
      ssize_t n = recv(fd, buf_.data(), buf_.size(), 0);
      if (n <= 0) {
        failed = true;
        break;
      }
      rtnl::for_each_message(buf_.data(), static_cast<size_t>(n), [&](const nlmsghdr *h) {
        if (h->nlmsg_seq != req.nh.nlmsg_seq) return;
        if (h->nlmsg_flags & NLM_F_DUMP_INTR) interrupted = true;
        if (h->nlmsg_type == NLMSG_DONE) end = true;
        else if (h->nlmsg_type == NLMSG_ERROR) failed = true;
        else apply(h, fresh, nullptr);
      });
    }
    done = end && !interrupted;
  }
  close(fd);
  if (!done) throw std::runtime_error("rtnetlink: cannot list the host's addresses");
  // What changed since the table was last right.
  for (auto it = present_.begin(); it != present_.end();) {
    if (!fresh.count(it->first)) {
      std::string key = it->first;
      it = present_.erase(it);
      report(key, false);
    } else {
      ++it;
    }
  }
  for (auto &[key, entries] : fresh) {
    bool is_new = !present_.count(key);
    present_[key] = entries;
    if (is_new) report(key, true);
  }
}

void LocalAddresses::on_readable() {
  for (int round = 0; round < 64; ++round) {
    sockaddr_nl from{};
    socklen_t fl = sizeof(from);
    ssize_t n = recvfrom(fd_, buf_.data(), buf_.size(), MSG_DONTWAIT,
                         reinterpret_cast<sockaddr *>(&from), &fl);
    if (n < 0) {
      if (errno == ENOBUFS) {
        // The kernel dropped notifications for us: list them all again.
        rtnl::discard_queued(fd_);
        try {
          resync();
        } catch (const std::exception &) {
          // Kept as it was; the next change or overflow tries again.
        }
        continue;
      }
      return; // EAGAIN (drained) or a transient error
    }
    if (from.nl_pid != 0) continue; // only the kernel speaks here
    std::vector<std::pair<std::string, bool>> events;
    rtnl::for_each_message(buf_.data(), static_cast<size_t>(n),
                           [&](const nlmsghdr *h) { apply(h, present_, &events); });
    for (const auto &[key, present] : events) report(key, present);
  }
}

} // namespace xdpq::dataplane
