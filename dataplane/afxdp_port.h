#pragma once
// DatagramPort on AF_XDP sockets bound to one or more NIC queues. It owns a
// UMEM (hugepages when the system has them reserved) that its sockets share,
// each socket's fill/completion/RX/TX rings and a free list, and runs the
// user-space Ethernet/IP/UDP path:
// received frames are parsed in place and handed up without a copy; QUIC
// writes each packet straight into a TX frame after TX_HEADROOM, and
// tx_commit() fills in the headers and checksums around it.
//
// Frame ownership is strict: a frame is in exactly one of the fill ring,
// the RX ring, held by the last receive() batch, the free list, the one
// tx_alloc() buffer, the pending TX list, the TX ring, or the completion
// ring. Frames of a receive() batch go back to the free list at the next
// receive(), which is why RxDatagram data is valid until then.
//
// Several queues (more NIC queues than workers): one socket per queue, all
// bound to the first one's UMEM (XDP_SHARED_UMEM), each with fill and
// completion rings of its own. Receive takes from every RX ring in turn,
// the fill rings share the free frames, and everything is sent through the
// first queue's TX ring (any queue of the device reaches the wire).

#include "base/counters.h"
#include "dataplane/datagram_port.h"
#include "dataplane/kernel_next_hops.h"
#include "dataplane/neighbor_cache.h"
#include "dataplane/packet.h"

#include <xdp/xsk.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace xdpq::dataplane {

class XdpProgram;

enum class ZeroCopy { automatic, on, off };

// "0,2,4": a list of queues as flags, logs and status show it.
std::string queue_list(const std::vector<uint32_t> &queues);

struct AfXdpOptions {
  std::string ifname;
  std::vector<uint32_t> queues{0}; // one socket each, on one shared UMEM
  ZeroCopy zerocopy = ZeroCopy::automatic;
  bool busy_poll = false;
  uint32_t frame_size = 4096;
  uint32_t num_frames = 8192; // per queue
  uint32_t ring_size = 2048; // RX, TX, fill and completion rings
  uint32_t batch = 64;
  // Hybrid TX: a train of at least this many datagrams to one peer leaves
  // through a kernel UDP socket as one UDP GSO send instead of frame by
  // frame through the TX ring (0: never; -1: 4 in copy mode, where the ring
  // costs the kernel an skb per frame, 0 in zero-copy mode). Receive and
  // everything shorter stay on AF_XDP.
  int kernel_train = -1;
  // How long to keep trying while the queue is still bound to a socket
  // being closed (EBUSY): a binary upgrade binds right after the previous
  // process let go.
  std::chrono::milliseconds busy_wait{0};
  // The sockets that hold the served ports (borrowed: the caller keeps
  // them open for the port's life): where kernel trains leave from.
  std::vector<std::pair<Address, int>> kernel_sockets;
};

#define XDPQ_AFXDP_COUNTERS(X)                                                         \
  X(rx_invalid_truncated, "frames dropped: shorter than their headers claim")          \
  X(rx_invalid_not_ip, "frames dropped: not IPv4 or IPv6")                             \
  X(rx_invalid_not_udp, "frames dropped: not UDP")                                     \
  X(rx_invalid_bad_ip_header, "frames dropped: bad IP header or checksum")             \
  X(rx_invalid_bad_ip_len, "frames dropped: IP length inconsistent with the frame")    \
  X(rx_invalid_bad_udp_len, "frames dropped: UDP length inconsistent with IP")         \
  X(rx_invalid_fragment, "frames dropped: IP fragment")                                \
  X(rx_invalid_bad_address, "frames dropped: source not unicast, destination not one host") \
  X(rx_invalid_no_udp_checksum, "frames dropped: IPv6 UDP with a zero checksum")     \
  X(tx_no_neighbor, "datagrams not sent: no MAC known for the next hop")               \
  X(tx_ring_full, "flushes that left datagrams pending (TX ring full)")                \
  X(tx_kicks, "sendto() wakeups of the TX ring")                                       \
  X(tx_kicks_left_to_wait, "TX ring wakeups left to the event loop's next poll of the socket") \
  X(rx_wakeups, "recvfrom() wakeups of the fill ring (need_wakeup)")                    \
  X(rx_busy_polls, "recvfrom() calls that ran the queue's NAPI (busy polling)")           \
  X(tx_kernel_trains, "trains sent through the kernel's UDP socket with GSO (hybrid TX)") \
  X(tx_kernel_datagrams, "datagrams in those trains")                                  \
  X(tx_kernel_refused, "trains the kernel refused, sent on the TX ring instead")        \
  X(tx_kernel_no_link, "datagrams sent through the kernel's UDP socket for want of a link address (loopback, another interface, an unresolved neighbour)") \
  X(tx_order_flushes, "ring submits so a kernel train would not overtake its path's packets") \
  X(fill_starved, "receives that found no free frame to refill")                       \
  X(xdp_rx_dropped, "kernel XDP_STATISTICS rx_dropped")                                \
  X(xdp_rx_invalid_descs, "kernel XDP_STATISTICS rx_invalid_descs")                    \
  X(xdp_tx_invalid_descs, "kernel XDP_STATISTICS tx_invalid_descs")                    \
  X(xdp_rx_ring_full, "kernel XDP_STATISTICS rx_ring_full")                            \
  X(xdp_rx_fill_ring_empty, "kernel XDP_STATISTICS rx_fill_ring_empty_descs")          \
  X(xdp_tx_ring_empty, "kernel XDP_STATISTICS tx_ring_empty_descs")

