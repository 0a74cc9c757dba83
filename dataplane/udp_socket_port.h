#pragma once
// DatagramPort on kernel UDP sockets: one SO_REUSEPORT socket per listen
// address per worker, recvmmsg/sendmmsg, UDP GRO on receive, UDP GSO on
// send for runs of equal-sized datagrams of one path, ECN via IP_TOS /
// IPV6_TCLASS, local address via IP_PKTINFO / IPV6_PKTINFO.

#include "dataplane/datagram_port.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace xdpq::dataplane {

class PortError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct UdpSocketOptions {
  bool reuseport = true;
  // Refuse an address another socket holds. SO_REUSEPORT alone would let a
  // second server of the same user share the port silently. Worker 0 checks;
  // the others join its group.
  bool check_in_use = true;
  bool gro = true;
  bool gso = true;
  // Sockets a previous process of ours bound (binary upgrade), taken over
  // instead of binding new ones: the first for an address serves it, the
  // rest are read too (the previous process had more workers).
  std::vector<std::pair<Address, int>> inherited;
  size_t rx_batch = 32;      // datagrams (or GRO trains) per recvmmsg
  size_t tx_capacity = 256;  // datagrams queued before a flush is forced
  int socket_buffer = 4 << 20;
};

class UdpSocketPort final : public DatagramPort {
public:
  // Binds one socket per address. Throws PortError naming the address and
  // the reason (in use, permission, bad address).
  UdpSocketPort(const std::vector<Address> &listen, const UdpSocketOptions &opts = {});
  ~UdpSocketPort() override;
  UdpSocketPort(const UdpSocketPort &) = delete;
  UdpSocketPort &operator=(const UdpSocketPort &) = delete;

  size_t receive(std::span<RxDatagram> out) override;
  bool rx_pending() const override { return rx_pending_pos_ < rx_pending_.size(); }
  std::span<uint8_t> tx_alloc(size_t max_len) override;
  void tx_commit(const Path &path, uint8_t ecn, size_t len) override;
  bool flush() override;
  bool waits_for_room(int fd) const override;
  std::span<const int> fds() const override { return fds_; }
  const PortStats &stats() const override { return stats_; }

  // Makes the kernel deliver each short-header QUIC packet to the socket
  // whose index in its SO_REUSEPORT group equals the worker byte in the
  // packet's DCID (quic::Endpoint::make_cid), so a client that migrates to
  // a new address still reaches the worker that owns its connection. Long
  // headers and out-of-range ids fall back to the kernel's 4-tuple hash.
  // Call on one port of the group after every worker has bound. Returns
  // false (with errno) if the kernel refuses the filter.
  // worker_offset: where in the CID the worker byte (the socket's index
  // in the group) sits.
  bool steer_by_connection_id(size_t worker_offset);

  // The options every socket of a port has (buffers, ECN and local
  // address on receive, path MTU probing, GRO and GSO as opts asks and the
  // kernel allows: gro and gso come back false where it refuses), set on
  // an unbound socket. For sockets others create that a port may adopt.
  static void configure(int fd, int family, const UdpSocketOptions &opts, bool &gro, bool &gso);

  // The address each listen address's socket is bound to (port 0 resolved).
  std::vector<Address> bound_addresses() const;
  // Each socket's descriptor and bound address.
  std::vector<std::pair<int, Address>> sockets() const;
  // Binary upgrade: the next process reads fd from now on; this port only
  // sends through it. False if fd is not one of ours.
  bool stop_receiving(int fd) override { return set_receiving(fd, false); }
  bool resume_receiving(int fd) override { return set_receiving(fd, true); }
  bool gso_enabled() const { return gso_; }
  bool gro_enabled() const { return gro_; }

private:
  struct Socket {
    int fd = -1;
    Address bound;
    bool receiving = true;
  };
  struct TxEntry { // one sendmsg: a single datagram or a GSO train
    Path path;
    uint8_t ecn;
    size_t offset; // into tx_buf_
    size_t len;
    size_t segment; // datagram size (all but the last equal)
    size_t count;
  };

  int socket_for(const Address &local) const;
  bool set_receiving(int fd, bool on);
  size_t drain_socket(size_t sock, std::span<RxDatagram> out);

  UdpSocketOptions opts_;
  std::vector<Socket> sockets_; // one per listen address, then extra inherited ones
  size_t primary_ = 0;
  std::vector<int> fds_;
  bool gso_ = false;
  bool gro_ = false;
  size_t next_rx_socket_ = 0;
  PortStats stats_;

  // Receive side: rx_batch buffers of 64 KiB (a GRO train fits) and the
  // mmsghdr/iovec/cmsg arrays, allocated once.
  std::vector<uint8_t> rx_buf_;
  std::vector<mmsghdr> rx_msgs_;
  std::vector<iovec> rx_iov_;
  std::vector<sockaddr_storage> rx_names_;
  std::vector<uint8_t> rx_cmsg_;
  // Trains split into datagrams waiting to be handed out.
  std::vector<RxDatagram> rx_pending_;
  size_t rx_pending_pos_ = 0;

  // Send side.
  std::vector<uint8_t> tx_buf_;
  size_t tx_used_ = 0;
  std::vector<TxEntry> tx_entries_;
  // Per socket: whether the last flush found its send buffer full.
  std::vector<uint8_t> blocked_;
  std::vector<mmsghdr> tx_msgs_;
  std::vector<iovec> tx_iov_;
  std::vector<uint8_t> tx_cmsg_;
  size_t tx_datagrams_ = 0;
};

} // namespace xdpq::dataplane
