// The reverse proxy's per-worker half: upstream pools, balancing and
// passive health, and the exchange that carries one request upstream and
// its response back (the request body streamed up, the response streamed
// down). About 1,100 lines in one file because the exchange's states and the
// pool's connection life cycle drive each other (a connection's events
// advance its exchange, an exchange's end returns its connection; the
// connection writes the body the exchange holds); split, each half would
// need the other's internals.

#include "http/proxy.h"

#include "http/proxy_headers.h"
#include "http/router.h"
#include "http/upstream_health.h"

#include "base/small_alloc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace xdpq::http {

namespace {
// What one readiness event of an upstream connection reads at most.
constexpr size_t READ_BUDGET = 64 * 1024;
} // namespace

struct ProxyRouteState {
  RouteSettings settings;
  std::vector<Upstream *> upstreams;
  size_t next = 0; // round robin
  // Exchanges waiting for a connection, oldest first (linked through
  // them): every upstream was at its connection limit when they came.
  ProxyExchange *wait_first = nullptr;
  ProxyExchange *wait_last = nullptr;
  size_t waiting = 0;
};

// The routes and upstreams of one configuration. A reload makes a new one;
// the old one lives on, retired, while exchanges and connections use it.
struct ProxyGeneration {
  std::shared_ptr<const ProxyConfig> cfg;
  std::vector<std::unique_ptr<Upstream>> upstreams; // configuration order
  std::vector<ProxyRouteState> routes;              // as cfg->routes
  size_t users = 0;                                 // exchanges and connections on it
  bool retired = false;
};

// What an upstream carries from this worker, shared by the upstreams of
// the same route and URL across reloads: requests still in flight on the
// old configuration count against the new one's connection limit and in
// its least-outstanding choice.
struct UpstreamLoad {
  size_t conns = 0;         // open, idle or not, every generation's
  uint64_t outstanding = 0; // requests in flight, every generation's
  Upstream *current = nullptr; // the newest generation's, while it exists
};

struct Upstream final : HealthListener {
  Upstream() { load->current = this; }
  ~Upstream() {
    if (load->current == this) load->current = nullptr;
  }
  Upstream(const Upstream &) = delete;
  Upstream &operator=(const Upstream &) = delete;

  UpstreamAddress addr;
  Proxy *proxy = nullptr;
  ProxyGeneration *gen = nullptr;
  ProxyRouteState *route = nullptr;
  const RouteSettings *settings = nullptr; // its route's
  std::vector<UpstreamConn *> idle; // this generation's pooled ones
  std::shared_ptr<UpstreamLoad> load = std::make_shared<UpstreamLoad>();
  uint64_t down_until = 0;
  unsigned fails = 0;
  // Shared with the same route and URL of the next generation after a
  // reload: requests in flight on this one count on where they are read.
  std::shared_ptr<UpstreamStats> stats = std::make_shared<UpstreamStats>();
  std::unique_ptr<HealthProbe> probe; // with --proxy-health-check

  // Skipped by pick(): within a passive back-off, or its last probe failed.
  bool held_down(uint64_t now) const { return down_until > now || (probe && probe->failing()); }
  // A passing probe is proof the upstream accepts and answers again: it
  // ends a passive back-off too. A failing one holds it down by itself.
  // Either way, requests waiting on the route are looked at again.
  void probe_done(bool passed) override {
    if (passed) {
      fails = 0;
      down_until = 0;
    }
    proxy->serve_soon(*route);
  }
};

// One socket to an upstream. Owned by the Proxy; freed at the end of the
// pass in which it closed (the event loop may still hold it this pass).
class UpstreamConn final : public dataplane::FdHandler {
public:
  UpstreamConn(Proxy &p, Upstream &u) : proxy_(p), up_(u), timer_(timer_fired, this) {
    up_.gen->users += 1;
  }
  ~UpstreamConn() {
    if (fd_ >= 0) ::close(fd_);
    up_.gen->users -= 1;
  }

  // Starts a non-blocking connect. False (and closed) if it failed at once.
  bool open() {
    bool connected = false;
    fd_ = start_connect(up_.addr, connected);
    if (fd_ < 0) return false;
    if (!proxy_.loop().try_watch(fd_, this, true)) {
      // Our shortage (errno ENOMEM or ENOSPC), not the upstream's.
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      errno = err;
      return false;
    }
    want_read_ = want_write_ = true;
    state_ = connected ? State::sending : State::connecting;
    opened_at_ = proxy_.loop().now();
    if (connected) up_.stats->connect_time.record(0);
    up_.load->conns += 1;
    up_.stats->connects += 1;
    counted_ = true;
    return true;
  }

  bool connecting() const { return state_ == State::connecting; }
  // Not a byte of the request head has gone up yet.
  bool nothing_written() const { return head_off_ == 0; }
  // Where the Proxy keeps it among its open connections.
  size_t index = SIZE_MAX;

  // Writes what the exchange holds of its request now (the session handed
  // in body bytes).
  void flush() {
    if (state_ == State::sending) write_some();
  }

  // Carries ex's request from now on.
  void assign(ProxyExchange *ex) {
    ex_ = ex;
    parser_.reset(&ex->parser_handler(), ex->head_request(),
                  ex->framing() == RequestFraming::tunnel);
    head_off_ = 0;
    frame_len_ = frame_off_ = 0;
    chunk_left_ = 0;
    chunks_ = last_chunk_ = write_failed_ = stray_ = false;
    sent_at_ = proxy_.loop().now(); // a connecting one sets it again when connected
    head_timed_ = false;
    proxy_.loop().timers().cancel(timer_);
    if (state_ == State::idle) {
      // Proxy::connect() takes the most recently pooled one: the back.
      if (up_.idle.back() == this) {
        up_.idle.pop_back();
      } else {
        std::erase(up_.idle, this);
      }
    }
    // Pooled, or handed on as its last answer ended (Proxy::pool()).
    if (state_ == State::idle || state_ == State::receiving) state_ = State::sending;
    if (state_ == State::sending && ex->ready_to_send()) write_some();
  }

  // The exchange is gone (its client left): a connection in the middle of
  // a request cannot be reused.
  void detach() {
    ex_ = nullptr;
    close();
  }

  // Nothing behind its last answer: no bytes and no close from the
  // upstream (the socket asked without taking anything). A read that
  // ended with the answer says nothing of a FIN right behind it, and a
  // request handed such a connection would fail before any byte of
  // answer: a POST, never retried, would get 502.
  bool quiet() {
    if (stray_) return false;
    char c;
    const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) up_.stats->stray_bytes += 1;
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  // For a pooled one about to be reused: epoll told of what came before
  // the last pass's wait (on_io closed it). What came after it is reported
  // in this pass's events, maybe after the request that takes the
  // connection: an upstream closing an idle connection (its keep-alive
  // timeout, or right behind its answer) in the same batch as a client's
  // request would fail the request, and a POST, never retried, would get
  // 502. So the socket is asked when the connection was pooled in this
  // pass, has an event of this pass still to come, or sat idle long enough
  // for an upstream to give up on it; one handed straight on (back-to-back
  // requests) costs no system call.
  static constexpr uint64_t ASK_AFTER_IDLE_NS = 1'000'000;
  bool reusable() {
    return (pooled_in_ != proxy_.loop().pass() &&
            proxy_.loop().now() - pooled_at_ < ASK_AFTER_IDLE_NS &&
            !proxy_.loop().may_have_event(this)) ||
           quiet();
  }

