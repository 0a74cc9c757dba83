#pragma once
// The reverse proxy of one worker: its upstream connections (non-blocking
// connects on the worker's event loop, HTTP/1.1 keep-alive pools per
// upstream), balancing and passive health, and the exchanges that carry
// one client request each. Shared-nothing like the rest of the worker: no
// thread hop, no lock.
//
// An exchange is the client stream's response body. It stays empty until
// the upstream's head arrives (or fails: 502, 503, 504), then fills a
// 64 KiB window that the client's transport drains; the upstream socket is
// read only while the window has room, so a client that reads nothing
// holds its upstream still, and nothing waits in an unbounded buffer.
//
// The other way, it starts with the request head and streams the request
// body: the session hands body bytes in as they arrive, they go out as the
// upstream socket takes them, and the session gives the client flow-control
// credit (or reads its socket) only as bytes leave. The bytes held between
// are charged to the connection's and worker's body budgets.

#include "base/counters.h"
#include "dataplane/address.h"
#include "dataplane/event_loop.h"
#include "dataplane/histogram.h"
#include "http/memory_budget.h"
#include "http/message.h"
#include "http/proxy_config.h"
#include "http/proxy_headers.h"
#include "http/upstream_response.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xdpq::http {

// Per upstream and worker; plain fields, one writer (the worker).
#define XDPQ_UPSTREAM_COUNTERS(X)                                                                  \
  X(requests, "requests sent to the upstream")                                                     \
  X(responses, "responses received whole")                                                         \
  X(connects, "connections opened")                                                                \
  X(reused, "requests sent on a pooled keep-alive connection")                                     \
  X(connect_failures, "connects refused, failed or timed out (the upstream is marked down)")      \
  X(timeouts, "requests without a response head within the proxy timeout (504), or whose body stalled past it (client stream reset)") \
  X(resets, "connections the upstream closed or reset under a request: before its answer (retried or 502) or mid-body (client stream reset)") \
  X(bad_responses, "malformed or oversized response heads (502)")                                  \
  X(stray_bytes, "answers followed by bytes that are no answer (the connection is closed)")       \
  X(retries, "requests moved to another connection or upstream before any response byte")        \
  X(marked_down, "times passive health marked the upstream down")                                \
  X(probes, "active health checks started")                                                        \
  X(probe_failures, "health checks failed: a status not 2xx/3xx, no connect, a bad head, timeout") \
  X(probe_timeouts, "health checks without a response head within the health check timeout")

#define XDPQ_UPSTREAM_GAUGES(X)                                                                    \
  X(idle_connections, "pooled keep-alive connections")                                             \
  X(busy_connections, "connections connecting or carrying a request")                              \
  X(outstanding, "requests in flight")                                                             \
  X(down, "1 while passive health or a failed health check holds the upstream down")

struct UpstreamStats {
  XDPQ_COUNTER_FIELDS(XDPQ_UPSTREAM_COUNTERS)
  XDPQ_COUNTER_FIELDS(XDPQ_UPSTREAM_GAUGES)
  // Connect started to connected (a unix socket's usually at once: 0), and
  // the request starting out (the connect done) to its response head parsed.
  dataplane::Log2Histogram connect_time;
  dataplane::Log2Histogram head_latency;
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_UPSTREAM_COUNTERS) }
  template <typename F> void visit_gauges(F &&f) const {
    XDPQ_COUNTER_VISIT(XDPQ_UPSTREAM_GAUGES)
  }
};

