#include "dataplane/timer_wheel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

using namespace xdpq::dataplane;

namespace {
struct Owner {
  Timer timer;
  std::vector<uint64_t> *log;
  uint64_t id;
};
void fire(Timer &t) {
  auto *o = static_cast<Owner *>(t.owner());
  o->log->push_back(o->id);
}
constexpr uint64_t MS = 1'000'000;
} // namespace

TEST(TimerWheel, FiresInOrderNeverEarly) {
  const uint64_t t0 = 5'000 * MS;
  TimerWheel w(t0);
  std::vector<uint64_t> log;
  Owner a{Timer(fire, nullptr), &log, 1}, b{Timer(fire, nullptr), &log, 2};
  a.timer.set_callback(fire, &a);
  b.timer.set_callback(fire, &b);
  w.schedule(a.timer, t0 + 10 * MS);
  w.schedule(b.timer, t0 + 3 * MS);
  EXPECT_EQ(w.size(), 2u);
  EXPECT_LE(w.next_expiry(), t0 + 3 * MS + (1u << TimerWheel::TICK_SHIFT));
  w.run(t0 + 2 * MS);
  EXPECT_TRUE(log.empty());
  w.run(t0 + 3 * MS);
  EXPECT_EQ(log, std::vector<uint64_t>{2});
  w.run(t0 + 20 * MS);
  EXPECT_EQ(log, (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.next_expiry(), TimerWheel::NEVER);
}

TEST(TimerWheel, BeyondOneRevolutionAndCancel) {
  const uint64_t t0 = 1'000 * MS;
  TimerWheel w(t0);
  std::vector<uint64_t> log;
  Owner far{Timer(), &log, 7}, gone{Timer(), &log, 8};
  far.timer.set_callback(fire, &far);
  gone.timer.set_callback(fire, &gone);
  w.schedule(far.timer, t0 + 5'000 * MS); // several revolutions out
  w.schedule(gone.timer, t0 + 1 * MS);
  w.cancel(gone.timer);
  EXPECT_FALSE(gone.timer.scheduled());
  for (uint64_t t = t0; t < t0 + 4'900 * MS; t += 100 * MS) w.run(t);
  EXPECT_TRUE(log.empty());
  EXPECT_GE(w.next_expiry(), t0 + 4'900 * MS);
  w.run(t0 + 5'001 * MS);
  EXPECT_EQ(log, std::vector<uint64_t>{7});
}

TEST(TimerWheel, RescheduleFromCallbackAndPastDue) {
  const uint64_t t0 = 1'000 * MS;
  TimerWheel w(t0);
  int fired = 0;
  struct Self {
    Timer t;
    TimerWheel *w;
    int *fired;
  } s{Timer(), &w, &fired};
  s.t.set_callback(
      [](Timer &t) {
        auto *me = static_cast<Self *>(t.owner());
        if (++*me->fired < 3) me->w->schedule(t, t.expiry() + MS);
      },
      &s);
  w.schedule(s.t, t0 - 5 * MS); // already due
  w.run(t0);
  EXPECT_EQ(fired, 1);
  w.run(t0 + 10 * MS);
  EXPECT_GE(fired, 2);
  w.run(t0 + 20 * MS);
  EXPECT_EQ(fired, 3);
}

TEST(TimerWheel, DestroyedTimerUnlinks) {
  TimerWheel w(0);
  {
    Timer t([](Timer &) { FAIL() << "destroyed timer fired"; }, nullptr);
    w.schedule(t, 5 * MS);
  }
  EXPECT_EQ(w.size(), 0u);
  w.run(10 * MS);
}

// Regression: far timers (every connection's idle timeout) sat in
// the level-0 slots, and next_expiry() walked them on every loop turn.
TEST(TimerWheel, FarTimersAreNeverWalkedAndFireOnTime) {
  const uint64_t t0 = 7'000 * MS;
  TimerWheel w(t0);
  std::vector<uint64_t> log;
  std::vector<std::unique_ptr<Owner>> far;
  for (uint64_t i = 0; i < 10'000; ++i) {
    far.push_back(std::unique_ptr<Owner>(new Owner{Timer(), &log, i}));
    far.back()->timer.set_callback(fire, far.back().get());
    w.schedule(far.back()->timer, t0 + 30'000 * MS + i * MS); // 30 to 40 s out
  }
  Owner near{Timer(), &log, 99'999};
  near.timer.set_callback(fire, &near);
  w.schedule(near.timer, t0 + 2 * MS);
  EXPECT_EQ(w.next_expiry(), t0 + 2 * MS);
  EXPECT_LE(w.last_scan(), 1u);
  w.run(t0 + 3 * MS);
  EXPECT_EQ(log, std::vector<uint64_t>{99'999});
  // Only far timers left: a wake-up bound, found without walking them.
  uint64_t next = w.next_expiry();
  EXPECT_EQ(w.last_scan(), 0u);
  EXPECT_GT(next, t0 + 20'000 * MS);
  EXPECT_LE(next, t0 + 30'000 * MS);
  log.clear();
  uint64_t t = t0 + 3 * MS;
  std::vector<uint64_t> fired_at(10'000, 0);
  while (t < t0 + 41'000 * MS) {
    t += 7 * MS;
    size_t before = log.size();
    w.run(t);
    for (size_t k = before; k < log.size(); ++k)
      fired_at[log[k]] = t;
    if (w.size() > 0) {
      uint64_t nx = w.next_expiry();
      EXPECT_LE(w.last_scan(), 20u) << "walked far timers at " << t;
      EXPECT_GE(nx, t - (1u << TimerWheel::TICK_SHIFT));
    }
  }
  ASSERT_EQ(log.size(), 10'000u);
  for (uint64_t i = 0; i < 10'000; ++i) {
    uint64_t due = t0 + 30'000 * MS + i * MS;
    EXPECT_GE(fired_at[i], due) << i;          // never early
    EXPECT_LT(fired_at[i], due + 8 * MS) << i; // within a run step
  }
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, BeyondLevelOneReachStillFires) {
  const uint64_t t0 = 1'000 * MS;
  TimerWheel w(t0);
  std::vector<uint64_t> log;
  Owner o{Timer(), &log, 1};
  o.timer.set_callback(fire, &o);
  const uint64_t due = t0 + 3ull * 3600 * 1000 * MS; // 3 h: past level 1
  w.schedule(o.timer, due);
  uint64_t t = t0;
  while (log.empty() && t < due + 10'000 * MS) {
    uint64_t next = w.next_expiry();
    ASSERT_GT(next, t);                   // it never asks for a busy loop
    t = std::min(next, t + 600'000 * MS); // sleep until then (at most 10 min)
    w.run(t);
  }
  ASSERT_EQ(log.size(), 1u);
  EXPECT_GE(t, due);
  EXPECT_LT(t, due + MS);
}

// Timers due in the same run: the first to fire may cancel, move or
// destroy the others, and those then do not fire now (a connection's
// timeout that tears down streams whose own timers were due too).
TEST(TimerWheel, ACallbackMayCancelMoveOrDestroyTimersDueInTheSameRun) {
  const uint64_t t0 = 5'000 * MS;
  TimerWheel w(t0);
  struct Peer {
    Timer timer;
    TimerWheel *w;
    std::vector<int> *fired;
    int id;
    Peer *cancel = nullptr, *cancel_too = nullptr, *move = nullptr;
    std::unique_ptr<Peer> *destroy = nullptr;
  };
  auto cb = [](Timer &t) {
    auto *p = static_cast<Peer *>(t.owner());
    p->fired->push_back(p->id);
    if (p->cancel) p->w->cancel(p->cancel->timer);
    if (p->cancel_too) p->w->cancel(p->cancel_too->timer);
    if (p->move) p->w->schedule(p->move->timer, p->move->timer.expiry() + 50 * MS);
    if (p->destroy) p->destroy->reset();
  };
  std::vector<int> fired;
  // Each of them acts on all the others: whichever fires first, none of
  // the rest may fire in this run.
  Peer a{Timer(cb, nullptr), &w, &fired, 1};
  Peer b{Timer(cb, nullptr), &w, &fired, 2};
  std::unique_ptr<Peer> c(new Peer{Timer(cb, nullptr), &w, &fired, 3});
  a.timer.set_callback(cb, &a);
  b.timer.set_callback(cb, &b);
  c->timer.set_callback(cb, c.get());
  a.cancel = &b;
  a.destroy = &c;
  b.move = &a;
  b.destroy = &c;
  c->cancel = &a;
  c->move = nullptr;
  c->cancel_too = &b;
  for (Timer *t : {&a.timer, &b.timer, &c->timer}) w.schedule(*t, t0 + 5 * MS);
  w.run(t0 + 5 * MS);
  ASSERT_EQ(fired.size(), 1u);
  const int first = fired[0];
  // What the first one moved fires later, at its new time; what it
  // cancelled or destroyed never does.
  w.run(t0 + 60 * MS);
  const std::vector<int> expect = first == 2 ? std::vector<int>{2, 1} : std::vector<int>{first};
  EXPECT_EQ(fired, expect);
  EXPECT_EQ(w.size(), 0u);
}

// Regression: with any timer on level 0, next_expiry() named the first of
// those and ignored level 1, whose first timer could be due earlier (placed
// on level 1 just before the wheel turned): a loop that slept until the
// level-0 timer fired the other one up to half a revolution (~0.5 s) late.
TEST(TimerWheel, TheWaitBoundCoversAFarTimerDueFirst) {
  constexpr uint64_t TICK = uint64_t{1} << TimerWheel::TICK_SHIFT;
  TimerWheel w(0);
  std::vector<uint64_t> log;
  Owner a{Timer(), &log, 1}, b{Timer(), &log, 2};
  a.timer.set_callback(fire, &a);
  b.timer.set_callback(fire, &b);
  w.schedule(a.timer, TimerWheel::SLOTS * TICK); // one revolution out: level 1
  w.run(1000 * TICK);
  w.schedule(b.timer, (TimerWheel::SLOTS + 999) * TICK); // later, yet on level 0
  // A loop that sleeps until each bound, as the event loop does.
  for (int i = 0; i < 10 && log.empty(); ++i) {
    const uint64_t next = w.next_expiry();
    ASSERT_NE(next, TimerWheel::NEVER);
    EXPECT_LE(next, a.timer.expiry()) << "the bound is past the earliest timer";
    w.run(next);
  }
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front(), 1u) << "the later timer fired first";
}
