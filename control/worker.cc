// The worker's set-up and life cycle: construction, its thread, the
// control thread's requests and the loop's wakeups that answer them, drain,
// certificate reload and counter snapshots.

#include "control/worker.h"

#include "base/log.h"
#include "base/small_alloc.h"
#include "control/counters.h"
#include "dataplane/cpu.h"
#include "http/static_files.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace xdpq::control {

namespace {

constexpr uint64_t HEARTBEAT_NS = 250'000'000;

http::H3Limits with_budget(http::H3Limits l, http::MemoryBudget &b) {
  l.budget = &b;
  return l;
}

// The calling thread's heap figures: call on the worker's thread.
void read_heap(WorkerHeap &heap, uint64_t &cached) {
  auto blocks = small_alloc::thread_stats();
  cached = blocks.cached_bytes;
  heap.block_cache_hits = blocks.hits;
  heap.block_cache_misses = blocks.misses;
  heap.heap_allocations = thread_malloc_count();
}

} // namespace

Worker::Worker(int id, int cpu, std::unique_ptr<dataplane::DatagramPort> port,
               const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
               std::shared_ptr<quic::ReplayStore> replays,
               std::shared_ptr<const http::Router> router, const quic::EndpointConfig &ecfg,
               const http::H3Limits &h3, Capture &capture, size_t body_budget)
    : id_(id), cpu_(cpu), port_(std::move(port)), secrets_(secrets), capture_(capture),
      replays_(std::move(replays)),
      tls_(std::make_unique<quic::TlsContext>(tls_cfg, secrets, replays_)), budget_(body_budget),
      h3_(router, with_budget(h3, budget_)),
      endpoint_(ecfg, *tls_, secrets, h3_, loop_.timers(), clock_, *this),
      generation_(ecfg.generation),
      heartbeat_(heartbeat_fired, this) {
  for (int fd : port_->fds()) loop_.watch(fd, port_handler(fd));
  loop_.timers().schedule(heartbeat_, dataplane::monotonic_ns() + HEARTBEAT_NS);
}

void Worker::connect_peers(const std::vector<Worker *> &all) {
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

void Worker::set_proxy(std::shared_ptr<const http::ProxyConfig> cfg) {
  proxy_ = std::make_unique<http::Proxy>(std::move(cfg), loop_);
  h3_.set_proxy(proxy_.get());
}

void Worker::set_access_log(std::shared_ptr<http::AccessLog> log) {
  access_log_ = log ? std::make_unique<http::AccessLogBuffer>(std::move(log)) : nullptr;
  h3_.set_access_log(access_log_.get());
}

void Worker::add_tcp(const http::TcpConfig &cfg, const http::SessionEnv &env,
                     std::shared_ptr<http::TcpTlsContext> tls) {
  http::SessionEnv e = env;
  e.budget = &budget_;
  e.proxy = proxy_.get();
  e.access_log = access_log_.get();
  tcp_ = std::make_unique<http::TcpServer>(cfg, e, std::move(tls), loop_);
}

#ifdef XDPQ_HAVE_AFXDP
void Worker::set_afxdp(dataplane::AfXdpPort *p) {
  afxdp_ = p;
  if (p->next_hop_fd() >= 0) loop_.watch(p->next_hop_fd(), &next_hop_events_);
}

void Worker::NextHopEvents::on_io(uint32_t) {
  if (worker.afxdp_) worker.afxdp_->on_next_hop_events(); // it may have been replaced
}
#endif

void Worker::set_side_door(const std::vector<std::pair<dataplane::Address, int>> &reservations) {
  dataplane::UdpSocketOptions o;
  o.check_in_use = false;
  o.rx_batch = 8; // a side door: little traffic
  o.tx_capacity = 1;
  std::vector<dataplane::Address> listen;
  for (const auto &[addr, fd] : reservations) {
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) {
      for (auto &[a, f] : o.inherited) close(f);
      throw dataplane::PortError(std::string("dup: ") + std::strerror(errno));
    }
    o.inherited.emplace_back(addr, dup);
    listen.push_back(addr);
  }
  side_door_ = std::make_unique<dataplane::UdpSocketPort>(listen, o);
  watch_side_door(true);
}

void Worker::watch_side_door(bool on) {
  if (!side_door_ || side_door_watched_ == on) return;
  side_door_watched_ = on;
  for (int fd : side_door_->fds()) {
    if (on) loop_.watch(fd, &side_door_events_);
    else loop_.unwatch(fd);
  }
}