#define XDPQ_PROXY_COUNTERS(X)                                                                     \
  X(proxy_requests, "requests matched by a proxy prefix")                                          \
  X(proxy_no_upstream, "proxied requests answered 502: every upstream failing its health check")  \
  X(proxy_tried_while_down, "attempts sent to an upstream in passive back-off, all being down")   \
  X(proxy_pool_full, "proxied requests answered 503: every upstream at its connection limit "     \
                     "and the route's queue full")                                               \
  X(proxy_queued, "proxied requests that waited for a connection (every upstream at its limit)")  \
  X(proxy_queue_timeouts, "proxied requests answered 503 after waiting past the queue timeout")   \
  X(proxy_budget_refusals, "proxied requests answered 503: the response window budget spent")    \
  X(proxy_bad_requests, "proxied requests answered 400: not expressible as HTTP/1.1")           \
  X(proxy_body_aborts, "proxied request bodies cut short, too long or reset by the client "       \
                       "(not when the exchange had failed already)")                             \
  X(proxy_body_budget_refusals, "proxied request bodies refused mid-way: the body budget spent")  \
  X(proxy_local_errors, "proxied requests answered 503: no socket for the upstream (descriptors, " \
                        "memory or local ports exhausted here; no upstream held down)")      \
  X(proxy_client_timeouts, "proxied responses reset: the client took no byte of them for "       \
                           "--proxy-client-timeout while the proxy held its window full")       \
  X(proxy_body_timeouts, "proxied requests whose client paused its body too long (408, or "     \
                         "a reset after the answer's head)")                                     \
  X(proxy_reconfigured, "reloads that changed the routes (new pools; the old ones finish)")      \
  X(proxy_waiters_moved, "requests waiting for a connection that a reload moved to their "      \
                         "route's new upstreams")                                                \
  X(proxy_tunnels, "HTTP/1.1 connections switched to another protocol (WebSocket) by an "        \
                   "upstream's 101, tunnelled to it")                                            \
  X(proxy_tunnel_timeouts, "tunnels closed: no byte either way for --proxy-tunnel-timeout")

struct ProxyStats {
  XDPQ_COUNTER_FIELDS(XDPQ_PROXY_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_PROXY_COUNTERS) }
};

// Told when an exchange moves: its head is ready, body bytes arrived, or
// it ended or failed. Called from the worker's loop (upstream socket
// events, timers), never from inside a Proxy::start() call; the listener
// must not destroy the exchange from within the call.
class ProxyListener {
public:
  virtual void proxy_progress(void *tag) = 0;

protected:
  ~ProxyListener() = default;
};

class Proxy;
class UpstreamConn;
struct Upstream;
struct ProxyRouteState;
struct ProxyGeneration;

class ProxyExchange final : public Body, private UpstreamResponseParser::Handler {
public:
  // Response bytes held at most: the ring a response's body passes
  // through is this big for a long or unannounced body, and as big as the
  // body when its content-length is no more than SMALL_BODY.
  static constexpr size_t WINDOW = 64 * 1024;
  static constexpr size_t SMALL_BODY = 16 * 1024;
  // Request body bytes held before the client is given no more credit.
  static constexpr size_t REQUEST_WINDOW = 64 * 1024;

  ProxyExchange(Proxy &proxy, size_t route, Request &req, std::string head,
                RequestFraming framing, uint64_t length, ProxyListener *l, void *tag,
                BudgetAccount *budget);
  ~ProxyExchange() override;

  // Body: the bytes in [offset, received()) that are contiguous in the
  // window; empty when none are there yet (see ended(), failed()).
  uint64_t size() const override { return head_.content_length; }
  std::span<const uint8_t> chunk(uint64_t offset) const override;
  void release(uint64_t offset) override;

  bool head_ready() const { return head_ready_; }
  // Status and fields for the client (content_length / length_unknown set).
  const Response &head() const { return head_; }
  // False for HEAD, 204, 304 and an announced length of 0.
  bool has_body() const { return has_body_; }
  uint64_t received() const { return end_; }
  // Every body byte arrived: received() is the whole body.
  bool ended() const { return ended_; }
  // The body was cut short after the head went out: the client's stream
  // must be reset, never finished.
  bool failed() const { return failed_; }
  // ... and the upstream's doing (it broke off, or sent nothing for
  // --proxy-timeout), not the client's.
  bool upstream_failed() const { return upstream_failed_; }

