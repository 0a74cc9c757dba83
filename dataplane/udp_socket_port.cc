#include "dataplane/udp_socket_port.h"

#include "dataplane/udp_send_control.h"

#include <linux/filter.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace xdpq::dataplane {

namespace {

constexpr size_t RX_BUF_SIZE = 65536;  // one GRO train
constexpr size_t CMSG_PER_MSG = 128;
static_assert(CMSG_PER_MSG >= UDP_SEND_CONTROL_SPACE);
constexpr size_t GSO_MAX_SEGMENTS = 64; // UDP_MAX_SEGMENTS on 6.x kernels
constexpr size_t GSO_MAX_BYTES = 65000;
constexpr size_t TX_SLOT = 2048;

std::string why(const Address &a, const char *what) {
  return "listen " + a.to_string() + ": " + what + ": " + std::strerror(errno);
}

void set_int(int fd, int level, int name, int value) {
  setsockopt(fd, level, name, &value, sizeof(value));
}

// True when another socket already holds the address: SO_REUSEPORT would
// otherwise let us silently share a port with another process of ours.
bool address_taken(const Address &a) {
  if (a.port() == 0) return false;
  int fd = socket(a.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  if (a.family() == AF_INET6) set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
  bool taken = bind(fd, &a.u.sa, a.len) != 0 && errno == EADDRINUSE;
  close(fd);
  return taken;
}

} // namespace

void UdpSocketPort::configure(int fd, int family, const UdpSocketOptions &opts, bool &gro,
                              bool &gso) {
  set_int(fd, SOL_SOCKET, SO_RCVBUF, opts.socket_buffer);
  set_int(fd, SOL_SOCKET, SO_SNDBUF, opts.socket_buffer);
  if (family == AF_INET6) {
    set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
    set_int(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1);
    set_int(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, 1);
    set_int(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE);
  } else {
    set_int(fd, IPPROTO_IP, IP_PKTINFO, 1);
    set_int(fd, IPPROTO_IP, IP_RECVTOS, 1);
    // QUIC does its own path MTU discovery: never fragment.
    set_int(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE);
  }
  if (gro) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof(one)) != 0) gro = false;
  }
  if (gso) {
    int seg = 1200; // probe only: the real size goes in each sendmsg
    if (setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof(seg)) != 0) {
      gso = false;
    } else {
      seg = 0;
      setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof(seg));
    }
  }
}

UdpSocketPort::UdpSocketPort(const std::vector<Address> &listen, const UdpSocketOptions &opts)
    : opts_(opts) {
  if (listen.empty()) throw PortError("no listen address");
  gso_ = opts_.gso;
  gro_ = opts_.gro;
  auto inherited = opts_.inherited;
  auto take_inherited = [&](const Address &addr) {
    for (auto it = inherited.begin(); it != inherited.end(); ++it) {
      if (it->first == addr) {
        int fd = it->second;
        inherited.erase(it);
        return fd;
      }
    }
    return -1;
  };
  std::vector<std::pair<Address, int>> extra;
  for (const auto &addr : listen) {
    int fd = take_inherited(addr);
    if (fd >= 0) {
      sockets_.push_back(Socket{fd, addr, true});
      fds_.push_back(fd);
      sockets_.back().bound = addr;
      continue; // bound and set up by the previous process
    }
    if ((opts_.check_in_use || !opts_.reuseport) && address_taken(addr)) {
      errno = EADDRINUSE;
      throw PortError(why(addr, "bind"));
    }
    fd = socket(addr.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) throw PortError(why(addr, "socket"));
    sockets_.push_back(Socket{fd, addr});
    fds_.push_back(fd);
    if (opts_.reuseport) set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1);
    configure(fd, addr.family(), opts_, gro_, gso_);
    if (bind(fd, &addr.u.sa, addr.len) != 0) throw PortError(why(addr, "bind"));
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl);
    sockets_.back().bound = Address::from(reinterpret_cast<sockaddr *>(&ss), sl);
  }
  primary_ = sockets_.size();
  // Inherited sockets beyond one per address: read as well (their packets
  // are ours to route); sends use the first socket of an address.
  for (const auto &[addr, fd] : inherited) {
    sockets_.push_back(Socket{fd, addr, true});
    fds_.push_back(fd);
  }

  size_t n = opts_.rx_batch;
  rx_buf_.resize(n * RX_BUF_SIZE);
  rx_msgs_.resize(n);
  rx_iov_.resize(n);
  rx_names_.resize(n);
  rx_cmsg_.resize(n * CMSG_PER_MSG);
  rx_pending_.reserve(n * GSO_MAX_SEGMENTS);
  tx_buf_.resize(opts_.tx_capacity * TX_SLOT);
  tx_entries_.reserve(opts_.tx_capacity);
  tx_msgs_.resize(opts_.tx_capacity);
  tx_iov_.resize(opts_.tx_capacity);
  tx_cmsg_.resize(opts_.tx_capacity * CMSG_PER_MSG);
}

