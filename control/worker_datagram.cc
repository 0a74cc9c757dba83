// The worker's packet path: datagrams in from its port (or handed over by
// other workers), out through it for the endpoint, hand-off to the worker
// that owns a connection, and the end of each pass that flushes it all.
// Everything here runs per packet or per pass: keep it in one unit.

#include "control/worker.h"

#include <cstring>

#include <unistd.h>

namespace xdpq::control {

void Worker::TransmitEvents::on_io(uint32_t events) {
  worker.wait_polls_ = true;
  worker.port_->next_wait_polls(true);
  worker.on_io(events);
}

void Worker::on_io(uint32_t) {
  // A polled port's receive() takes from all its queues (and busy-polls
  // each empty one): once a pass, whichever of its descriptors woke us.
  if (port_->polled()) {
    if (polled_this_pass_) return;
    polled_this_pass_ = true;
  }
  receive_batches();
}

size_t Worker::receive_batches(dataplane::DatagramPort &from) {
  size_t total = 0;
  // 16 rounds, then other descriptors get their turn; but what a read
  // already took from the socket is handed out whole (its queue may be
  // empty now: nothing would wake us for the rest).
  for (int round = 0; round < 16 || from.rx_pending(); ++round) {
    size_t n = from.receive(batch_);
    if (n == 0) break;
    total += n;
    if (echo_) {
      echo(n);
      continue;
    }
    bool cap = capture_.active();
    for (size_t i = 0; i < n; ++i) {
      const auto &dg = batch_[i];
      if (cap) capture_.record(dg.path.remote, dg.path.local, {dg.data, dg.len}, dg.ecn);
      endpoint_.on_datagram(dg);
      check_held_output();
    }
  }
  return total;
}

// What the pass so far made ready leaves now, not after the rest of the
// pass: a burst of handshakes (hundreds of microseconds each, QUIC ones in
// the datagrams or TLS ones on TCP connections) would otherwise hold the
// first reply until the last handshake is done.
void Worker::check_held_output() {
  if (held_since_ == HELD_BLOCKED || !endpoint_.has_pending_writes()) return;
  const uint64_t now = endpoint_.clock().now();
  if (held_since_ == 0) {
    held_since_ = now;
  } else if (now - held_since_ >= HOLD_BUDGET_NS) {
    flush_held_output();
  }
}

void Worker::flush_held_output() {
  held_since_ = 0;
  passes_.output_flushed_mid_pass += 1;
  endpoint_.end_of_pass();
  port_->next_wait_polls(false);
  port_->flush();
  port_->next_wait_polls(wait_polls_);
  // The port had no room for all of it: trying again before the pass ends
  // would only repeat the flush; the end of the pass retries and asks to
  // be told when the port drains.
  if (endpoint_.write_blocked()) held_since_ = HELD_BLOCKED;
}

void Worker::echo(size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto &dg = batch_[i];
    auto buf = port_->tx_alloc(dg.len);
    if (buf.empty()) {
      port_->flush();
      buf = port_->tx_alloc(dg.len);
      if (buf.empty()) continue; // dropped, like a full NIC queue
    }
    std::memcpy(buf.data(), dg.data, dg.len);
    port_->tx_commit_reply(dg, dg.len);
  }
}

std::span<uint8_t> Worker::tx_alloc(size_t max_len) {
  last_alloc_ = port_->tx_alloc(max_len);
  return last_alloc_;
}

void Worker::tx_commit(const dataplane::Path &path, uint8_t ecn, size_t len) {
  if (capture_.active() && len <= last_alloc_.size()) {
    capture_.record(path.local, path.remote, {last_alloc_.data(), len}, ecn);
  }
  port_->tx_commit(path, ecn, len);
}

void Worker::tx_commit_reply(const dataplane::RxDatagram &to, size_t len) {
  if (capture_.active() && len <= last_alloc_.size()) {
    capture_.record(to.path.local, to.path.remote, {last_alloc_.data(), len}, 0);
  }
  port_->tx_commit_reply(to, len);
}

void Worker::peer_verified(const dataplane::Path &path, uint64_t link, bool strong) {
  port_->peer_verified(path, link, strong);
}

