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
//
// A ring may also live in memory shared between two processes (a binary
// upgrade: the next process hands the previous one its connections'
// datagrams): HandoffRegion maps such rings from a memfd, and each process
// builds its own HandoffRing view on the same bytes.

#include "dataplane/datagram_port.h"

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

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
      : mask_(round(capacity) - 1),
        // Not value-initialised: pages are touched only as slots are used.
        own_(std::make_unique_for_overwrite<std::byte[]>(region_bytes(capacity) + 63)) {
    void *p = own_.get();
    size_t space = region_bytes(capacity) + 63;
    place(std::align(64, region_bytes(capacity), p, space), true);
  }
  // A view of a ring at region (64-byte aligned, region_bytes(capacity)
  // long, shared with another process); init sets it up empty (the
  // creator does, once, before anyone pushes).
  HandoffRing(void *region, size_t capacity, bool init) : mask_(round(capacity) - 1) {
    place(region, init);
  }
  HandoffRing(const HandoffRing &) = delete;
  HandoffRing &operator=(const HandoffRing &) = delete;

  // Bytes a ring of capacity slots occupies in a region.
  static size_t region_bytes(size_t capacity) {
    return sizeof(Indices) + round(capacity) * sizeof(Slot);
  }

  size_t capacity() const { return mask_ + 1; }

  enum class Push { ok, full, too_big };

  // Producer: copies dg into the ring.
  Push push(const RxDatagram &dg) {
    if (dg.len > MAX_PAYLOAD) return Push::too_big;
    const uint64_t tail = ix_->tail.load(std::memory_order_relaxed);
    if (tail - head_cache_ > mask_) {
      head_cache_ = ix_->head.load(std::memory_order_acquire);
      if (tail - head_cache_ > mask_) return Push::full;
    }
    Slot &s = slots_[tail & mask_];
    s.path = dg.path;
    s.link = dg.link;
    s.len = static_cast<uint16_t>(dg.len);
    s.ecn = dg.ecn;
    std::memcpy(s.data, dg.data, dg.len);
    ix_->tail.store(tail + 1, std::memory_order_release);
    return Push::ok;
  }

  // Consumer: calls f(const RxDatagram &) for up to max datagrams in the
  // order they were pushed; each datagram's data is valid only during its
  // call. Returns how many it handed to f.
  template <typename F> size_t drain(F &&f, size_t max = SIZE_MAX) {
    const uint64_t head = ix_->head.load(std::memory_order_relaxed);
    const uint64_t tail = ix_->tail.load(std::memory_order_acquire);
    if (tail - head > capacity()) {
      // More waiting than the ring holds: a producer in another process
      // that does not keep the ring as we do (a bug, another layout). No
      // slot can be trusted: skip them all rather than read round and round.
      ix_->head.store(tail, std::memory_order_release);
      return 0;
    }
    size_t n = 0;
    for (uint64_t i = head; i != tail && n < max; ++i, ++n) {
      Slot &s = slots_[i & mask_];
      // The producer may be another process: never trust its length.
      const size_t len = s.len <= MAX_PAYLOAD ? s.len : 0;
      RxDatagram dg{s.data, len, s.path, s.ecn, s.link};
      if (len > 0) f(static_cast<const RxDatagram &>(dg));
      // The slot goes back to the producer only once f is done with it.
      ix_->head.store(i + 1, std::memory_order_release);
    }
    return n;
  }

  // Consumer: whether anything is waiting (a hint from the consumer's
  // side; the producer may be adding more).
  bool empty() const {
    return ix_->head.load(std::memory_order_relaxed) ==
           ix_->tail.load(std::memory_order_acquire);
  }

private:
  struct Slot {
    Path path;
    uint64_t link;
    uint16_t len;
    uint8_t ecn;
    uint8_t data[MAX_PAYLOAD];
  };
  // The producer's and the consumer's indices on their own cache lines
  // (lock-free atomics: the same in two processes mapping the region).
  struct Indices {
    alignas(64) std::atomic<uint64_t> tail;
    alignas(64) std::atomic<uint64_t> head;
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free);

  static size_t round(size_t capacity) { return std::bit_ceil(capacity < 2 ? size_t{2} : capacity); }

  void place(void *region, bool init) {
    ix_ = init ? new (region) Indices{} : std::launder(static_cast<Indices *>(region));
    slots_ = reinterpret_cast<Slot *>(static_cast<std::byte *>(region) + sizeof(Indices));
  }

  const size_t mask_;
  std::unique_ptr<std::byte[]> own_; // the ring's memory, unless it lives in a region
  Indices *ix_ = nullptr;
  Slot *slots_ = nullptr;
  uint64_t head_cache_ = 0; // the producer's copy of head
};

// Rings in one shared memory object (a memfd), for hand-offs between two
// processes: count rings of capacity slots each. The creator makes the
// memfd; the other process maps the same fd.
class HandoffRegion {
public:
  // Creates a region of count empty rings (throws std::runtime_error).
  HandoffRegion(size_t count, size_t capacity);
  // Maps the region another process created and takes fd over (throws
  // std::runtime_error, leaving fd open, if it is not count rings of
  // capacity slots).
  HandoffRegion(int fd, size_t count, size_t capacity);
  ~HandoffRegion();
  HandoffRegion(const HandoffRegion &) = delete;
  HandoffRegion &operator=(const HandoffRegion &) = delete;

  int fd() const { return fd_; }
  size_t count() const { return count_; }
  size_t capacity() const { return capacity_; }
  // This process's view of ring i.
  HandoffRing &ring(size_t i) { return *rings_[i]; }

private:
  void map(bool init);
  size_t count_;
  size_t capacity_;
  size_t stride_;
  int fd_ = -1;
  void *base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<std::unique_ptr<HandoffRing>> rings_;
};

} // namespace xdpq::dataplane
