#pragma once
// One shard: its datagram port, TLS context, QUIC endpoint, TCP side and
// timer wheel, all used by one pinned thread only. The control thread talks
// to it only through the mailboxes below (flag + wake; the worker answers
// from its own thread), never by touching its state.

#include "base/counters.h"
#include "base/log.h"
#include "base/small_alloc.h"
#include "control/capture.h"
#include "dataplane/cpu.h"
#include "dataplane/event_loop.h"
#include "dataplane/handoff_ring.h"
#include "http/h3_session.h"
#include "http/tcp_server.h"
#include "quic/endpoint.h"
#include "quic/tls_context.h"
#ifdef XDPQ_HAVE_AFXDP
#include "dataplane/afxdp_port.h"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include <unistd.h>

namespace xdpq::dataplane {
class AfXdpPort;
}

namespace xdpq::control {

#define XDPQ_WORKER_GAUGES(X)                                                                      \
  X(quic_connections, "QUIC connections open")                                                     \
  X(tcp_connections, "TCP connections open")                                                       \
  X(body_bytes_held, "request body bytes held (and responses made from them)")                     \
  X(body_bytes_limit, "the worker's body budget (--max-body-per-worker)")                          \
  X(block_cache_bytes, "freed small blocks the worker's thread keeps for reuse")

struct WorkerGauges {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_GAUGES)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_WORKER_GAUGES) }
};

// The worker thread's heap traffic.
#define XDPQ_WORKER_HEAP_COUNTERS(X)                                                               \
  X(block_cache_hits, "small blocks served from the worker's block cache")                         \
  X(block_cache_misses, "small blocks the block cache had to take from malloc")                    \
  X(heap_allocations, "malloc calls on the worker's thread (counted only under the "               \
                      "benchmark shim libxdpq_malloc_count.so; 0 otherwise)")

struct WorkerHeap {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_HEAP_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_WORKER_HEAP_COUNTERS) }
};

// Cross-queue routing: datagrams for a connection another worker owns.
#define XDPQ_WORKER_HANDOFF_COUNTERS(X)                                                            \
  X(handoff_received, "datagrams other workers handed to this one (their owner)")                 \
  X(handoff_wakeups, "wakeups sent to other workers for datagrams handed to them")                 \
  X(handoff_ring_full, "datagrams not handed off: the owner's ring was full")                      \
  X(handoff_too_big, "datagrams not handed off: larger than a hand-off slot")

struct WorkerHandoff {
  XDPQ_COUNTER_FIELDS(XDPQ_WORKER_HANDOFF_COUNTERS)
  template <typename F> void visit(F &&f) const {
    XDPQ_COUNTER_VISIT(XDPQ_WORKER_HANDOFF_COUNTERS)
  }
};

// This thread's malloc calls, when the counting shim is preloaded.
uint64_t thread_malloc_count();

// A copy of a worker's counters (and optionally its connections), taken on
// the worker's own thread.
struct WorkerSnapshot {
  int id = 0;
  int cpu = -1;
  dataplane::PortStats port;
  quic::EndpointStats endpoint;
  http::H3Stats h3;
  bool has_tcp = false;
  http::TcpStats tcp;
  bool has_afxdp = false;
#ifdef XDPQ_HAVE_AFXDP
  dataplane::AfXdpStats afxdp;
  dataplane::NextHopStats next_hops;
  std::vector<uint32_t> queues;
  bool zerocopy = false;
#endif
  WorkerGauges gauges;
  WorkerHeap heap;
  WorkerHandoff handoff;
  dataplane::LoopStats loop;
  std::vector<quic::ConnInfo> quic_conns;
  std::vector<http::TcpConnInfo> tcp_conns;
};