  // The request body, from the session. put_body() takes bytes (all of
  // them: what the client was allowed to send); false when they cannot be
  // held (budget) or overrun the content-length: the exchange is aborted
  // and the client's stream must be reset. Bytes that arrive after the
  // exchange no longer wants them (it failed or the upstream answered
  // whole) are dropped and count as sent.
  bool put_body(const uint8_t *data, size_t len);
  // The client's body is complete; false if it is short of its length.
  bool end_body();
  // Writes what put_body() took; call once after a batch of them.
  void flush_body();
  // The client broke off its body (reset, closed): the upstream connection
  // is closed, the client gets 502 or a reset.
  void abort_body();
  // Body bytes taken and not yet written upstream.
  size_t body_held() const { return req_buf_.size() - req_off_; }
  // How much more the session should take now (0: stop reading / crediting).
  // A tunnel takes nothing until the upstream has switched.
  size_t body_room() const {
    if (framing_ == RequestFraming::tunnel && !switched_) return 0;
    return body_held() >= REQUEST_WINDOW ? 0 : REQUEST_WINDOW - body_held();
  }
  // The upstream answered a tunnel request with 101: head() is that, and
  // the body both ways is the new protocol's bytes until either side closes.
  bool switched() const { return switched_; }
  // Body bytes that left the exchange (written upstream or dropped): the
  // client's credit may grow by as much.
  uint64_t body_out() const { return req_out_; }
  uint64_t body_in() const { return req_in_; }
  bool body_expected() const { return framing_ != RequestFraming::none && !req_ended_; }
  // put_body() refused bytes for want of the worker's budget (what all
  // clients hold: not this client's doing).
  bool worker_budget_refused() const { return budget_refused_ && !own_budget_refused_; }

  // Used by the proxy and the upstream connection.
  void begin();
  // A connection came free for this waiting exchange: c (the upstream's
  // keep-alive connection whose answer just ended), or a new one to u
  // (c null), which has room for it. False if the exchange could not
  // take it (the budget refused its response window: 503): c is still
  // free.
  bool dequeued(Upstream &u, UpstreamConn *c);
  // Waiting, with no upstream left that could serve it: 502, as a new
  // request gets.
  void no_upstream();
  // The first exchange waiting on route, or null.
  static ProxyExchange *first_waiting(ProxyRouteState &route);
  // A reload replaced the route it waits on: it waits on to (the new
  // route of the same prefix, in the new generation g) instead, keeping
  // its place and deadline.
  void move_to(ProxyGeneration &g, ProxyRouteState &to);
  void connected();
  // The connection failed before a response byte (connect: while
  // connecting; unsent: before a byte of the request went up).
  void conn_failed(bool connect, bool unsent = true);
  void conn_broke(std::string_view why); // after response bytes: reset or cut short
  void conn_done();                      // the response is complete
  size_t room() const { return cap_ - static_cast<size_t>(end_ - base_); }
  UpstreamResponseParser::Handler &parser_handler() { return *this; }
  bool head_request() const { return head_request_; }
  const std::string &request_head() const { return request_; }
  RequestFraming framing() const { return framing_; }
  bool body_ended() const { return req_ended_; }
  // The held body bytes, contiguous.
  std::span<const uint8_t> body_data() const {
    return {reinterpret_cast<const uint8_t *>(req_buf_.data()) + req_off_, body_held()};
  }
  void body_written(size_t n);
  // A byte moved either way, or the client freed the window: check_stall's
  // clock restarts.
  void moved();
  // Where writing the request stands: waiting for the client's body,
  // blocked on the upstream socket, complete, or failed (the upstream
  // closed). Arms the response timeout unless waiting for the client.
  enum class Send : uint8_t { waiting, blocked, complete, failed };
  void send_state(Send st);
  // Something is there to write (the head alone waits for the first body
  // bytes when a body follows, so both leave in one write).
  bool ready_to_send() const {
    return framing_ == RequestFraming::none || framing_ == RequestFraming::tunnel ||
           body_held() > 0 || req_ended_;
  }
  void notify();

private:
  void on_head(const UpstreamResponseParser &p) override;
  void on_body(const uint8_t *data, size_t len) override;
  void on_complete() override;
  static void timer_fired(dataplane::Timer &t);
  // After the head: --proxy-timeout without a byte moving ends the exchange.
  void check_stall();
  void watch_drain();
  bool client_hold_expired(uint64_t now, uint64_t &at);
  // Finds an upstream connection (chosen: on that upstream, skipping the
  // queue), or waits in the route's queue, or fails.
  void attempt(bool fresh, Upstream *chosen = nullptr);
  void use(UpstreamConn *c, bool reused);
  // Charges the response window to the budget (once); false: refused.
  bool reserve_window();
  // Joins the route's queue (false: it is full).
  bool wait_in_queue();
  // Counts a failed connect; true if the request may try another.
  bool connect_retry();
  // An empty body ended before the head went up: the head loses its
  // chunked framing.
  void unchunk_head();
  void join_queue();
  void leave_queue();
  void fail_with(int status);
  // 502, counted: no upstream of the route can take a request.
  void fail_no_upstream();
  void detach();
  void drop_body();

