// Binary upgrade on the worker's side: the two processes' generations of
// connection IDs, the old process handing its sockets to the new one (and
// taking them back if the new one dies), and moving to another port.

#include "control/worker.h"

#include <thread>

namespace xdpq::control {

void Worker::set_previous_generation(std::vector<dataplane::HandoffRing *> rings,
                                     std::vector<int> wake_fds) {
  to_previous_ = std::move(rings);
  previous_wake_fds_ = std::move(wake_fds);
  previous_wake_pending_.assign(to_previous_.size(), false);
  endpoint_.set_other_generation(static_cast<uint8_t>(to_previous_.size()));
  endpoint_.set_handoff(this);
}

bool Worker::expect_next_generation(bool expect, std::chrono::milliseconds timeout) {
  next_generation_.store(expect ? 2 : 1, std::memory_order_release);
  loop_.wake();
  auto until = std::chrono::steady_clock::now() + timeout;
  while (next_generation_.load(std::memory_order_acquire) != 0) {
    if (stopped() || std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void Worker::request_previous_gone() {
  previous_gone_.store(true, std::memory_order_release);
  loop_.wake();
}

bool Worker::wait_previous_gone(std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (previous_gone_.load(std::memory_order_acquire)) {
    if (stopped() || std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void Worker::request_handover(std::vector<dataplane::HandoffRing *> rings, std::vector<int> fds,
                              std::vector<int> tcp_kept) {
  {
    std::lock_guard lock(mu_);
    handover_rings_ = std::move(rings);
    handover_fds_ = std::move(fds);
    handover_tcp_kept_ = std::move(tcp_kept);
  }
  handover_requested_.store(true, std::memory_order_release);
  loop_.wake();
}

void Worker::request_take_back() {
  take_back_requested_.store(true, std::memory_order_release);
  loop_.wake();
}

bool Worker::replace_port(std::unique_ptr<dataplane::DatagramPort> port,
                          [[maybe_unused]] dataplane::AfXdpPort *afxdp,
                          std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  next_port_ = std::move(port); // a port still waiting here is replaced
  next_afxdp_ = afxdp;
  const uint64_t seq = ++port_seq_;
  replace_port_requested_.store(true, std::memory_order_release);
  loop_.wake();
  cv_.wait_for(lock, timeout, [&] { return port_done_seq_ >= seq || stopped(); });
  return port_done_seq_ >= seq;
}

void Worker::take_back() {
  if (finishing_) return; // too late: this worker already closed its connections
  drain_requested_.store(false, std::memory_order_relaxed);
  for (int fd : send_only_) {
    port_->resume_receiving(fd);
    loop_.set_interest(fd, port_handler(fd), true, want_write_ && port_->waits_for_room(fd));
  }
  send_only_.clear();
  watch_side_door(true);
  from_next_.clear();
  handed_over_ = false;
  idle_after_handover_.store(false, std::memory_order_release);
  tcp_goaway_ = false;
  endpoint_.set_other_generation(0);
  if (draining_) {
    draining_ = false;
    endpoint_.stop_drain();
  }
  if (tcp_) tcp_->resume_accepting();
}

void Worker::take_next_port() {
  std::unique_ptr<dataplane::DatagramPort> next;
  [[maybe_unused]] dataplane::AfXdpPort *next_afxdp;
  uint64_t seq;
  {
    std::lock_guard lock(mu_);
    next = std::move(next_port_);
    next_afxdp = next_afxdp_;
    seq = port_seq_;
  }
  if (next) {
    port_->flush();
    for (int fd : port_->fds()) loop_.unwatch(fd);
#ifdef XDPQ_HAVE_AFXDP
    if (afxdp_ && afxdp_->next_hop_fd() >= 0) loop_.unwatch(afxdp_->next_hop_fd());
    afxdp_ = nullptr;
#endif
    send_only_.clear();
    want_write_ = false;
    port_ = std::move(next); // the old one closes here
    for (int fd : port_->fds()) loop_.watch(fd, port_handler(fd));
#ifdef XDPQ_HAVE_AFXDP
    if (next_afxdp) set_afxdp(next_afxdp);
#endif
  }
  std::lock_guard lock(mu_);
  port_done_seq_ = seq;
  cv_.notify_all();
}

// The old process's side of the hand-over: stop reading the sockets the
// new process took, take its rings, and drain.
void Worker::take_handover() {
  std::vector<dataplane::HandoffRing *> rings;
  std::vector<int> fds, tcp_kept;
  {
    std::lock_guard lock(mu_);
    rings.swap(handover_rings_);
    fds.swap(handover_fds_);
    tcp_kept.swap(handover_tcp_kept_);
  }
  for (int fd : fds) {
    if (port_->stop_receiving(fd)) {
      send_only_.insert(fd);
      loop_.set_interest(fd, port_handler(fd), false, want_write_ && port_->waits_for_room(fd));
    }
  }
  watch_side_door(false); // the new process reads the reservations now
  from_next_ = std::move(rings);
  handed_over_ = true;
  if (tcp_) {
    tcp_->stop_accepting(); // the new process accepts from our listeners now
    tcp_->close_listeners_except(tcp_kept); // ... those it took; the rest refuse
  }
}

} // namespace xdpq::control
