#pragma once
// Flow-control credit for proxied request bodies on a multiplexed
// connection (HTTP/2, HTTP/3). A body's bytes are held by its exchange
// until the upstream takes them, charged to the connection's body budget.
// The stream's credit comes back only as they leave, so that a slow
// upstream slows its own client stream. The connection's comes back as
// they arrive, so that stalled uploads do not stall every other stream of
// the connection, but only while the connection's budget holds no more
// than an allowance (allowance()): past that, as they leave, or when their
// stream ends. What proxied bodies hold beyond the allowance is then the
// connection's window at most, and a client with many uploads to a stalled
// upstream is slowed down rather than refused for the budget.

#include <algorithm>
#include <cstdint>

namespace xdpq::http {

class BodyCredit {
public:
  struct Stream {
    uint64_t out = 0;  // bytes that left the exchange: the stream's credit given
    uint64_t conn = 0; // bytes whose connection credit was given (>= out)
  };
  explicit BodyCredit(uint64_t allowance) : allowance_(allowance) {}

  // For a connection whose body budget is limit and whose receive window
  // can reach window: at most half the budget, and room left for the
  // window and an eighth of the budget besides (response windows, bodies
  // answered here). 0 (credit as bytes leave) when the budget is smaller.
  static uint64_t allowance(uint64_t limit, uint64_t window) {
    const uint64_t reserve = window + limit / 8;
    return limit > reserve ? std::min(limit / 2, limit - reserve) : 0;
  }

  // n bytes the exchange took, with the connection's budget holding
  // budget_held (them included): the connection credit to give now.
  uint64_t arrived(Stream &s, uint64_t n, uint64_t budget_held) const {
    if (budget_held > allowance_) return 0;
    s.conn += n;
    return n;
  }
  // The exchange's bytes out are now out (body_out()): the stream's credit
  // to give, and the connection's for bytes that had none yet.
  struct Credit {
    uint64_t stream = 0, conn = 0;
  };
  static Credit left(Stream &s, uint64_t out) {
    Credit c;
    if (out <= s.out) return c;
    c.stream = out - s.out;
    if (s.conn < out) {
      c.conn = out - s.conn;
      s.conn = out;
    }
    s.out = out;
    return c;
  }
  // The stream ended with in bytes taken in all (body_in()): the
  // connection credit for those still without it (they die with it).
  static uint64_t closed(Stream &s, uint64_t in) {
    const uint64_t owed = in > s.conn ? in - s.conn : 0;
    s = Stream{};
    return owed;
  }

private:
  uint64_t allowance_;
};

} // namespace xdpq::http