  void make_idle(uint64_t idle_timeout) {
    pooled_in_ = proxy_.loop().pass();
    pooled_at_ = proxy_.loop().now();
    state_ = State::idle;
    up_.idle.push_back(this);
    interest(true, false);
    proxy_.loop().timers().schedule(timer_, proxy_.loop().now() + idle_timeout);
  }

  void close() {
    if (state_ == State::closed) return;
    if (state_ == State::idle) std::erase(up_.idle, this);
    state_ = State::closed;
    proxy_.loop().timers().cancel(timer_);
    proxy_.loop().unwatch(fd_);
    ::close(fd_);
    fd_ = -1;
    if (counted_) {
      up_.load->conns -= 1;
      proxy_.capacity_freed(up_);
    }
    counted_ = false;
    proxy_.closed(*this);
  }

  void resume_read() {
    if (parked_ && state_ != State::closed) {
      // Back in epoll: the client made room for what the socket still holds.
      parked_ = false;
      try {
        proxy_.loop().watch(fd_, this, false);
        want_read_ = true;
        want_write_ = false;
      } catch (const std::exception &) {
        // No memory to watch it again (called from inside the client's
        // read of the window, so not ended here): nothing moves, and the
        // exchange's deadlines end it.
      }
      return;
    }
    if (state_ == State::receiving || state_ == State::sending) {
      interest(true, state_ == State::sending && want_write_);
    }
  }

  void on_io(uint32_t events) override {
    switch (state_) {
    case State::closed: return;
    case State::idle:
      // Pooled and idle: whatever comes (the upstream's close, stray bytes)
      // ends it.
      close();
      return;
    case State::connecting: {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) return failed_before_response(true);
      if (!(events & EPOLLOUT)) return;
      state_ = State::sending;
      sent_at_ = proxy_.loop().now();
      up_.stats->connect_time.record(sent_at_ - opened_at_);
      if (ex_) ex_->connected();
      if (ex_ && !ex_->ready_to_send()) {
        // As a pooled connection does (assign()): the head waits for the
        // first body bytes or the body's end (an empty body then goes
        // without chunks), and the client has --proxy-timeout for them.
        interest(ex_->room() > 0, false);
        ex_->send_state(ProxyExchange::Send::waiting);
        break;
      }
      wrote_and_tell();
      break;
    }
    case State::sending:
      if (events & EPOLLOUT) wrote_and_tell();
      if (state_ == State::closed) return;
      if (unread_hangup(events)) return;
      if (events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) read_some();
      break;
    case State::receiving:
      if (unread_hangup(events)) return;
      read_some();
      break;
    }
  }

  Upstream &upstream() { return up_; }

