#pragma once
// Flow-control credit for proxied request bodies on a multiplexed
// connection (HTTP/2, HTTP/3). A body's bytes are held by its exchange
// until the upstream takes them. The stream's credit comes back only as
// they leave, so that a slow upstream slows its own client stream. The
// connection's comes back as they arrive, so that stalled uploads do not
// stall every other stream of the connection, but only while the bytes so
// held stay under an allowance: past it, as they leave. What a connection
// holds of proxied bodies is then at most the allowance plus its
// connection window, kept under its body budget, and a client with many
// uploads to a stalled upstream is slowed down, never refused.

#include <cstdint>

namespace xdpq::http {

class BodyCredit {
public:
  struct Stream {
    uint64_t out = 0;  // bytes that left the exchange: the stream's credit given
    uint64_t conn = 0; // bytes whose connection credit was given (>= out)
  };
  explicit BodyCredit(uint64_t allowance) : allowance_(allowance) {}

  // n bytes the exchange took: the connection credit to give now (n or 0).
  uint64_t arrived(Stream &s, uint64_t n) {
    if (held_ + n > allowance_) return 0;
    held_ += n;
    s.conn += n;
    return n;
  }
  // The exchange's bytes out are now out (body_out()): the stream's credit
  // to give, and the connection's for bytes that had none yet.
  struct Credit {
    uint64_t stream = 0, conn = 0;
  };
  Credit left(Stream &s, uint64_t out) {
    Credit c;
    if (out <= s.out) return c;
    c.stream = out - s.out;
    if (s.conn >= out) {
      held_ -= out - s.out;
    } else {
      held_ -= s.conn - s.out;
      c.conn = out - s.conn;
      s.conn = out;
    }
    s.out = out;
    return c;
  }
  // The stream ended with in bytes taken in all (body_in()): the
  // connection credit for those still without it (they die with it).
  uint64_t closed(Stream &s, uint64_t in) {
    held_ -= s.conn - s.out;
    const uint64_t owed = in > s.conn ? in - s.conn : 0;
    s = Stream{};
    return owed;
  }
  uint64_t held() const { return held_; }

private:
  uint64_t allowance_;
  uint64_t held_ = 0; // bytes held whose connection credit was given
};

} // namespace xdpq::http
