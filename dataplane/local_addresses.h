#pragma once
// The host's own IP addresses, followed from the kernel (rtnetlink address
// notifications): the XDP program serves a port listened on every address
// only on these, so traffic to other addresses (forwarded, broadcast) stays
// the kernel's. Loopback and IPv4-mapped addresses are left out: they never
// arrive on a NIC.

#include "dataplane/address.h"

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

struct nlmsghdr;

namespace xdpq::dataplane {

class LocalAddresses {
public:
  // change(address, present): an address appeared (true) or went (false).
  using Change = std::function<void(const Address &, bool)>;

  // Subscribes, then lists the addresses there are now (each reported to
  // change before the constructor returns). Throws std::runtime_error.
  explicit LocalAddresses(Change change);
  ~LocalAddresses();
  LocalAddresses(const LocalAddresses &) = delete;
  LocalAddresses &operator=(const LocalAddresses &) = delete;

  // The notification socket: call on_readable() when it is readable.
  int fd() const { return fd_; }
  void on_readable();
  size_t size() const { return present_.size(); }
  bool contains(const Address &a) const;
  uint64_t resyncs() const { return resyncs_; }

private:
  // Address bytes with their family in front -> the entries that hold it
  // (IPv4: interface, prefix length and peer, as Linux lets one link have
  // the same address twice with other prefixes; IPv6: interface). Gone
  // when its last entry goes.
  using Table = std::map<std::string, std::set<std::string>>;
  // Lists every address (a blocking dump on a socket of its own) and
  // reports what changed since the table was last right.
  void resync();
  static void apply(const nlmsghdr *h, Table &t, std::vector<std::pair<std::string, bool>> *events);
  void report(const std::string &key, bool present);

  Change change_;
  int fd_ = -1;
  Table present_;
  std::vector<uint8_t> buf_;
  uint64_t resyncs_ = 0;
};

} // namespace xdpq::dataplane
