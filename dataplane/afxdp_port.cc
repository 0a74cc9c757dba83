#include "dataplane/afxdp_port.h"

#include "base/clock.h"
#include "base/log.h"
#include "dataplane/udp_send_control.h"
#include "dataplane/xdp_program.h"

#include <linux/if_xdp.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#ifndef SO_PREFER_BUSY_POLL
#define SO_PREFER_BUSY_POLL 69
#endif
#ifndef SO_BUSY_POLL_BUDGET
#define SO_BUSY_POLL_BUDGET 70
#endif

namespace xdpq::dataplane {

namespace {

std::string where(const AfXdpOptions &o) {
  return "AF_XDP " + o.ifname + (o.queues.size() == 1 ? " queue " : " queues ") +
         queue_list(o.queues) + ": ";
}

// The size of the huge pages MAP_HUGETLB maps (2 MiB unless the kernel was
// told otherwise).
size_t default_huge_page_size() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long kib = 0;
    if (std::sscanf(line.c_str(), "Hugepagesize: %lu kB", &kib) == 1 && kib > 0) return kib * 1024;
  }
  return 2u << 20;
}

Mac interface_mac(const std::string &ifname) {
  Mac mac{};
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (fd >= 0 && ioctl(fd, SIOCGIFHWADDR, &ifr) == 0) {
    std::memcpy(mac.data(), ifr.ifr_hwaddr.sa_data, 6);
  }
  if (fd >= 0) close(fd);
  return mac;
}

} // namespace

std::string queue_list(const std::vector<uint32_t> &queues) {
  std::string s;
  for (uint32_t q : queues) s += (s.empty() ? "" : ",") + std::to_string(q);
  return s;
}

AfXdpPort::AfXdpPort(const AfXdpOptions &opts, XdpProgram &program)
    : opts_(opts), program_(program) {
  if (opts_.queues.empty()) throw XdpError(where(opts_) + "no queue to bind");
  opts_.num_frames *= static_cast<uint32_t>(opts_.queues.size());
  umem_size_ = static_cast<size_t>(opts_.num_frames) * opts_.frame_size;
  // Whole huge pages: madvise() and munmap() of a part of one fail.
  const size_t huge = default_huge_page_size();
  map_size_ = (umem_size_ + huge - 1) / huge * huge;
  void *area = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
  if (area != MAP_FAILED) {
    hugepages_ = true;
  } else {
    map_size_ = umem_size_;
    area = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (area == MAP_FAILED) {
      throw XdpError(where(opts_) + "cannot map UMEM: " + std::strerror(errno));
    }
  }
  umem_area_ = static_cast<uint8_t *>(area);
  // The kernel pins the UMEM for the sockets, and fork() copies pinned
  // private pages into the child at once (huge ones from the pool: with
  // none spare, fork() failed and so did every binary upgrade). The
  // upgrade's child only execs: it gets no copy.
  if (madvise(area, map_size_, MADV_DONTFORK) != 0) {
    LOG_WARN("%sMADV_DONTFORK on the UMEM: %s (a binary upgrade's fork copies it)",
             where(opts_).c_str(), std::strerror(errno));
  }
  try {
    for (uint32_t id : opts_.queues) {
      queues_.push_back(std::make_unique<Queue>());
      queues_.back()->id = id;
      bind_queue(*queues_.back(), queues_.size() == 1);
      fds_.push_back(queues_.back()->fd);
    }
  } catch (...) {
    close_sockets();
    munmap(umem_area_, map_size_);
    throw;
  }
  local_mac_ = interface_mac(opts_.ifname);
  kernel_train_ = opts_.kernel_train >= 0 ? static_cast<uint32_t>(opts_.kernel_train)
                  : zerocopy_               ? 0
                                            : 4;
  if (opts_.kernel_sockets.empty()) kernel_train_ = 0;
  try {
    next_hops_ = std::make_unique<KernelNextHops>(static_cast<int>(if_nametoindex(opts_.ifname.c_str())));
  } catch (const std::exception &e) {
    LOG_WARN("%sno next hops from the kernel (%s): replies go only to MACs learned from "
             "authenticated packets, so peers behind a gateway may not be reached",
             where(opts_).c_str(), e.what());
  }

  free_.reserve(opts_.num_frames);
  for (uint32_t i = opts_.num_frames; i-- > 0;) {
    free_.push_back(static_cast<uint64_t>(i) * opts_.frame_size);
  }
  rx_held_.reserve(opts_.batch);
  pending_.reserve(opts_.ring_size);
  refill();
  try {
    for (const auto &q : queues_) program_.set_socket(q->id, q->fd);
  } catch (...) {
    for (const auto &q : queues_) program_.set_socket(q->id, -1);
    close_sockets();
    munmap(umem_area_, map_size_);
    throw;
  }
}