UdpSocketPort::~UdpSocketPort() {
  for (auto &s : sockets_) close(s.fd);
}

bool UdpSocketPort::steer_by_connection_id(size_t worker_offset) {
  // Classic BPF runs with skb->data at the UDP payload; a short header's
  // DCID starts at its second byte. A packet too short to hold the byte
  // ends the program with 0 (socket 0); no valid short header is that short.
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 0),           // A = first byte
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x80, 3, 0), // long header?
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, static_cast<uint32_t>(1 + worker_offset)), // worker
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x7f),       // without the generation bit
      BPF_STMT(BPF_RET | BPF_A, 0),                    // socket index
      BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),          // out of range: hash
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(code) / sizeof(code[0])), code};
  for (const auto &s : sockets_) {
    if (setsockopt(s.fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof(prog)) != 0) {
      return false;
    }
  }
  return true;
}

std::vector<std::pair<int, Address>> UdpSocketPort::sockets() const {
  std::vector<std::pair<int, Address>> v;
  for (const auto &s : sockets_) v.emplace_back(s.fd, s.bound);
  return v;
}

bool UdpSocketPort::set_receiving(int fd, bool on) {
  for (auto &s : sockets_) {
    if (s.fd == fd) {
      s.receiving = on;
      return true;
    }
  }
  return false;
}

std::vector<Address> UdpSocketPort::bound_addresses() const {
  std::vector<Address> v;
  for (size_t i = 0; i < primary_ && i < sockets_.size(); ++i) v.push_back(sockets_[i].bound);
  return v;
}

