#pragma once
// The per-core loop: waits on the worker's file descriptors and its timer
// wheel, then runs the worker's pollers in order. One thread, no locks;
// another thread may only call wake() and stop().

#include "base/clock.h"
#include "base/counters.h"
#include "dataplane/timer_wheel.h"

#include <atomic>
#include <cstdint>
#include <vector>

namespace xdpq::dataplane {

using xdpq::monotonic_ns; // base/clock.h

// Something with a file descriptor in the loop. on_io runs when it is
// ready; it must not block. A handler must stay alive until the end of the
// iteration in which it is unwatched (defer deletion to on_iteration_end).
class FdHandler {
public:
  virtual void on_io(uint32_t epoll_events) = 0;

protected:
  ~FdHandler() = default;
};

class LoopHandler {
public:
  // End of an iteration, after timers ran: flush batched output.
  virtual void on_iteration_end() = 0;
  // wake() was called from another thread.
  virtual void on_wake() = 0;
  // One descriptor's handler returned (the pass goes on with the next).
  virtual void after_event() {}

protected:
  ~LoopHandler() = default;
};

#define XDPQ_LOOP_COUNTERS(X)                                                                      \
  X(loop_passes, "event loop passes")                                                              \
  X(loop_idle_passes, "passes that found nothing to do (a timer, or a spin that came back empty)") \
  X(loop_sleeps, "passes that blocked in epoll until something happened")                          \
  X(loop_wakeups, "wakeups by another thread (hand-offs, the control plane)")                      \
  X(loop_interest_changes, "epoll_ctl calls that changed what a descriptor is watched for")

struct LoopStats {
  XDPQ_COUNTER_FIELDS(XDPQ_LOOP_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_LOOP_COUNTERS) }
};

class EventLoop {
public:
  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop &) = delete;
  EventLoop &operator=(const EventLoop &) = delete;

  // Watch fd for readability, and for writability while want_write is set.
  // Throws std::runtime_error if epoll refuses.
  void watch(int fd, FdHandler *h, bool want_write = false);
  // The same for one client's or upstream's socket, where epoll refusing
  // (ENOMEM, or ENOSPC past fs.epoll.max_user_watches) costs that socket
  // only: false with errno set, nothing watched.
  bool try_watch(int fd, FdHandler *h, bool want_write = false);
  // Change what fd is watched for. Free when nothing changes: the loop
  // remembers what epoll has for each fd and asks the kernel only for a
  // change (connections call this after every event).
  void set_want_write(int fd, FdHandler *h, bool want_write);
  void set_interest(int fd, FdHandler *h, bool want_read, bool want_write);
  void unwatch(int fd);

  TimerWheel &timers() { return wheel_; }
  uint64_t now() const { return now_; }
  // Which pass this is (events, timers and the end of the iteration count
  // as one; now() may move within a pass).
  uint64_t pass() const { return stats_.loop_passes; }
  // Whether h may have an event in this pass not yet handed to it: one
  // later in the batch epoll returned, or the batch was full (what came
  // past it is unknown). What changed on a descriptor before the pass's
  // wait is in the batch, in epoll's order, not necessarily first.
  bool may_have_event(const FdHandler *h) const;

  // Runs until stop(). Returns when the handler's last iteration ended.
  void run(LoopHandler &handler);
  void stop();
  void wake();
  // The eventfd behind wake(): writing 1 to it from anywhere (another
  // process too) wakes the loop.
  int wake_fd() const { return wakefd_; }
  bool stopping() const { return stop_.load(std::memory_order_acquire); }

  // Spin budget: after a pass that had work, keep polling without
  // sleeping for up to ns (0: always sleep when idle). Trades a core's
  // idle time for the latency of a wakeup.
  void set_spin(uint64_t ns) { spin_ns_ = ns; }
  // Within the spin budget of the last work (set_spin).
  bool spinning() const { return now_ < spin_until_; }
  // Work found without an event (busy polling): spin on from now.
  void extend_spin() {
    if (spin_ns_ != 0) spin_until_ = now_ + spin_ns_;
  }
  const LoopStats &stats() const { return stats_; }

private:
  void modify(int fd, FdHandler *h, uint32_t events);

  // What epoll has for each watched fd (index: the fd).
  struct Registered {
    FdHandler *handler = nullptr;
    uint32_t events = 0;
  };
  std::vector<Registered> registered_;
  int epfd_ = -1;
  int wakefd_ = -1;
  uint64_t now_;
  TimerWheel wheel_;
  std::atomic<bool> stop_{false};
  uint64_t spin_ns_ = 0;
  uint64_t spin_until_ = 0;
  LoopStats stats_;
  // This pass's batch (epoll_event, in run()): the events from batch_next_
  // on are not handed out yet; batch_full_ when epoll had room for no more.
  const void *batch_ = nullptr;
  int batch_n_ = 0;
  int batch_next_ = 0;
  bool batch_full_ = false;
};

} // namespace xdpq::dataplane