class Worker final : public dataplane::LoopHandler,
                     public dataplane::FdHandler,
                     public dataplane::TxSink,
                     public quic::Handoff {
public:
  Worker(int id, int cpu, std::unique_ptr<dataplane::DatagramPort> port,
         const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
         std::shared_ptr<const http::Router> router, const quic::EndpointConfig &ecfg,
         const http::H3Limits &h3, Capture &capture, size_t body_budget)
      : id_(id), cpu_(cpu), port_(std::move(port)), secrets_(secrets), capture_(capture),
        tls_(std::make_unique<quic::TlsContext>(tls_cfg, secrets)), budget_(body_budget),
        h3_(router, with_budget(h3, budget_)),
        endpoint_(ecfg, *tls_, secrets, h3_, loop_.timers(), clock_, *this),
        generation_(ecfg.generation),
        heartbeat_(heartbeat_fired, this) {
    for (int fd : port_->fds()) loop_.watch(fd, this);
    loop_.timers().schedule(heartbeat_, dataplane::monotonic_ns() + HEARTBEAT_NS);
  }

  // Joins the workers that share the CID space (all[i] has id i; this one
  // among them): each gets a hand-off ring from every other, owned by the
  // receiving worker. Call for every worker before any start().
  void connect_peers(const std::vector<Worker *> &all) {
    peers_ = all;
    wake_pending_.assign(all.size(), false);
    inbox_.clear();
    inbox_.resize(all.size());
    if (all.size() < 2) return;
    // About 2 MiB of slots per worker, split over its peers, at least 32
    // slots each; pages are touched only as slots are used.
    constexpr size_t SLOT_BYTES = dataplane::HandoffRing::MAX_PAYLOAD + 96;
    size_t slots = std::max<size_t>(32, (2u << 20) / SLOT_BYTES / (all.size() - 1));
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] != this) inbox_[i] = std::make_unique<dataplane::HandoffRing>(slots);
    }
    endpoint_.set_handoff(this);
  }

  // Binary upgrade, the new process: the previous process's workers
  // (their rings from this worker, indexed by their id, and the eventfds
  // that wake them) take the datagrams of their connections. Before start().
  void set_previous_generation(std::vector<dataplane::HandoffRing *> rings,
                               std::vector<int> wake_fds) {
    to_previous_ = std::move(rings);
    previous_wake_fds_ = std::move(wake_fds);
    previous_wake_pending_.assign(to_previous_.size(), false);
    endpoint_.set_other_generation(static_cast<uint8_t>(to_previous_.size()));
    endpoint_.set_handoff(this);
  }
  // Binary upgrade, the old process, before the new one starts: its CIDs
  // (the other generation) are dropped here, never reset, while both
  // processes read the same sockets. expect false: the upgrade failed.
  // Returns once the worker applied it (or after timeout).
  bool expect_next_generation(bool expect, std::chrono::milliseconds timeout) {
    next_generation_.store(expect ? 2 : 1, std::memory_order_release);
    loop_.wake();
    auto until = std::chrono::steady_clock::now() + timeout;
    while (next_generation_.load(std::memory_order_acquire) != 0) {
      if (stopped() || std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  // The previous process exited: its CIDs are unknown ones from now on.
  void request_previous_gone() {
    previous_gone_.store(true, std::memory_order_release);
    loop_.wake();
  }
  // True once the worker dropped its rings to the previous process and
  // its wake descriptors (the caller may close and unmap them then);
  // false after timeout or if the worker stopped without doing so.
  bool wait_previous_gone(std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (previous_gone_.load(std::memory_order_acquire)) {
      if (stopped() || std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  // Binary upgrade, the old process: the new process reads these sockets
  // now (this worker only sends through them) and hands this worker its
  // connections' datagrams through rings (one per new worker). Then drain.
  void request_handover(std::vector<dataplane::HandoffRing *> rings, std::vector<int> fds) {
    {
      std::lock_guard lock(mu_);
      handover_rings_ = std::move(rings);
      handover_fds_ = std::move(fds);
    }
    handover_requested_.store(true, std::memory_order_release);
    loop_.wake();
  }
  // Binary upgrade, the old process, after the hand-over: the new process
  // died. Read the sockets again, accept again, stop draining.
  void request_take_back() {
    take_back_requested_.store(true, std::memory_order_release);
    loop_.wake();
  }
  int wake_fd() const { return loop_.wake_fd(); }
  // The port's sockets (socket dataplane: immutable once built; any thread).
  const dataplane::DatagramPort &datagram_port() const { return *port_; }

  // Binary upgrade on AF_XDP: the worker moves to another port between two
  // passes (what the old one had queued is flushed, then it is closed on
  // the worker's thread) and keeps its connections: to kernel UDP sockets
  // while the new process takes the queues, back to an AF_XDP port if it
  // fails. afxdp: the new port if it is one. Returns once done, false
  // after timeout (it still happens when the worker gets to it).
  bool replace_port(std::unique_ptr<dataplane::DatagramPort> port,
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

  // Adds the TCP side to this worker's loop (throws http::TcpError).
  void add_tcp(const http::TcpConfig &cfg, const http::SessionEnv &env,
               std::shared_ptr<http::TcpTlsContext> tls) {
    http::SessionEnv e = env;
    e.budget = &budget_;
    tcp_ = std::make_unique<http::TcpServer>(cfg, e, std::move(tls), loop_);
  }
#ifdef XDPQ_HAVE_AFXDP
  void set_afxdp(dataplane::AfXdpPort *p) {
    afxdp_ = p;
    if (p->next_hop_fd() >= 0) loop_.watch(p->next_hop_fd(), &next_hop_events_);
  }
#endif

  void start() {
    thread_ = std::thread([this] {
      if (cpu_ >= 0) {
        int rv = dataplane::pin_current_thread(cpu_);
        if (rv != 0) LOG_WARN("worker %d: cannot pin to CPU %d: %s", id_, cpu_, strerror(rv));
      }
      // Nothing may leave a worker silently: a failure stops the daemon,
      // loudly, with exit status 1.
      try {
        loop_.run(*this);
      } catch (const std::exception &e) {
        LOG_ERROR("worker %d failed: %s; stopping xdpqd", id_, e.what());
        failed_.store(true, std::memory_order_release);
      } catch (...) {
        LOG_ERROR("worker %d failed (unknown exception); stopping xdpqd", id_);
        failed_.store(true, std::memory_order_release);
      }
      // Thread-local figures must be read here; final_snapshot() runs on
      // the control thread after join().
      read_heap(heap_at_exit_, cached_at_exit_);
      loop_done_ = true;
      stopped_.store(true, std::memory_order_release);
    });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  // --- mailboxes (any thread) ---------------------------------------------

  // Stop now: CONNECTION_CLOSE / close everything this iteration.
  void request_stop() {
    stop_requested_.store(true, std::memory_order_release);
    loop_.wake();
  }
  // Graceful drain: GOAWAY everywhere, finish what is in flight, then stop;
  // at deadline_ns at the latest.
  void request_drain(uint64_t deadline_ns) {
    drain_deadline_.store(deadline_ns, std::memory_order_relaxed);
    drain_requested_.store(true, std::memory_order_release);
    loop_.wake();
  }
  // New QUIC certificate for new connections.
  void request_reload(std::shared_ptr<const quic::TlsConfig> cfg) {
    {
      std::lock_guard lock(mu_);
      reload_cfg_ = std::move(cfg);
    }
    loop_.wake();
  }
  // A copy of the counters (and connections), within timeout.
  bool snapshot(WorkerSnapshot &out, bool with_conns, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    snap_ready_ = false;
    snap_conns_ = with_conns;
    snap_requested_.store(true, std::memory_order_release);
    loop_.wake();
    if (!cv_.wait_for(lock, timeout, [this] { return snap_ready_; })) return false;
    out = std::move(snap_);
    return true;
  }
  // Iterations of the event loop so far (the watchdog checks it moves).
  uint64_t heartbeat() const { return beats_.load(std::memory_order_relaxed); }
  // The counters after join() (no other thread runs then).
  WorkerSnapshot final_snapshot() {
    fill_snapshot();
    return std::move(snap_);
  }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  // After a hand-over: no connection left here (see check_drain).
  bool idle_after_handover() const {
    return idle_after_handover_.load(std::memory_order_acquire);
  }
  // The worker's loop ended with an exception (it stopped; the daemon must).
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // --- read after join() --------------------------------------------------
  const dataplane::DatagramPort &port() const { return *port_; }
  dataplane::DatagramPort &port() { return *port_; }
  const quic::EndpointStats &endpoint_stats() const { return endpoint_.stats(); }
  const http::H3Stats &h3_stats() const {
    return h3_.stats();
  }
  const http::TcpServer *tcp() const { return tcp_.get(); }
#ifdef XDPQ_HAVE_AFXDP
  dataplane::AfXdpPort *afxdp() const { return afxdp_; }
#endif

  // --- dataplane::FdHandler: the port's descriptors ------------------------
  void on_io(uint32_t) override {
    // A polled port's receive() takes from all its queues (and busy-polls
    // each empty one): once a pass, whichever of its descriptors woke us.
    if (port_->polled()) {
      if (polled_this_pass_) return;
      polled_this_pass_ = true;
    }
    receive_batches();
  }

  // Returns how many datagrams came in. Bounded work per wakeup so timers
  // and writes get their turn.
  size_t receive_batches() {
    size_t total = 0;
    for (int round = 0; round < 16; ++round) {
      size_t n = port_->receive(batch_);
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
      }
    }
    return total;
  }

  // --- dataplane::TxSink: the endpoint writes through us -------------------
  std::span<uint8_t> tx_alloc(size_t max_len) override {
    last_alloc_ = port_->tx_alloc(max_len);
    return last_alloc_;
  }
  void tx_commit(const dataplane::Path &path, uint8_t ecn, size_t len) override {
    if (capture_.active() && len <= last_alloc_.size()) {
      capture_.record(path.local, path.remote, {last_alloc_.data(), len}, ecn);
    }
    port_->tx_commit(path, ecn, len);
  }
  void tx_commit_reply(const dataplane::RxDatagram &to, size_t len) override {
    if (capture_.active() && len <= last_alloc_.size()) {
      capture_.record(to.path.local, to.path.remote, {last_alloc_.data(), len}, 0);
    }
    port_->tx_commit_reply(to, len);
  }
  void peer_verified(const dataplane::Path &path, uint64_t link, bool strong) override {
    port_->peer_verified(path, link, strong);
  }

  // --- quic::Handoff: another worker's datagrams -----------------------------
  bool hand_off(uint8_t owner, const dataplane::RxDatagram &dg) override {
    const size_t worker = owner & 0x7f;
    if (owner >> 7 != generation_) { // the previous process's connection
      if (worker >= to_previous_.size()) return false;
      return count_push(to_previous_[worker]->push(dg), previous_wake_pending_[worker]);
    }
    if (worker >= peers_.size() || peers_[worker] == this) return false;
    return count_push(peers_[worker]->inbox_[static_cast<size_t>(id_)]->push(dg),
                      wake_pending_[worker]);
  }
  bool count_push(dataplane::HandoffRing::Push r, std::vector<bool>::reference pending) {
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

  // --- dataplane::LoopHandler ----------------------------------------------
  void on_iteration_end() override {
    beats_.fetch_add(1, std::memory_order_relaxed);
    // Busy polling: while spinning, the port is asked on every pass, since
    // its packets come in through the receive call, not as events.
    if (port_->polled()) {
      if (!polled_this_pass_ && loop_.spinning() && receive_batches() > 0) loop_.extend_spin();
      polled_this_pass_ = false;
    }
    if (any_wake_pending_) wake_owners();
    if (tcp_) tcp_->end_of_pass();
    if (draining_) check_drain();
    bool drained = true;
    for (int round = 0; round < 8; ++round) {
      endpoint_.end_of_pass();
      drained = port_->flush();
      if (!drained || !endpoint_.write_blocked()) break;
    }
    if (drained == want_write_) {
      want_write_ = !drained;
      for (int fd : port_->fds()) {
        if (send_only_.contains(fd)) {
          loop_.set_interest(fd, this, false, want_write_);
        } else {
          loop_.set_want_write(fd, this, want_write_ && port_->sends_through(fd));
        }
      }
    }
    if (finishing_) {
      stopped_.store(true, std::memory_order_release);
      loop_.stop(); // after this iteration, which flushed the closes
    }
  }

  void on_wake() override {
    if (int n = next_generation_.load(std::memory_order_acquire); n != 0) {
      // Any of its workers (it may have more than we do).
      endpoint_.set_other_generation(n == 2 ? quic::EndpointConfig::MAX_WORKERS : 0);
      next_generation_.store(0, std::memory_order_release);
    }
    if (replace_port_requested_.exchange(false, std::memory_order_acquire)) take_next_port();
    if (handover_requested_.exchange(false, std::memory_order_acquire)) take_handover();
    if (take_back_requested_.exchange(false, std::memory_order_acquire)) take_back();
    if (previous_gone_.load(std::memory_order_acquire)) {
      endpoint_.set_other_generation(0);
      to_previous_.clear();
      previous_wake_fds_.clear();
      previous_wake_pending_.clear();
      previous_gone_.store(false, std::memory_order_release); // now they may go
    }
    take_handoffs();
    if (snap_requested_.exchange(false, std::memory_order_acquire)) fill_snapshot();
    std::shared_ptr<const quic::TlsConfig> reload;
    {
      std::lock_guard lock(mu_);
      reload.swap(reload_cfg_);
    }
    if (reload) apply_reload(*reload);
    if (drain_requested_.exchange(false, std::memory_order_acquire) && !draining_) {
      // A hand-over always precedes its drain: take it first if it raced.
      if (handover_requested_.exchange(false, std::memory_order_acquire)) take_handover();
      draining_ = true;
      drain_started_ = loop_.now();
      endpoint_.start_drain();
      // After a binary upgrade, TCP connections are served until their
      // clients close them (or the deadline): no GOAWAY, which some
      // clients answer by giving up on the requests they had not sent.
      // HTTP/3 clients get GOAWAY and move to the new process.
      if (tcp_ && !handed_over_) tcp_->shutdown(); // GOAWAY / close after the current response
    }
    if (stop_requested_.load(std::memory_order_acquire)) finish();
  }

  // Spin budget of the worker's loop (EventLoop::set_spin); before start().
  void set_spin(uint64_t ns) { loop_.set_spin(ns); }

  // Benchmark mode: every datagram goes straight back (no QUIC), to measure
  // the bare packet path of this dataplane.
  void set_echo(bool on) { echo_ = on; }

private:
  static http::H3Limits with_budget(http::H3Limits l, http::MemoryBudget &b) {
    l.budget = &b;
    return l;
  }

  void echo(size_t n) {
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

  static constexpr uint64_t HEARTBEAT_NS = 250'000'000;

  // One wakeup per owner per pass, however many datagrams it was handed;
  // the wake follows the pushes, so the owner sees them when it runs.
  void wake_owners() {
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

  void take_back() {
    if (finishing_) return; // too late: this worker already closed its connections
    drain_requested_.store(false, std::memory_order_relaxed);
    for (int fd : send_only_) {
      port_->resume_receiving(fd);
      loop_.set_interest(fd, this, true, want_write_);
    }
    send_only_.clear();
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

  void take_next_port() {
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
      for (int fd : port_->fds()) loop_.watch(fd, this);
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
  void take_handover() {
    std::vector<dataplane::HandoffRing *> rings;
    std::vector<int> fds;
    {
      std::lock_guard lock(mu_);
      rings.swap(handover_rings_);
      fds.swap(handover_fds_);
    }
    for (int fd : fds) {
      if (port_->stop_receiving(fd)) {
        send_only_.insert(fd);
        loop_.set_interest(fd, this, false, want_write_);
      }
    }
    from_next_ = std::move(rings);
    handed_over_ = true;
    if (tcp_) tcp_->stop_accepting(); // the new process accepts from our listeners now
  }

  // Datagrams other workers received for our connections: processed as if
  // they had arrived on our queue; the replies leave through our port.
  void take_handoffs() {
    if (echo_) return;
    auto process = [this](const dataplane::RxDatagram &dg) { endpoint_.on_datagram(dg); };
    for (auto &ring : inbox_) {
      if (ring) handoff_.handoff_received += ring->drain(process);
    }
    for (auto *ring : from_next_) handoff_.handoff_received += ring->drain(process);
  }

  static void heartbeat_fired(dataplane::Timer &t) {
    auto *w = static_cast<Worker *>(t.owner());
    w->loop_.timers().schedule(t, w->loop_.now() + HEARTBEAT_NS);
  }

  void check_drain() {
    const uint64_t deadline = drain_deadline_.load(std::memory_order_relaxed);
    if (handed_over_ && tcp_ && !tcp_goaway_ && deadline > drain_started_ &&
        loop_.now() >= drain_started_ + (deadline - drain_started_) / 2) {
      // Half the drain time served the old TCP connections as they were;
      // now the graceful GOAWAY moves what is left to the new process.
      tcp_goaway_ = true;
      tcp_->shutdown();
    }
    bool idle = handed_over_ ? endpoint_.connection_count() == 0 &&
                                   (!tcp_ || tcp_->connection_count() == 0)
                             : endpoint_.active_requests() == 0 &&
                                   (!tcp_ || tcp_->busy_connections() == 0);
    if (handed_over_ && idle && loop_.now() < deadline) {
      // Not stopping alone: if the new process died, every worker of ours
      // is needed again. The control thread stops us all once all are idle.
      idle_after_handover_.store(true, std::memory_order_release);
      return;
    }
    if (idle || loop_.now() >= deadline) {
      if (!idle) LOG_WARN("worker %d: drain timeout, closing what is left", id_);
      finish();
    }
  }

  void finish() {
    if (finishing_) return;
    finishing_ = true;
    endpoint_.close_all();
    if (tcp_) tcp_->shutdown();
  }

  void apply_reload(const quic::TlsConfig &cfg) {
    try {
      auto fresh = std::make_unique<quic::TlsContext>(cfg, secrets_);
      endpoint_.set_tls(*fresh);
      // Sessions started with the old credentials still point at them.
      retired_tls_.push_back(std::move(tls_));
      tls_ = std::move(fresh);
    } catch (const std::exception &e) {
      LOG_ERROR("worker %d: certificate reload failed, keeping the old one: %s", id_, e.what());
    }
  }

  // The calling thread's heap figures: call on the worker's thread.
  static void read_heap(WorkerHeap &heap, uint64_t &cached) {
    auto blocks = small_alloc::thread_stats();
    cached = blocks.cached_bytes;
    heap.block_cache_hits = blocks.hits;
    heap.block_cache_misses = blocks.misses;
    heap.heap_allocations = thread_malloc_count();
  }

  void fill_snapshot() {
    WorkerSnapshot s;
    s.id = id_;
    s.cpu = cpu_;
    s.port = port_->stats();
    s.endpoint = endpoint_.stats();
    s.h3 = h3_.stats();
    s.gauges.quic_connections = endpoint_.connection_count();
    s.gauges.body_bytes_held = budget_.held();
    s.gauges.body_bytes_limit = budget_.limit();
    s.handoff = handoff_;
    s.loop = loop_.stats();
    if (loop_done_) {
      s.heap = heap_at_exit_;
      s.gauges.block_cache_bytes = cached_at_exit_;
    } else {
      read_heap(s.heap, s.gauges.block_cache_bytes);
    }
    if (tcp_) {
      s.has_tcp = true;
      s.tcp = tcp_->stats();
      s.gauges.tcp_connections = tcp_->connection_count();
    }
#ifdef XDPQ_HAVE_AFXDP
    if (afxdp_) {
      s.has_afxdp = true;
      s.afxdp = afxdp_->xdp_stats();
      if (const auto *nh = afxdp_->next_hop_stats()) s.next_hops = *nh;
      s.queues = afxdp_->queues();
      s.zerocopy = afxdp_->zerocopy();
    }
#endif
    std::lock_guard lock(mu_);
    if (snap_conns_) {
      endpoint_.list_connections(s.quic_conns);
      if (tcp_) tcp_->list_connections(s.tcp_conns);
    }
    snap_ = std::move(s);
    snap_ready_ = true;
    cv_.notify_all();
  }

  WorkerHeap heap_at_exit_; // read by the worker thread as its loop ended
  uint64_t cached_at_exit_ = 0;
  bool loop_done_ = false; // set on the worker thread; read after join()
  int id_;
  int cpu_;
  quic::SystemClock clock_;
  dataplane::EventLoop loop_;
  std::unique_ptr<dataplane::DatagramPort> port_;
  quic::Secrets secrets_;
  Capture &capture_;
  std::unique_ptr<quic::TlsContext> tls_;
  http::MemoryBudget budget_; // before the endpoint and the TCP side, which use it
  http::H3ApplicationFactory h3_; // HTTP/3 on the endpoint's connections
  std::vector<std::unique_ptr<quic::TlsContext>> retired_tls_;
  quic::Endpoint endpoint_;
  std::unique_ptr<http::TcpServer> tcp_;
  std::array<dataplane::RxDatagram, 64> batch_{};
  // Cross-queue routing: every worker by id (peers_[id_] is this one), the
  // rings others push into (inbox_[sender], ours), and the owners to wake
  // at the end of this pass.
  std::vector<Worker *> peers_;
  std::vector<std::unique_ptr<dataplane::HandoffRing>> inbox_;
  std::vector<bool> wake_pending_;
  bool any_wake_pending_ = false;
  // Binary upgrade. New process: rings to the previous process's workers
  // and their wake eventfds. Old process: the rings the new process's
  // workers fill for us, and the sockets we only send through now.
  uint8_t generation_ = 0;
  std::vector<dataplane::HandoffRing *> to_previous_;
  std::vector<int> previous_wake_fds_;
  std::vector<bool> previous_wake_pending_;
  std::vector<dataplane::HandoffRing *> from_next_;
  std::unordered_set<int> send_only_;
  bool handed_over_ = false; // the old process of an upgrade: its connections finish here
  bool tcp_goaway_ = false;  // ... and its TCP connections got their GOAWAY
  uint64_t drain_started_ = 0;
  std::atomic<int> next_generation_{0}; // 2: expect it, 1: not any more, 0: applied
  std::atomic<bool> previous_gone_{false};
  std::atomic<bool> handover_requested_{false};
  std::atomic<bool> take_back_requested_{false};
  std::atomic<bool> idle_after_handover_{false};
  std::vector<dataplane::HandoffRing *> handover_rings_; // under mu_
  std::vector<int> handover_fds_;                        // under mu_
  std::atomic<bool> replace_port_requested_{false};
  std::unique_ptr<dataplane::DatagramPort> next_port_; // under mu_, with:
  dataplane::AfXdpPort *next_afxdp_ = nullptr;          // next_port_ if it is one
  uint64_t port_seq_ = 0;      // under mu_: replace_port() calls
  uint64_t port_done_seq_ = 0; // under mu_: the last one the worker took
  WorkerHandoff handoff_;
  std::span<uint8_t> last_alloc_;
  dataplane::Timer heartbeat_;
  std::thread thread_;
  bool want_write_ = false;
  bool echo_ = false;
  bool draining_ = false;
  bool finishing_ = false;
#ifdef XDPQ_HAVE_AFXDP
  dataplane::AfXdpPort *afxdp_ = nullptr;
  // The port's rtnetlink socket: routing and neighbour answers and changes.
  struct NextHopEvents final : dataplane::FdHandler {
    explicit NextHopEvents(Worker &w) : worker(w) {}
    void on_io(uint32_t) override {
      if (worker.afxdp_) worker.afxdp_->on_next_hop_events(); // it may have been replaced
    }
    Worker &worker;
  } next_hop_events_{*this};
#endif
  bool polled_this_pass_ = false; // a polled port was asked this pass
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> drain_requested_{false};
  std::atomic<uint64_t> drain_deadline_{0};
  std::atomic<bool> snap_requested_{false};
  std::atomic<uint64_t> beats_{0};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> failed_{false};
  std::mutex mu_; // guards the mailboxes below, never the packet path
  std::condition_variable cv_;
  bool snap_ready_ = false;
  bool snap_conns_ = false;
  WorkerSnapshot snap_;
  std::shared_ptr<const quic::TlsConfig> reload_cfg_;
};

} // namespace xdpq::control
