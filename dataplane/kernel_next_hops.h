#pragma once
// Next hops from the kernel, for the AF_XDP dataplane that writes Ethernet
// headers itself: the route towards a destination (RTM_GETROUTE, so policy
// rules and every table count as they do for the kernel's own packets) and
// the MAC address of that route's gateway or of the on-link peer, from the
// kernel's neighbour table. One instance per AF_XDP port, used by its
// worker thread only: its own non-blocking rtnetlink socket, subscribed to
// neighbour and route changes, read when the worker's loop finds it
// readable. Nothing here blocks: an unknown route or neighbour is asked
// for (the kernel resolves a neighbour it does not know, NTF_USE) and the
// answer arrives later; meanwhile the caller falls back to what it learned
// from authenticated packets, or drops and lets QUIC retransmit.
//
// Only the kernel and the operator's routing configuration decide: no
// packet from a peer changes these tables. Memory is bounded: each table
// holds at most max_entries, and is cleared (then refilled on demand) when
// full.

#include "base/counters.h"
#include "dataplane/address.h"
#include "dataplane/keyed_hash.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

struct nlmsghdr; // <linux/netlink.h>

namespace xdpq::dataplane {

#define XDPQ_NEXT_HOP_COUNTERS(X)                                                                  \
  X(nh_lookups, "next-hop lookups for a destination other than the last one sent to")             \
  X(nh_route_queries, "routes asked of the kernel (rtnetlink RTM_GETROUTE)")                       \
  X(nh_route_misses, "lookups while the route to the destination was not known yet")               \
  X(nh_route_elsewhere, "lookups whose route leaves through another interface")                    \
  X(nh_route_unreachable, "lookups whose route refuses the destination (blackhole, unreachable, prohibit)") \
  X(nh_neigh_misses, "lookups while the next hop's MAC was not known yet")                         \
  X(nh_solicits, "neighbour resolutions asked of the kernel (NTF_USE)")                            \
  X(nh_neigh_updates, "neighbour entries taken from the kernel (dump or change)")                  \
  X(nh_route_flushes, "route caches dropped after a routing change")                               \
  X(nh_resyncs, "full reloads after lost netlink messages")                                       \
  X(nh_asks_deferred, "route or neighbour queries put off: a second's allowance was spent")

struct NextHopStats {
  XDPQ_COUNTER_FIELDS(XDPQ_NEXT_HOP_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_NEXT_HOP_COUNTERS) }
};

class KernelNextHops {
public:
  struct Hop {
    // local: an address of this host (its packets come through the kernel);
    // unreachable: a route that refuses it (blackhole, unreachable,
    // prohibit: the kernel answers the query with an error)
    enum class Kind : uint8_t { unknown, onlink, gateway, elsewhere, local, unreachable };
    Kind kind = Kind::unknown;
    Address via; // the gateway (kind gateway), else the destination itself
  };

  // Opens the socket in the calling thread's network namespace for the
  // interface ifindex and asks for its neighbour table. Throws
  // std::runtime_error naming the failing call.
  explicit KernelNextHops(int ifindex, size_t max_entries = 65536);
  ~KernelNextHops();
  KernelNextHops(const KernelNextHops &) = delete;
  KernelNextHops &operator=(const KernelNextHops &) = delete;

  int fd() const { return fd_; }
  // Reads everything the kernel has sent, without blocking.
  void on_readable();

  // The next hop towards dst, if the kernel has told us; otherwise unknown,
  // and the kernel is asked (at most once per second per destination; the
  // clock is read only then).
  Hop route(const Address &dst);
  // The next hop's MAC (packed as by pack_link, VLAN 0) from the kernel's
  // neighbour table, or 0: then the kernel is asked to resolve it (at most
  // once per second per address).
  uint64_t neighbor(const Address &ip);

  // Rises whenever an answer or a change arrives: a caller caching the
  // result of route()/neighbor() drops its cache when this moves.
  uint64_t generation() const { return generation_; }
  const NextHopStats &stats() const { return stats_; }
  size_t route_count() const { return routes_.size(); }
  size_t neighbor_count() const { return neigh_.size(); }

private:
  struct Route {
    Hop hop;
    uint64_t asked_at = 0; // when a query was last sent (kind unknown: pending)
  };
  struct Neigh {
    uint64_t link = 0;        // 0: not usable (incomplete, failed)
    uint64_t solicited_at = 0; // when resolution was last asked for
  };

  // Peers choose the destinations asked about (a spoofed datagram's
  // source, answered statelessly or by a new connection): at most this
  // many queries a second, so a flood of sources costs the kernel and this
  // thread a bounded amount of work. A destination not asked yet is asked
  // at a later lookup.
  static constexpr uint32_t MAX_ASKS_PER_SECOND = 1024;
  uint64_t ask_window_ = 0;
  uint32_t asks_in_window_ = 0;
  bool may_ask(uint64_t now_ns);
  void send_request(const void *msg, size_t len);
  void ask_route(const Address &dst);
  void ask_resolution(const Address &ip);
  void dump_neighbors();
  void handle(const ::nlmsghdr *h);
  void on_route(const ::nlmsghdr *h);
  void on_error(const ::nlmsghdr *h);
  void on_neigh(const ::nlmsghdr *h);
  void resync();

  // Peers choose the destinations (a spoofed Initial's source): a keyed
  // hash, so nobody can aim them all at one bucket.
  struct AddrHash {
    KeyedHash h;
    size_t operator()(const Address &a) const;
  };

  int fd_ = -1;
  int ifindex_;
  size_t max_entries_;
  uint32_t seq_ = 0;
  uint32_t group_ = 0; // multicast group of the message being handled (0: an answer to us)
  uint64_t generation_ = 1;
  // Keys are addresses with port 0.
  std::unordered_map<Address, Route, AddrHash> routes_;
  std::unordered_map<Address, Neigh, AddrHash> neigh_;
  std::vector<uint8_t> buf_;
  NextHopStats stats_;
};

} // namespace xdpq::dataplane