private:
  enum class State { connecting, sending, receiving, idle, closed };

  static void timer_fired(dataplane::Timer &t) {
    auto *c = static_cast<UpstreamConn *>(t.owner());
    if (c->state_ == State::idle) c->close();
  }

  // A hangup while we are not reading (the client holds the window full):
  // epoll reports it whatever we watch, and read_some() would read
  // nothing, so the event would come back at once. A reset ends the
  // connection here (what the socket held is lost with it). A clean one
  // (a unix socket's upstream closed after its answer; a TCP upstream
  // closed after a tunnel's client closed its side) still has the
  // upstream's last bytes in the socket: the connection leaves epoll until
  // the client makes room. True if handled.
  bool unread_hangup(uint32_t events) {
    if (!(events & (EPOLLHUP | EPOLLERR)) || !ex_ || ex_->room() != 0) return false;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    // A write that failed (ECONNRESET, EPIPE) took the socket's error with
    // it: that hangup is a reset too.
    if ((events & EPOLLERR) || err != 0 || write_failed_) {
      broke(false);
    } else {
      proxy_.loop().unwatch(fd_);
      parked_ = true;
    }
    return true;
  }

  // Sets the epoll interest, skipping the call when it is unchanged.
  void interest(bool read, bool write) {
    if (read == want_read_ && write == want_write_) return;
    want_read_ = read;
    want_write_ = write;
    proxy_.loop().set_interest(fd_, this, read, write);
  }

  // write_some() from a socket event: the session learns that body bytes
  // left (it gives the client credit for them).
  void wrote_and_tell() {
    ProxyExchange *ex = ex_;
    if (write_some() && ex_ == ex && ex) ex->notify();
  }

  // The next chunk's framing when the previous one is out: its size line
  // (after the previous chunk's CRLF), or the last chunk once the body ended.
  void next_frame(size_t held, bool ended) {
    const char *sep = chunks_ ? "\r\n" : "";
    int n = 0;
    if (held > 0) {
      n = std::snprintf(frame_, sizeof(frame_), "%s%zx\r\n", sep, held);
      chunk_left_ = held;
      chunks_ = true;
    } else if (ended && !last_chunk_) {
      n = std::snprintf(frame_, sizeof(frame_), "%s0\r\n\r\n", sep);
      last_chunk_ = true;
    }
    frame_len_ = static_cast<uint8_t>(n);
    frame_off_ = 0;
  }

  // Writes the head, then the body as the exchange holds it (framed as it
  // says), in one sendmsg while the socket takes it. Then the connection
  // waits for the socket (EPOLLOUT), for the client's next body bytes, or
  // for the response once the whole request is out. True if body bytes left.
  bool write_some() {
    ProxyExchange *ex = ex_;
    if (!ex) {
      close();
      return false;
    }
    const std::string &head = ex->request_head();
    const bool chunked = ex->framing() == RequestFraming::chunked;
    bool body_left = false;
    while (!write_failed_) {
      auto data = ex->body_data();
      if (chunked && frame_off_ == frame_len_ && chunk_left_ == 0) {
        next_frame(data.size(), ex->body_ended());
      }
      iovec iov[3];
      int n = 0;
      if (head_off_ < head.size()) {
        iov[n++] = {const_cast<char *>(head.data()) + head_off_, head.size() - head_off_};
      }
      if (frame_off_ < frame_len_) {
        iov[n++] = {frame_ + frame_off_, static_cast<size_t>(frame_len_ - frame_off_)};
      }
      size_t take = chunked ? std::min(data.size(), chunk_left_) : data.size();
      if (take > 0) iov[n++] = {const_cast<uint8_t *>(data.data()), take};
      if (n == 0) break;
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          interest(ex->room() > 0, true);
          ex->send_state(ProxyExchange::Send::blocked);
          return body_left;
        }
        if (errno == EINTR) continue;
        // The upstream closed on us; if it answered first, that answer
        // is still in the socket for read_some(). The rest of the body has
        // nowhere to go.
        write_failed_ = true;
        break;
      }
      size_t k = static_cast<size_t>(w);
      size_t part = std::min(k, head.size() - head_off_);
      head_off_ += part;
      k -= part;
      part = std::min<size_t>(k, frame_len_ - frame_off_);
      frame_off_ = static_cast<uint8_t>(frame_off_ + part);
      k -= part;
      if (k > 0) {
        if (chunked) chunk_left_ -= k;
        ex->body_written(k);
        body_left = true;
      }
    }
    const bool complete = head_off_ == head.size() && ex->body_ended() && ex->body_held() == 0 &&
                          (!chunked || (last_chunk_ && frame_off_ == frame_len_));
    // Reading stays off while the client holds the response window full.
    if (complete || write_failed_) {
      // A tunnel's client closed its side: so does the upstream's.
      if (complete && ex->framing() == RequestFraming::tunnel) ::shutdown(fd_, SHUT_WR);
      state_ = State::receiving;
      interest(ex->room() > 0, false);
      if (write_failed_) ex->send_state(ProxyExchange::Send::failed);
      else ex->send_state(ProxyExchange::Send::complete);
    } else {
      interest(ex->room() > 0, false); // and wait for the client's next bytes
      ex->send_state(ProxyExchange::Send::waiting);
    }
    return body_left;
  }

  void read_some() {
    ProxyExchange *ex = ex_;
    if (!ex) return close();
    bool progressed = false;
    auto &buf = proxy_.scratch();
    // Bytes that fill no room (chunk framing, extensions, trailers) could
    // keep this loop going while the upstream writes: at most this much
    // per readiness event, then the loop's other work (the socket stays
    // readable and watched, so it comes back).
    size_t budget = READ_BUDGET;
    while (ex_) {
      if (budget == 0) break;
      size_t room = ex_->room();
      if (room == 0) {
        // The client has not taken what we hold: pause reading the
        // upstream until it does (release() resumes us).
        interest(false, state_ == State::sending && want_write_);
        break;
      }
      const size_t want = std::min(room, buf.size());
      ssize_t n = ::recv(fd_, buf.data(), want, 0);
      if (n > 0) {
        progressed = true;
        budget -= std::min(budget, static_cast<size_t>(n));
        ex_->moved(); // framing, trailers and 1xx count as the upstream speaking too
        const auto r = parser_.feed(buf.data(), static_cast<size_t>(n));
        if (!head_timed_ && parser_.head_done()) {
          head_timed_ = true;
          up_.stats->head_latency.record(proxy_.loop().now() - sent_at_);
        }
        if (r != UpstreamResponseParser::Result::ok) {
          // Bytes after a whole answer: the answer stands, but what
          // followed it must never pass for the next request's response,
          // so the connection is closed rather than reused.
          if (!parser_.complete()) return broke(true);
          up_.stats->stray_bytes += 1;
          stray_ = true;
          return done();
        }
        if (parser_.complete()) {
          // A read as long as asked may have stopped right where the
          // answer ends, with more behind it: the socket is asked (without
          // taking anything) before the connection can serve another
          // request. A shorter read emptied it of bytes; a close behind
          // them is this connection's event in the next pass (reusable()).
          // Bytes behind it (counted), a close or a reset make the
          // connection unusable.
          if (static_cast<size_t>(n) == want && !quiet()) stray_ = true;
          return done();
        }
        continue;
      }
      if (n == 0) {
        if (!parser_.started()) return failed_before_response(false);
        if (parser_.finish() != UpstreamResponseParser::Result::ok) return broke(false);
        return done();
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      if (!parser_.started()) return failed_before_response(false);
      return broke(false);
    }
    if (progressed) ex->notify();
  }

  void failed_before_response(bool connect) {
    ProxyExchange *ex = ex_;
    ex_ = nullptr;
    close();
    if (ex) ex->conn_failed(connect, nothing_written());
  }

  void broke(bool malformed) {
    ProxyExchange *ex = ex_;
    ex_ = nullptr;
    close();
    if (ex) {
      if (malformed) ex->conn_broke(parser_.error());
      else ex->conn_broke({});
    }
  }

  void done() {
    ProxyExchange *ex = ex_;
    ex_ = nullptr;
    // A connection whose request write failed (the upstream answered and
    // closed its side) is never pooled, whatever its answer said.
    if (parser_.keep_alive() && state_ != State::closed && state_ != State::sending &&
        !write_failed_ && !stray_) {
      proxy_.pool(*this);
    } else {
      close();
    }
    ex->conn_done();
  }

  Proxy &proxy_;
  Upstream &up_;
  int fd_ = -1;
  State state_ = State::connecting;
  bool counted_ = false;
  ProxyExchange *ex_ = nullptr;
  uint64_t pooled_in_ = UINT64_MAX; // the loop's pass in which it last became idle
  uint64_t pooled_at_ = 0;          // ... and the loop's time then
  UpstreamResponseParser parser_;
  size_t head_off_ = 0;
  char frame_[24];              // a chunk's framing being written
  uint8_t frame_len_ = 0;
  uint8_t frame_off_ = 0;
  size_t chunk_left_ = 0;       // body bytes of the current chunk not yet written
  bool chunks_ = false;         // a chunk went out (the next framing starts with its CRLF)
  bool last_chunk_ = false;
  bool write_failed_ = false;
  bool stray_ = false;          // more than its answer came, or the close: not reused
  bool want_read_ = false;      // the epoll interest set
  bool want_write_ = false;
  uint64_t opened_at_ = 0; // the connect started (loop time)
  uint64_t sent_at_ = 0;   // the request started out
  bool head_timed_ = false;
  bool parked_ = false; // out of epoll (unread_hangup) until resume_read()
  dataplane::Timer timer_;
};

// --- ProxyExchange -----------------------------------------------------------

ProxyExchange::ProxyExchange(Proxy &proxy, size_t route, Request &req, std::string head,
                             RequestFraming framing, uint64_t length, ProxyListener *l, void *tag,
                             BudgetAccount *budget)
    : proxy_(proxy), gen_(&proxy.generation()), route_(&gen_->routes[route]),
      request_(std::move(head)), framing_(framing), req_length_(length), listener_(l), tag_(tag),
      budget_(budget), timer_(timer_fired, this) {
  gen_->users += 1;
  const auto &m = req.method;
  head_request_ = m == "HEAD";
  body_method_ = method_defines_body(m);
  // RFC 9110 9.2.2; a request that may be repeated after a lost response.
  idempotent_ = m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "PUT" || m == "DELETE" ||
                m == "TRACE";
}

ProxyExchange::~ProxyExchange() {
  detach();
  proxy_.loop().timers().cancel(timer_);
  proxy_.recycle_headers(head_.headers);
  proxy_.give_head(std::move(request_));
  if (window_) proxy_.give_window(std::move(window_));
  small_alloc::deallocate(small_window_);
  if (budget_) budget_->give_back(window_charged_ + req_charged_);
  gen_->users -= 1;
}

void ProxyExchange::detach() {
  if (queued_) leave_queue();
  if (conn_) {
    UpstreamConn *c = conn_;
    conn_ = nullptr;
    c->detach();
  }
  if (counted_) {
    upstream_->load->outstanding -= 1;
    counted_ = false;
  }
}

void ProxyExchange::begin() {
  if (request_.empty()) {
    proxy_.mutable_stats().proxy_bad_requests += 1;
    return fail_with(400);
  }
  attempt(false);
}

bool ProxyExchange::reserve_window() {
  // The budget holds the largest ring the response may need, from the
  // moment the request has a connection (waiting in the queue it holds
  // none) until its head says how much it does (on_head gives the rest
  // back).
  if (!budget_ || window_charged_ > 0) return true;
  if (!budget_->try_take(WINDOW)) {
    proxy_.mutable_stats().proxy_budget_refusals += 1;
    return false;
  }
  window_charged_ = WINDOW;
  return true;
}

