#include "dataplane/timer_wheel.h"

namespace xdpq::dataplane {

Timer::~Timer() {
  if (wheel_) wheel_->cancel(*this);
}

TimerWheel::TimerWheel(uint64_t now_ns) : current_tick_(tick_of(now_ns)) {}

TimerWheel::~TimerWheel() {
  for (auto *slots : {slots_.data(), far_slots_.data()}) {
    size_t n = slots == slots_.data() ? SLOTS : FAR_SLOTS;
    for (size_t i = 0; i < n; ++i) {
      while (Timer *t = slots[i]) {
        slots[i] = t->next_;
        t->wheel_ = nullptr;
        t->prev_ = t->next_ = nullptr;
      }
    }
  }
}

void TimerWheel::link(Timer &t) {
  // A timer due in the past goes in the current slot: it fires next run().
  uint64_t tick = tick_of(t.expiry_);
  if (tick < current_tick_) tick = current_tick_;
  Timer **slots;
  uint64_t *occupied;
  size_t slot;
  if (tick - current_tick_ < SLOTS) {
    t.far_ = false;
    slot = tick % SLOTS;
    slots = slots_.data();
    occupied = occupied_.data();
  } else {
    // Its half revolution h is at least two away; it moves down when the
    // current one reaches h - 1. Beyond level 1's reach: its last slot.
    uint64_t half = tick >> HALF_SHIFT;
    uint64_t last = (current_tick_ >> HALF_SHIFT) + FAR_SLOTS - 1;
    if (half > last)
      half = last;
    t.far_ = true;
    slot = half % FAR_SLOTS;
    slots = far_slots_.data();
    occupied = far_occupied_.data();
  }
  t.slot_ = slot;
  t.prev_ = nullptr;
  t.next_ = slots[slot];
  if (t.next_) t.next_->prev_ = &t;
  slots[slot] = &t;
  occupied[slot / 64] |= 1ull << (slot % 64);
  t.wheel_ = this;
  ++count_;
}

void TimerWheel::unlink(Timer &t) {
  if (t.due_) {
    // Out of its slot already (and not counted): off run()'s list.
    if (t.prev_) t.prev_->next_ = t.next_;
    else due_ = t.next_;
    if (t.next_) t.next_->prev_ = t.prev_;
    t.prev_ = t.next_ = nullptr;
    t.wheel_ = nullptr;
    t.due_ = false;
    return;
  }
  Timer **slots = t.far_ ? far_slots_.data() : slots_.data();
  uint64_t *occupied = t.far_ ? far_occupied_.data() : occupied_.data();
  if (t.prev_) {
    t.prev_->next_ = t.next_;
  } else {
    slots[t.slot_] = t.next_;
    if (!t.next_)
      occupied[t.slot_ / 64] &= ~(1ull << (t.slot_ % 64));
  }
  if (t.next_) t.next_->prev_ = t.prev_;
  t.prev_ = t.next_ = nullptr;
  t.wheel_ = nullptr;
  --count_;
}

void TimerWheel::schedule(Timer &t, uint64_t at_ns) {
  if (t.wheel_) unlink(t);
  t.expiry_ = at_ns;
  link(t);
}

void TimerWheel::cancel(Timer &t) {
  if (t.wheel_ == this) unlink(t);
}

void TimerWheel::cascade(uint64_t half) {
  size_t slot = half % FAR_SLOTS;
  Timer *list = far_slots_[slot];
  far_slots_[slot] = nullptr;
  far_occupied_[slot / 64] &= ~(1ull << (slot % 64));
  while (list) {
    Timer *t = list;
    list = t->next_;
    --count_; // link() counts it again
    link(*t); // level 0 now, or level 1 again when it was beyond reach
  }
}

size_t TimerWheel::run(uint64_t now_ns) {
  size_t fired = 0;
  uint64_t now_tick = tick_of(now_ns);
  if (now_tick < current_tick_) return 0;
  // Visit each slot at most once per call, even after a long stall. The
  // current tick moves to now first, so a callback that reschedules a timer
  // into the past lands in a slot this or the next run() visits.
  uint64_t start = current_tick_;
  uint64_t last = now_tick - start >= SLOTS ? start + SLOTS - 1 : now_tick;
  uint64_t old_half = start >> HALF_SHIFT;
  uint64_t new_half = now_tick >> HALF_SHIFT;
  current_tick_ = now_tick;
  // Level-1 slots whose half revolution is now within reach move down
  // (every slot at most once, even after a long stall).
  for (uint64_t h = old_half + 2; h <= new_half + 1 && h < old_half + 2 + FAR_SLOTS; ++h) {
    if (far_occupied_[(h % FAR_SLOTS) / 64] & (1ull << ((h % FAR_SLOTS) % 64)))
      cascade(h);
  }
  for (uint64_t tick = start; tick <= last; ++tick) {
    size_t slot = tick % SLOTS;
    if (!(occupied_[slot / 64] & (1ull << (slot % 64)))) continue;
    // Detach the due timers first: callbacks may reschedule into this
    // slot. They stay on the wheel's own list until they fire, so that a
    // callback that cancels or reschedules one of them (or destroys its
    // owner) takes it off the list instead of leaving it to fire.
    for (Timer *t = slots_[slot]; t;) {
      Timer *next = t->next_;
      if (t->expiry_ <= now_ns) {
        unlink(*t);
        t->due_ = true;
        t->wheel_ = this;
        t->prev_ = nullptr;
        t->next_ = due_;
        if (due_) due_->prev_ = t;
        due_ = t;
      }
      t = next;
    }
    while (Timer *t = due_) {
      unlink(*t);
      ++fired;
      if (t->cb_) t->cb_(*t);
    }
  }
  return fired;
}

size_t TimerWheel::first_set(const uint64_t *bits, size_t nbits, size_t from) {
  // The first set bit at or after `from`, going round; nbits if none.
  for (size_t n = 0; n < nbits;) {
    size_t i = (from + n) % nbits;
    uint64_t word = bits[i / 64] >> (i % 64);
    if (word == 0) {
      n += 64 - i % 64;
      continue;
    }
    n += static_cast<size_t>(__builtin_ctzll(word));
    return n < nbits ? n : nbits;
  }
  return nbits;
}

uint64_t TimerWheel::next_expiry() const {
  last_scan_ = 0;
  if (count_ == 0)
    return NEVER;
  // Far timers: the first of them moves down when its half revolution
  // comes within reach, which may be before a level-0 timer is due (one
  // placed on level 1 just before the wheel turned, then a level-0 timer
  // further out): wake for that too, or it would fire late.
  uint64_t due = NEVER;
  uint64_t half = current_tick_ >> HALF_SHIFT;
  size_t m = first_set(far_occupied_.data(), FAR_SLOTS, (half + 2) % FAR_SLOTS);
  if (m < FAR_SLOTS) {
    uint64_t when_half = half + 2 + m - 1;
    due = (when_half << HALF_SHIFT) << TICK_SHIFT;
  }
  // Level 0: one tick per slot, so the first occupied slot holds the
  // earliest timers.
  size_t n = first_set(occupied_.data(), SLOTS, current_tick_ % SLOTS);
  if (n < SLOTS) {
    for (Timer *t = slots_[(current_tick_ + n) % SLOTS]; t; t = t->next_) {
      ++last_scan_;
      if (t->expiry_ < due)
        due = t->expiry_;
    }
  }
  return due;
}

} // namespace xdpq::dataplane
