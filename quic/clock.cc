#include "quic/clock.h"

#include "base/clock.h"

namespace xdpq::quic {

uint64_t SystemClock::now() const {
  return monotonic_ns();
}
uint64_t SystemClock::wall() const {
  return wall_ns();
}

} // namespace xdpq::quic
