#pragma once
// Runs an event loop on the test's thread through steps, for tests of
// code driven by the loop (upstream sockets, timers).

#include "base/clock.h"
#include "dataplane/event_loop.h"

#include <functional>
#include <vector>

namespace xdpq::testing {

// Runs the loop on this thread through steps: each waits (checked at the
// end of every pass) until its condition holds, then runs its action.
// Gives up after a generous deadline (a bound, not a timing assertion).
class Steps final : public xdpq::dataplane::LoopHandler {
public:
  struct Step {
    std::function<bool()> until;
    std::function<void()> then;
  };
  Steps(xdpq::dataplane::EventLoop &loop, std::vector<Step> steps) : loop_(loop), steps_(std::move(steps)) {}

  // The number of steps whose condition was met.
  size_t run() {
    deadline_ = xdpq::monotonic_ns() + 20'000'000'000ull;
    // Passes happen on events and timers; a timer keeps checks coming.
    loop_.timers().schedule(tick_, loop_.now());
    loop_.run(*this);
    return done_;
  }

  void on_iteration_end() override {
    while (done_ < steps_.size() && steps_[done_].until()) {
      if (steps_[done_].then) steps_[done_].then();
      ++done_;
    }
    if (done_ == steps_.size() || xdpq::monotonic_ns() > deadline_) loop_.stop();
  }
  void on_wake() override {}

private:
  static void ticked(xdpq::dataplane::Timer &t) {
    auto *s = static_cast<Steps *>(t.owner());
    s->loop_.timers().schedule(t, s->loop_.now() + 10'000'000);
  }

  xdpq::dataplane::EventLoop &loop_;
  std::vector<Step> steps_;
  xdpq::dataplane::Timer tick_{ticked, this};
  size_t done_ = 0;
  uint64_t deadline_ = 0;
};

} // namespace xdpq::testing