int UdpSocketPort::socket_for(const Address &local) const {
  for (size_t i = 0; i < sockets_.size(); ++i) {
    const auto &b = sockets_[i].bound;
    if (b.family() == local.family() && b.port() == local.port() &&
        (b.is_unspecified() || b == local)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

size_t UdpSocketPort::drain_socket(size_t sock, std::span<RxDatagram> out) {
  const Socket &s = sockets_[sock];
  size_t batch = rx_msgs_.size();
  for (size_t i = 0; i < batch; ++i) {
    rx_iov_[i] = {rx_buf_.data() + i * RX_BUF_SIZE, RX_BUF_SIZE};
    auto &h = rx_msgs_[i].msg_hdr;
    h = {};
    h.msg_name = &rx_names_[i];
    h.msg_namelen = sizeof(sockaddr_storage);
    h.msg_iov = &rx_iov_[i];
    h.msg_iovlen = 1;
    h.msg_control = rx_cmsg_.data() + i * CMSG_PER_MSG;
    h.msg_controllen = CMSG_PER_MSG;
  }
  int n = recvmmsg(s.fd, rx_msgs_.data(), static_cast<unsigned>(batch), MSG_DONTWAIT, nullptr);
  if (n <= 0) {
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      stats_.rx_errors += 1;
    }
    return 0;
  }
  rx_pending_.clear();
  rx_pending_pos_ = 0;
  for (int i = 0; i < n; ++i) {
    auto &h = rx_msgs_[i].msg_hdr;
    size_t len = rx_msgs_[i].msg_len;
    if (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
      stats_.rx_truncated += 1;
      continue;
    }
    Path path;
    path.remote = Address::from(static_cast<sockaddr *>(h.msg_name), h.msg_namelen);
    path.local = s.bound;
    uint8_t ecn = 0;
    size_t gso = 0;
    bool not_unicast = false;
    for (cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
        in_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        path.local.u.in.sin_addr = pi.ipi_addr;
        // To a broadcast (the link's or a subnet's) or a multicast group,
        // the kernel names the interface's own address as where it came
        // instead: not a host of ours that could answer from it.
        not_unicast = pi.ipi_addr.s_addr != pi.ipi_spec_dst.s_addr;
      } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
        in6_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        path.local.u.in6.sin6_addr = pi.ipi6_addr;
        not_unicast = pi.ipi6_addr.s6_addr[0] == 0xff; // multicast
      } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
        ecn = *CMSG_DATA(c) & 0x3;
      } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
        int tc;
        std::memcpy(&tc, CMSG_DATA(c), sizeof(tc));
        ecn = static_cast<uint8_t>(tc & 0x3);
      } else if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
        int g;
        std::memcpy(&g, CMSG_DATA(c), sizeof(g));
        gso = static_cast<size_t>(g);
      }
    }
    if (not_unicast) {
      stats_.rx_not_unicast += 1;
      continue;
    }
    uint8_t *base = static_cast<uint8_t *>(rx_iov_[i].iov_base);
    if (len == 0) {
      // An empty datagram is still a datagram: the endpoint counts it.
      rx_pending_.push_back(RxDatagram{base, 0, path, ecn});
      stats_.rx_datagrams += 1;
      continue;
    }
    if (gso == 0 || gso >= len) gso = len;
    for (size_t off = 0; off < len; off += gso) {
      size_t seg = len - off < gso ? len - off : gso;
      rx_pending_.push_back(RxDatagram{base + off, seg, path, ecn});
      stats_.rx_datagrams += 1;
      stats_.rx_bytes += seg;
    }
  }
  size_t k = 0;
  while (k < out.size() && rx_pending_pos_ < rx_pending_.size()) {
    out[k++] = rx_pending_[rx_pending_pos_++];
  }
  return k;
}

size_t UdpSocketPort::receive(std::span<RxDatagram> out) {
  size_t k = 0;
  // Hand out what is left of the last GRO split before reading again: its
  // buffers must not be overwritten while still queued.
  while (k < out.size() && rx_pending_pos_ < rx_pending_.size()) {
    out[k++] = rx_pending_[rx_pending_pos_++];
  }
  if (k > 0) return k;
  for (size_t tries = 0; tries < sockets_.size() && k == 0; ++tries) {
    size_t sock = next_rx_socket_;
    next_rx_socket_ = (next_rx_socket_ + 1) % sockets_.size();
    if (sockets_[sock].receiving) k = drain_socket(sock, out);
  }
  return k;
}

std::span<uint8_t> UdpSocketPort::tx_alloc(size_t max_len) {
  if (tx_entries_.size() >= opts_.tx_capacity || tx_used_ + max_len > tx_buf_.size()) {
    return {};
  }
  return {tx_buf_.data() + tx_used_, max_len};
}

void UdpSocketPort::tx_commit(const Path &path, uint8_t ecn, size_t len) {
  if (len == 0) return;
  tx_datagrams_ += 1;
  if (gso_ && !tx_entries_.empty()) {
    TxEntry &last = tx_entries_.back();
    bool open_train = last.len == last.segment * last.count; // no short tail yet
    if (open_train && last.ecn == ecn && len <= last.segment &&
        last.count < GSO_MAX_SEGMENTS && last.len + len <= GSO_MAX_BYTES &&
        last.offset + last.len == tx_used_ && last.path == path) {
      last.len += len;
      last.count += 1;
      tx_used_ += len;
      return;
    }
  }
  tx_entries_.push_back(TxEntry{path, ecn, tx_used_, len, len, 1});
  tx_used_ += len;
}

