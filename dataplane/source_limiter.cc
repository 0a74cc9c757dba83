#include "dataplane/source_limiter.h"

#include <cstring>

namespace xdpq::dataplane {

SourceLimiter::SourceLimiter(const SourceLimits &limits, size_t slots) : limits_(limits) {
  if (limits_.burst <= 0) limits_.burst = (limits_.rate > 1 ? limits_.rate : 1) * 2;
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

SourceLimiter::Verdict SourceLimiter::admit(const Address &src, uint64_t now_ns, uint32_t *slot) {
  *slot = NONE;
  if (!enabled()) return Verdict::ok;
  uint32_t i = index(src);
  Slot &s = slots_[i];
  if (limits_.max_connections > 0 && s.connections >= limits_.max_connections) {
    return Verdict::too_many_connections;
  }
  if (limits_.rate > 0) {
    if (s.refill_ns == 0) {
      s.tokens = limits_.burst;
    } else if (now_ns > s.refill_ns) {
      s.tokens += static_cast<double>(now_ns - s.refill_ns) * 1e-9 * limits_.rate;
      if (s.tokens > limits_.burst) s.tokens = limits_.burst;
    }
    s.refill_ns = now_ns ? now_ns : 1;
    if (s.tokens < 1.0) return Verdict::too_fast;
    s.tokens -= 1.0;
  }
  s.connections += 1;
  *slot = i;
  return Verdict::ok;
}

void SourceLimiter::release(uint32_t slot) {
  if (slot == NONE || slot >= slots_.size()) return;
  if (slots_[slot].connections > 0) slots_[slot].connections -= 1;
}

uint32_t SourceLimiter::connections(const Address &src) const {
  if (!enabled()) return 0;
  return slots_[index(src)].connections;
}

} // namespace xdpq::dataplane
