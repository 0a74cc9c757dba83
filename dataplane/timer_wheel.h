#pragma once
// A two-level timing wheel, one per worker, with timers embedded in their
// owners (intrusive lists: scheduling never allocates). Time is in
// nanoseconds of the worker's clock. A timer fires in the first run() at or
// after its expiry, never early.
//
// Level 0 has a slot per 131 us tick for the next revolution (~1.07 s) and
// holds only timers due within it, one tick per slot, so next_expiry() is
// exact and looks at one slot's timers. Timers further out (idle timeouts:
// most of a busy server's timers) wait on level 1, a slot per half
// revolution (~36 min in all; further ones are placed in its last slot and
// placed again when it comes), and move down when their half revolution
// comes within reach. Neither run() nor next_expiry() ever walks them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace xdpq::dataplane {

class TimerWheel;

class Timer {
public:
  using Callback = void (*)(Timer &);
  explicit Timer(Callback cb = nullptr, void *owner = nullptr) : cb_(cb), owner_(owner) {}
  ~Timer();
  Timer(const Timer &) = delete;
  Timer &operator=(const Timer &) = delete;

  void set_callback(Callback cb, void *owner) {
    cb_ = cb;
    owner_ = owner;
  }
  void *owner() const { return owner_; }
  bool scheduled() const { return wheel_ != nullptr; }
  uint64_t expiry() const { return expiry_; }

private:
  friend class TimerWheel;
  Callback cb_;
  void *owner_;
  TimerWheel *wheel_ = nullptr;
  Timer *prev_ = nullptr;
  Timer *next_ = nullptr;
  uint64_t expiry_ = 0;
  size_t slot_ = 0;
  bool far_ = false; // on level 1
  bool due_ = false; // taken out of its slot by run(), about to fire
};

class TimerWheel {
public:
  static constexpr unsigned TICK_SHIFT = 17; // 131072 ns per tick
  static constexpr size_t SLOTS = 8192;       // ~1.07 s per revolution
  static constexpr unsigned HALF_SHIFT = 12;  // ticks per level-1 slot: half a revolution
  static constexpr size_t FAR_SLOTS = 4096;   // ~36 min of level 1
  static constexpr uint64_t NEVER = std::numeric_limits<uint64_t>::max();

  explicit TimerWheel(uint64_t now_ns);
  ~TimerWheel();
  TimerWheel(const TimerWheel &) = delete;
  TimerWheel &operator=(const TimerWheel &) = delete;

  // (Re)schedules t to fire at or after at_ns.
  void schedule(Timer &t, uint64_t at_ns);
  void cancel(Timer &t);
  // Fires every timer due at now_ns. Callbacks may (re)schedule or cancel
  // any timer, those due in this run but not fired yet included (one
  // cancelled or moved to later does not fire now).
  size_t run(uint64_t now_ns);
  // Earliest time a timer could be due (an upper bound on the wait), or
  // NEVER when nothing is scheduled.
  uint64_t next_expiry() const;
  size_t size() const { return count_; }
  // Timers next_expiry() looked at in its last call (tests: it never walks
  // the far ones).
  size_t last_scan() const { return last_scan_; }

private:
  static uint64_t tick_of(uint64_t ns) { return ns >> TICK_SHIFT; }
  void link(Timer &t);
  void unlink(Timer &t);
  // Moves level-1 slot `half` (a half-revolution index) down.
  void cascade(uint64_t half);
  static size_t first_set(const uint64_t *bits, size_t nbits, size_t from);

  std::array<Timer *, SLOTS> slots_{};
  std::array<uint64_t, SLOTS / 64> occupied_{};
  std::array<Timer *, FAR_SLOTS> far_slots_{};
  std::array<uint64_t, FAR_SLOTS / 64> far_occupied_{};
  Timer *due_ = nullptr; // run()'s timers of one slot, still to fire
  uint64_t current_tick_; // every tick before this one has been run
  size_t count_ = 0;
  mutable size_t last_scan_ = 0;
};

} // namespace xdpq::dataplane