void ProxyExchange::attempt(bool fresh, Upstream *chosen) {
  // First come, first served: while others wait, a new request waits
  // behind them (a connection that came free goes to the oldest).
  if (!chosen && attempts_ == 0 && route_->waiting > 0) {
    if (Proxy::checked_out(*route_)) {
      // As the waiting ones will be: nothing can serve the route.
      return fail_no_upstream();
    }
    if (!wait_in_queue()) return fail_with(503);
    // An upstream may have room the waiting ones have not been given yet
    // (one back from a back-off): they are served in order.
    return proxy_.serve_soon(*route_);
  }
  if (!reserve_window()) return fail_with(503);
  for (;;) {
    // One with room first; if every one is at its limit, the pick as
    // usual (the request then waits).
    upstream_ = chosen ? chosen : proxy_.pick(*route_, true);
    if (!upstream_) upstream_ = proxy_.pick(*route_);
    chosen = nullptr;
    if (!upstream_) return fail_no_upstream();
    attempts_ += 1;
    bool reused = false;
    bool pool_full = false;
    bool local_error = false;
    UpstreamConn *c = proxy_.connect(*upstream_, fresh, reused, pool_full, local_error);
    if (c) return use(c, reused);
    if (local_error) {
      // Out of descriptors or ports here: no upstream is to blame (none
      // is held down) and no other would fare better now.
      proxy_.mutable_stats().proxy_local_errors += 1;
      return fail_with(503);
    }
    if (pool_full) {
      attempts_ -= 1; // nothing was tried
      // Nothing is sent while it waits: its window is not held meanwhile.
      if (budget_) budget_->give_back(window_charged_);
      window_charged_ = 0;
      if (!wait_in_queue()) fail_with(503);
      return;
    }
    // The connect failed at once (a unix socket nobody listens on).
    upstream_->stats->connect_failures += 1;
    proxy_.mark_down(*upstream_);
    if (!connect_retry()) return fail_with(502);
    upstream_->stats->retries += 1;
  }
}

bool ProxyExchange::connect_retry() {
  // A failed connect is tried again on another upstream (the failed one is
  // held down, so the pick passes it over), up to one try per upstream of
  // the route, at least two and at most three in all; whatever happened to
  // the request before (a pooled connection that dropped it) does not use
  // these up.
  connect_fails_ += 1;
  const int tries = static_cast<int>(std::clamp<size_t>(route_->upstreams.size(), 2, 3));
  return connect_fails_ < tries;
}

void ProxyExchange::use(UpstreamConn *c, bool reused) {
  conn_ = c;
  upstream_->stats->requests += 1;
  upstream_->load->outstanding += 1;
  counted_ = true;
  if (reused) upstream_->stats->reused += 1;
  const auto &cfg = route_->settings;
  const bool connecting = conn_->connecting();
  if (!connecting) proxy_.mark_up(*upstream_);
  // The response timeout starts once the request is out (send_state()).
  if (connecting) {
    proxy_.loop().timers().schedule(timer_, proxy_.loop().now() + cfg.connect_timeout_ns);
  } else {
    proxy_.loop().timers().cancel(timer_);
  }
  conn_->assign(this);
  // A pooled connection waits for the first body bytes before writing.
  if (!connecting && !ready_to_send()) send_state(Send::waiting);
}

bool ProxyExchange::wait_in_queue() {
  auto &stats = proxy_.mutable_stats();
  if (route_->waiting >= route_->settings.max_queue) {
    stats.proxy_pool_full += 1;
    return false;
  }
  if (queue_deadline_ == 0) {
    // Counted, and its wait bounded, from the first time it waits (a
    // request whose connect failed may come back).
    stats.proxy_queued += 1;
    queue_deadline_ = proxy_.loop().now() + route_->settings.queue_timeout_ns;
  }
  join_queue();
  proxy_.serve_at_backoff_end(*route_);
  return true;
}

void ProxyExchange::join_queue() {
  upstream_ = nullptr;
  queued_ = true;
  wait_prev_ = route_->wait_last;
  wait_next_ = nullptr;
  if (wait_prev_) wait_prev_->wait_next_ = this;
  else route_->wait_first = this;
  route_->wait_last = this;
  route_->waiting += 1;
  proxy_.waiting_changed(true);
  proxy_.loop().timers().schedule(timer_, queue_deadline_); // then 503 (timer_fired)
}

void ProxyExchange::move_to(ProxyGeneration &g, ProxyRouteState &to) {
  leave_queue();
  gen_->users -= 1;
  gen_ = &g;
  route_ = &to;
  gen_->users += 1;
  join_queue();
}

void ProxyExchange::leave_queue() {
  if (!queued_) return;
  queued_ = false;
  if (wait_prev_) wait_prev_->wait_next_ = wait_next_;
  else route_->wait_first = wait_next_;
  if (wait_next_) wait_next_->wait_prev_ = wait_prev_;
  else route_->wait_last = wait_prev_;
  wait_prev_ = wait_next_ = nullptr;
  route_->waiting -= 1;
  proxy_.waiting_changed(false);
}

ProxyExchange *ProxyExchange::first_waiting(ProxyRouteState &route) { return route.wait_first; }

bool ProxyExchange::dequeued(Upstream &u, UpstreamConn *c) {
  leave_queue();
  proxy_.loop().timers().cancel(timer_);
  const uint64_t out = req_out_;
  if (!reserve_window()) {
    fail_with(503);
    notify();
    return false;
  }
  if (c) {
    upstream_ = &u;
    attempts_ += 1;
    use(c, true);
  } else {
    attempt(false, &u);
  }
  // Body bytes that waited went up (the session gives the client credit
  // for them), or the connect failed at once: tell the session.
  if (req_out_ != out || head_ready_) notify();
  return true;
}

void ProxyExchange::fail_no_upstream() {
  proxy_.mutable_stats().proxy_no_upstream += 1;
  fail_with(502);
}

void ProxyExchange::no_upstream() {
  fail_no_upstream();
  notify();
}

void ProxyExchange::connected() { proxy_.mark_up(*upstream_); }

void ProxyExchange::send_state(Send st) {
  if (head_ready_) return;
  // Request out (or the socket full): the upstream has --proxy-timeout to
  // answer (or to take more). Waiting for the client's body: the client
  // has as long to send more (past it: 408). A tunnel's client sends
  // nothing before the upstream switches: that wait is the upstream's.
  waiting_for_client_ = st == Send::waiting && framing_ != RequestFraming::tunnel;
  proxy_.loop().timers().schedule(timer_,
                                  proxy_.loop().now() + route_->settings.response_timeout_ns);
}

bool ProxyExchange::put_body(const uint8_t *data, size_t len) {
  if (len == 0) return true;
  if (req_ended_ || (framing_ == RequestFraming::length && req_length_ - req_in_ < len)) {
    // More than the client announced: the body cannot be framed upstream.
    abort_body();
    return false;
  }
  if (req_dropping_) {
    req_in_ += len;
    req_out_ += len;
    return true;
  }
  if (budget_ && !budget_->try_take(len)) {
    proxy_.mutable_stats().proxy_body_budget_refusals += 1;
    budget_refused_ = true; // counted as that, not also as an abort
    own_budget_refused_ = budget_->own_limit_refused();
    abort_body();
    return false; // not taken: the session credits them itself
  }
  req_in_ += len;
  req_charged_ += len;
  req_buf_.append(reinterpret_cast<const char *>(data), len);
  moved();
  return true;
}