  Proxy &proxy_;
  // The routes it started on (a reload may bring new ones; one that finds
  // it waiting moves it to its route of the same prefix).
  ProxyGeneration *gen_;
  ProxyRouteState *route_;
  std::string request_; // the HTTP/1.1 request head
  RequestFraming framing_;
  uint64_t req_length_; // the client's content-length (framing_ length)
  std::string req_buf_; // request body bytes [req_off_, size()) not yet written
  size_t req_off_ = 0;
  uint64_t req_in_ = 0;  // body bytes taken from the client
  uint64_t req_out_ = 0; // ... written upstream or dropped
  size_t req_charged_ = 0; // budget held for req_buf_
  bool req_ended_ = false;
  bool req_dropping_ = false; // the body has nowhere to go any more
  bool req_aborted_ = false;
  bool waiting_for_client_ = false; // the timer runs for the client's next body bytes
  uint64_t moved_at_ = 0; // after the head: a response byte read or a body byte taken or written
  // The client holding the window full: since when (0: not seen so), and
  // where its taking stood then (any byte taken since starts it anew).
  uint64_t held_since_ = 0;
  uint64_t held_base_ = 0;
  ProxyListener *listener_;
  void *tag_;
  BudgetAccount *budget_;
  size_t window_charged_ = 0; // budget held for the response ring
  Upstream *upstream_ = nullptr;
  UpstreamConn *conn_ = nullptr;
  // Waiting for a connection: its place in the route's queue (intrusive,
  // first in first out).
  ProxyExchange *wait_prev_ = nullptr;
  ProxyExchange *wait_next_ = nullptr;
  bool queued_ = false;
  uint64_t queue_deadline_ = 0; // set the first time it waits
  dataplane::Timer timer_;
  Response head_;
  // The response body's ring, sized at the head (see WINDOW): a pooled
  // WINDOW-byte one or a small one from the worker's block cache. Until
  // the head, cap_ is WINDOW and nothing is allocated (WINDOW is what the
  // budget holds for it meanwhile).
  std::unique_ptr<uint8_t[]> window_;
  uint8_t *small_window_ = nullptr;
  uint8_t *ring_ = nullptr; // whichever of the two is in use
  size_t cap_ = WINDOW;
  std::string_view static_body_; // an error page (static storage)
  uint64_t base_ = 0; // bytes before this are released
  uint64_t end_ = 0;  // bytes received
  int attempts_ = 0;       // connections asked for (pooled or fresh)
  int connect_fails_ = 0;  // connects refused, failed or timed out
  int drops_ = 0;          // connections closed before a byte of response
  bool idempotent_ = false;
  bool head_request_ = false;
  bool body_method_ = false; // POST, PUT, PATCH: a body defined (so content-length: 0 without)
  bool head_ready_ = false;
  bool has_body_ = false;
  bool ended_ = false;
  bool failed_ = false;
  bool upstream_failed_ = false;
  bool budget_refused_ = false; // the body cut off by the budget
  bool own_budget_refused_ = false; // ... by the connection's own part of it
  bool counted_ = false; // outstanding on upstream_
  bool switched_ = false; // a tunnel's 101 came
};

