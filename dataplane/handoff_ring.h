#pragma once
// A bounded, lock-free, single-producer single-consumer ring of datagram
// copies: how one worker hands a datagram to the worker that owns its
// connection (a client whose new path hashes to another NIC queue). One
// ring per ordered pair of workers, owned by the consumer; only the
// producer's thread calls push(), only the consumer's calls drain().
//
// Every slot is fixed-size (path, link address, ECN and up to
// MAX_PAYLOAD bytes), so a push is one copy and never allocates. What does
// not fit, because the ring is full or the datagram is too large, is
// refused, and the caller drops and counts it: a peer can make a worker
// copy at most capacity() datagrams ahead of their owner, never more.

#include "dataplane/datagram_port.h"

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace xdpq::dataplane {

class HandoffRing {
public:
  // Larger than any datagram a QUIC peer of ours sends: the server's
  // max_udp_payload_size transport parameter is at most 1452 by default,
  // and Initials (which are never handed off) are the only packets that
  // may be padded past what a path carries.
  static constexpr size_t MAX_PAYLOAD = 2048;

  // capacity is rounded up to a power of two (at least 2).
  explicit HandoffRing(size_t capacity)
      : mask_(std::bit_ceil(capacity < 2 ? size_t{2} : capacity) - 1),
        // Not value-initialised: pages are touched only as slots are used.
        slots_(std::make_unique_for_overwrite<Slot[]>(mask_ + 1)) {}
  HandoffRing(const HandoffRing &) = delete;
  HandoffRing &operator=(const HandoffRing &) = delete;

  size_t capacity() const { return mask_ + 1; }

  enum class Push { ok, full, too_big };

  // Producer: copies dg into the ring.
  Push push(const RxDatagram &dg) {
    if (dg.len > MAX_PAYLOAD) return Push::too_big;
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_cache_ > mask_) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (tail - head_cache_ > mask_) return Push::full;
    }
    Slot &s = slots_[tail & mask_];
    s.path = dg.path;
    s.link = dg.link;
    s.len = static_cast<uint16_t>(dg.len);
    s.ecn = dg.ecn;
    std::memcpy(s.data, dg.data, dg.len);
    tail_.store(tail + 1, std::memory_order_release);
    return Push::ok;
  }

  // Consumer: calls f(const RxDatagram &) for up to max datagrams in the
  // order they were pushed; each datagram's data is valid only during its
  // call. Returns how many it handed to f.
  template <typename F> size_t drain(F &&f, size_t max = SIZE_MAX) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    size_t n = 0;
    for (uint64_t i = head; i != tail && n < max; ++i, ++n) {
      Slot &s = slots_[i & mask_];
      RxDatagram dg{s.data, s.len, s.path, s.ecn, s.link};
      f(static_cast<const RxDatagram &>(dg));
      // The slot goes back to the producer only once f is done with it.
      head_.store(i + 1, std::memory_order_release);
    }
    return n;
  }

  // Consumer: whether anything is waiting (a hint from the consumer's
  // side; the producer may be adding more).
  bool empty() const {
    return head_.load(std::memory_order_relaxed) == tail_.load(std::memory_order_acquire);
  }

private:
  struct Slot {
    Path path;
    uint64_t link;
    uint16_t len;
    uint8_t ecn;
    uint8_t data[MAX_PAYLOAD];
  };

  const size_t mask_;
  std::unique_ptr<Slot[]> slots_;
  // The producer's and the consumer's indices on their own cache lines,
  // with the producer's cached copy of head beside its own index.
  alignas(64) std::atomic<uint64_t> tail_{0};
  uint64_t head_cache_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};
};

} // namespace xdpq::dataplane
