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

#include "base/token_bucket.h"
#include "dataplane/address.h"
#include "dataplane/keyed_hash.h"

#include <cstdint>
#include <vector>

namespace xdpq::dataplane {

// Two rates, because a source is two different things before and after it
// has proven its address. Before (a QUIC Initial without a valid token),
// the address may be forged: over `rate` the caller answers with something
// that costs it one packet and asks the source to prove itself (a Retry).
// After (a Retry or NEW_TOKEN token, or a TCP handshake), the source is
// real and only `validated_rate` holds it back, which the default sets
// above one core's handshake rate: one load-generating host is never
// throttled, a host that opens connections faster than a core can finish
// them is refused.
struct SourceLimits {
  uint32_t max_connections = 0; // per source; 0: no cap
  double rate = 0;              // unvalidated new connections/s per source; 0: no cap
  double burst = 0;             // bucket depth (0: max(rate, 1) * 2)
  double validated_rate = 0;    // new connections/s per proven source; 0: no cap
};

class SourceLimiter {
public:
  static constexpr uint32_t NONE = UINT32_MAX;
  enum class Verdict { ok, too_many_connections, too_fast };
  enum class Proof { none, validated };

  explicit SourceLimiter(const SourceLimits &limits, size_t slots = 16384);

  bool enabled() const {
    return limits_.max_connections > 0 || limits_.rate > 0 || limits_.validated_rate > 0;
  }

  // A new connection from src, which has (validated) or has not proven its
  // address; each kind draws on its own bucket (SourceLimits). On ok,
  // *slot names what release() gives back (NONE when the limiter is off).
  // The connection cap counts a proven source's connections apart from
  // those admitted without proof: forged Initials in a victim's name fill
  // only the unproven part, and the victim with a token still gets in.
  Verdict admit(const Address &src, uint64_t now_ns, uint32_t *slot, Proof proof = Proof::none);
  // A connection admitted without proof proved its address (its handshake
  // completed): it counts as proven from now on.
  void proven(uint32_t slot);
  // The connection admitted with slot ended; unproven: it never proved its
  // address (admitted without proof, proven() never called).
  void release(uint32_t slot, bool unproven = false);

  // Connections held by src's slot (tests, diagnostics).
  uint32_t connections(const Address &src) const;

private:
  struct Slot {
    uint32_t connections = 0;
    uint32_t unproven = 0; // of connections, admitted without proof and not proven since
    TokenBucket unvalidated;
    TokenBucket validated;
  };
  uint32_t index(const Address &src) const;

  SourceLimits limits_;
  double validated_burst_ = 2;
  KeyedHash hash_;
  std::vector<Slot> slots_;
};

} // namespace xdpq::dataplane