bool UdpSocketPort::flush() {
  // A socket whose send buffer is full holds back only its own datagrams:
  // they stay queued, in order, moved to the front of the buffer, while the
  // other sockets' go out.
  blocked_.assign(sockets_.size(), 0);
  bool any_blocked = false;
  size_t kept = 0;      // entries still queued, at the front of tx_entries_
  size_t kept_used = 0; // their bytes, at the front of tx_buf_
  auto keep = [&](TxEntry e) {
    // Entries lie in tx_buf_ in order, so this moves data only towards the
    // front, below every entry not yet looked at.
    if (e.offset != kept_used) std::memmove(tx_buf_.data() + kept_used, tx_buf_.data() + e.offset, e.len);
    e.offset = kept_used;
    kept_used += e.len;
    tx_entries_[kept++] = e;
  };
  size_t first = 0;
  while (first < tx_entries_.size()) {
    int sock = socket_for(tx_entries_[first].path.local);
    if (sock < 0) {
      stats_.tx_dropped += tx_entries_[first].count;
      first += 1;
      continue;
    }
    if (blocked_[static_cast<size_t>(sock)]) {
      keep(tx_entries_[first]);
      first += 1;
      continue;
    }
    // One sendmmsg per run of entries that leave through the same socket.
    const Socket &s = sockets_[static_cast<size_t>(sock)];
    size_t n = 0;
    for (size_t i = first; i < tx_entries_.size(); ++i, ++n) {
      TxEntry &e = tx_entries_[i];
      if (socket_for(e.path.local) != sock) break;
      tx_iov_[n] = {tx_buf_.data() + e.offset, e.len};
      auto &h = tx_msgs_[n].msg_hdr;
      h = {};
      h.msg_name = const_cast<sockaddr *>(&e.path.remote.u.sa);
      h.msg_namelen = e.path.remote.len;
      h.msg_iov = &tx_iov_[n];
      h.msg_iovlen = 1;
      set_send_control(h, tx_cmsg_.data() + n * CMSG_PER_MSG, e.path.local,
                       s.bound.is_unspecified(), e.ecn,
                       e.count > 1 ? static_cast<uint16_t>(e.segment) : 0);
    }
    int sent = sendmmsg(s.fd, tx_msgs_.data(), static_cast<unsigned>(n), MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
        blocked_[static_cast<size_t>(sock)] = 1;
        any_blocked = true;
        continue; // this run is kept by the check above
      }
      if (errno == EINTR) continue;
      // The first message failed for good (unreachable, too big, GSO not
      // supported by the route): drop it and go on with the rest.
      TxEntry &e = tx_entries_[first];
      if (errno == EIO && e.count > 1) gso_ = false;
      if (errno == EMSGSIZE || (errno == EINVAL && e.count > 1)) {
        // Larger than the route allows: a path MTU probe, most often. GSO
        // refuses a whole train whose segment is too large (EINVAL; a
        // source address no longer local gets that too, and is counted
        // so). Every datagram of the segment's size is, but a shorter last
        // one (the packet that followed a probe into its train) may fit:
        // it goes alone, not lost with the probe.
        const size_t full = e.len / e.segment;
        stats_.tx_too_big += full;
        if (e.count > 1 && full < e.count) {
          stats_.tx_dropped += full;
          e.offset += full * e.segment;
          e.len -= full * e.segment;
          e.segment = e.len;
          e.count = 1;
          continue;
        }
      }
      stats_.tx_dropped += e.count;
      first += 1;
      continue;
    }
    stats_.tx_sends += 1;
    for (int i = 0; i < sent; ++i) {
      const TxEntry &e = tx_entries_[first + static_cast<size_t>(i)];
      stats_.tx_datagrams += e.count;
      stats_.tx_bytes += e.len;
      if (e.count > 1) stats_.tx_gso_batches += 1;
    }
    first += static_cast<size_t>(sent);
  }
  tx_entries_.resize(kept);
  tx_used_ = kept_used;
  return !any_blocked;
}

bool UdpSocketPort::waits_for_room(int fd) const {
  for (size_t i = 0; i < sockets_.size() && i < blocked_.size(); ++i) {
    if (sockets_[i].fd == fd) return blocked_[i] != 0;
  }
  return false;
}

} // namespace xdpq::dataplane