void Worker::start() {
  thread_ = std::thread([this] {
    // Named for ps -L, top -H and perf: xdpq-worker-N (15 characters at most).
    const std::string name = "xdpq-worker-" + std::to_string(id_);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
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
    passes_.file_descriptors_refused = http::file_descriptors_refused();
    loop_done_ = true;
    {
      // Under the lock: a snapshot() waiting on cv_ sees it or is told.
      std::lock_guard lock(mu_);
      stopped_.store(true, std::memory_order_release);
      exited_ = true;
    }
    cv_.notify_all();
  });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::request_stop() {
  stop_requested_.store(true, std::memory_order_release);
  loop_.wake();
}

void Worker::request_drain(uint64_t deadline_ns) {
  drain_deadline_.store(deadline_ns, std::memory_order_relaxed);
  drain_requested_.store(true, std::memory_order_release);
  loop_.wake();
}

void Worker::request_reload(std::shared_ptr<const quic::TlsConfig> cfg) {
  {
    std::lock_guard lock(mu_);
    reload_cfg_ = std::move(cfg);
  }
  loop_.wake();
}

void Worker::request_proxy_reload(std::shared_ptr<const http::ProxyConfig> cfg) {
  {
    std::lock_guard lock(mu_);
    reload_proxy_ = std::move(cfg);
  }
  loop_.wake();
}

void Worker::request_snapshot(bool with_conns) {
  std::lock_guard lock(mu_);
  snap_ready_ = false;
  snap_conns_ = with_conns;
  snap_requested_.store(true, std::memory_order_release);
  loop_.wake();
}

bool Worker::collect_snapshot(WorkerSnapshot &out,
                              std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [this] { return snap_ready_ || exited_; })) return false;
  if (!snap_ready_) {
    // Its thread has finished (a drained worker stops before the others)
    // and touches nothing any more: its figures are read here, as after
    // join().
    lock.unlock();
    fill_snapshot();
    lock.lock();
  }
  out = std::move(snap_);
  return true;
}

WorkerSnapshot Worker::final_snapshot() {
  fill_snapshot();
  return std::move(snap_);
}

void Worker::on_wake() {
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
  std::shared_ptr<const quic::TlsConfig> reload;
  std::shared_ptr<const http::ProxyConfig> reload_proxy;
  bool snap = false;
  {
    // Read together: a snapshot asked for after a reload is taken after
    // that reload is applied (the control thread labels the upstreams'
    // figures with the new routes already).
    std::lock_guard lock(mu_);
    reload.swap(reload_cfg_);
    reload_proxy.swap(reload_proxy_);
    snap = snap_requested_.exchange(false, std::memory_order_acquire);
  }
  if (reload) apply_reload(*reload);
  if (reload_proxy && proxy_) proxy_->reconfigure(std::move(reload_proxy));
  if (snap) fill_snapshot();
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
    if (tcp_ && !handed_over_) {
      tcp_->shutdown(); // GOAWAY / close after the current response
      tcp_->close_listeners(); // nobody takes them over: refuse new clients now
    }
  }
  if (stop_requested_.load(std::memory_order_acquire)) finish();
}

void Worker::heartbeat_fired(dataplane::Timer &t) {
  auto *w = static_cast<Worker *>(t.owner());
  http::sweep_file_caches(w->loop_.now());
  if (w->access_log_) w->access_log_->flush(); // lines show within a heartbeat
  // Credentials a reload replaced go once their last connection has.
  std::erase_if(w->retired_tls_, [w](const auto &c) {
    if (c->sessions() != 0) return false;
    w->replays_refused_gone_ += c->replays_refused();
    return true;
  });
  w->loop_.timers().schedule(t, w->loop_.now() + HEARTBEAT_NS);
}

void Worker::check_drain() {
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

void Worker::finish() {
  if (finishing_) return;
  finishing_ = true;
  endpoint_.close_all();
  if (tcp_) tcp_->shutdown();
}

void Worker::apply_reload(const quic::TlsConfig &cfg) {
  try {
    auto fresh = std::make_unique<quic::TlsContext>(cfg, secrets_, replays_);
    endpoint_.set_tls(*fresh);
    // Sessions started with the old credentials still point at them.
    retired_tls_.push_back(std::move(tls_));
    tls_ = std::move(fresh);
  } catch (const std::exception &e) {
    LOG_ERROR("worker %d: certificate reload failed, keeping the old one: %s", id_, e.what());
  }
}

void Worker::fill_snapshot() {
  WorkerSnapshot s;
  s.id = id_;
  s.cpu = cpu_;
  s.port = port_->stats();
  s.endpoint = endpoint_.stats();
  s.endpoint.early_data_refused = replays_refused_gone_ + tls_->replays_refused();
  for (const auto &c : retired_tls_) s.endpoint.early_data_refused += c->replays_refused();
  s.h3 = h3_.stats();
  s.gauges.quic_connections = endpoint_.connection_count();
  s.gauges.quic_memory_bytes = endpoint_.memory();
  s.gauges.tls_contexts_retired = retired_tls_.size();
  s.gauges.body_bytes_held = budget_.held();
  s.gauges.body_bytes_limit = budget_.limit();
  if (!loop_done_) s.gauges.file_read_bytes_held = http::file_read_bytes_held();
  s.handoff = handoff_;
  s.passes = passes_;
  if (side_door_) s.passes.side_door_datagrams = side_door_->stats().rx_datagrams;
  if (access_log_) s.passes.access_log_lost_writes = access_log_->lost_writes();
  if (!loop_done_) s.passes.file_descriptors_refused = http::file_descriptors_refused();
  s.loop = loop_.stats();
  if (loop_done_) {
    s.heap = heap_at_exit_;
    s.gauges.block_cache_bytes = cached_at_exit_;
  } else {
    read_heap(s.heap, s.gauges.block_cache_bytes);
  }
  if (proxy_) {
    s.proxy = proxy_->stats();
    s.gauges.proxy_waiting = proxy_->waiting();
    proxy_->upstream_stats(s.upstreams);
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

} // namespace xdpq::control
