#pragma once
// A fixed-bucket latency histogram, one per worker (plain counters, one
// writer). Buckets match Prometheus conventions: upper bounds in seconds.

#include <array>
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

} // namespace xdpq::dataplane
