#pragma once
// Backs off a listening socket when accept() fails for lack of descriptors
// (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM). The pending connection stays
// in the backlog, so the listener stays readable: retrying at once would
// spin a core while nothing can be accepted. Instead the listener leaves
// the event loop for a while (doubling from 50 ms to 1 s while the
// condition lasts) and the worker keeps serving what it has.

#include "dataplane/event_loop.h"

#include <cerrno>
#include <cstdint>

namespace xdpq::dataplane {

class AcceptBackoff {
public:
  static constexpr uint64_t MIN_NS = 50'000'000;
  static constexpr uint64_t MAX_NS = 1'000'000'000;

  AcceptBackoff(EventLoop &loop, int fd, FdHandler *handler)
      : loop_(loop), fd_(fd), handler_(handler), timer_(resume_fired, this) {}
  ~AcceptBackoff() { loop_.timers().cancel(timer_); }
  AcceptBackoff(const AcceptBackoff &) = delete;
  AcceptBackoff &operator=(const AcceptBackoff &) = delete;

  static bool is_resource_error(int err) {
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
  }
  // After accept() failed with err: pauses the listener when it is a
  // resource error (returns true; count it), otherwise does nothing.
  bool on_error(int err) {
    if (!is_resource_error(err) || paused_) return paused_ && is_resource_error(err);
    loop_.unwatch(fd_);
    pause();
    return true;
  }
  // After a successful accept: the next pause starts short again.
  void on_success() { delay_ = MIN_NS; }
  // Stops (shutdown, or a binary upgrade handing the listener over): no
  // resume until restart(). The caller unwatches the listener.
  void stop() {
    loop_.timers().cancel(timer_);
    stopped_ = true;
    paused_ = false;
  }
  // Listening again after stop() (the new process of an upgrade died):
  // watches the listener; later errors back off as before.
  void restart() {
    stopped_ = false;
    delay_ = MIN_NS;
    watch_or_pause();
  }
  bool paused() const { return paused_; }

private:
  void pause() {
    paused_ = true;
    loop_.timers().schedule(timer_, loop_.now() + delay_);
    delay_ = delay_ * 2 > MAX_NS ? MAX_NS : delay_ * 2;
  }
  // The listener back in the loop; if epoll refuses it (no memory, or
  // fs.epoll.max_user_watches reached: the same pressure that paused it),
  // another pause, never an exception out of the loop (it stopped the
  // worker, and with it the server).
  void watch_or_pause() {
    paused_ = false;
    // EEXIST: watched already (a restart of one never unwatched).
    if (!loop_.try_watch(fd_, handler_) && errno != EEXIST) pause();
  }
  static void resume_fired(Timer &t) {
    auto *b = static_cast<AcceptBackoff *>(t.owner());
    b->paused_ = false;
    if (!b->stopped_) b->watch_or_pause();
  }

  EventLoop &loop_;
  int fd_;
  FdHandler *handler_;
  Timer timer_;
  uint64_t delay_ = MIN_NS;
  bool paused_ = false;
  bool stopped_ = false;
};

} // namespace xdpq::dataplane