struct AfXdpStats {
  XDPQ_COUNTER_FIELDS(XDPQ_AFXDP_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_AFXDP_COUNTERS) }
  void count_invalid(ParseStatus st);
};

class AfXdpPort final : public DatagramPort {
public:
  // Creates the UMEM and socket and registers it in program's XSKMAP.
  // Throws XdpError naming the interface, queue and reason.
  AfXdpPort(const AfXdpOptions &opts, XdpProgram &program);
  ~AfXdpPort() override;
  AfXdpPort(const AfXdpPort &) = delete;
  AfXdpPort &operator=(const AfXdpPort &) = delete;

  size_t receive(std::span<RxDatagram> out) override;
  std::span<uint8_t> tx_alloc(size_t max_len) override;
  void tx_commit(const Path &path, uint8_t ecn, size_t len) override;
  void tx_commit_reply(const RxDatagram &to, size_t len) override;
  void peer_verified(const Path &path, uint64_t link, bool strong) override;
  bool flush() override;
  std::span<const int> fds() const override { return fds_; }
  bool sends_through(int fd) const override { return fd == fds_[0]; }
  bool polled() const override { return opts_.busy_poll; }
  // Copy mode: poll() on the socket transmits the TX ring.
  int wait_transmits_fd() const override {
    return zerocopy_ || opts_.busy_poll ? -1 : fds_[0];
  }
  void next_wait_polls(bool yes) override { next_wait_polls_ = yes; }
  const PortStats &stats() const override { return stats_; }

  const AfXdpStats &xdp_stats(); // refreshes the kernel's XDP_STATISTICS
  bool zerocopy() const { return zerocopy_; }
  bool hugepages() const { return hugepages_; }
  // The hybrid TX threshold in force (0: off).
  uint32_t kernel_train() const { return kernel_train_; }
  const std::vector<uint32_t> &queues() const { return opts_.queues; }

  const NeighborCache &neighbors() const { return neighbors_; }

  // Next hops from the kernel's routing and neighbour tables (null when
  // rtnetlink could not be opened: then only learned MACs are used). Its
  // socket must be watched by the port's loop, which calls
  // on_next_hop_events() when it is readable.
  int next_hop_fd() const { return next_hops_ ? next_hops_->fd() : -1; }
  void on_next_hop_events() {
    if (next_hops_) next_hops_->on_readable();
  }
  const NextHopStats *next_hop_stats() const {
    return next_hops_ ? &next_hops_->stats() : nullptr;
  }

private:
  struct Pending {
    uint64_t addr;
    uint32_t len;     // the frame, headers included
    uint32_t payload; // the UDP payload (tx_bytes counts these, as on sockets)
  };

  // One queue's socket and rings. Held by pointer: libxdp keeps the
  // addresses of the fill and completion rings until the socket is deleted.
  struct Queue {
    uint32_t id = 0;
    int fd = -1;
    xsk_socket *xsk = nullptr;
    xsk_ring_prod fill{};
    xsk_ring_cons comp{};
    xsk_ring_cons rx{};
    xsk_ring_prod tx{};
    // Frames given to the fill ring and not read back from the RX ring:
    // in the fill ring, held by the driver, or received and not read yet.
    // refill() tops the ring up only when this, less what the RX ring was
    // last seen to hold, falls below 3/4 of it, so it reads the kernel's
    // consumer index (a cache line the other side writes) about once per
    // quarter ring, not on every receive.
    uint32_t in_fill = 0;
  };

