#pragma once
// xdpq's XDP steering program on one interface: loaded from the object
// embedded in the binary, attached through a bpf_link (the kernel detaches
// it when the process dies, even by SIGKILL), served addresses filled in,
// AF_XDP sockets registered per queue, per-CPU counters read out.

#include "dataplane/address.h"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

struct bpf_object;

namespace xdpq::dataplane {

class XdpError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

enum class XdpMode { native, generic, automatic };

// Counter names, in the order of enum xdpq_counter (bpf/xdpq_shared.h).
extern const char *const XDP_COUNTER_NAMES[];
size_t xdp_counter_count();

// What is attached to an interface now, for clear refusals.
struct XdpAttachment {
  uint32_t prog_id = 0; // 0: nothing
  std::string prog_name;
  std::string mode; // "native", "generic", "offload", "multi"
};
XdpAttachment query_xdp(int ifindex);

class XdpProgram {
public:
  // Opens and loads the embedded object. Throws XdpError with the reason.
  XdpProgram();
  ~XdpProgram(); // detaches (destroys the link) and unloads
  XdpProgram(const XdpProgram &) = delete;
  XdpProgram &operator=(const XdpProgram &) = delete;

  // Attaches to ifname. Refuses (XdpError naming it) when another XDP
  // program is attached unless replace is set. automatic tries native and
  // falls back to generic; the reason for falling back is in fallback_reason().
  // A program replaced is put back if ours cannot attach, and by detach()
  // until keep_replacement() says the start succeeded.
  void attach(const std::string &ifname, XdpMode mode, bool replace = false);
  void keep_replacement();
  void detach();
  bool attached() const { return link_fd_ >= 0; }

  // Binary upgrade. The link that attaches the running xdpqd's program to
  // ifname, handed over by it: this program takes its place with
  // update_link() once its sockets are in its XSKMAP; the previous
  // process's program stays loaded until it exits. Takes link_fd.
  void adopt_link(int link_fd, const std::string &ifname);
  // Puts this program on the link (atomically: every packet meets one
  // program or the other). Throws XdpError.
  void update_link();
  int link_fd() const { return link_fd_; }
  const std::string &mode() const { return mode_; }
  const std::string &fallback_reason() const { return fallback_reason_; }
  int ifindex() const { return ifindex_; }
  uint32_t prog_id() const;

  // Served (address, port) pairs; an unspecified address serves the port on
  // every address of that family.
  void add_served(const Address &a);
  // The host's own addresses (the port of a wildcard is served on these
  // only); throws XdpError when the table is full.
  void set_local(const Address &a, bool local);
  // Registers the AF_XDP socket of a queue (or removes it with fd < 0).
  void set_socket(uint32_t queue, int xsk_fd);

  // Counters summed over CPUs, indexed like XDP_COUNTER_NAMES.
  std::vector<uint64_t> counters() const;

  // For unit tests: runs the program on one frame with BPF_PROG_TEST_RUN.
  // Returns the XDP verdict; rx_queue goes in xdp_md.
  int test_run(const std::vector<uint8_t> &frame, uint32_t rx_queue = 0) const;
  // Average kernel-side nanoseconds per run over repeat runs.
  uint32_t test_run_ns(const std::vector<uint8_t> &frame, int repeat) const;

private:
  int map_fd(const char *name) const;

  bpf_object *obj_ = nullptr;
  int link_fd_ = -1;
  // While attach() replaces another program: that program, to put back.
  int previous_fd_ = -1;
  uint32_t previous_flags_ = 0;
  void attach_ours(const std::string &ifname, XdpMode mode);
  bool put_back_previous();
  void drop_previous();
  int prog_fd_ = -1;
  int ifindex_ = 0;
  std::string mode_;
  std::string fallback_reason_;
};

// What can be told of an AF_XDP setup without attaching anything (for
// --check-config): the interface exists, and each queue is one of its
// receive queues, when its driver says how many it has. Empty when fine,
// else why not; queue_at_fault says which of the two it is.
std::string check_interface(const std::string &ifname, const std::vector<int> &queues,
                            bool &queue_at_fault);

} // namespace xdpq::dataplane
