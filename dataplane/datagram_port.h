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
};

struct PortStats {
  uint64_t rx_datagrams = 0;
  uint64_t rx_bytes = 0;
  uint64_t tx_datagrams = 0;
  uint64_t tx_bytes = 0;
  uint64_t tx_sends = 0;      // system calls (or ring kicks) that sent
  uint64_t tx_gso_batches = 0; // sends that carried more than one datagram
  uint64_t tx_dropped = 0;    // datagrams the backend could not send
  uint64_t rx_truncated = 0;  // datagrams cut short by the receive buffer
  uint64_t rx_errors = 0;
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

protected:
  ~TxSink() = default;
};

class DatagramPort : public TxSink {
public:
  virtual ~DatagramPort() = default;
  // Receives up to out.size() datagrams without blocking; 0 when none.
  virtual size_t receive(std::span<RxDatagram> out) = 0;
  // Pushes committed datagrams to the wire. Returns false when the backend
  // would block with datagrams still queued (wait for writability).
  virtual bool flush() = 0;
  // File descriptors to wait on for readability (and writability when
  // flush() returned false).
  virtual std::span<const int> fds() const = 0;
  virtual const PortStats &stats() const = 0;
};

} // namespace xdpq::dataplane
