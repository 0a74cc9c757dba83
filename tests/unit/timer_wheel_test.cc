#include "dataplane/timer_wheel.h"

#include <gtest/gtest.h>

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
