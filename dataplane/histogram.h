#pragma once
// A fixed-bucket latency histogram, one per worker (plain counters, one
// writer). Buckets match Prometheus conventions: upper bounds in seconds.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace xdpq::dataplane {

struct Histogram {
  // Upper bounds in nanoseconds; the last bucket is +Inf.
  static constexpr std::array<uint64_t, 16> BOUNDS_NS = {
      100'000,     250'000,     500'000,       1'000'000,     2'500'000,     5'000'000,
      10'000'000,  25'000'000,  50'000'000,    100'000'000,   250'000'000,   500'000'000,
      1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
  std::array<uint64_t, BOUNDS_NS.size() + 1> counts{};
  uint64_t sum_ns = 0;
  uint64_t count = 0;

  void record(uint64_t ns) {
    size_t i = 0;
    while (i < BOUNDS_NS.size() && ns > BOUNDS_NS[i]) ++i;
    counts[i] += 1;
    sum_ns += ns;
    count += 1;
  }
  void merge(const Histogram &o) {
    for (std::size_t i = 0; i < o.counts.size(); ++i) counts[i] += o.counts[i];
    sum_ns += o.sum_ns;
    count += o.count;
  }
};

// Latency in powers of two: bucket i counts values up to 64 us << i
// (64 us to 16.8 s), the last bucket everything above. record() costs a
// division by a constant, a bit width and two additions, cheap enough for
// every proxied request; the count is the buckets' sum, made when read.
struct Log2Histogram {
  static constexpr size_t FINITE = 19; // upper bounds 64 us << 0 .. 64 us << 18
  std::array<uint64_t, FINITE + 1> counts{};
  uint64_t sum_ns = 0;

  static constexpr uint64_t bound_ns(size_t i) { return (64ull << i) * 1000; }
  static constexpr size_t bucket(uint64_t ns) {
    const uint64_t us = ns / 1000 + (ns % 1000 != 0); // rounded up: bounds are inclusive
    if (us <= 64) return 0;
    const size_t i = static_cast<size_t>(std::bit_width(us - 1)) - 6; // us in (64<<i-1, 64<<i]
    return i < FINITE ? i : FINITE;
  }
  void record(uint64_t ns) {
    counts[bucket(ns)] += 1;
    sum_ns += ns;
  }
  uint64_t count() const {
    uint64_t n = 0;
    for (uint64_t c : counts) n += c;
    return n;
  }
  void merge(const Log2Histogram &o) {
    for (size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
    sum_ns += o.sum_ns;
  }
  // The q-quantile (0..1) in nanoseconds, interpolated linearly inside its
  // bucket as Prometheus's histogram_quantile() does; a value in the last
  // bucket reads as the last finite bound. 0 when empty.
  uint64_t quantile(double q) const {
    const uint64_t n = count();
    if (n == 0) return 0;
    const double rank = q * static_cast<double>(n);
    uint64_t below = 0;
    for (size_t i = 0; i < FINITE; ++i) {
      if (counts[i] != 0 && static_cast<double>(below + counts[i]) >= rank) {
        const double lo = i == 0 ? 0.0 : static_cast<double>(bound_ns(i - 1));
        const double hi = static_cast<double>(bound_ns(i));
        const double part = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
        return static_cast<uint64_t>(lo + (hi - lo) * (part < 0 ? 0 : part));
      }
      below += counts[i];
    }
    return bound_ns(FINITE - 1);
  }
};

} // namespace xdpq::dataplane
