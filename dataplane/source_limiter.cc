#include "dataplane/source_limiter.h"

#include <cstring>

namespace xdpq::dataplane {

SourceLimiter::SourceLimiter(const SourceLimits &limits, size_t slots) : limits_(limits) {
  if (limits_.burst <= 0) limits_.burst = (limits_.rate > 1 ? limits_.rate : 1) * 2;
  validated_burst_ = (limits_.validated_rate > 1 ? limits_.validated_rate : 1) * 2;
  if (enabled()) slots_.resize(slots ? slots : 1);
}

uint32_t SourceLimiter::index(const Address &src) const {
  uint8_t key[16] = {};
  if (src.family() == AF_INET6) {
    const uint8_t *a = src.u.in6.sin6_addr.s6_addr;
    // An IPv4-mapped address is its IPv4 address; otherwise the /64.
    static constexpr uint8_t MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a, MAPPED, 12) == 0) {
      std::memcpy(key, a + 12, 4);
    } else {
      key[15] = 6;
      std::memcpy(key, a, 8);
    }
  } else {
    std::memcpy(key, &src.u.in.sin_addr, 4);
  }
  return static_cast<uint32_t>(hash_(key) % slots_.size());
}

SourceLimiter::Verdict SourceLimiter::admit(const Address &src, uint64_t now_ns, uint32_t *slot,
                                            Proof proof) {
  *slot = NONE;
  if (!enabled()) return Verdict::ok;
  uint32_t i = index(src);
  Slot &s = slots_[i];
  const uint32_t proven = s.connections > s.unproven ? s.connections - s.unproven : 0;
  const uint32_t held = proof == Proof::validated ? proven : s.connections;
  if (limits_.max_connections > 0 && held >= limits_.max_connections) {
    return Verdict::too_many_connections;
  }
  if (proof == Proof::validated) {
    if (limits_.validated_rate > 0 &&
        !s.validated.take(1, limits_.validated_rate, validated_burst_, now_ns)) {
      return Verdict::too_fast;
    }
  } else if (limits_.rate > 0 && !s.unvalidated.take(1, limits_.rate, limits_.burst, now_ns)) {
    return Verdict::too_fast;
  }
  s.connections += 1;
  if (proof == Proof::none) s.unproven += 1;
  *slot = i;
  return Verdict::ok;
}

void SourceLimiter::proven(uint32_t slot) {
  if (slot == NONE || slot >= slots_.size()) return;
  if (slots_[slot].unproven > 0) slots_[slot].unproven -= 1;
}

void SourceLimiter::release(uint32_t slot, bool unproven) {
  if (slot == NONE || slot >= slots_.size()) return;
  Slot &s = slots_[slot];
  if (s.connections > 0) s.connections -= 1;
  if (unproven && s.unproven > 0) s.unproven -= 1;
}

uint32_t SourceLimiter::connections(const Address &src) const {
  if (!enabled()) return 0;
  return slots_[index(src)].connections;
}

} // namespace xdpq::dataplane
