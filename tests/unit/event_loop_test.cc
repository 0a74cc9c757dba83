#include "dataplane/accept_backoff.h"
#include "dataplane/event_loop.h"
#include "loop_steps.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace xdpq::dataplane;

namespace {

struct PipeReader final : FdHandler {
  int fd;
  std::atomic<int> reads{0};
  explicit PipeReader(int f) : fd(f) {}
  void on_io(uint32_t) override {
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    reads.fetch_add(1);
  }
};

struct Handler final : LoopHandler {
  std::atomic<int> wakes{0};
  void on_iteration_end() override {}
  void on_wake() override { wakes.fetch_add(1); }
};

// Runs a loop with the given spin budget: one readable event, one wake from
// another thread, then stop. Returns its counters.
LoopStats run_once(uint64_t spin_ns) {
  EventLoop loop;
  loop.set_spin(spin_ns);
  int p[2];
  EXPECT_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
  PipeReader reader(p[0]);
  loop.watch(p[0], &reader);
  Handler h;
  std::thread t([&] { loop.run(h); });
  EXPECT_EQ(write(p[1], "x", 1), 1);
  while (reader.reads.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  loop.wake();
  while (h.wakes.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  loop.stop();
  t.join();
  close(p[0]);
  close(p[1]);
  return loop.stats();
}

} // namespace

TEST(EventLoop, CountsPassesWakeupsAndSleepsWithoutSpin) {
  LoopStats s = run_once(0);
  EXPECT_GE(s.loop_passes, 2u); // the event, the wake (and the stop)
  EXPECT_GE(s.loop_wakeups, 1u);
  // Never spinning: every pass waited in epoll.
  EXPECT_EQ(s.loop_sleeps, s.loop_passes);
}

TEST(EventLoop, SpinsAfterWorkInsteadOfSleeping) {
  // A window far longer than the test: after the first event the loop
  // only looks (timeout 0) until it is stopped.
  LoopStats s = run_once(10'000'000'000ull);
  EXPECT_GE(s.loop_wakeups, 1u);
  EXPECT_LT(s.loop_sleeps, s.loop_passes);
  EXPECT_GT(s.loop_idle_passes, 0u); // empty looks while spinning
}

// Connections restate what they watch after every event; only a change
// reaches the kernel, and the events still follow the latest interest.
TEST(EventLoop, InterestChangesOnlyWhenTheyChange) {
  EventLoop loop;
  int p[2];
  ASSERT_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
  PipeReader reader(p[0]);
  loop.watch(p[0], &reader);
  for (int i = 0; i < 5; ++i) loop.set_interest(p[0], &reader, true, false);
  EXPECT_EQ(loop.stats().loop_interest_changes, 1u); // EPOLLRDHUP added once
  loop.set_interest(p[0], &reader, false, false);
  loop.set_interest(p[0], &reader, false, false);
  EXPECT_EQ(loop.stats().loop_interest_changes, 2u);
  // Not reading: a byte in the pipe wakes nothing.
  EXPECT_EQ(write(p[1], "x", 1), 1);
  Handler h;
  std::thread t([&] { loop.run(h); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(reader.reads.load(), 0);
  loop.stop();
  t.join();
  // A descriptor watched anew starts from what watch() registered.
  loop.unwatch(p[0]);
  loop.watch(p[0], &reader);
  loop.set_interest(p[0], &reader, true, false);
  EXPECT_EQ(loop.stats().loop_interest_changes, 3u);
  close(p[0]);
  close(p[1]);
}

// The handler hears after each descriptor's handler, within the pass, so
// that output made ready early in a pass need not wait for the rest of it.
TEST(EventLoop, TellsTheHandlerAfterEachDescriptorsEvent) {
  struct Counting final : LoopHandler {
    const PipeReader *a = nullptr;
    const PipeReader *b = nullptr;
    // Handlers run so far at each after_event(); -1 for each pass's end.
    std::vector<int> trace;
    void on_iteration_end() override { trace.push_back(-1); }
    void on_wake() override {}
    void after_event() override { trace.push_back(a->reads.load() + b->reads.load()); }
  };
  EventLoop loop;
  int a[2], b[2];
  ASSERT_EQ(pipe2(a, O_NONBLOCK | O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(b, O_NONBLOCK | O_CLOEXEC), 0);
  PipeReader ra(a[0]), rb(b[0]);
  loop.watch(a[0], &ra);
  loop.watch(b[0], &rb);
  // Both readable before the loop runs: its first pass has both events.
  ASSERT_EQ(write(a[1], "x", 1), 1);
  ASSERT_EQ(write(b[1], "y", 1), 1);
  Counting h;
  h.a = &ra;
  h.b = &rb;
  std::thread t([&] { loop.run(h); });
  while (ra.reads.load() + rb.reads.load() < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  loop.stop();
  t.join();
  // Once after each handler, within the pass (the stop's wake is no
  // descriptor's event, so only pass ends follow).
  ASSERT_GE(h.trace.size(), 3u);
  EXPECT_EQ(std::vector<int>(h.trace.begin(), h.trace.begin() + 3), (std::vector<int>{1, 2, -1}));
  for (size_t i = 3; i < h.trace.size(); ++i) EXPECT_EQ(h.trace[i], -1);
  for (int fd : {a[0], a[1], b[0], b[1]}) close(fd);
}

// Regression: after a binary upgrade's new process died, the old one
// listened again, but its backoff still thought itself stopped: the first
// EMFILE took the listener out of the loop for good (and one already
// paused when stopped made every later EMFILE spin).
TEST(AcceptBackoff, ListensAgainAfterAStopAndARestart) {
  EventLoop loop;
  int p[2];
  ASSERT_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
  PipeReader listener(p[0]); // stands for a listening socket
  AcceptBackoff backoff(loop, p[0], &listener);
  loop.watch(p[0], &listener);
  backoff.stop(); // the upgrade's new process took the listener
  loop.unwatch(p[0]);
  backoff.restart(); // it died: taken back (and watched)
  EXPECT_TRUE(backoff.on_error(EMFILE)); // out of descriptors
  EXPECT_TRUE(backoff.paused());
  ASSERT_EQ(write(p[1], "x", 1), 1);
  xdpq::testing::Steps steps(loop, {{[&] { return listener.reads.load() > 0; }, nullptr}});
  EXPECT_EQ(steps.run(), 1u) << "the listener never came back after its pause";
  // Stopped while paused: not paused any more, so a later error backs
  // off again instead of being taken for one already handled.
  EXPECT_TRUE(backoff.on_error(EMFILE));
  backoff.stop();
  EXPECT_FALSE(backoff.paused());
  close(p[0]);
  close(p[1]);
}

// Regression: when the pause ended, epoll could refuse the listener again
// (no memory, or fs.epoll.max_user_watches: the pressure that paused it),
// and the exception left the event loop: the worker stopped, and with it
// the server. Now the listener pauses again. (A regular file stands for
// the refused listener: epoll refuses every one.)
TEST(AcceptBackoff, AListenerEpollRefusesAfterItsPausePausesAgain) {
  EventLoop loop;
  char path[] = "/tmp/xdpq-backoff-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  PipeReader listener(fd);
  AcceptBackoff backoff(loop, fd, &listener);
  EXPECT_TRUE(backoff.on_error(ENOMEM));
  EXPECT_NO_THROW(loop.timers().run(loop.now() + AcceptBackoff::MIN_NS + 10'000'000));
  EXPECT_TRUE(backoff.paused()) << "refused, yet not paused again";
  // And again, later, with the longer delay.
  EXPECT_NO_THROW(loop.timers().run(loop.now() + 4 * AcceptBackoff::MIN_NS));
  EXPECT_TRUE(backoff.paused());
  backoff.stop();
  EXPECT_NO_THROW(backoff.restart());
  EXPECT_TRUE(backoff.paused()) << "a restart epoll refuses must pause too";
  backoff.stop();
  close(fd);
}
