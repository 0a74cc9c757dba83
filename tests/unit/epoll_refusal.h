#pragma once
// Makes epoll refuse sockets, as the kernel does when it has no memory for
// a watch or fs.epoll.max_user_watches is reached: the unit tests' own
// epoll_ctl() stands in front of libc's for the whole test binary and
// passes every call on, except that while a RefuseSocketWatches lives, its
// next n EPOLL_CTL_ADDs of a connected or connecting TCP or unix stream
// socket (never a listener, an eventfd or a timerfd) fail with ENOSPC.

namespace xdpq::testing {

class RefuseSocketWatches {
public:
  explicit RefuseSocketWatches(int n);
  ~RefuseSocketWatches(); // refusals not used up end here, not in a later test
  RefuseSocketWatches(const RefuseSocketWatches &) = delete;
  RefuseSocketWatches &operator=(const RefuseSocketWatches &) = delete;
  // How many refusals are still to come.
  int left() const;
};

} // namespace xdpq::testing
