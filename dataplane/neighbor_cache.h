#pragma once
// Where replies to a peer go on the wire: its MAC address (and VLAN tag),
// by IP address, for the AF_XDP dataplane that writes Ethernet headers
// itself. Entries are learned only from packets that prove the sender
// holds a connection's 1-RTT keys (see TxSink::peer_verified): no spoofed
// packet can redirect a connection, or hold a place a peer needs.
//
// Fixed memory, no allocation after construction: 4-way set-associative
// buckets under a keyed hash (nobody can aim many addresses at one
// bucket); a full bucket evicts its least recently used entry.

#include "dataplane/address.h"
#include "dataplane/keyed_hash.h"
#include "dataplane/packet.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace xdpq::dataplane {

// A MAC address and VLAN tag packed in 64 bits (0: none known).
inline uint64_t pack_link(const Mac &mac, uint16_t vlan_tci) {
  uint64_t v = 0;
  for (int i = 0; i < 6; ++i) v |= static_cast<uint64_t>(mac[static_cast<size_t>(i)]) << (8 * i);
  return v | static_cast<uint64_t>(vlan_tci) << 48;
}
inline void unpack_link(uint64_t v, Mac &mac, uint16_t &vlan_tci) {
  for (int i = 0; i < 6; ++i) mac[static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
  vlan_tci = static_cast<uint16_t>(v >> 48);
}

class NeighborCache {
public:
  static constexpr size_t WAYS = 4;

  explicit NeighborCache(size_t buckets = 16384) : entries_((buckets ? buckets : 1) * WAYS) {}

  // strong: the peer proved it holds the connection's keys (1-RTT), so it
  // replaces what is there. Weak (a handshake packet, whose keys anyone on
  // the link can derive for any source address): not learned at all.
  // Taken as a fill-in for an unknown peer, a forged Initial with a
  // victim's address made the victim's own handshake replies go to the
  // forger (its own Initials, as weak, could not correct it, and lookups
  // kept the entry fresh), and a flood of them evicted proven peers.
  // Until a peer is proven, its replies take the kernel's route (the
  // kernel's neighbour entry, or the kernel's socket).
  void learn(const Address &ip, uint64_t link, bool strong) {
    if (link == 0 || !strong) return;
    Key k = key_of(ip);
    Entry *b = bucket(k);
    Entry *victim = &b[0];
    for (size_t i = 0; i < WAYS; ++i) {
      Entry &e = b[i];
      if (e.link != 0 && e.key == k) {
        e.link = link;
        e.stamp = ++clock_;
        return;
      }
      if (e.link == 0) {
        victim = &e;
      } else if (victim->link != 0 && e.stamp < victim->stamp) {
        victim = &e;
      }
    }
    if (victim->link != 0) evictions_ += 1;
    else size_ += 1;
    victim->key = k;
    victim->link = link;
    victim->stamp = ++clock_;
  }

  // The link for ip, or 0.
  uint64_t lookup(const Address &ip) {
    Key k = key_of(ip);
    Entry *b = bucket(k);
    for (size_t i = 0; i < WAYS; ++i) {
      if (b[i].link != 0 && b[i].key == k) {
        b[i].stamp = ++clock_;
        return b[i].link;
      }
    }
    return 0;
  }

  size_t size() const { return size_; }
  uint64_t evictions() const { return evictions_; }

private:
  struct Key {
    uint8_t bytes[16] = {};
    bool operator==(const Key &o) const { return std::memcmp(bytes, o.bytes, 16) == 0; }
  };
  struct Entry {
    Key key;
    uint64_t link = 0; // 0: empty
    uint64_t stamp = 0;
  };

  static Key key_of(const Address &a) {
    Key k;
    if (a.family() == AF_INET6) {
      std::memcpy(k.bytes, &a.u.in6.sin6_addr, 16);
    } else {
      // ::ffff:a.b.c.d, so IPv4 keys never equal an IPv6 one.
      k.bytes[10] = k.bytes[11] = 0xff;
      std::memcpy(k.bytes + 12, &a.u.in.sin_addr, 4);
    }
    return k;
  }
  Entry *bucket(const Key &k) {
    size_t n = entries_.size() / WAYS;
    return &entries_[(hash_(k.bytes) % n) * WAYS];
  }

  KeyedHash hash_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  size_t size_ = 0;
  uint64_t evictions_ = 0;
};

} // namespace xdpq::dataplane