bool ProxyExchange::end_body() {
  if (req_ended_) return true;
  if (framing_ == RequestFraming::length && req_in_ != req_length_) {
    abort_body();
    return false;
  }
  if (framing_ == RequestFraming::chunked && req_in_ == 0 && (!conn_ || conn_->nothing_written())) {
    // The body that was to follow is empty (a client that ended its stream
    // in a frame after its head) and nothing went up yet: the request goes
    // as one without a body would, not as a chunked GET (which some
    // upstreams refuse).
    unchunk_head();
  }
  req_ended_ = true;
  return true;
}

void ProxyExchange::unchunk_head() {
  constexpr std::string_view CHUNKED = "\r\ntransfer-encoding: chunked\r\n";
  const size_t at = request_.find(CHUNKED);
  if (at == std::string::npos) return;
  // A method that defines a body still says it has none (as the head
  // built for no body does).
  request_.replace(at, CHUNKED.size(), body_method_ ? "\r\ncontent-length: 0\r\n" : "\r\n");
  framing_ = RequestFraming::none;
}

void ProxyExchange::flush_body() {
  if (conn_ && (body_held() > 0 || req_ended_)) conn_->flush();
}

void ProxyExchange::abort_body() {
  if (req_aborted_) return;
  req_aborted_ = true;
  req_ended_ = true;
  drop_body();
  // Answered whole already: the rest of the body does not matter. Failed
  // already (the upstream broke off, or nothing moved for --proxy-timeout):
  // the client's stream is being reset for that, counted as that.
  if (ended_ || failed_) return;
  if (!budget_refused_) proxy_.mutable_stats().proxy_body_aborts += 1;
  detach(); // never back to the pool half-written
  // A body refused for the budget is the server's shortage, not a bad
  // request (HTTP/2 and HTTP/3 refuse the stream for it).
  if (!head_ready_) fail_with(budget_refused_ ? 503 : 400);
  else failed_ = true;
}

void ProxyExchange::moved() { moved_at_ = proxy_.loop().now(); }

void ProxyExchange::body_written(size_t n) {
  moved();
  req_off_ += n;
  req_out_ += n;
  req_charged_ -= n;
  if (budget_) budget_->give_back(n);
  if (req_off_ == req_buf_.size()) {
    req_buf_.clear();
    req_off_ = 0;
  } else if (req_off_ >= REQUEST_WINDOW / 4 && req_off_ * 2 >= req_buf_.size()) {
    req_buf_.erase(0, req_off_); // at most as much again moved
    req_off_ = 0;
  }
}

void ProxyExchange::drop_body() {
  req_dropping_ = true;
  req_out_ += body_held();
  if (budget_) budget_->give_back(req_charged_);
  req_charged_ = 0;
  std::string().swap(req_buf_);
  req_off_ = 0;
}

void ProxyExchange::conn_failed(bool connect, bool unsent) {
  conn_ = nullptr;
  if (counted_) {
    upstream_->load->outstanding -= 1;
    counted_ = false;
  }
  proxy_.loop().timers().cancel(timer_);
  bool retry;
  if (connect) {
    upstream_->stats->connect_failures += 1;
    proxy_.mark_down(*upstream_);
    retry = connect_retry();
  } else {
    // Closed or reset before a byte of response: a stale pooled
    // connection, or an upstream that dropped the request. Only a request
    // that may be repeated goes again, twice at most; so does one of which
    // not a byte left (its head waited for the body while the upstream's
    // idle or header timeout ran out): the upstream never saw it.
    upstream_->stats->resets += 1;
    drops_ += 1;
    // Body bytes that left cannot be sent again: the request is not repeated.
    retry = (idempotent_ || unsent) && drops_ < 3 && req_out_ == 0;
  }
  if (!retry) {
    fail_with(502);
    return notify();
  }
  upstream_->stats->retries += 1;
  attempt(!connect);
  // Answered (502, 503), or body bytes went on the new connection at once.
  notify();
}

void ProxyExchange::conn_broke(std::string_view why) {
  conn_ = nullptr;
  proxy_.loop().timers().cancel(timer_);
  if (counted_) {
    upstream_->load->outstanding -= 1;
    counted_ = false;
  }
  if (!why.empty()) upstream_->stats->bad_responses += 1;
  else upstream_->stats->resets += 1;
  if (!head_ready_) {
    fail_with(502);
  } else {
    failed_ = true;
    upstream_failed_ = true;
    // Nobody will take the rest of the request body now.
    if (!req_ended_) drop_body();
  }
  notify();
}

void ProxyExchange::conn_done() {
  conn_ = nullptr;
  proxy_.loop().timers().cancel(timer_);
  if (counted_) {
    upstream_->load->outstanding -= 1;
    counted_ = false;
  }
  upstream_->stats->responses += 1;
  ended_ = true;
  // Answered before the whole body went up (the connection was closed):
  // the rest has nowhere to go.
  if (!req_ended_) drop_body();
  watch_drain();
  notify();
}

// The whole answer is here, and what the client has not taken of it holds
// the ring and its budget: the client must take something of it within
// --proxy-client-timeout, as while the upstream still sent (a client that
// grants no window would hold it for ever, on HTTP/3 where no connection
// deadline sees a stalled stream).
void ProxyExchange::watch_drain() {
  if (failed_ || base_ == end_) return; // all taken
  uint64_t at;
  if (!client_hold_expired(proxy_.loop().now(), at)) proxy_.loop().timers().schedule(timer_, at);
}

// The client holds what the ring has: stamped when it last took some.
// Once it has taken nothing for --proxy-client-timeout, the exchange
// fails (counted, the session told: it resets the stream) and this is
// true; else at is when that comes.
bool ProxyExchange::client_hold_expired(uint64_t now, uint64_t &at) {
  const uint64_t client_timeout = proxy_.config().client_timeout_ns;
  if (held_since_ == 0 || held_base_ != base_) {
    held_since_ = now;
    held_base_ = base_;
  } else if (now - held_since_ >= client_timeout) {
    proxy_.mutable_stats().proxy_client_timeouts += 1;
    detach();
    failed_ = true;
    drop_body();
    notify();
    return true;
  }
  at = held_since_ + client_timeout;
  return false;
}

void ProxyExchange::timer_fired(dataplane::Timer &t) {
  auto *ex = static_cast<ProxyExchange *>(t.owner());
  if (ex->head_ready_) return ex->check_stall();
  if (ex->queued_) {
    // No connection came free in time.
    ex->proxy_.mutable_stats().proxy_queue_timeouts += 1;
    ex->fail_with(503);
    return ex->notify();
  }
  if (ex->conn_ && ex->conn_->connecting()) {
    // The connect did not finish in time: a failed connect, like a refusal.
    UpstreamConn *c = ex->conn_;
    ex->conn_ = nullptr;
    c->detach();
    return ex->conn_failed(true);
  }
  if (ex->waiting_for_client_) {
    // The client stopped sending its body: the upstream must not wait.
    ex->proxy_.mutable_stats().proxy_body_timeouts += 1;
    ex->detach();
    ex->fail_with(408);
    return ex->notify();
  }
  ex->upstream_->stats->timeouts += 1;
  ex->detach();
  ex->fail_with(504);
  ex->notify();
}

