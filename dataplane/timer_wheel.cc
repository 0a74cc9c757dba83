#include "dataplane/timer_wheel.h"

namespace xdpq::dataplane {

Timer::~Timer() {
  if (wheel_) wheel_->cancel(*this);
}

TimerWheel::TimerWheel(uint64_t now_ns) : current_tick_(tick_of(now_ns)) {}

TimerWheel::~TimerWheel() {
  for (auto *&head : slots_) {
    while (head) {
      Timer *t = head;
      head = t->next_;
      t->wheel_ = nullptr;
      t->prev_ = t->next_ = nullptr;
    }
  }
}

void TimerWheel::link(Timer &t) {
  // A timer due in the past goes in the current slot: it fires next run().
  uint64_t tick = tick_of(t.expiry_);
  if (tick < current_tick_) tick = current_tick_;
  size_t slot = tick % SLOTS;
  t.slot_ = slot;
  t.prev_ = nullptr;
  t.next_ = slots_[slot];
  if (t.next_) t.next_->prev_ = &t;
  slots_[slot] = &t;
  occupied_[slot / 64] |= 1ull << (slot % 64);
  t.wheel_ = this;
  ++count_;
}

void TimerWheel::unlink(Timer &t) {
  if (t.prev_) {
    t.prev_->next_ = t.next_;
  } else {
    slots_[t.slot_] = t.next_;
    if (!t.next_) occupied_[t.slot_ / 64] &= ~(1ull << (t.slot_ % 64));
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

size_t TimerWheel::run(uint64_t now_ns) {
  size_t fired = 0;
  uint64_t now_tick = tick_of(now_ns);
  if (now_tick < current_tick_) return 0;
  // Visit each slot at most once per call, even after a long stall. The
  // current tick moves to now first, so a callback that reschedules a timer
  // into the past lands in a slot this or the next run() visits.
  uint64_t start = current_tick_;
  uint64_t last = now_tick - start >= SLOTS ? start + SLOTS - 1 : now_tick;
  current_tick_ = now_tick;
  for (uint64_t tick = start; tick <= last; ++tick) {
    size_t slot = tick % SLOTS;
    if (!(occupied_[slot / 64] & (1ull << (slot % 64)))) continue;
    // Detach the due timers first: callbacks may reschedule into this slot.
    Timer *due = nullptr;
    for (Timer *t = slots_[slot]; t;) {
      Timer *next = t->next_;
      if (t->expiry_ <= now_ns) {
        unlink(*t);
        t->next_ = due;
        due = t;
      }
      t = next;
    }
    while (due) {
      Timer *t = due;
      due = t->next_;
      t->next_ = nullptr;
      ++fired;
      if (t->cb_) t->cb_(*t);
    }
  }
  return fired;
}

uint64_t TimerWheel::next_expiry() const {
  if (count_ == 0) return NEVER;
  uint64_t fallback = NEVER;
  size_t start = current_tick_ % SLOTS;
  for (size_t n = 0; n < SLOTS;) {
    size_t slot = (start + n) % SLOTS;
    uint64_t word = occupied_[slot / 64] >> (slot % 64);
    if (word == 0) {
      n += 64 - slot % 64;
      continue;
    }
    n += static_cast<size_t>(__builtin_ctzll(word));
    if (n >= SLOTS) break;
    slot = (start + n) % SLOTS;
    uint64_t slot_tick = current_tick_ + n;
    uint64_t due = NEVER;
    for (Timer *t = slots_[slot]; t; t = t->next_) {
      // Due in this revolution (timers from later ones share the slot).
      if (tick_of(t->expiry_) <= slot_tick && t->expiry_ < due) due = t->expiry_;
      if (t->expiry_ < fallback) fallback = t->expiry_;
    }
    if (due != NEVER) return due;
    ++n;
  }
  return fallback;
}

} // namespace xdpq::dataplane
