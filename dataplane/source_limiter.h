#pragma once
// Per-source caps: how many connections one source may hold and how fast
// it may open new ones, so that no single address can take every
// connection or handshake slot of a worker. A source is an IPv4 address or
// an IPv6 /64 (one subscriber's prefix).
//
// Memory is fixed: sources hash (keyed, see keyed_hash.h) into a table of
// slots; two sources that share a slot share its caps, which can only make
// the caps stricter for them, and an attacker cannot choose whom to collide
// with. One limiter per worker and protocol (no locking).

#include "dataplane/address.h"
#include "dataplane/keyed_hash.h"

#include <cstdint>
#include <vector>

namespace xdpq::dataplane {

struct SourceLimits {
  uint32_t max_connections = 0; // per source; 0: no cap
  double rate = 0;              // new connections per second per source; 0: no cap
  double burst = 0;             // bucket depth (0: max(rate, 1) * 2)
};

class SourceLimiter {
public:
  static constexpr uint32_t NONE = UINT32_MAX;
  enum class Verdict { ok, too_many_connections, too_fast };

  explicit SourceLimiter(const SourceLimits &limits, size_t slots = 16384);

  bool enabled() const { return limits_.max_connections > 0 || limits_.rate > 0; }

  // A new connection from src. On ok, *slot names what release() gives
  // back (NONE when the limiter is off).
  Verdict admit(const Address &src, uint64_t now_ns, uint32_t *slot);
  // The connection admitted with slot ended.
  void release(uint32_t slot);

  // Connections held by src's slot (tests, diagnostics).
  uint32_t connections(const Address &src) const;

private:
  struct Slot {
    uint32_t connections = 0;
    double tokens = 0;
    uint64_t refill_ns = 0; // 0: never used (full bucket)
  };
  uint32_t index(const Address &src) const;

  SourceLimits limits_;
  KeyedHash hash_;
  std::vector<Slot> slots_;
};

} // namespace xdpq::dataplane
