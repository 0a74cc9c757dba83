#pragma once
// Time source for QUIC, in nanoseconds. Injected so tests drive time.

#include <cstdint>

namespace xdpq::quic {

class Clock {
public:
  virtual ~Clock() = default;
  // Monotonic time, for ngtcp2 timestamps and timers.
  virtual uint64_t now() const = 0;
  // Wall-clock time, for address-validation tokens that must survive a
  // restart of the server (a monotonic clock restarts with the machine).
  virtual uint64_t wall() const = 0;
};

class SystemClock final : public Clock {
public:
  uint64_t now() const override;
  uint64_t wall() const override;
};

class ManualClock final : public Clock {
public:
  explicit ManualClock(uint64_t start = 1'000'000'000) : now_(start) {}
  uint64_t now() const override { return now_; }
  uint64_t wall() const override { return 1'700'000'000'000'000'000ull + now_; }
  void advance(uint64_t ns) { now_ += ns; }
  void set(uint64_t ns) { now_ = ns; }

private:
  uint64_t now_;
};

} // namespace xdpq::quic
