#include "quic/clock.h"

#include <time.h>

namespace xdpq::quic {

namespace {
uint64_t read(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}
} // namespace

uint64_t SystemClock::now() const { return read(CLOCK_MONOTONIC); }
uint64_t SystemClock::wall() const { return read(CLOCK_REALTIME); }

} // namespace xdpq::quic
