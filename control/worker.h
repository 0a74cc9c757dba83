#pragma once
// One shard: its datagram port, TLS context, QUIC endpoint, TCP side and
// timer wheel, all used by one pinned thread only. The control thread talks
// to it only through the mailboxes below (flag + wake; the worker answers
// from its own thread), never by touching its state.
// Defined in worker.cc, worker_datagram.cc (packet path), worker_upgrade.cc.

#include "control/capture.h"
#include "control/worker_counters.h"
#include "dataplane/event_loop.h"
#include "dataplane/handoff_ring.h"
#include "http/h3_session.h"
#include "http/tcp_server.h"
#include "quic/endpoint.h"
#include "quic/tls_context.h"
#include "dataplane/udp_socket_port.h"
#ifdef XDPQ_HAVE_AFXDP
#include "dataplane/afxdp_port.h"
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

namespace xdpq::dataplane {
class AfXdpPort;
}

namespace xdpq::control {

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
  http::ProxyStats proxy;
  std::vector<http::UpstreamStats> upstreams; // configuration order
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
  WorkerPasses passes;
  dataplane::LoopStats loop;
  std::vector<quic::ConnInfo> quic_conns;
  std::vector<http::TcpConnInfo> tcp_conns;
};

class Worker final : public dataplane::LoopHandler, public dataplane::FdHandler,
                     public dataplane::TxSink, public quic::Handoff {
public:
  Worker(int id, int cpu, std::unique_ptr<dataplane::DatagramPort> port,
         const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
         std::shared_ptr<quic::ReplayStore> replays, std::shared_ptr<const http::Router> router, const quic::EndpointConfig &ecfg,
         const http::H3Limits &h3, Capture &capture, size_t body_budget);
  int id() const { return id_; }

  // Joins the workers that share the CID space (all[i] has id i; this one
  // among them): each gets a hand-off ring from every other, owned by the
  // receiving worker. Call for every worker before any start().
  void connect_peers(const std::vector<Worker *> &all);

  // Binary upgrade, the new process: the previous process's workers
  // (their rings from this worker, indexed by their id, and the eventfds
  // that wake them) take the datagrams of their connections. Before start().
  void set_previous_generation(std::vector<dataplane::HandoffRing *> rings,
                               std::vector<int> wake_fds);
  // Binary upgrade, the old process, before the new one starts: its CIDs
  // (the other generation) are dropped here, never reset, while both
  // processes read the same sockets. expect false: the upgrade failed.
  // Returns once the worker applied it (or after timeout).
  bool expect_next_generation(bool expect, std::chrono::milliseconds timeout);
  // The previous process exited: its CIDs are unknown ones from now on.
  void request_previous_gone();
  // True once the worker dropped its rings to the previous process and
  // its wake descriptors (the caller may close and unmap them then);
  // false after timeout or if the worker stopped without doing so.
  bool wait_previous_gone(std::chrono::milliseconds timeout);
  // Binary upgrade, the old process: the new process reads these sockets
  // now (this worker only sends through them) and hands this worker its
  // connections' datagrams through rings (one per new worker). It accepts
  // from none of its TCP listeners any more, and closes those not in
  // tcp_kept (the new process did not take them). Then drain.
  void request_handover(std::vector<dataplane::HandoffRing *> rings, std::vector<int> fds,
                        std::vector<int> tcp_kept);
  // Binary upgrade, the old process, after the hand-over: the new process
  // died. Read the sockets again, accept again, stop draining.
  void request_take_back();
  int wake_fd() const { return loop_.wake_fd(); }
  // The port's sockets (socket dataplane: immutable once built; any thread).
  const dataplane::DatagramPort &datagram_port() const { return *port_; }
  // Binary upgrade on AF_XDP: the worker moves to another port between two
  // passes (what the old one had queued is flushed, then it is closed on
  // the worker's thread) and keeps its connections: to kernel UDP sockets
  // while the new process takes the queues, back to an AF_XDP port if it
  // fails. afxdp: the new port if it is one. Returns once done, false
  // after timeout (it still happens when the worker gets to it).
  bool replace_port(std::unique_ptr<dataplane::DatagramPort> port, dataplane::AfXdpPort *afxdp,
                    std::chrono::milliseconds timeout);
  // The reverse proxy (its upstream pools live in this worker's loop);
  // before add_tcp() and start().
  void set_proxy(std::shared_ptr<const http::ProxyConfig> cfg);
  // Requests are logged to log (null: none). Before add_tcp() and start().
  void set_access_log(std::shared_ptr<http::AccessLog> log);
  // Adds the TCP side to this worker's loop (throws http::TcpError).
  void add_tcp(const http::TcpConfig &cfg, const http::SessionEnv &env,
               std::shared_ptr<http::TcpTlsContext> tls);
#ifdef XDPQ_HAVE_AFXDP
  void set_afxdp(dataplane::AfXdpPort *p);
#endif
  // AF_XDP, one worker: the kernel's sockets that hold the served ports
  // (the reservations) are read too, for the UDP that reaches the kernel
  // instead of the XDP program: from this host (loopback), through another
  // interface, what the program passes. Replies to such peers leave through
  // those sockets (AfXdpPort: no link address). The descriptors are
  // duplicated. Before start(). Throws PortError.
  void set_side_door(const std::vector<std::pair<dataplane::Address, int>> &reservations);
  // Runs the loop on its own thread (pinned if cpu >= 0); see failed().
  void start();
  void join();

  // --- mailboxes (any thread) ---------------------------------------------
  // Stop now: CONNECTION_CLOSE / close everything this iteration.
  void request_stop();
  // Graceful drain: GOAWAY everywhere, finish what is in flight, then stop;
  // at deadline_ns at the latest.
  void request_drain(uint64_t deadline_ns);
  // New QUIC certificate for new connections.
  void request_reload(std::shared_ptr<const quic::TlsConfig> cfg);
  // New proxy routes for requests from now on (set_proxy() came first).
  void request_proxy_reload(std::shared_ptr<const http::ProxyConfig> cfg);
  // Asks for a copy of the counters (and connections), which
  // collect_snapshot() then waits for until deadline (false: not in time):
  // several workers are asked first and make their copies at once.
  void request_snapshot(bool with_conns);
  bool collect_snapshot(WorkerSnapshot &out, std::chrono::steady_clock::time_point deadline);
  // Iterations of the event loop so far (the watchdog checks it moves).
  uint64_t heartbeat() const { return beats_.load(std::memory_order_relaxed); }
  // The counters after join() (no other thread runs then).
  WorkerSnapshot final_snapshot();
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  // After a hand-over: no connection left here (see check_drain).
  bool idle_after_handover() const { return idle_after_handover_.load(std::memory_order_acquire); }
  // The worker's loop ended with an exception (it stopped; the daemon must).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // --- read after join() --------------------------------------------------
  const dataplane::DatagramPort &port() const { return *port_; }
  dataplane::DatagramPort &port() { return *port_; }
  const quic::EndpointStats &endpoint_stats() const { return endpoint_.stats(); }
  const http::H3Stats &h3_stats() const { return h3_.stats(); }
  const http::TcpServer *tcp() const { return tcp_.get(); }
#ifdef XDPQ_HAVE_AFXDP
  dataplane::AfXdpPort *afxdp() const { return afxdp_; }
#endif
  // --- dataplane::FdHandler: the port's descriptors ------------------------
  void on_io(uint32_t) override;
  // Returns how many datagrams came in. Bounded work per wakeup so timers
  // and writes get their turn.
  size_t receive_batches() { return receive_batches(*port_); }
  size_t receive_batches(dataplane::DatagramPort &from);
  void watch_side_door(bool on);
  // Output made ready this pass that has waited HOLD_BUDGET_NS behind later
  // work (datagrams, or any other descriptor's handler) leaves now.
  void check_held_output();
  void flush_held_output();
  // --- dataplane::TxSink: the endpoint writes through us -------------------
  std::span<uint8_t> tx_alloc(size_t max_len) override;
  void tx_commit(const dataplane::Path &path, uint8_t ecn, size_t len) override;
  void tx_commit_reply(const dataplane::RxDatagram &to, size_t len) override;
  void peer_verified(const dataplane::Path &path, uint64_t link, bool strong) override;
  // --- quic::Handoff: another worker's datagrams -----------------------------
  bool hand_off(uint8_t owner, const dataplane::RxDatagram &dg) override;
  // --- dataplane::LoopHandler ----------------------------------------------
  void on_iteration_end() override;
  void on_wake() override;
  void after_event() override { check_held_output(); }
  // Spin budget of the worker's loop (EventLoop::set_spin); before start().
  void set_spin(uint64_t ns) { loop_.set_spin(ns); }
  // Benchmark mode: every datagram goes straight back (no QUIC), to measure
  // the bare packet path of this dataplane.
  void set_echo(bool on) { echo_ = on; }

private:
  static void heartbeat_fired(dataplane::Timer &t);
  void echo(size_t n);
  bool count_push(dataplane::HandoffRing::Push r, std::vector<bool>::reference pending);
  void wake_owners();
  void take_handoffs();
  void take_back();
  void take_next_port();
  void take_handover();
  void check_drain();
  void finish();
  void apply_reload(const quic::TlsConfig &cfg);
  void fill_snapshot();

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
  std::shared_ptr<quic::ReplayStore> replays_; // the process's 0-RTT anti-replay store
  std::unique_ptr<quic::TlsContext> tls_;
  uint64_t replays_refused_gone_ = 0; // counted by retired contexts since freed
  http::MemoryBudget budget_; // before the endpoint and the TCP side, which use it
  // This worker's access log lines (null: no log). Before the endpoint and
  // the TCP side: their connections log the requests open when they go.
  std::unique_ptr<http::AccessLogBuffer> access_log_;
  // Before the HTTP/3 factory, the endpoint and the TCP side: their
  // sessions' exchanges are gone before the proxy's connections close.
  std::unique_ptr<http::Proxy> proxy_;
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
  std::vector<int> handover_tcp_kept_;                   // under mu_
  std::atomic<bool> replace_port_requested_{false};
  std::unique_ptr<dataplane::DatagramPort> next_port_; // under mu_, with:
  dataplane::AfXdpPort *next_afxdp_ = nullptr;          // next_port_ if it is one
  uint64_t port_seq_ = 0;      // under mu_: replace_port() calls
  uint64_t port_done_seq_ = 0; // under mu_: the last one the worker took
  WorkerHandoff handoff_;
  std::unique_ptr<dataplane::UdpSocketPort> side_door_; // see set_side_door()
  bool side_door_watched_ = false;
  struct SideDoorEvents final : dataplane::FdHandler {
    explicit SideDoorEvents(Worker &w) : worker(w) {}
    void on_io(uint32_t) override { worker.receive_batches(*worker.side_door_); }
    Worker &worker;
  } side_door_events_{*this};
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
    void on_io(uint32_t) override;
    Worker &worker;
  } next_hop_events_{*this};