class Proxy {
public:
  // cfg may have no routes (match() is then always -1) and gain some on a
  // reload.
  Proxy(std::shared_ptr<const ProxyConfig> cfg, dataplane::EventLoop &loop);
  ~Proxy();
  Proxy(const Proxy &) = delete;
  Proxy &operator=(const Proxy &) = delete;

  // The index of the route whose prefix matches the request target's
  // path (its query and fragment ignored), or -1. Without routes (the
  // static server's case) it returns before any call.
  int match(std::string_view target) const {
    if (cfg_->routes.empty()) return -1;
    return match_path(target);
  }

  struct Client {
    const dataplane::Address *peer = nullptr; // null: unknown (tests)
    // The peer's address is proven (TCP's handshake; QUIC's handshake or a
    // path validation): only a proven one can be a trusted proxy's.
    bool peer_proven = true;
    bool tls = true;
    // The request came in TLS early data (0-RTT), before the handshake
    // completed: it could be a replay (RFC 8470).
    bool early = false;
    // An HTTP/1.1 client's Upgrade (it asked to switch protocols, with
    // "Connection: upgrade", and sends no body): the exchange is a tunnel
    // (RequestFraming::tunnel). Empty: an ordinary request.
    std::string_view upgrade;
  };
  // Starts proxying req on route once its head is complete. body_follows:
  // the client will send a body (HTTP/1.1 chunked or with a length, HTTP/2
  // and HTTP/3 HEADERS without END_STREAM); the session then hands it in
  // through put_body()/end_body(). Its content-length field, if any, is
  // the upstream framing; without one a body goes chunked. The exchange
  // may be finished at once (a 502 or 400 with head_ready()): the
  // listener is not called for that.
  std::unique_ptr<ProxyExchange> start(int route, Request &req, bool body_follows,
                                       const Client &client, ProxyListener *listener, void *tag,
                                       BudgetAccount *budget);

  // Routes, upstreams and settings from now on (a reload). Requests in
  // flight finish on the upstreams they started with; pooled connections
  // to those are closed, busy ones when their request ends.
  void reconfigure(std::shared_ptr<const ProxyConfig> cfg);
  // Frees the connections closed during this pass, and the routes a
  // reload replaced once nothing uses them (call at the pass's end).
  void end_of_pass();
  const ProxyStats &stats() const { return stats_; }
  // One entry per configured upstream, in configuration order (the
  // current routes').
  void upstream_stats(std::vector<UpstreamStats> &out) const;
  static std::vector<std::string> upstream_names(const ProxyConfig &cfg);

