#include "dataplane/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace xdpq::dataplane {

EventLoop::EventLoop() : now_(monotonic_ns()), wheel_(now_) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wakefd_ < 0) {
    throw std::runtime_error(std::string("event loop: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr; // the wake eventfd
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
}

EventLoop::~EventLoop() {
  close(wakefd_);
  close(epfd_);
}

void EventLoop::watch(int fd, FdHandler *h, bool want_write) {
  if (!try_watch(fd, h, want_write)) {
    throw std::runtime_error(std::string("epoll_ctl: ") + std::strerror(errno));
  }
}

bool EventLoop::try_watch(int fd, FdHandler *h, bool want_write) {
  epoll_event ev{};
  ev.events = EPOLLIN | (want_write ? EPOLLOUT : 0u);
  ev.data.ptr = h;
  if (fd >= 0 && static_cast<size_t>(fd) >= registered_.size()) registered_.resize(fd + 64);
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
  if (fd >= 0) registered_[fd] = {h, ev.events};
  return true;
}

void EventLoop::modify(int fd, FdHandler *h, uint32_t events) {
  if (fd >= 0 && static_cast<size_t>(fd) < registered_.size()) {
    Registered &r = registered_[fd];
    if (r.handler == h && r.events == events) return;
    r = {h, events};
  }
  stats_.loop_interest_changes += 1;
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = h;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::set_want_write(int fd, FdHandler *h, bool want_write) {
  modify(fd, h, EPOLLIN | (want_write ? EPOLLOUT : 0u));
}

void EventLoop::set_interest(int fd, FdHandler *h, bool want_read, bool want_write) {
  modify(fd, h, (want_read ? EPOLLIN | EPOLLRDHUP : 0u) | (want_write ? EPOLLOUT : 0u));
}

void EventLoop::unwatch(int fd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  if (fd >= 0 && static_cast<size_t>(fd) < registered_.size()) registered_[fd] = {};
}

void EventLoop::run(LoopHandler &handler) {
  constexpr int MAX_EVENTS = 64;
  epoll_event events[MAX_EVENTS];
  while (!stopping()) {
    now_ = monotonic_ns();
    uint64_t next = wheel_.next_expiry();
    timespec ts{};
    timespec *timeout = nullptr;
    if (now_ < spin_until_) {
      timeout = &ts; // spinning: look, do not sleep
    } else if (next != TimerWheel::NEVER) {
      uint64_t wait = next > now_ ? next - now_ : 0;
      ts.tv_sec = static_cast<time_t>(wait / 1000000000ull);
      ts.tv_nsec = static_cast<long>(wait % 1000000000ull);
      timeout = &ts;
    }
    if (timeout == nullptr || ts.tv_sec != 0 || ts.tv_nsec != 0) stats_.loop_sleeps += 1;
    int n = epoll_pwait2(epfd_, events, MAX_EVENTS, timeout, nullptr);
    if (n < 0 && errno != EINTR) {
      throw std::runtime_error(std::string("epoll_pwait2: ") + std::strerror(errno));
    }
    now_ = monotonic_ns();
    stats_.loop_passes += 1;
    if (n <= 0) {
      stats_.loop_idle_passes += 1;
    } else if (spin_ns_ != 0) {
      spin_until_ = now_ + spin_ns_;
    }
    bool woken = false;
    {
      // The batch is over once its events are handed out (or a handler
      // threw): timers and the iteration's end see none.
      struct BatchOver {
        EventLoop &loop;
        ~BatchOver() {
          loop.batch_n_ = 0;
          loop.batch_full_ = false;
        }
      } over{*this};
      batch_ = events;
      batch_n_ = n > 0 ? n : 0;
      batch_full_ = n == MAX_EVENTS;
      for (int i = 0; i < n; ++i) {
        batch_next_ = i + 1;
        auto *h = static_cast<FdHandler *>(events[i].data.ptr);
        if (h == nullptr) {
          uint64_t v;
          while (read(wakefd_, &v, sizeof(v)) > 0) {
          }
          woken = true;
        } else {
          h->on_io(events[i].events);
          handler.after_event();
        }
      }
    }
    if (woken) {
      stats_.loop_wakeups += 1;
      handler.on_wake();
    }
    now_ = monotonic_ns();
    wheel_.run(now_);
    handler.on_iteration_end();
  }
}

bool EventLoop::may_have_event(const FdHandler *h) const {
  if (batch_full_) return true;
  const auto *events = static_cast<const epoll_event *>(batch_);
  for (int i = batch_next_; i < batch_n_; ++i) {
    if (events[i].data.ptr == h) return true;
  }
  return false;
}

void EventLoop::stop() {
  stop_.store(true, std::memory_order_release);
  wake();
}

void EventLoop::wake() {
  uint64_t one = 1;
  [[maybe_unused]] auto r = write(wakefd_, &one, sizeof(one));
}

} // namespace xdpq::dataplane