#endif
  // The port's descriptor whose poll transmits (see
  // DatagramPort::wait_transmits_fd): reported ready, it tells the port
  // that the next wait will poll it, then reads like any port descriptor.
  struct TransmitEvents final : dataplane::FdHandler {
    explicit TransmitEvents(Worker &w) : worker(w) {}
    void on_io(uint32_t events) override;
    Worker &worker;
  } transmit_events_{*this};
  dataplane::FdHandler *port_handler(int fd) {
    if (fd == port_->wait_transmits_fd()) return &transmit_events_;
    return this;
  }
  bool polled_this_pass_ = false; // a polled port was asked this pass
  bool wait_polls_ = false;       // next_wait_polls(true) was said this pass
  // When the pass first had output to send (0: none yet), and how much
  // further work (datagrams, other handlers) may pile up behind it before
  // it is flushed mid-pass.
  uint64_t held_since_ = 0;
  static constexpr uint64_t HOLD_BUDGET_NS = 100'000;
  // held_since_ once a mid-pass flush found the port full: no more tries
  // this pass.
  static constexpr uint64_t HELD_BLOCKED = UINT64_MAX;
  WorkerPasses passes_;
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
  bool exited_ = false; // the thread has finished: nothing of it runs any more
  WorkerSnapshot snap_;
  std::shared_ptr<const quic::TlsConfig> reload_cfg_;
  std::shared_ptr<const http::ProxyConfig> reload_proxy_;
};

} // namespace xdpq::control