  // Used by exchanges and connections.
  const ProxyConfig &config() const { return *cfg_; }
  dataplane::EventLoop &loop() { return loop_; }
  ProxyStats &mutable_stats() { return stats_; }
  ProxyGeneration &generation() { return *cur_; }
  // An upstream of the route for a new attempt (round robin or least
  // outstanding), skipping those held down (with need_room, those at their
  // connection limit too); null if none is up.
  Upstream *pick(ProxyRouteState &route, bool need_room = false);
  // At its connection limit with none of them idle.
  static bool full(const Upstream &u);
  // Requests waiting for a connection, all routes.
  size_t waiting() const { return waiting_; }
  void waiting_changed(bool joined) { joined ? ++waiting_ : --waiting_; }
  // pick() on the current configuration's route i; null past the last
  // (for tests).
  Upstream *pick_route(size_t i);
  // A connection to u: a pooled one (reused set) unless fresh_only, or a
  // new one; null when the per-upstream limit is reached (pool_full set)
  // or the connect failed at once (local_error set if for want of a
  // descriptor, memory or a port here).
  UpstreamConn *connect(Upstream &u, bool fresh_only, bool &reused, bool &pool_full,
                        bool &local_error);
  void mark_down(Upstream &u);
  void mark_up(Upstream &u);
  // c's answer ended and c may carry another: to the route's first
  // waiting exchange, else into the pool (or closed).
  void pool(UpstreamConn &c);
  // A connection to u closed: a waiting exchange may open another.
  void capacity_freed(Upstream &u);
  // Something changed for route (a request came, a connection closed, a
  // probe ended): its waiting exchanges are looked at soon, from the
  // loop's timers. Those an upstream has room for get a connection; if
  // every upstream fails its health check, each gets a 502.
  void serve_soon(ProxyRouteState &route);
  // route's waiting exchanges are looked at again when the first passive
  // back-off of an upstream with room ends.
  void serve_at_backoff_end(const ProxyRouteState &route);
  // Every upstream of route fails its active health check: nothing can
  // serve it (a passive back-off alone never counts, see pick()).
  static bool checked_out(const ProxyRouteState &route);
  void closed(UpstreamConn &c);
  std::unique_ptr<uint8_t[]> take_window();
  void give_window(std::unique_ptr<uint8_t[]> w);
  // Response field lists kept between exchanges, their strings' buffers
  // with them: a response head copied in allocates nothing.
  void reuse_headers(HeaderList &h);
  void recycle_headers(HeaderList &h);
  // Upstream request heads, their buffers kept between exchanges the same
  // way: an empty string with room for a head, and one given back.
  std::string take_head();
  void give_head(std::string &&head);
  std::vector<uint8_t> &scratch() { return scratch_; }

private:
  std::unique_ptr<ProxyGeneration> build(std::shared_ptr<const ProxyConfig> cfg);
  int match_path(std::string_view target) const;
  // Waiting exchanges to upstreams with room now (after connections closed).
  static void serve_fired(dataplane::Timer &t);
  void serve_queues(ProxyGeneration &g);

  std::shared_ptr<const ProxyConfig> cfg_;               // cur_'s
  dataplane::EventLoop &loop_;
  std::unique_ptr<ProxyGeneration> cur_;
  std::vector<std::unique_ptr<ProxyGeneration>> retired_; // replaced, still in use
  std::vector<std::unique_ptr<UpstreamConn>> conns_;     // open ones
  std::vector<std::unique_ptr<UpstreamConn>> dead_;      // closed this pass
  std::vector<std::unique_ptr<uint8_t[]>> windows_;      // free response windows
  struct SpareHeaders {
    HeaderList list;
    size_t bytes; // its retained_bytes() when it was put back
  };
  std::vector<SpareHeaders> header_lists_;               // free response field lists
  size_t header_bytes_ = 0;                              // ... and the heap they hold
  static constexpr size_t MAX_SPARE_HEADER_BYTES = 4u << 20;
  std::vector<std::string> heads_;                       // free request head buffers
  size_t head_bytes_ = 0;                                // ... and the heap they hold
  static constexpr size_t HEAD_RESERVE = 512;            // a fresh one's room
  static constexpr size_t MAX_SPARE_HEAD = 4096;         // larger ones are freed
  static constexpr size_t MAX_SPARE_HEAD_BYTES = 4u << 20;
  std::vector<uint8_t> scratch_;
  ProxyStats stats_;
  size_t waiting_ = 0;
  dataplane::Timer serve_timer_; // due now while requests wait and something changed
};

} // namespace xdpq::http