// The head came; the rest of the response (and of the request body) must
// keep moving. Without a byte either way for --proxy-timeout, the exchange
// ends: the client's stream is reset (never a short body that looks
// whole), the upstream connection closed. A client that holds the response
// window full is not the upstream's silence: its own deadlines apply.
// The timer is the one that bounded the wait for the head; progress only
// stamps moved_at_, and the timer moves on when it fires.
void ProxyExchange::check_stall() {
  if (ended_) return watch_drain();
  if (!conn_ || failed_) return;
  const uint64_t now = proxy_.loop().now();
  const uint64_t timeout =
      switched_ ? proxy_.config().tunnel_timeout_ns : route_->settings.response_timeout_ns;
  const bool held_by_client = room() == 0;
  if (held_by_client) {
    // Not the upstream's silence: the client's. It may be slow, but it
    // must take something within --proxy-client-timeout.
    uint64_t at;
    if (!client_hold_expired(now, at)) proxy_.loop().timers().schedule(timer_, std::min(now + timeout, at));
    return;
  }
  held_since_ = 0;
  if (now - moved_at_ < timeout) {
    uint64_t at = moved_at_ + timeout;
    // A tunnel's timeout is long: a client that fills the window meanwhile
    // is noticed within --proxy-timeout.
    if (switched_) at = std::min(at, now + route_->settings.response_timeout_ns);
    proxy_.loop().timers().schedule(timer_, at);
    return;
  }
  if (switched_) {
    proxy_.mutable_stats().proxy_tunnel_timeouts += 1; // nobody spoke
  } else if (body_expected() && body_held() == 0) {
    proxy_.mutable_stats().proxy_body_timeouts += 1; // the client's body stopped
  } else {
    upstream_->stats->timeouts += 1;
    upstream_failed_ = true;
  }
  detach();
  failed_ = true;
  drop_body();
  notify();
}

void ProxyExchange::fail_with(int status) {
  detach();
  drop_body();
  proxy_.loop().timers().cancel(timer_);
  // The error page is static: no ring, no budget for one.
  if (budget_) budget_->give_back(window_charged_);
  window_charged_ = 0;
  head_.reset();
  head_.status = status;
  head_.add_header("content-type", "text/plain; charset=utf-8");
  auto text = reason_phrase(status);
  head_.content_length = head_request_ ? 0 : text.size();
  head_ready_ = true;
  has_body_ = !head_request_;
  if (has_body_) {
    static_body_ = text; // static storage: no ring needed
    end_ = text.size();
  }
  ended_ = true;
}

void ProxyExchange::on_head(const UpstreamResponseParser &p) {
  head_.reset();
  head_.status = p.status();
  proxy_.reuse_headers(head_.headers);
  copy_response_fields(p.headers(), head_.headers);
  if (p.switched()) {
    // The switch goes to the client as the upstream made it: its Upgrade
    // (the session writes "Connection: upgrade"), then the tunnel's bytes.
    switched_ = true;
    proxy_.mutable_stats().proxy_tunnels += 1;
    for (const auto &f : p.headers()) {
      if (f.name == "upgrade") head_.headers.add(f.name, f.value);
    }
  }
  if (p.length_known()) {
    head_.content_length = p.content_length();
  } else {
    head_.length_unknown = true;
  }
  has_body_ = switched_ || (!head_request_ && p.status() != 204 && p.status() != 304 &&
                            !(p.length_known() && p.content_length() == 0));
  size_t need = 0;
  if (has_body_) {
    const bool small = p.length_known() && p.content_length() <= SMALL_BODY;
    need = small ? static_cast<size_t>(p.content_length()) : WINDOW;
    if (small && (small_window_ = static_cast<uint8_t *>(small_alloc::allocate(need)))) {
      ring_ = small_window_;
    } else {
      window_ = proxy_.take_window();
      ring_ = window_.get();
      need = WINDOW;
    }
    cap_ = need;
  }
  if (budget_ && window_charged_ > need) {
    budget_->give_back(window_charged_ - need);
    window_charged_ = need;
  }
  head_ready_ = true;
  // The timer now bounds silence mid-exchange (check_stall); a response
  // complete in this read cancels it. A tunnel's silence has its own bound.
  moved();
  if (switched_) {
    // Looked at again within --proxy-timeout at most: a client that holds
    // the window full is noticed (check_stall).
    proxy_.loop().timers().schedule(
        timer_, moved_at_ + std::min(proxy_.config().tunnel_timeout_ns,
                                     route_->settings.response_timeout_ns));
  } else if (!timer_.scheduled()) {
    proxy_.loop().timers().schedule(timer_, moved_at_ + route_->settings.response_timeout_ns);
  }
}

void ProxyExchange::on_body(const uint8_t *data, size_t len) {
  // Never more than room(): the connection reads at most that much. A
  // response the parser says has no body brings none (no ring is there).
  if (!ring_) return;
  while (len > 0) {
    size_t at = static_cast<size_t>(end_ % cap_);
    size_t take = std::min(len, cap_ - at);
    std::memcpy(ring_ + at, data, take);
    end_ += take;
    data += take;
    len -= take;
  }
}

void ProxyExchange::on_complete() {}

std::span<const uint8_t> ProxyExchange::chunk(uint64_t offset) const {
  if (offset >= end_ || offset < base_) return {};
  if (!static_body_.empty()) {
    return {reinterpret_cast<const uint8_t *>(static_body_.data()) + offset,
            static_cast<size_t>(end_ - offset)};
  }
  size_t at = static_cast<size_t>(offset % cap_);
  size_t n = std::min(static_cast<size_t>(end_ - offset), cap_ - at);
  return {ring_ + at, n};
}

void ProxyExchange::release(uint64_t offset) {
  if (offset <= base_) return;
  bool was_full = room() == 0;
  base_ = std::min(offset, end_);
  if (was_full && conn_) {
    // The client held the window full: the upstream's silence counts from now.
    moved();
    conn_->resume_read();
  }
}

void ProxyExchange::notify() {
  if (listener_) listener_->proxy_progress(tag_);
}

// --- Proxy -------------------------------------------------------------------

Proxy::Proxy(std::shared_ptr<const ProxyConfig> cfg, dataplane::EventLoop &loop)
    : cfg_(std::move(cfg)), loop_(loop), scratch_(16 * 1024), serve_timer_(serve_fired, this) {
  cur_ = build(cfg_);
}

std::unique_ptr<ProxyGeneration> Proxy::build(std::shared_ptr<const ProxyConfig> cfg) {
  auto g = std::make_unique<ProxyGeneration>();
  g->routes.resize(cfg->routes.size());
  for (size_t i = 0; i < cfg->routes.size(); ++i) {
    const ProxyRoute &r = cfg->routes[i];
    ProxyRouteState &state = g->routes[i];
    state.settings = cfg->settings(r);
    for (const auto &a : r.upstreams) {
      auto u = std::make_unique<Upstream>();
      u->addr = a;
      u->proxy = this;
      u->gen = g.get();
      u->route = &state;
      u->settings = &state.settings;
      // The same route and URL as before a reload: its counters go on. A
      // URL listed more than once is matched listing by listing.
      const auto listing = static_cast<size_t>(std::count_if(
          r.upstreams.data(), &a, [&](const auto &other) { return other.text == a.text; }));
      const Upstream *before = nullptr;
      for (size_t j = 0; cur_ && !before && j < cur_->routes.size(); ++j) {
        if (cur_->cfg->routes[j].prefix != r.prefix) continue;
        size_t seen = 0;
        for (const Upstream *old : cur_->routes[j].upstreams) {
          if (old->addr.text == a.text && seen++ == listing) {
            before = old;
            break;
          }
        }
      }
      if (before) {
        u->stats = before->stats; // shared: the old generation's requests count on too
        u->load = before->load; // its connections and requests in flight count on
        u->load->current = u.get();
      }
      if (!cfg->health_check_path.empty()) {
        u->probe = std::make_unique<HealthProbe>(loop_, u->addr, cfg->health_check_path,
                                                 cfg->health_interval_ns, cfg->health_timeout_ns,
                                                 *u->stats, *u);
        // Nor does a failed check's verdict: out until a check passes.
        if (before && before->probe && before->probe->failing()) u->probe->assume_failing();
      }
      state.upstreams.push_back(u.get());
      g->upstreams.push_back(std::move(u));
    }
  }
  g->cfg = std::move(cfg);
  return g;
}

