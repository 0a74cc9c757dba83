#pragma once
// The one clock every layer reads: monotonic nanoseconds (and wall-clock
// nanoseconds, for what must survive a reboot, like address-validation
// tokens). quic/ takes time through an injected Clock (tests drive it); its
// system implementation reads these.

#include <time.h>

#include <cstdint>

namespace xdpq {

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline uint64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

} // namespace xdpq
