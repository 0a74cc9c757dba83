#pragma once
// The seam between the dataplane and QUIC. A DatagramPort moves batches of
// UDP datagrams with their path (local and remote address) and ECN bits.
// Backends: kernel UDP sockets (udp_socket_port.h) and, later, AF_XDP.
//
// Sending is zero-copy friendly: the caller asks for a buffer (tx_alloc),
// writes one datagram's payload into it in place, and commits it with its
// path. A backend may hold committed datagrams until flush(); the socket
// backend coalesces runs of one path into UDP GSO sends, the AF_XDP backend
// hands out UMEM frames and fills in the headers around the payload.

#include "base/counters.h"
#include "dataplane/address.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace xdpq::dataplane {

struct Path {
  Address local;
  Address remote;
  bool operator==(const Path &o) const { return local == o.local && remote == o.remote; }
};

struct RxDatagram {
  uint8_t *data; // valid until the next receive()
  size_t len;
  Path path;
  uint8_t ecn; // low two bits of the TOS / traffic class
  // Where the datagram came from on the link (AF_XDP: the sender's MAC and
  // VLAN tag, see neighbor_cache.h); 0 for kernel sockets.
  uint64_t link = 0;
};

#define XDPQ_PORT_COUNTERS(X)                                                          \
  X(rx_datagrams, "UDP datagrams received")                                            \
  X(rx_bytes, "UDP payload bytes received")                                            \
  X(tx_datagrams, "UDP datagrams sent")                                                \
  X(tx_bytes, "UDP payload bytes sent")                                                \
  X(tx_sends, "system calls or ring kicks that sent datagrams")                        \
  X(tx_gso_batches, "sends that carried more than one datagram (GSO)")                 \
  X(tx_dropped, "datagrams the dataplane could not send")                              \
  X(tx_too_big, "datagrams larger than their route allows (path MTU probes, mostly), in tx_dropped too") \
  X(rx_truncated, "datagrams cut short by the receive buffer")                         \
  X(rx_not_unicast, "datagrams to a broadcast or multicast address (a wildcard socket takes them): dropped") \
  X(rx_errors, "receive errors")

struct PortStats {
  XDPQ_COUNTER_FIELDS(XDPQ_PORT_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_PORT_COUNTERS) }
};

// Where stateless packets and connection packets go. quic/ writes through
// this interface and never sees a socket.
class TxSink {
public:
  // A buffer for one datagram of up to max_len bytes, or an empty span when
  // the backend is out of room (flush and retry, or wait for writability).
  // Valid until the next tx_alloc/commit/flush call.
  virtual std::span<uint8_t> tx_alloc(size_t max_len) = 0;
  // Sends the first len bytes of the buffer from the last tx_alloc.
  virtual void tx_commit(const Path &path, uint8_t ecn, size_t len) = 0;
  // Sends it back to where `to` came from (stateless replies): on AF_XDP
  // to the very link address it came from, learning nothing.
  virtual void tx_commit_reply(const RxDatagram &to, size_t len) {
    tx_commit(Path{to.path.local, to.path.remote}, 0, len);
  }
  // QUIC authenticated a packet that arrived on path with this link:
  // strong when it was protected with 1-RTT keys only the peer holds, weak
  // for handshake packets (anyone can forge those). The AF_XDP dataplane
  // learns where to send replies from strong ones only.
  virtual void peer_verified(const Path &path, uint64_t link, bool strong) {
    (void)path;
    (void)link;
    (void)strong;
  }

protected:
  ~TxSink() = default;
};

class DatagramPort : public TxSink {
public:
  virtual ~DatagramPort() = default;
  // Receives up to out.size() datagrams without blocking; 0 when none.
  virtual size_t receive(std::span<RxDatagram> out) = 0;
  // Datagrams already read that receive() has not handed out yet (a read
  // of GRO batches split into more than one receive() takes): no event
  // will come for them.
  virtual bool rx_pending() const { return false; }
  // Pushes committed datagrams to the wire. Returns false when the backend
  // would block with datagrams still queued (wait for writability).
  virtual bool flush() = 0;
  // Binary upgrade: stop reading fd (another process does), keep sending
  // through it. False if the port cannot (or fd is not its own).
  virtual bool stop_receiving(int /*fd*/) { return false; }
  // Undoes stop_receiving (the other process died).
  virtual bool resume_receiving(int /*fd*/) { return false; }
  // File descriptors to wait on for readability (and writability when
  // flush() returned false).
  virtual std::span<const int> fds() const = 0;
  // Whether writability of fd (one of fds()) can unblock a flush(): a port
  // that sends through only some of its descriptors says which.
  virtual bool sends_through(int /*fd*/) const { return true; }
  // After a flush() that returned false: whether writability of fd can
  // unblock what is still queued (a port with one send buffer per
  // descriptor names the full ones only).
  virtual bool waits_for_room(int fd) const { return sends_through(fd); }
  // Whether receive() should run on every pass while the worker spins, not
  // only when a descriptor is readable (busy polling: the receive call
  // itself brings packets in).
  virtual bool polled() const { return false; }
  // A descriptor (one of fds()) whose readiness check itself transmits what
  // flush() left on the port's ring, or -1. The event loop's epoll is
  // level-triggered: a descriptor it reported in a pass is checked again
  // by the next wait, so after next_wait_polls(true) a flush() in that
  // pass may leave its transmit kick to the wait (one system call fewer).
  virtual int wait_transmits_fd() const { return -1; }
  virtual void next_wait_polls(bool) {}
  virtual const PortStats &stats() const = 0;
};

} // namespace xdpq::dataplane