int Proxy::match_path(std::string_view target) const {
  const ProxyRoute *r = cfg_->match(path_only(target));
  return r ? static_cast<int>(r - cfg_->routes.data()) : -1;
}

void Proxy::reconfigure(std::shared_ptr<const ProxyConfig> cfg) {
  auto g = build(cfg);
  // Requests waiting for a connection wait on in the new route of their
  // prefix, in their order and ahead of any new request, and the new
  // upstreams serve them. A prefix the reload removed keeps its old ones.
  for (size_t i = 0; i < cur_->routes.size(); ++i) {
    auto &from = cur_->routes[i];
    if (from.waiting == 0) continue;
    const auto &prefix = cfg_->routes[i].prefix;
    auto same = std::find_if(cfg->routes.begin(), cfg->routes.end(),
                             [&](const ProxyRoute &r) { return r.prefix == prefix; });
    if (same == cfg->routes.end()) continue;
    auto &to = g->routes[static_cast<size_t>(same - cfg->routes.begin())];
    while (ProxyExchange *ex = from.wait_first) {
      ex->move_to(*g, to);
      stats_.proxy_waiters_moved += 1;
    }
    serve_soon(to);
  }
  cur_->retired = true;
  // Pooled connections to the old upstreams would never be used again,
  // nor would checks of them (the new upstreams have their own).
  for (auto &u : cur_->upstreams) {
    while (!u->idle.empty()) u->idle.back()->close();
    if (u->probe) u->probe->stop();
  }
  retired_.push_back(std::move(cur_));
  cur_ = std::move(g);
  cfg_ = std::move(cfg);
  stats_.proxy_reconfigured += 1;
}

Proxy::~Proxy() {
  // Sessions (and their exchanges) are gone; close what is pooled.
  while (!conns_.empty()) conns_.back()->close();
  dead_.clear();
}

std::vector<std::string> Proxy::upstream_names(const ProxyConfig &cfg) {
  std::vector<std::string> names;
  for (const auto &r : cfg.routes) {
    for (const auto &a : r.upstreams) names.push_back(r.prefix + "=" + a.text);
  }
  return names;
}

std::unique_ptr<ProxyExchange> Proxy::start(int route, Request &req, bool body_follows,
                                            const Client &client, ProxyListener *listener,
                                            void *tag, BudgetAccount *budget) {
  stats_.proxy_requests += 1;
  char ip[INET6_ADDRSTRLEN] = "unknown";
  bool trusted = false;
  if (client.peer) {
    const auto &a = *client.peer;
    if (a.family() == AF_INET) {
      inet_ntop(AF_INET, &a.u.in.sin_addr, ip, sizeof(ip));
    } else if (a.family() == AF_INET6) {
      if (IN6_IS_ADDR_V4MAPPED(&a.u.in6.sin6_addr)) {
        inet_ntop(AF_INET, a.u.in6.sin6_addr.s6_addr + 12, ip, sizeof(ip));
      } else {
        inet_ntop(AF_INET6, &a.u.in6.sin6_addr, ip, sizeof(ip));
      }
    }
    if (client.peer_proven) {
      for (const auto &c : cfg_->trusted) trusted |= c.contains(a);
    }
  }
  ForwardContext ctx;
  ctx.client_ip = ip;
  ctx.proto = client.tls ? "https" : "http";
  ctx.early = client.early;
  ctx.trusted = trusted;
  ctx.forwarded_headers = cfg_->forwarded_headers;
  ctx.via = cfg_->via;
  // The client's content-length frames the body upstream too; without one
  // a body goes chunked. A length that is no number, or that promises a
  // body which cannot follow, makes the request unforwardable (400).
  bool framable = true;
  const bool tunnel = !client.upgrade.empty();
  if (tunnel) {
    // The client's bytes go up only after the upstream's 101, as they are.
    ctx.framing = RequestFraming::tunnel;
    ctx.upgrade = client.upgrade;
    framable = !body_follows;
  } else if (const std::string *cl = req.find("content-length")) {
    const char *end = cl->data() + cl->size();
    auto r = std::from_chars(cl->data(), end, ctx.content_length);
    framable = !cl->empty() && r.ec == std::errc() && r.ptr == end &&
               (body_follows || ctx.content_length == 0);
    ctx.framing = RequestFraming::length;
  } else if (body_follows) {
    ctx.framing = RequestFraming::chunked;
  }
  // A path that leaves its prefix once resolved is not forwarded (400).
  if (has_dot_segment(path_only(req.path))) framable = false;
  std::string head = take_head();
  if (!framable || !build_upstream_request(req, ctx, head)) head.clear();
  auto ex = std::make_unique<ProxyExchange>(*this, static_cast<size_t>(route), req,
                                            std::move(head), ctx.framing, ctx.content_length,
                                            listener, tag, budget);
  if (!body_follows && framable && !tunnel) ex->end_body();
  ex->begin();
  return ex;
}

bool Proxy::full(const Upstream &u) {
  return u.load->conns >= u.settings->max_conns_per_upstream && u.idle.empty();
}

Upstream *Proxy::pick(ProxyRouteState &route, bool need_room) {
  auto &list = route.upstreams;
  const size_t n = list.size();
  const uint64_t now = loop_.now();
  Upstream *best = nullptr;
  size_t best_at = 0;
  bool any_up = false;
  for (size_t i = 0; i < n; ++i) {
    size_t at = (route.next + i) % n;
    Upstream *u = list[at];
    if (u->held_down(now)) continue;
    any_up = true;
    if (need_room && full(*u)) continue;
    if (route.settings.balancing == Balancing::round_robin) {
      best = u;
      best_at = at;
      break;
    }
    if (!best || u->load->outstanding < best->load->outstanding) {
      best = u;
      best_at = at;
    }
  }
  if (!best && !any_up) {
    // Every upstream is held down. Passive health is a guess from one
    // failure (a connect that timed out in a burst, a reset): with
    // nowhere else to go, the one whose back-off ends first is tried
    // rather than refusing the route for seconds. An upstream failing its
    // active health check stays out.
    for (size_t at = 0; at < n; ++at) {
      Upstream *u = list[at];
      if (u->probe && u->probe->failing()) continue;
      if (need_room && full(*u)) continue;
      if (!best || u->down_until < best->down_until) {
        best = u;
        best_at = at;
      }
    }
    if (best) stats_.proxy_tried_while_down += 1;
  }
  if (best) route.next = (best_at + 1) % n;
  return best;
}

Upstream *Proxy::pick_route(size_t i) {
  return i < cur_->routes.size() ? pick(cur_->routes[i]) : nullptr;
}