void AfXdpPort::bind_queue(Queue &q, bool first) {
  const std::string at = "AF_XDP " + opts_.ifname + " queue " + std::to_string(q.id) + ": ";
  if (first) {
    xsk_umem_config ucfg{};
    ucfg.fill_size = opts_.ring_size;
    ucfg.comp_size = opts_.ring_size;
    ucfg.frame_size = opts_.frame_size;
    ucfg.frame_headroom = 0;
    int err = xsk_umem__create(&umem_, umem_area_, umem_size_, &q.fill, &q.comp, &ucfg);
    if (err) {
      umem_ = nullptr;
      throw XdpError(at + "cannot create UMEM: " + std::strerror(-err) +
                     " (needs CAP_NET_RAW and CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)");
    }
  }
  xsk_socket_config scfg{};
  scfg.rx_size = opts_.ring_size;
  scfg.tx_size = opts_.ring_size;
  scfg.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD; // our own program steers
  // The first socket of a UMEM binds with the rings given to
  // xsk_umem__create; the others share it with fill, completion and RX
  // rings of their own, and no TX ring (everything leaves through the
  // first; an unused TX ring would still cost a transmit attempt on every
  // poll of the socket in copy mode).
  auto create = [&] {
    return first ? xsk_socket__create(&q.xsk, opts_.ifname.c_str(), q.id, umem_, &q.rx, &q.tx,
                                      &scfg)
                 : xsk_socket__create_shared(&q.xsk, opts_.ifname.c_str(), q.id, umem_, &q.rx,
                                             nullptr, &q.fill, &q.comp, &scfg);
  };
  // The queue's previous socket (another process's, in a binary upgrade)
  // lets go of it a moment after it is closed: the kernel frees it from a
  // work queue. Until then binding says EBUSY.
  const auto give_up = std::chrono::steady_clock::now() + opts_.busy_wait;
  int err = 0;
  for (;;) {
    scfg.bind_flags = XDP_USE_NEED_WAKEUP;
    if (opts_.zerocopy == ZeroCopy::on) scfg.bind_flags |= XDP_ZEROCOPY;
    if (opts_.zerocopy == ZeroCopy::off) scfg.bind_flags |= XDP_COPY;
    err = create();
    if (err && err != -EBUSY && opts_.zerocopy == ZeroCopy::automatic) {
      // Some drivers refuse the default bind; copy mode always works.
      // (Only for the first socket: the others get its mode from the
      // kernel, so with a shared UMEM it is all zero-copy or all copy.)
      scfg.bind_flags = XDP_USE_NEED_WAKEUP | XDP_COPY;
      err = create();
    }
    if (err != -EBUSY || std::chrono::steady_clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (err) {
    q.xsk = nullptr;
    throw XdpError(at + "cannot create socket: " + std::strerror(-err) +
                   (opts_.zerocopy == ZeroCopy::on ? " (the driver may not support zero-copy)"
                                                    : ""));
  }
  q.fd = xsk_socket__fd(q.xsk);
  xdp_options xo{};
  socklen_t xl = sizeof(xo);
  if (getsockopt(q.fd, SOL_XDP, XDP_OPTIONS, &xo, &xl) == 0) {
    // Reported as zero-copy only if every queue is.
    const bool zc = xo.flags & XDP_OPTIONS_ZEROCOPY;
    zerocopy_ = first ? zc : zerocopy_ && zc;
  }
  if (opts_.busy_poll) {
    int one = 1, usec = 20, budget = static_cast<int>(opts_.batch);
    if (setsockopt(q.fd, SOL_SOCKET, SO_PREFER_BUSY_POLL, &one, sizeof(one)) != 0 ||
        setsockopt(q.fd, SOL_SOCKET, SO_BUSY_POLL, &usec, sizeof(usec)) != 0 ||
        setsockopt(q.fd, SOL_SOCKET, SO_BUSY_POLL_BUDGET, &budget, sizeof(budget)) != 0) {
      LOG_WARN("%sbusy polling not available: %s", at.c_str(), std::strerror(errno));
    }
  }
}

void AfXdpPort::close_sockets() {
  // The sockets before the UMEM (libxdp refuses to delete a UMEM in use).
  for (auto it = queues_.rbegin(); it != queues_.rend(); ++it) {
    if ((*it)->xsk) xsk_socket__delete((*it)->xsk);
    (*it)->xsk = nullptr;
  }
  if (umem_) xsk_umem__delete(umem_);
  umem_ = nullptr;
}

AfXdpPort::~AfXdpPort() {
  // Whatever the ring holds leaves now: no wait will poll these sockets.
  next_wait_polls_ = false;
  submit_ring();
  for (const auto &q : queues_) program_.set_socket(q->id, -1);
  close_sockets();
  if (umem_area_) munmap(umem_area_, map_size_);
}

void AfXdpPort::refill() {
  // Keep frames for TX: at least a ring's worth stays on the free list
  // unless RX would otherwise starve completely. The rest is shared out
  // over the fill rings that have room for a quarter ring or more.
  const uint32_t low = opts_.ring_size - opts_.ring_size / 4;
  const size_t reserve_for_tx = opts_.num_frames / 4;
  for (size_t k = 0; k < queues_.size(); ++k) {
    Queue &q = *queues_[k];
    // Frames the last look at the RX ring saw there, not yet read, have
    // left the fill ring already.
    const uint32_t unread = q.rx.cached_prod - q.rx.cached_cons;
    const uint32_t filled = q.in_fill > unread ? q.in_fill - unread : 0;
    if (filled >= low) continue;
    if (free_.size() <= reserve_for_tx) {
      xdp_stats_.fill_starved += 1;
      return;
    }
    const size_t left = free_.size() - reserve_for_tx;
    const uint32_t want = static_cast<uint32_t>(
        std::min<size_t>(opts_.ring_size, (left + (queues_.size() - k) - 1) / (queues_.size() - k)));
    uint32_t idx = 0;
    uint32_t n = xsk_prod_nb_free(&q.fill, want);
    if (n > want) n = want;
    if (n == 0 || xsk_ring_prod__reserve(&q.fill, n, &idx) != n) continue;
    for (uint32_t i = 0; i < n; ++i) {
      *xsk_ring_prod__fill_addr(&q.fill, idx + i) = free_.back();
      free_.pop_back();
    }
    xsk_ring_prod__submit(&q.fill, n);
    q.in_fill += n;
    // A driver that ran out of frames waits to be told of these (zero-copy
    // with need_wakeup): with none posted it raises no interrupt, so
    // nothing would look at the RX ring again until a send woke the queue.
    if (!opts_.busy_poll && xsk_ring_prod__needs_wakeup(&q.fill)) {
      xdp_stats_.rx_wakeups += 1;
      recvfrom(q.fd, nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
    }
  }
}

void AfXdpPort::release_rx_batch() {
  for (uint64_t f : rx_held_) free_.push_back(f);
  rx_held_.clear();
}

void AfXdpPort::peer_verified(const Path &path, uint64_t link, bool strong) {
  if (link == 0) return; // it came through the kernel's socket: nothing to learn
  neighbors_.learn(path.remote, link, strong);
  last_link_ = 0; // the cached lookup may be stale now
}

size_t AfXdpPort::receive(std::span<RxDatagram> out) {
  release_rx_batch();
  refill();
  size_t want = out.size() < opts_.batch ? out.size() : opts_.batch;
  size_t k = 0;
  ParsedFrame pf;
  // Every queue in turn, starting one further each call, so a busy queue
  // cannot keep the others waiting.
  const size_t nq = queues_.size();
  const size_t start = rx_next_;
  rx_next_ = nq > 1 ? (rx_next_ + 1) % nq : 0;
  for (size_t j = 0; j < nq && rx_held_.size() < want; ++j) {
    Queue &q = *queues_[(start + j) % nq];
    uint32_t idx = 0;
    uint32_t n = xsk_ring_cons__peek(&q.rx, static_cast<uint32_t>(want - rx_held_.size()), &idx);
    if (n == 0) {
      if (opts_.busy_poll) {
        // Busy polling: the call runs the queue's NAPI in this thread (the
        // kernel defers the queue's interrupts while we do); then look
        // again.
        xdp_stats_.rx_busy_polls += 1;
        recvfrom(q.fd, nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
        n = xsk_ring_cons__peek(&q.rx, static_cast<uint32_t>(want - rx_held_.size()), &idx);
      } else if (xsk_ring_prod__needs_wakeup(&q.fill)) {
        xdp_stats_.rx_wakeups += 1;
        recvfrom(q.fd, nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
      }
      if (n == 0) continue;
    }
    q.in_fill = q.in_fill > n ? q.in_fill - n : 0;
    // Every frame's headers at once: each is a cache miss (the kernel wrote
    // it on another core), and they can overlap.
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t addr = xsk_ring_cons__rx_desc(&q.rx, idx + i)->addr;
      __builtin_prefetch(frame(xsk_umem__add_offset_to_addr(addr)));
    }
    for (uint32_t i = 0; i < n; ++i) {
      const xdp_desc *d = xsk_ring_cons__rx_desc(&q.rx, idx + i);
      uint64_t addr = xsk_umem__add_offset_to_addr(d->addr);
      uint64_t base =
          xsk_umem__extract_addr(d->addr) & ~static_cast<uint64_t>(opts_.frame_size - 1);
      rx_held_.push_back(base);
      uint8_t *data = frame(addr);
      auto st = parse_frame(data, d->len, pf);
      if (st != ParseStatus::ok) {
        xdp_stats_.count_invalid(st);
        continue;
      }
      stats_.rx_datagrams += 1;
      stats_.rx_bytes += pf.payload_len; // UDP payload, as on sockets
      out[k++] = RxDatagram{data + pf.payload_offset, pf.payload_len, pf.path, pf.ecn,
                            pack_link(pf.src_mac, pf.vlan_tci)};
    }
    xsk_ring_cons__release(&q.rx, n);
  }
  return k;
}

void AfXdpPort::reclaim_completions() {
  // Only the first queue sends, so only its completion ring has frames.
  Queue &q = *queues_[0];
  uint32_t idx = 0;
  uint32_t n = xsk_ring_cons__peek(&q.comp, opts_.ring_size, &idx);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t addr = *xsk_ring_cons__comp_addr(&q.comp, idx + i);
    free_.push_back(addr & ~static_cast<uint64_t>(opts_.frame_size - 1));
  }
  if (n) {
    xsk_ring_cons__release(&q.comp, n);
    outstanding_tx_ -= n;
  }
}

std::span<uint8_t> AfXdpPort::tx_alloc(size_t max_len) {
  size_t room = opts_.frame_size - TX_HEADROOM;
  if (max_len > room) return {};
  if (tx_frame_ == UINT64_MAX) {
    if (pending_.size() >= opts_.ring_size) return {};
    if (free_.empty()) reclaim_completions();
    if (free_.empty()) return {};
    tx_frame_ = free_.back();
    free_.pop_back();
  }
  return {frame(tx_frame_) + TX_HEADROOM, max_len};
}

void AfXdpPort::tx_commit(const Path &path, uint8_t ecn, size_t len) {
  if (tx_frame_ == UINT64_MAX) return;
  const uint64_t f = tx_frame_;
  tx_frame_ = UINT64_MAX;
  if (kernel_train_ == 0 || len == 0) {
    commit_frame(f, path, ecn, len, link_for(path.remote));
    return;
  }
  Train &t = train_;
  bool joins = t.count > 0 && !t.tail && t.ecn == ecn && len <= t.segment && t.count < 64 &&
               t.bytes + len <= 65000 && t.path == path;
  if (!joins) {
    close_train();
    t.path = path;
    t.ecn = ecn;
    t.segment = static_cast<uint32_t>(len);
  }
  t.frames[t.count] = f;
  t.lens[t.count] = static_cast<uint16_t>(len);
  t.count += 1;
  t.bytes += static_cast<uint32_t>(len);
  t.tail = len < t.segment;
}

uint64_t AfXdpPort::link_for(const Address &dst) {
  // By host, not port: where a packet goes on the link depends on the
  // address only, and many connections share one (a NAT, a busy client).
  auto same_host = [](const Address &a, const Address &b) {
    if (a.family() != b.family()) return false;
    if (a.family() == AF_INET) return a.u.in.sin_addr.s_addr == b.u.in.sin_addr.s_addr;
    return std::memcmp(&a.u.in6.sin6_addr, &b.u.in6.sin6_addr, 16) == 0 &&
           a.u.in6.sin6_scope_id == b.u.in6.sin6_scope_id;
  };
  uint64_t generation = next_hops_ ? next_hops_->generation() : 0;
  if (!(last_link_ != 0 && generation == last_generation_ && same_host(dst, last_peer_))) {
    last_peer_ = dst;
    last_link_ = resolve_link(dst);
    last_generation_ = next_hops_ ? next_hops_->generation() : 0;
  }
  return last_link_;
}

void AfXdpPort::close_train() {
  Train &t = train_;
  if (t.count == 0) return;
  bool via_kernel = false;
  if (t.count >= kernel_train_) {
    // Packets of this path still waiting for the ring must leave first: a
    // train overtaking them would look like loss to the peer's ACKs.
    bool waiting = ring_peer_count_ > RING_PEERS;
    for (size_t i = 0; i < ring_peer_count_ && i < RING_PEERS && !waiting; ++i) {
      waiting = ring_peers_[i] == t.path.remote;
    }
    if (waiting && ring_unsent()) {
      xdp_stats_.tx_order_flushes += 1;
      submit_ring(Kick::now);
    }
    via_kernel = send_train_via_kernel();
  }
  if (via_kernel) {
    for (uint32_t i = 0; i < t.count; ++i) free_.push_back(t.frames[i]); // the kernel copied them
  } else {
    uint64_t link = link_for(t.path.remote);
    for (uint32_t i = 0; i < t.count; ++i) commit_frame(t.frames[i], t.path, t.ecn, t.lens[i], link);
    // Remember who has frames waiting (past RING_PEERS: assume everyone).
    bool known = false;
    for (size_t i = 0; i < ring_peer_count_ && i < RING_PEERS && !known; ++i) {
      known = ring_peers_[i] == t.path.remote;
    }
    if (!known && ring_peer_count_ <= RING_PEERS) {
      if (ring_peer_count_ < RING_PEERS) ring_peers_[ring_peer_count_] = t.path.remote;
      ring_peer_count_ += 1;
    }
  }
  t.count = 0;
  t.bytes = 0;
  t.tail = false;
}

bool AfXdpPort::send_train_via_kernel() {
  const Train &t = train_;
  if (t.count > 1 && !kernel_gso_) return false;
  if (!send_via_kernel(t.path, t.ecn, t.frames, t.lens, t.count, t.segment)) {
    // Full socket buffer, no route, or a route that cannot segment: the
    // ring carries this train.
    xdp_stats_.tx_kernel_refused += 1;
    return false;
  }
  xdp_stats_.tx_kernel_trains += 1;
  xdp_stats_.tx_kernel_datagrams += t.count;
  return true;
}

bool AfXdpPort::send_via_kernel(const Path &path, uint8_t ecn, const uint64_t *frames,
                                const uint16_t *lens, uint32_t count, uint32_t segment) {
  int fd = -1;
  bool wildcard = false;
  for (const auto &[bound, sfd] : opts_.kernel_sockets) {
    if (bound.family() != path.local.family() || bound.port() != path.local.port()) continue;
    wildcard = bound.is_unspecified();
    if (wildcard || bound == path.local) {
      fd = sfd;
      break;
    }
  }
  if (fd < 0) return false;
  iovec iov[64];
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < count && i < 64; ++i) {
    iov[i] = {frame(frames[i]) + TX_HEADROOM, lens[i]};
    bytes += lens[i];
  }
  msghdr h{};
  h.msg_name = const_cast<sockaddr *>(&path.remote.u.sa);
  h.msg_namelen = path.remote.len;
  h.msg_iov = iov;
  h.msg_iovlen = count < 64 ? count : 64;
  alignas(cmsghdr) uint8_t control[UDP_SEND_CONTROL_SPACE];
  set_send_control(h, control, path.local, wildcard, ecn,
                   count > 1 ? static_cast<uint16_t>(segment) : 0);
  if (sendmsg(fd, &h, MSG_DONTWAIT) < 0) {
    if (errno == EIO && count > 1) kernel_gso_ = false; // the route cannot segment
    return false;
  }
  stats_.tx_datagrams += count;
  stats_.tx_bytes += bytes;
  stats_.tx_sends += 1;
  if (count > 1) stats_.tx_gso_batches += 1;
  return true;
}

uint64_t AfXdpPort::resolve_link(const Address &dst) {
  const uint64_t learned = neighbors_.lookup(dst);
  if (!next_hops_) return learned;
  // An on-link or gateway hop is one whose route leaves through this very
  // interface, not a VLAN device on it: its frames are untagged, whatever
  // tag a packet with the peer's address carried. (Taking that tag let a
  // forged Initial tagged with any VLAN make every reply to the peer
  // vanish, its own Initials being too weak to correct it.) A peer on a
  // VLAN routes through the VLAN device: elsewhere, and the learned link
  // with its tag is all there is.
  constexpr uint64_t MAC_BITS = (uint64_t{1} << 48) - 1;
  const uint64_t untagged = learned & MAC_BITS;
  auto hop = next_hops_->route(dst);
  switch (hop.kind) {
  case KernelNextHops::Hop::Kind::onlink: {
    // On the link: the kernel's neighbour entry where it has one (what the
    // kernel itself would send to, a static entry included), else what the
    // peer's authenticated packets showed (and the kernel is asked). Not
    // the other way round: a handshake packet's keys are anyone's, and one
    // forged with the peer's address and another MAC would otherwise steer
    // the peer's replies away before it has spoken.
    const uint64_t kernel = next_hops_->neighbor(dst);
    return kernel ? kernel : untagged;
  }
  case KernelNextHops::Hop::Kind::gateway: {
    // Behind a gateway: the route decides, not the router the peer's
    // packets came through (asymmetric paths, ECMP, a new MAC).
    const uint64_t gw = next_hops_->neighbor(hop.via);
    return gw ? gw : untagged;
  }
  case KernelNextHops::Hop::Kind::local:
    // This host itself (a client on it, through the kernel's socket): never
    // a MAC on the wire, whatever a packet forged with this host's address
    // taught us. The kernel's socket delivers it.
    return 0;
  case KernelNextHops::Hop::Kind::unreachable:
    // A route that refuses the peer (an operator's blackhole, prohibit or
    // unreachable route): the kernel's socket is told, and refuses the
    // send as the kernel would (counted as tx_no_neighbor, dropped).
    return 0;
  case KernelNextHops::Hop::Kind::unknown:   // asked; meanwhile what we learned
  case KernelNextHops::Hop::Kind::elsewhere: // not through this interface
    break;
  }
  return learned;
}

void AfXdpPort::tx_commit_reply(const RxDatagram &to, size_t len) {
  if (tx_frame_ == UINT64_MAX) return;
  // Back to the very link the datagram came from, unless the kernel's
  // route refuses the peer (an operator's blackhole for a reflection
  // victim's address, say): then the kernel's socket is told, and refuses
  // it as the kernel would. A source the kernel takes for this host's own
  // came over the wire forged: its reply is dropped, not delivered to
  // whatever listens on this host at the port the forger chose.
  uint64_t link = to.link;
  if (next_hops_ && link != 0) {
    const auto kind = next_hops_->route(to.path.remote).kind;
    if (kind == KernelNextHops::Hop::Kind::local) {
      xdp_stats_.tx_no_neighbor += 1;
      stats_.tx_dropped += 1;
      return; // the frame stays ours for the next tx_alloc
    }
    if (kind == KernelNextHops::Hop::Kind::unreachable) link = 0;
  }
  const uint64_t f = tx_frame_;
  tx_frame_ = UINT64_MAX;
  commit_frame(f, Path{to.path.local, to.path.remote}, 0, len, link);
}

void AfXdpPort::commit_frame(uint64_t f, const Path &path, uint8_t ecn, size_t len,
                             uint64_t link) {
  if (link == 0 && len > 0) {
    // No link address for it: the peer is behind another interface or on
    // loopback (its packets came in through the kernel's socket), or its
    // neighbour entry is not resolved yet. The kernel's socket can send
    // it: the kernel routes and resolves.
    const uint16_t l = static_cast<uint16_t>(len);
    // What waits for the ring leaves first: a peer whose link went unknown
    // must not see this datagram overtake its predecessors.
    if (!pending_.empty() || (ring_peer_count_ > 0 && ring_unsent())) {
      xdp_stats_.tx_order_flushes += 1;
      submit_ring(Kick::now);
    }
    if (send_via_kernel(path, ecn, &f, &l, 1, 0)) {
      xdp_stats_.tx_kernel_no_link += 1;
    } else {
      xdp_stats_.tx_no_neighbor += 1;
      stats_.tx_dropped += 1;
    }
    free_.push_back(f); // the kernel copied it
    return;
  }
  if (len == 0) {
    stats_.tx_dropped += 1;
    free_.push_back(f);
    return;
  }
  Mac mac;
  uint16_t vlan;
  unpack_link(link, mac, vlan);
  size_t hlen = build_headers(frame(f) + TX_HEADROOM, len, path, ecn, local_mac_, mac, vlan);
  pending_.push_back(Pending{f + TX_HEADROOM - hlen, static_cast<uint32_t>(hlen + len),
                            static_cast<uint32_t>(len)});
}

bool AfXdpPort::flush() {
  kick_stuck_ = false;
  close_train();
  submit_ring();
  reclaim_completions();
  refill();
  if (!pending_.empty()) {
    xdp_stats_.tx_ring_full += 1;
    return false;
  }
  return true;
}

bool AfXdpPort::ring_unsent() {
  return !pending_.empty() ||
         opts_.ring_size - xsk_prod_nb_free(&queues_[0]->tx, opts_.ring_size) > 0;
}

void AfXdpPort::submit_ring(Kick kick) {
  reclaim_completions();
  xsk_ring_prod &tx = queues_[0]->tx;
  if (!pending_.empty()) {
    uint32_t idx = 0;
    uint32_t n = xsk_prod_nb_free(&tx, static_cast<uint32_t>(pending_.size()));
    if (n > pending_.size()) n = static_cast<uint32_t>(pending_.size());
    if (n > 0 && xsk_ring_prod__reserve(&tx, n, &idx) == n) {
      for (uint32_t i = 0; i < n; ++i) {
        xdp_desc *d = xsk_ring_prod__tx_desc(&tx, idx + i);
        d->addr = pending_[i].addr;
        d->len = pending_[i].len;
        d->options = 0;
        stats_.tx_bytes += pending_[i].payload;
      }
      xsk_ring_prod__submit(&tx, n);
      outstanding_tx_ += n;
      stats_.tx_datagrams += n;
      stats_.tx_sends += 1;
      pending_.erase(pending_.begin(), pending_.begin() + n);
    }
  }
  // Copy mode transmits only when kicked, at most 32 frames a kick
  // (EAGAIN: more queued); with need_wakeup the kernel says when zero-copy
  // needs a kick too, and a busy-polling socket is always kicked (its
  // interrupts are deferred). Bounded, so a stuck queue cannot spin the
  // worker.
  if (outstanding_tx_ > 0 &&
      (!zerocopy_ || opts_.busy_poll || xsk_ring_prod__needs_wakeup(&tx))) {
    if (wait_transmits_fd() >= 0) {
      // Copy mode sends what is still on the ring, at most 32 frames per
      // kick or poll (the kernel's batch): nothing to kick when the kernel
      // took it all, and one batch can wait for the poll that the loop's
      // next wait makes of this socket anyway.
      const uint32_t unsent = opts_.ring_size - xsk_prod_nb_free(&tx, opts_.ring_size);
      if (unsent == 0) {
        if (pending_.empty()) ring_peer_count_ = 0;
        return;
      }
      if (next_wait_polls_ && unsent <= 32 && kick == Kick::may_wait) {
        xdp_stats_.tx_kicks_left_to_wait += 1;
        return; // its peers stay remembered
      }
    }
    // A queue that would not take the ring's frames this pass is not
    // kicked again for order until the pass's flush: under congestion that
    // would be a string of failing sends per train.
    if (kick == Kick::now && kick_stuck_) return;
    uint32_t k = 0;
    for (; k < opts_.ring_size / 32 + 1; ++k) {
      xdp_stats_.tx_kicks += 1;
      if (sendto(fds_[0], nullptr, 0, MSG_DONTWAIT, nullptr, 0) >= 0) break;
      if (errno != EAGAIN) break; // EBUSY/ENOBUFS: retry on the next flush
    }
    if (k == opts_.ring_size / 32 + 1) kick_stuck_ = true;
  }
  if (pending_.empty()) ring_peer_count_ = 0;
}

void AfXdpStats::count_invalid(ParseStatus st) {
  switch (st) {
  case ParseStatus::ok:
  case ParseStatus::count_: break;
  case ParseStatus::truncated: rx_invalid_truncated += 1; break;
  case ParseStatus::not_ip: rx_invalid_not_ip += 1; break;
  case ParseStatus::not_udp: rx_invalid_not_udp += 1; break;
  case ParseStatus::bad_ip_header: rx_invalid_bad_ip_header += 1; break;
  case ParseStatus::bad_ip_len: rx_invalid_bad_ip_len += 1; break;
  case ParseStatus::bad_udp_len: rx_invalid_bad_udp_len += 1; break;
  case ParseStatus::fragment: rx_invalid_fragment += 1; break;
  case ParseStatus::bad_address: rx_invalid_bad_address += 1; break;
  case ParseStatus::no_udp_checksum: rx_invalid_no_udp_checksum += 1; break;
  }
}

const AfXdpStats &AfXdpPort::xdp_stats() {
  xdp_statistics sum{};
  bool any = false;
  for (const auto &q : queues_) {
    xdp_statistics s{};
    socklen_t len = sizeof(s);
    if (getsockopt(q->fd, SOL_XDP, XDP_STATISTICS, &s, &len) != 0) continue;
    any = true;
    sum.rx_dropped += s.rx_dropped;
    sum.rx_invalid_descs += s.rx_invalid_descs;
    sum.tx_invalid_descs += s.tx_invalid_descs;
    sum.rx_ring_full += s.rx_ring_full;
    sum.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
    sum.tx_ring_empty_descs += s.tx_ring_empty_descs;
  }
  if (any) {
    xdp_stats_.xdp_rx_dropped = sum.rx_dropped;
    xdp_stats_.xdp_rx_invalid_descs = sum.rx_invalid_descs;
    xdp_stats_.xdp_tx_invalid_descs = sum.tx_invalid_descs;
    xdp_stats_.xdp_rx_ring_full = sum.rx_ring_full;
    xdp_stats_.xdp_rx_fill_ring_empty = sum.rx_fill_ring_empty_descs;
    xdp_stats_.xdp_tx_ring_empty = sum.tx_ring_empty_descs;
  }
  return xdp_stats_;
}

} // namespace xdpq::dataplane
