#pragma once
// Binary upgrade (xdpqctl upgrade, SIGUSR2): the running xdpqd starts a new
// one (the binary at its path now, its configuration as it is now) and
// hands it its sockets over a SOCK_SEQPACKET socket pair, descriptors as
// SCM_RIGHTS. The new process serves every new connection; the old one
// finishes its own, whose packets the new one hands back through rings in
// shared memory (dataplane::HandoffRegion); their CIDs carry the old
// process's generation bit.
//
//   old → new   inheritance: text lines, one per descriptor, in messages
//               of at most MAX_FDS descriptors, then "end"
//   new → old   on AF_XDP: "prepared" once its XDP program is loaded;
//   old → new   "released" once its AF_XDP sockets are closed (it serves
//               through its kernel UDP sockets meanwhile), or "error TEXT";
//               the new process binds the queues and moves the XDP link to
//               its program
//   new → old   "ready PID WORKERS CAPACITY ADOPTED..." with the rings'
//               memfd, or "error TEXT"; then the socket stays open: its
//               end tells either side that the other exited.

#include "dataplane/address.h"
#include "quic/secrets.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq::control {

// The environment variable naming the new process's end of the pair.
inline constexpr const char *UPGRADE_FD_ENV = "XDPQ_UPGRADE_FD";

// What the old process hands over.
struct Inheritance {
  // reservation: on AF_XDP, the kernel UDP socket that holds a served
  // address (and sends what the kernel sends); xdp_link: the bpf_link that
  // attaches the XDP program.
  enum class Kind { udp, tcp_tls, tcp_clear, control, metrics, wake, reservation, xdp_link };
  struct Socket {
    Kind kind;
    int worker = -1; // udp, tcp_*, wake: the old process's worker
    dataplane::Address addr; // udp, tcp_*: the bound address
    int fd = -1;
  };
  uint8_t generation = 0; // the old process's
  int workers = 0;        // its worker count
  std::string dataplane = "socket";
  std::string interface; // afxdp: the interface its XDP program is on
  // Its connection IDs' format (Server::cid_format_): the new process must
  // read them to route the old connections' packets, so it must match.
  std::string cid_format;
  // Its secrets: a server without a secrets file keeps its keys across an
  // upgrade too (tokens, tickets and resets stay valid).
  quic::Secrets secrets;
  std::vector<Socket> sockets;

  // The descriptors of one kind (and worker, unless -1).
  std::vector<const Socket *> of(Kind k, int worker = -1) const;
  void close_all();
};

// The new process's answer.
struct UpgradeReady {
  int pid = 0;
  int workers = 0;       // the new process's
  size_t capacity = 0;   // slots per ring: workers × old workers rings
  std::vector<size_t> adopted; // indices into Inheritance::sockets it serves
  int region_fd = -1;
};

// One message with up to MAX_FDS descriptors. False (errno set) on failure.
inline constexpr size_t MAX_FDS = 200;
bool send_message(int sock, std::string_view text, std::span<const int> fds);
// One message: false on end of stream, error or timeout (timeout_ms < 0:
// none). Received descriptors are the caller's (close-on-exec set).
bool recv_message(int sock, std::string &text, std::vector<int> &fds, int timeout_ms);

void send_inheritance(int sock, const Inheritance &inh);
// Throws std::runtime_error on a malformed or incomplete inheritance.
Inheritance receive_inheritance(int sock, int timeout_ms);

std::string ready_text(const UpgradeReady &r);
// Parses a "ready ..." message (fd from the same message); false if it is
// not one.
bool parse_ready(const std::string &text, UpgradeReady &r);

// The path of the running binary (what the new process execs): the path
// this one was started from, even if the file has since been replaced.
std::string running_binary_path();

} // namespace xdpq::control