bool Worker::hand_off(uint8_t owner, const dataplane::RxDatagram &dg) {
  const size_t worker = owner & 0x7f;
  if (owner >> 7 != generation_) { // the previous process's connection
    if (worker >= to_previous_.size()) return false;
    return count_push(to_previous_[worker]->push(dg), previous_wake_pending_[worker]);
  }
  if (worker >= peers_.size() || peers_[worker] == this) return false;
  return count_push(peers_[worker]->inbox_[static_cast<size_t>(id_)]->push(dg),
                    wake_pending_[worker]);
}

bool Worker::count_push(dataplane::HandoffRing::Push r, std::vector<bool>::reference pending) {
  switch (r) {
  case dataplane::HandoffRing::Push::ok:
    pending = true;
    any_wake_pending_ = true;
    return true;
  case dataplane::HandoffRing::Push::full:
    handoff_.handoff_ring_full += 1;
    return false;
  case dataplane::HandoffRing::Push::too_big:
    handoff_.handoff_too_big += 1;
    return false;
  }
  return false;
}

// Datagrams other workers received for our connections: processed as if
// they had arrived on our queue; the replies leave through our port.
void Worker::take_handoffs() {
  if (echo_) return;
  auto process = [this](const dataplane::RxDatagram &dg) { endpoint_.on_datagram(dg); };
  for (auto &ring : inbox_) {
    if (ring) handoff_.handoff_received += ring->drain(process);
  }
  for (auto *ring : from_next_) handoff_.handoff_received += ring->drain(process);
}

// One wakeup per owner per pass, however many datagrams it was handed;
// the wake follows the pushes, so the owner sees them when it runs.
void Worker::wake_owners() {
  any_wake_pending_ = false;
  for (size_t i = 0; i < wake_pending_.size(); ++i) {
    if (!wake_pending_[i]) continue;
    wake_pending_[i] = false;
    handoff_.handoff_wakeups += 1;
    peers_[i]->loop_.wake();
  }
  for (size_t i = 0; i < previous_wake_pending_.size(); ++i) {
    if (!previous_wake_pending_[i]) continue;
    previous_wake_pending_[i] = false;
    handoff_.handoff_wakeups += 1;
    const uint64_t one = 1;
    [[maybe_unused]] auto r = write(previous_wake_fds_[i], &one, sizeof(one));
  }
}

void Worker::on_iteration_end() {
  beats_.fetch_add(1, std::memory_order_relaxed);
  // Busy polling: while spinning, the port is asked on every pass, since
  // its packets come in through the receive call, not as events.
  if (port_->polled()) {
    if (!polled_this_pass_ && loop_.spinning() && receive_batches() > 0) loop_.extend_spin();
    polled_this_pass_ = false;
  }
  if (any_wake_pending_) wake_owners();
  if (tcp_) tcp_->end_of_pass();
  if (proxy_) proxy_->end_of_pass();
  if (draining_) check_drain();
  // The loop ends after this pass without another wait: kick for itself.
  if (finishing_) port_->next_wait_polls(false);
  bool drained = true;
  for (int round = 0; round < 8; ++round) {
    endpoint_.end_of_pass();
    drained = port_->flush();
    if (!drained || !endpoint_.write_blocked()) break;
  }
  port_->next_wait_polls(false); // flushes outside a pass kick for themselves
  wait_polls_ = false;
  held_since_ = 0;
  // Writability is watched only on the descriptors whose send buffer is
  // full, and afresh after each blocked flush: which ones are full can
  // change from pass to pass. Watching a descriptor with room would wake
  // every pass.
  if (!drained || want_write_) {
    want_write_ = !drained;
    for (int fd : port_->fds()) {
      const bool watch = want_write_ && port_->waits_for_room(fd);
      if (send_only_.contains(fd)) {
        loop_.set_interest(fd, port_handler(fd), false, watch);
      } else {
        loop_.set_want_write(fd, port_handler(fd), watch);
      }
    }
  }
  if (finishing_) {
    stopped_.store(true, std::memory_order_release);
    loop_.stop(); // after this iteration, which flushed the closes
  }
}

} // namespace xdpq::control
