#pragma once
// Splits a fuzzer's input into the pieces a harness feeds (datagrams,
// stream chunks): a one-byte selector and a two-byte length before each.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace xdpq::fuzz {

class Input {
public:
  Input(const uint8_t *data, size_t size) : p_(data), left_(size) {}
  bool empty() const { return left_ == 0; }
  uint8_t byte() {
    if (left_ == 0)
      return 0;
    --left_;
    return *p_++;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() << 8 | byte()); }
  // Up to n bytes (fewer at the end of the input).
  std::span<const uint8_t> take(size_t n) {
    n = std::min(n, left_);
    std::span<const uint8_t> s(p_, n);
    p_ += n;
    left_ -= n;
    return s;
  }
  std::span<const uint8_t> rest() { return take(left_); }

private:
  const uint8_t *p_;
  size_t left_;
};

} // namespace xdpq::fuzz
