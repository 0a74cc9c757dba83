#pragma once
// The per-core loop: waits on the worker's file descriptors and its timer
// wheel, then runs the worker's pollers in order. One thread, no locks;
// another thread may only call wake() and stop().

#include "dataplane/timer_wheel.h"

#include <atomic>
#include <cstdint>

namespace xdpq::dataplane {

uint64_t monotonic_ns();

class LoopHandler {
public:
  // A watched descriptor is ready (or the loop was woken). The handler
  // reads what it can, without blocking.
  virtual void on_ready() = 0;
  // End of an iteration, after timers ran: flush batched output.
  virtual void on_iteration_end() = 0;
  // wake() was called from another thread.
  virtual void on_wake() = 0;

protected:
  ~LoopHandler() = default;
};

class EventLoop {
public:
  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop &) = delete;
  EventLoop &operator=(const EventLoop &) = delete;

  // Watch fd for readability, and for writability while want_write is set.
  void watch(int fd, bool want_write = false);
  void set_want_write(int fd, bool want_write);

  TimerWheel &timers() { return wheel_; }
  uint64_t now() const { return now_; }

  // Runs until stop(). Returns when the handler's last iteration ended.
  void run(LoopHandler &handler);
  void stop();
  void wake();
  bool stopping() const { return stop_.load(std::memory_order_acquire); }

private:
  int epfd_ = -1;
  int wakefd_ = -1;
  uint64_t now_;
  TimerWheel wheel_;
  std::atomic<bool> stop_{false};
};

} // namespace xdpq::dataplane