  uint8_t *frame(uint64_t addr) { return umem_area_ + addr; }
  // Binds q's socket (the first creates the UMEM's rings, the others share
  // it); throws XdpError.
  void bind_queue(Queue &q, bool first);
  void close_sockets();
  void release_rx_batch();
  void reclaim_completions();
  void refill();
  // Where a packet to dst goes on the link (MAC and VLAN), 0 if unknown.
  uint64_t resolve_link(const Address &dst);
  // resolve_link() with the last answer cached (a train asks once).
  uint64_t link_for(const Address &dst);
  // Fills in the headers of frame f (payload at TX_HEADROOM) and queues it.
  void commit_frame(uint64_t f, const Path &path, uint8_t ecn, size_t len, uint64_t link);
  // Hybrid TX: the open train goes out, through the kernel or the ring.
  void close_train();
  // Moves pending frames to the TX ring and kicks it. A flush for order
  // (the kernel is about to send to a peer with frames on the ring) kicks
  // whatever the ring still holds: a batch left for the loop's next poll
  // would leave after the kernel's send.
  enum class Kick { may_wait, now };
  void submit_ring(Kick kick = Kick::may_wait);
  // Frames wait for the ring or sit on it unsent (copy mode).
  bool ring_unsent();
  bool send_train_via_kernel();
  // Sends count frames (payloads at TX_HEADROOM) to path through the
  // kernel's socket holding path.local's port, as one GSO send of segment
  // sized datagrams when count > 1. False when no socket holds the port or
  // the kernel refused (the frames stay the caller's).
  bool send_via_kernel(const Path &path, uint8_t ecn, const uint64_t *frames,
                       const uint16_t *lens, uint32_t count, uint32_t segment);

  AfXdpOptions opts_;
  XdpProgram &program_;
  uint8_t *umem_area_ = nullptr;
  size_t umem_size_ = 0;
  size_t map_size_ = 0; // umem_size_, in whole huge pages when on them
  bool hugepages_ = false;
  bool zerocopy_ = false;
  bool next_wait_polls_ = false; // the loop reported fds_[0] this pass
  xsk_umem *umem_ = nullptr;
  std::vector<std::unique_ptr<Queue>> queues_; // [0] owns the UMEM and sends
  size_t rx_next_ = 0;                          // the queue receive() starts at
  std::vector<int> fds_;                        // queues_[i]->fd
  Mac local_mac_{};

  std::vector<uint64_t> free_;     // frame base addresses we own and do not use
  std::vector<uint64_t> rx_held_;  // frames of the last receive() batch
  uint64_t tx_frame_ = UINT64_MAX; // the tx_alloc() buffer, not yet committed
  std::vector<Pending> pending_;   // committed, not yet in the TX ring
  uint32_t outstanding_tx_ = 0;    // in the TX or completion ring

  NeighborCache neighbors_; // learned from authenticated packets
  std::unique_ptr<KernelNextHops> next_hops_;
  // The last lookup: a train of packets to one peer looks up once (while
  // the kernel tables stay as they were).
  Address last_peer_{};
  uint64_t last_link_ = 0;
  uint64_t last_generation_ = 0;

  // Hybrid TX: committed datagrams to one path, held until the train ends
  // (another path, a shorter datagram, 64 of them, or the flush).
  struct Train {
    Path path;
    uint8_t ecn = 0;
    uint32_t segment = 0; // every datagram's size but a shorter last one
    uint32_t count = 0;
    uint32_t bytes = 0;
    bool tail = false; // a shorter datagram ended it
    uint64_t frames[64];
    uint16_t lens[64];
  };
  Train train_;
  uint32_t kernel_train_ = 0; // the policy in force (0: off)
  // Peers with trains committed to the ring and not yet sent, as far as
  // we know (a count past RING_PEERS means "too many to track": assume
  // any). Forgotten once the ring is kicked empty.
  static constexpr size_t RING_PEERS = 8;
  Address ring_peers_[RING_PEERS];
  size_t ring_peer_count_ = 0;
  bool kick_stuck_ = false; // a kick this pass left the ring unsent (see submit_ring)
  bool kernel_gso_ = true;    // off after the kernel said the route cannot GSO
  PortStats stats_;
  AfXdpStats xdp_stats_;
};

} // namespace xdpq::dataplane
