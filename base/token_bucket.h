#pragma once
// A token bucket: a burst, then a rate per second. Full when first used.

#include <algorithm>
#include <cstdint>

namespace xdpq {

struct TokenBucket {
  double tokens = 0;
  uint64_t refilled_ns = 0; // 0: never used

  // Takes cost tokens if there are as many, after refilling at rate (per
  // second) up to burst since the last call.
  bool take(double cost, double rate, double burst, uint64_t now_ns) {
    if (refilled_ns == 0) {
      tokens = burst;
    } else if (now_ns > refilled_ns) {
      tokens = std::min(burst, tokens + static_cast<double>(now_ns - refilled_ns) * rate / 1e9);
    }
    refilled_ns = now_ns ? now_ns : 1;
    if (tokens < cost) return false;
    tokens -= cost;
    return true;
  }
};

} // namespace xdpq