UpstreamConn *Proxy::connect(Upstream &u, bool fresh_only, bool &reused, bool &pool_full,
                             bool &local_error) {
  while (!fresh_only && !u.idle.empty()) {
    UpstreamConn *c = u.idle.back();
    if (c->reusable()) {
      reused = true;
      return c;
    }
    c->close(); // out of the idle list
  }
  if (u.load->conns >= u.settings->max_conns_per_upstream) {
    // Pooled ones first make room for a fresh one.
    if (!u.idle.empty()) {
      u.idle.front()->close();
    } else {
      pool_full = true;
      return nullptr;
    }
  }
  conns_.push_back(std::make_unique<UpstreamConn>(*this, u));
  UpstreamConn *c = conns_.back().get();
  c->index = conns_.size() - 1;
  if (!c->open()) {
    local_error = local_connect_error(errno);
    conns_.pop_back();
    return nullptr;
  }
  return c;
}

void Proxy::mark_down(Upstream &u) {
  u.fails += 1;
  uint64_t factor = 1ull << std::min(u.fails - 1, 5u);
  u.down_until = loop_.now() + cfg_->down_backoff_ns * factor;
  u.stats->marked_down += 1;
}

void Proxy::mark_up(Upstream &u) {
  u.fails = 0;
  u.down_until = 0;
}

void Proxy::pool(UpstreamConn &c) {
  Upstream &u = c.upstream();
  // The oldest waiting request takes it as it is (warm, no connect);
  // unless the upstream fails its health check, which gives it no request
  // (a passive back-off does not hold: this answer just came whole).
  const bool failing = u.probe && u.probe->failing();
  if (!failing && ProxyExchange::first_waiting(*u.route)) {
    // Handed on in the pass its answer ended: nothing may be behind it.
    // If something is, it closes and the waiting request gets a fresh one.
    if (!c.quiet()) return c.close();
    while (ProxyExchange *ex = ProxyExchange::first_waiting(*u.route)) {
      if (ex->dequeued(u, &c)) return;
    }
  }
  if (u.gen->retired || u.idle.size() >= u.settings->max_idle_per_upstream) return c.close();
  c.make_idle(u.settings->idle_timeout_ns);
}

void Proxy::capacity_freed(Upstream &u) {
  // A connection of a replaced configuration makes room for the new one's
  // upstream of the same route and URL.
  serve_soon(u.load->current ? *u.load->current->route : *u.route);
}

void Proxy::serve_soon(ProxyRouteState &route) {
  // Served from the loop's timers, not from here: a connection closes,
  // a request arrives, a probe ends, in the middle of an exchange's or a
  // session's own work.
  if (route.waiting == 0) return;
  if (serve_timer_.scheduled() && serve_timer_.expiry() <= loop_.now()) return;
  loop_.timers().schedule(serve_timer_, loop_.now());
}

// Requests still wait while an upstream with room sits out a passive
// back-off: they are served when it ends, not only when a connection of
// another frees (which may take as long as that one's slowest answer).
void Proxy::serve_at_backoff_end(const ProxyRouteState &route) {
  const uint64_t now = loop_.now();
  uint64_t at = UINT64_MAX;
  for (const Upstream *u : route.upstreams) {
    if (u->down_until > now && !(u->probe && u->probe->failing()) && !full(*u)) {
      at = std::min(at, u->down_until);
    }
  }
  if (at == UINT64_MAX) return;
  if (!serve_timer_.scheduled() || serve_timer_.expiry() > at) {
    loop_.timers().schedule(serve_timer_, at);
  }
}

bool Proxy::checked_out(const ProxyRouteState &route) {
  return std::all_of(route.upstreams.begin(), route.upstreams.end(),
                     [](const Upstream *u) { return u->probe && u->probe->failing(); });
}

void Proxy::serve_fired(dataplane::Timer &t) {
  auto *p = static_cast<Proxy *>(t.owner());
  p->serve_queues(*p->cur_);
  for (auto &g : p->retired_) p->serve_queues(*g);
}

void Proxy::serve_queues(ProxyGeneration &g) {
  for (auto &route : g.routes) {
    while (ProxyExchange *ex = ProxyExchange::first_waiting(route)) {
      if (Upstream *u = pick(route, true)) {
        ex->dequeued(*u, nullptr); // it may fail, or wait again
        continue;
      }
      // No room anywhere. Unless every upstream fails its health check
      // (then pick() has nothing for a new request either), they wait.
      if (!checked_out(route)) {
        serve_at_backoff_end(route);
        break;
      }
      ex->no_upstream();
    }
  }
}

void Proxy::closed(UpstreamConn &c) {
  // Swap with the last and pop: O(1) however many connections are open.
  const size_t at = c.index;
  if (at >= conns_.size() || conns_[at].get() != &c) return;
  c.index = SIZE_MAX;
  dead_.push_back(std::move(conns_[at]));
  if (at + 1 != conns_.size()) {
    conns_[at] = std::move(conns_.back());
    conns_[at]->index = at;
  }
  conns_.pop_back();
}

void Proxy::end_of_pass() {
  dead_.clear();
  if (!retired_.empty()) {
    std::erase_if(retired_, [](const std::unique_ptr<ProxyGeneration> &g) { return g->users == 0; });
  }
}

std::unique_ptr<uint8_t[]> Proxy::take_window() {
  if (windows_.empty()) return std::make_unique<uint8_t[]>(ProxyExchange::WINDOW);
  auto w = std::move(windows_.back());
  windows_.pop_back();
  return w;
}

void Proxy::give_window(std::unique_ptr<uint8_t[]> w) {
  // A few are kept for reuse; a burst's worth is given back to malloc.
  if (windows_.size() < 64) windows_.push_back(std::move(w));
}

void Proxy::reuse_headers(HeaderList &h) {
  if (header_lists_.empty() || h.slots() > 0) return;
  auto &spare = header_lists_.back();
  h = std::move(spare.list);
  header_bytes_ -= spare.bytes;
  header_lists_.pop_back();
}

void Proxy::recycle_headers(HeaderList &h) {
  // As many as the responses in flight use, up to a bound in bytes (what
  // an upstream sends decides how big a list is): past it, freed.
  h.trim();
  if (h.slots() == 0) return;
  const size_t bytes = h.retained_bytes();
  if (header_bytes_ + bytes > MAX_SPARE_HEADER_BYTES) return;
  header_bytes_ += bytes;
  header_lists_.push_back({std::move(h), bytes});
}

std::string Proxy::take_head() {
  if (heads_.empty()) {
    std::string head;
    head.reserve(HEAD_RESERVE);
    return head;
  }
  std::string head = std::move(heads_.back());
  heads_.pop_back();
  head_bytes_ -= head.capacity();
  return head;
}

void Proxy::give_head(std::string &&head) {
  // As many as the exchanges in flight use, each no larger than a common
  // head (a client's long fields make one long head, not a pool of them),
  // up to a bound in bytes.
  const size_t bytes = head.capacity();
  if (bytes < HEAD_RESERVE || bytes > MAX_SPARE_HEAD ||
      head_bytes_ + bytes > MAX_SPARE_HEAD_BYTES) {
    return;
  }
  head.clear();
  head_bytes_ += bytes;
  heads_.push_back(std::move(head));
}

void Proxy::upstream_stats(std::vector<UpstreamStats> &out) const {
  const uint64_t now = loop_.now();
  for (const auto &u : cur_->upstreams) {
    UpstreamStats s = *u->stats;
    s.idle_connections = u->idle.size();
    s.busy_connections = u->load->conns - u->idle.size();
    s.outstanding = u->load->outstanding;
    s.down = u->held_down(now) ? 1 : 0;
    out.push_back(s);
  }
}

} // namespace xdpq::http
