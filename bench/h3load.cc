// h3load: an HTTP/3 load generator on ngtcp2 + nghttp3 + GnuTLS, because
// Debian's h2load has no HTTP/3. h2load's flags where they apply and h2load's
// summary on stdout; --json for machine-readable results.
//
// One event loop per thread, many connections per thread, one connected UDP
// socket per connection: recvmmsg on receive, UDP GSO on send.
//
// One file (about 800 lines) on purpose: a standalone tool whose options,
// connection state machine and report are read together; nothing in it is
// reused elsewhere.

#include "dataplane/event_loop.h"
#include "http/h3_client.h"

#include <arpa/inet.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <netinet/udp.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xdpq_version.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

namespace {

using xdpq::dataplane::monotonic_ns;

struct Uri {
  std::string host; // numeric address
  std::string port;
  std::string authority;
  std::string path;
};

struct Config {
  uint64_t requests = 1;   // -n
  int clients = 1;         // -c
  int streams = 1;         // -m
  int threads = 1;         // -t
  double duration = 0;     // -D seconds (overrides -n)
  double warmup = 0;       // --warm-up-time seconds
  bool json = false;
  bool conn_per_request = false; // --new-connection-per-request
  double timeout = 10;     // seconds without progress before a connection fails
  std::vector<Uri> uris;
};

struct Stats {
  uint64_t started = 0, done = 0, succeeded = 0, failed = 0, errored = 0, timeout = 0;
  uint64_t status[6] = {};
  uint64_t bytes_total = 0; // UDP payload received
  uint64_t bytes_body = 0;
  uint64_t connections = 0, connect_failures = 0;
  uint64_t retried = 0; // refused unprocessed (H3_REQUEST_REJECTED) and sent again
  std::vector<uint32_t> request_us, ttfb_us, connect_us;
  std::string server_cert_sha256; // of the first handshake

  void merge(const Stats &o) {
    if (server_cert_sha256.empty()) server_cert_sha256 = o.server_cert_sha256;
    started += o.started; done += o.done; succeeded += o.succeeded; failed += o.failed;
    errored += o.errored; timeout += o.timeout;
    for (int i = 0; i < 6; ++i) status[i] += o.status[i];
    bytes_total += o.bytes_total; bytes_body += o.bytes_body;
    connections += o.connections; connect_failures += o.connect_failures;
    retried += o.retried;
    request_us.insert(request_us.end(), o.request_us.begin(), o.request_us.end());
    ttfb_us.insert(ttfb_us.end(), o.ttfb_us.begin(), o.ttfb_us.end());
    connect_us.insert(connect_us.end(), o.connect_us.begin(), o.connect_us.end());
  }
};

// Shared across threads: the request budget and the clock window.
struct Run {
  Config cfg;
  std::atomic<int64_t> remaining{0};
  uint64_t start_ns = 0, measure_from_ns = 0, end_ns = 0; // end_ns 0: by count
  std::atomic<bool> stop{false};

  bool take() {
    if (stop.load(std::memory_order_relaxed)) return false;
    if (end_ns) return monotonic_ns() < end_ns;
    if (remaining.fetch_sub(1, std::memory_order_relaxed) > 0) return true;
    remaining.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // A request the server did not process goes back to the budget.
  void give_back() {
    if (!end_ns) remaining.fetch_add(1, std::memory_order_relaxed);
  }
  bool measuring(uint64_t now) const { return now >= measure_from_ns; }
};

class Worker;

class Conn final : public xdpq::dataplane::FdHandler, public xdpq::http::H3ClientConn::Events {
public:
  Conn(Worker &w, const Uri &uri);
  ~Conn();
  bool start();
  void on_io(uint32_t) override;
  bool closed() const { return closed_; }

  // H3ClientConn::Events
  int on_handshake_completed() override;
  void on_goaway(int64_t id) override;
  int on_header(int64_t sid, std::string_view name, std::string_view value) override;
  int on_body(int64_t sid, const uint8_t *, size_t n) override;
  int on_stream_close(int64_t sid, uint64_t code) override;
  int on_end_stream(int64_t sid) override;
  int on_extend_max_streams() override;

private:
  struct Req {
    uint64_t start = 0, first_byte = 0;
    int status = 0;
    bool measured = false;
    bool complete = false; // response fully received (end of stream)
  };
  void complete(int64_t sid, bool ok);
  static void timer_cb(xdpq::dataplane::Timer &t) { static_cast<Conn *>(t.owner())->on_timer(); }
  void on_timer();
  void submit_more();
  void write();
  void send_batch(const uint8_t *data, size_t len, size_t seg);
  void fail_all(bool timeout);
  void finish();
  void update_timer();

  Worker &w_;
  Uri uri_;
  int fd_ = -1;
  sockaddr_storage local_{}, remote_{};
  socklen_t local_len_ = 0, remote_len_ = 0;
  std::unique_ptr<xdpq::http::H3ClientConn> h3c_;
  xdpq::dataplane::Timer timer_;
  std::map<int64_t, Req> reqs_;
  uint64_t started_at_ = 0, last_progress_ = 0;
  int done_here_ = 0;
  bool handshake_ = false, closed_ = false, draining_ = false;
  bool goaway_ = false; // the server sent GOAWAY
  bool finish_wanted_ = false; // close politely at the next write()
  uint64_t last_ts_ = 0;
  // ngtcp2 requires timestamps that never go back.
  uint64_t ts() {
    uint64_t t = monotonic_ns();
    if (t < last_ts_) t = last_ts_;
    return last_ts_ = t;
  }
  std::vector<uint8_t> txbuf_;
};

class Worker final : public xdpq::dataplane::LoopHandler {
public:
  Worker(Run &run, int clients, gnutls_certificate_credentials_t cred)
      : run_(run), clients_(clients), cred_(cred) {}
  void run_thread();
  void on_iteration_end() override;
  void on_wake() override {}
  Run &run() { return run_; }
  Stats &stats() { return stats_; }
  xdpq::dataplane::EventLoop &loop() { return loop_; }
  gnutls_certificate_credentials_t cred() const { return cred_; }
  void conn_done(Conn *c) { dead_.push_back(c); }

private:
  void spawn();
  Run &run_;
  int clients_;
  gnutls_certificate_credentials_t cred_;
  xdpq::dataplane::EventLoop loop_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Conn *> dead_;
  Stats stats_;
  size_t next_uri_ = 0;
  bool stopping_ = false;
  friend class Conn;
};

Conn::Conn(Worker &w, const Uri &uri) : w_(w), uri_(uri), timer_(timer_cb, this) {
  txbuf_.resize(64 * 1500);
}

Conn::~Conn() {
  w_.loop().timers().cancel(timer_);
  if (fd_ >= 0) {
    w_.loop().unwatch(fd_);
    close(fd_);
  }
}

bool Conn::start() {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  if (getaddrinfo(uri_.host.c_str(), uri_.port.c_str(), &hints, &res) != 0) return false;
  std::memcpy(&remote_, res->ai_addr, res->ai_addrlen);
  remote_len_ = res->ai_addrlen;
  fd_ = socket(res->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int rv = fd_ < 0 ? -1 : connect(fd_, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rv != 0) return false;
  int buf = 4 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  local_len_ = sizeof(local_);
  getsockname(fd_, reinterpret_cast<sockaddr *>(&local_), &local_len_);

  xdpq::http::H3ClientConn::Options o;
  o.path = {{reinterpret_cast<sockaddr *>(&local_), local_len_},
            {reinterpret_cast<sockaddr *>(&remote_), remote_len_},
            nullptr};
  o.now = monotonic_ns();
  o.cred = w_.cred();
  o.max_window = 64 << 20;
  o.max_stream_window = 16 << 20;
  try {
    h3c_ = std::make_unique<xdpq::http::H3ClientConn>(o, *this);
  } catch (const std::exception &) {
    return false;
  }
  w_.loop().watch(fd_, this);
  started_at_ = last_progress_ = monotonic_ns();
  w_.stats().connections += 1;
  write();
  return true;
}

int Conn::on_handshake_completed() {
  handshake_ = true;
  if (w_.stats().server_cert_sha256.empty()) {
    unsigned int n = 0;
    const gnutls_datum_t *certs = gnutls_certificate_get_peers(h3c_->tls(), &n);
    if (certs && n > 0) {
      unsigned char md[32];
      size_t mdlen = sizeof(md);
      if (gnutls_fingerprint(GNUTLS_DIG_SHA256, &certs[0], md, &mdlen) == 0) {
        static constexpr char H[] = "0123456789ABCDEF";
        for (size_t i = 0; i < mdlen; ++i) {
          if (i) w_.stats().server_cert_sha256 += ':';
          w_.stats().server_cert_sha256 += H[md[i] >> 4];
          w_.stats().server_cert_sha256 += H[md[i] & 15];
        }
      }
    }
  }
  uint64_t now = monotonic_ns();
  if (w_.run().measuring(now)) {
    w_.stats().connect_us.push_back(static_cast<uint32_t>((now - started_at_) / 1000));
  }
  submit_more();
  return 0;
}

int Conn::on_extend_max_streams() {
  submit_more();
  return 0;
}

void Conn::submit_more() {
  const auto &cfg = w_.run().cfg;
  while (!draining_ && !goaway_ && static_cast<int>(reqs_.size()) < cfg.streams &&
         ngtcp2_conn_get_streams_bidi_left(h3c_->conn()) > 0) {
    if (cfg.conn_per_request && done_here_ + static_cast<int>(reqs_.size()) >= 1) break;
    if (!w_.run().take()) {
      draining_ = true;
      break;
    }
    const Uri &u = cfg.uris[w_.next_uri_++ % cfg.uris.size()];
    auto nv = [](const char *n, const std::string &v) {
      return nghttp3_nv{reinterpret_cast<uint8_t *>(const_cast<char *>(n)),
                        reinterpret_cast<uint8_t *>(const_cast<char *>(v.data())), strlen(n),
                        v.size(), NGHTTP3_NV_FLAG_NONE};
    };
    static const std::string GET = "GET", HTTPS = "https", UA = "h3load";
    nghttp3_nv nva[] = {nv(":method", GET), nv(":scheme", HTTPS), nv(":authority", u.authority),
                        nv(":path", u.path), nv("user-agent", UA)};
    const int64_t sid = h3c_->submit_request(nva, false);
    if (sid < 0) {
      w_.run().give_back(); // taken, not sent
      break;
    }
    Req &r = reqs_[sid];
    r.start = monotonic_ns();
    r.measured = w_.run().measuring(r.start);
    if (r.measured) w_.stats().started += 1;
  }
  if ((draining_ || goaway_) && reqs_.empty()) finish_wanted_ = true;
}

int Conn::on_header(int64_t sid, std::string_view name, std::string_view value) {
  auto it = reqs_.find(sid);
  if (it == reqs_.end()) return 0;
  if (name == ":status") {
    it->second.status = std::atoi(std::string(value).c_str());
    if (!it->second.first_byte) it->second.first_byte = monotonic_ns();
  }
  return 0;
}

int Conn::on_body(int64_t sid, const uint8_t *, size_t n) {
  if (reqs_.count(sid) && reqs_[sid].measured) w_.stats().bytes_body += n;
  last_progress_ = monotonic_ns();
  return 0;
}

// A request is done when its response ends (HTTP/3 end of stream), not
// when QUIC closes the stream: that also waits for the peer to acknowledge
// our FIN, which adds up to its max_ack_delay to every measurement.
int Conn::on_end_stream(int64_t sid) {
  complete(sid, true);
  return 0;
}

int Conn::on_stream_close(int64_t sid, uint64_t code) {
  if (code == NGHTTP3_H3_REQUEST_REJECTED) {
    // Not processed (RFC 9114 4.1.1): it is retried on another connection.
    auto it = reqs_.find(sid);
    if (it != reqs_.end()) {
      if (it->second.measured) w_.stats().started -= 1;
      reqs_.erase(it);
      w_.run().give_back();
      w_.stats().retried += 1;
      goaway_ = true;
      if (reqs_.empty()) finish_wanted_ = true;
      return 0;
    }
  }
  complete(sid, code == NGHTTP3_H3_NO_ERROR);
  return 0;
}

void Conn::on_goaway(int64_t id) {
  goaway_ = true;
  // Requests at or above the GOAWAY's id will not be processed (RFC 9114
  // 5.2): they go back to the budget for another connection.
  for (auto it = reqs_.begin(); it != reqs_.end();) {
    if (it->first >= id) {
      if (it->second.measured) w_.stats().started -= 1;
      w_.run().give_back();
      w_.stats().retried += 1;
      it = reqs_.erase(it);
    } else {
      ++it;
    }
  }
  if (reqs_.empty()) finish_wanted_ = true;
}

void Conn::complete(int64_t sid, bool ok) {
  auto it = reqs_.find(sid);
  if (it == reqs_.end()) return;
  Req r = it->second;
  reqs_.erase(it);
  auto &st = w_.stats();
  uint64_t now = monotonic_ns();
  if (r.measured) {
    st.done += 1;
    if (ok && r.status > 0) {
      if (r.status / 100 < 6) st.status[r.status / 100] += 1;
      st.request_us.push_back(static_cast<uint32_t>((now - r.start) / 1000));
      st.ttfb_us.push_back(static_cast<uint32_t>((r.first_byte - r.start) / 1000));
      // As in h2load: a 4xx or 5xx completed, but it did not succeed.
      if (r.status < 400) {
        st.succeeded += 1;
      } else {
        st.failed += 1;
      }
    } else {
      st.failed += 1;
    }
  }
  ++done_here_;
  last_progress_ = now;
  if (w_.run().cfg.conn_per_request && reqs_.empty()) {
    finish_wanted_ = true; // not from inside ngtcp2's read: write() closes
  } else {
    submit_more();
  }
}

void Conn::fail_all(bool is_timeout) {
  auto &st = w_.stats();
  for (auto &[sid, r] : reqs_) {
    if (!r.measured) continue;
    st.done += 1;
    st.errored += 1;
    if (is_timeout) st.timeout += 1;
  }
  reqs_.clear();
  if (!handshake_) st.connect_failures += 1;
  closed_ = true;
  w_.conn_done(this);
}

void Conn::finish() {
  if (closed_) return;
  // Close politely so the server frees the connection at once.
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  ngtcp2_ccerr ce;
  ngtcp2_ccerr_default(&ce);
  ngtcp2_ccerr_set_application_error(&ce, NGHTTP3_H3_NO_ERROR, nullptr, 0);
  auto n = ngtcp2_conn_write_connection_close(h3c_->conn(), &ps.path, &pi, txbuf_.data(), 1452, &ce,
                                              ts());
  if (n > 0) [[maybe_unused]] auto s = ::send(fd_, txbuf_.data(), static_cast<size_t>(n), 0);
  closed_ = true;
  w_.conn_done(this);
}

void Conn::on_io(uint32_t) {
  if (closed_) return;
  constexpr int BATCH = 32;
  static thread_local std::vector<uint8_t> buf(BATCH * 65536);
  mmsghdr msgs[BATCH];
  iovec iov[BATCH];
  for (;;) {
    for (int i = 0; i < BATCH; ++i) {
      iov[i] = {buf.data() + i * 65536, 65536};
      msgs[i].msg_hdr = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(fd_, msgs, BATCH, MSG_DONTWAIT, nullptr);
    if (n <= 0) break;
    uint64_t now = ts();
    ngtcp2_path path{{reinterpret_cast<sockaddr *>(&local_), local_len_},
                     {reinterpret_cast<sockaddr *>(&remote_), remote_len_},
                     nullptr};
    for (int i = 0; i < n; ++i) {
      if (w_.run().measuring(now)) w_.stats().bytes_total += msgs[i].msg_len;
      ngtcp2_pkt_info pi{};
      int rv = h3c_->read_packet(path, pi, static_cast<uint8_t *>(iov[i].iov_base),
                                 msgs[i].msg_len, now);
      if (rv != 0) {
        fail_all(false);
        return;
      }
      if (finish_wanted_) break; // the rest of the batch is for a connection we close
    }
    last_progress_ = now;
    if (closed_) return;
    if (finish_wanted_) break;
  }
  write();
}

void Conn::send_batch(const uint8_t *data, size_t len, size_t seg) {
  iovec iov{const_cast<uint8_t *>(data), len};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(uint16_t))] = {};
  if (len > seg) {
    h.msg_control = cbuf;
    h.msg_controllen = sizeof(cbuf);
    cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = IPPROTO_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t s = static_cast<uint16_t>(seg);
    std::memcpy(CMSG_DATA(c), &s, sizeof(s));
  }
  [[maybe_unused]] auto r = sendmsg(fd_, &h, MSG_DONTWAIT);
}

void Conn::write() {
  if (closed_) return;
  if (finish_wanted_) return finish();
  const uint64_t now = ts();
  size_t off = 0, seg = 0;
  for (int pkts = 0; pkts < 64;) {
    ngtcp2_pkt_info pi{};
    auto n = h3c_->write_packet(txbuf_.data() + off, 1452, pi, now);
    if (n < 0) return fail_all(false);
    if (n == 0) break;
    // A packet of another size ends the GSO train.
    if (seg && static_cast<size_t>(n) != seg) {
      send_batch(txbuf_.data(), off, seg);
      std::memmove(txbuf_.data(), txbuf_.data() + off, static_cast<size_t>(n));
      off = 0;
      seg = 0;
    }
    if (!seg) seg = static_cast<size_t>(n);
    off += static_cast<size_t>(n);
    ++pkts;
  }
  if (off) send_batch(txbuf_.data(), off, seg);
  h3c_->written(now);
  update_timer();
}

void Conn::update_timer() {
  auto e = ngtcp2_conn_get_expiry(h3c_->conn());
  uint64_t limit = last_progress_ + static_cast<uint64_t>(w_.run().cfg.timeout * 1e9);
  w_.loop().timers().schedule(timer_, std::min<uint64_t>(e, limit));
}

void Conn::on_timer() {
  if (closed_) return;
  uint64_t now = ts();
  if (now >= last_progress_ + static_cast<uint64_t>(w_.run().cfg.timeout * 1e9)) {
    return fail_all(true);
  }
  if (ngtcp2_conn_handle_expiry(h3c_->conn(), now) != 0) return fail_all(false);
  write();
}

void Worker::spawn() {
  const auto &cfg = run_.cfg;
  auto c = std::make_unique<Conn>(*this, cfg.uris[next_uri_ % cfg.uris.size()]);
  if (!c->start()) {
    stats_.connect_failures += 1;
    return;
  }
  conns_.push_back(std::move(c));
}

void Worker::on_iteration_end() {
  for (Conn *d : dead_) {
    auto it = std::find_if(conns_.begin(), conns_.end(), [d](auto &p) { return p.get() == d; });
    if (it != conns_.end()) conns_.erase(it);
  }
  bool replaced = !dead_.empty();
  size_t died = dead_.size();
  dead_.clear();
  // Keep -c connections busy while requests remain (always, in
  // new-connection-per-request mode).
  if (replaced && !run_.stop.load()) {
    for (size_t i = 0; i < died && static_cast<int>(conns_.size()) < clients_; ++i) {
      bool more = run_.end_ns ? monotonic_ns() < run_.end_ns
                              : run_.remaining.load(std::memory_order_relaxed) > 0;
      if (!more) break;
      spawn();
    }
  }
  if (run_.end_ns && monotonic_ns() >= run_.end_ns + 2'000'000'000ull) run_.stop.store(true);
  if (conns_.empty() || run_.stop.load()) loop_.stop();
}

void Worker::run_thread() {
  for (int i = 0; i < clients_; ++i) spawn();
  if (conns_.empty()) return;
  // A timer so duration runs end even when idle.
  xdpq::dataplane::Timer tick([](xdpq::dataplane::Timer &) {}, nullptr);
  struct Tick {
    static void fire(xdpq::dataplane::Timer &t) {
      auto *w = static_cast<Worker *>(t.owner());
      w->loop().timers().schedule(t, monotonic_ns() + 100'000'000);
    }
  };
  tick.set_callback(Tick::fire, this);
  loop_.timers().schedule(tick, monotonic_ns() + 100'000'000);
  loop_.run(*this);
}

// ---- output ----------------------------------------------------------------

double pct(std::vector<uint32_t> &v, double p) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(std::ceil(p / 100.0 * v.size())) - 1;
  return v[std::min(i, v.size() - 1)];
}

std::string fmt_us(double us) {
  char b[32];
  if (us >= 1e6) snprintf(b, sizeof(b), "%.2fs", us / 1e6);
  else if (us >= 1e3) snprintf(b, sizeof(b), "%.2fms", us / 1e3);
  else snprintf(b, sizeof(b), "%.0fus", us);
  return b;
}

std::string fmt_bytes(double b) {
  char s[32];
  if (b >= 1 << 30) snprintf(s, sizeof(s), "%.2fGB", b / (1 << 30));
  else if (b >= 1 << 20) snprintf(s, sizeof(s), "%.2fMB", b / (1 << 20));
  else if (b >= 1 << 10) snprintf(s, sizeof(s), "%.2fKB", b / (1 << 10));
  else snprintf(s, sizeof(s), "%.0fB", b);
  return s;
}

struct Summary {
  double min, max, mean, sd, within_sd, p50, p90, p99, p999;
};

Summary summarize(std::vector<uint32_t> &v) {
  Summary s{};
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (auto x : v) sum += x;
  s.mean = sum / v.size();
  double var = 0;
  for (auto x : v) var += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(var / v.size());
  size_t within = 0;
  for (auto x : v) within += std::fabs(x - s.mean) <= s.sd;
  s.within_sd = 100.0 * within / v.size();
  s.min = v.front();
  s.max = v.back();
  s.p50 = pct(v, 50);
  s.p90 = pct(v, 90);
  s.p99 = pct(v, 99);
  s.p999 = pct(v, 99.9);
  return s;
}

void usage() {
  std::puts(R"(Usage: h3load [OPTIONS] URI...
HTTP/3 load generator (h2load's flags where they apply).

  -n, --requests N     total requests (default 1)
  -c, --clients N      concurrent connections (default 1)
  -m, --max-concurrent-streams N   requests in flight per connection (default 1)
  -t, --threads N      threads (default 1)
  -D, --duration S     run for S seconds instead of -n
  --warm-up-time S     with -D: ignore the first S seconds
  --new-connection-per-request   one request per connection (handshakes/s)
  --timeout S          fail a connection after S seconds without progress (10)
  --json               machine-readable results on stdout
  --version            print the version
  -h, --help

URIs: https://HOST:PORT/path with a numeric HOST (IPv6 in brackets).)");
}

bool parse_uri(const std::string &s, Uri &u) {
  if (s.rfind("https://", 0) != 0) return false;
  std::string rest = s.substr(8);
  auto slash = rest.find('/');
  std::string auth = slash == std::string::npos ? rest : rest.substr(0, slash);
  u.path = slash == std::string::npos ? "/" : rest.substr(slash);
  u.authority = auth;
  if (!auth.empty() && auth[0] == '[') {
    auto close = auth.find(']');
    if (close == std::string::npos) return false;
    u.host = auth.substr(1, close - 1);
    u.port = close + 2 <= auth.size() ? auth.substr(close + 2) : "443";
  } else {
    auto colon = auth.rfind(':');
    u.host = colon == std::string::npos ? auth : auth.substr(0, colon);
    u.port = colon == std::string::npos ? "443" : auth.substr(colon + 1);
  }
  return !u.host.empty();
}

} // namespace

int main(int argc, char **argv) {
  Run run;
  Config &cfg = run.cfg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "h3load: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "-n" || a == "--requests") cfg.requests = std::stoull(val());
      else if (a == "-c" || a == "--clients") cfg.clients = std::stoi(val());
      else if (a == "-m" || a == "--max-concurrent-streams") cfg.streams = std::stoi(val());
      else if (a == "-t" || a == "--threads") cfg.threads = std::stoi(val());
      else if (a == "-D" || a == "--duration") cfg.duration = std::stod(val());
      else if (a == "--warm-up-time") cfg.warmup = std::stod(val());
      else if (a == "--timeout") cfg.timeout = std::stod(val());
      else if (a == "--new-connection-per-request") cfg.conn_per_request = true;
      else if (a == "--json") cfg.json = true;
      else if (a == "-h" || a == "--help") { usage(); return 0; }
      else if (a == "--version") { std::printf("h3load %s\n", XDPQ_VERSION); return 0; }
      else if (!a.empty() && a[0] == '-') {
        std::fprintf(stderr, "h3load: unknown option %s (see --help)\n", a.c_str());
        return 2;
      } else {
        Uri u;
        if (!parse_uri(a, u)) {
          std::fprintf(stderr, "h3load: %s: expected https://HOST:PORT/path\n", a.c_str());
          return 2;
        }
        cfg.uris.push_back(u);
      }
    } catch (const std::exception &) {
      std::fprintf(stderr, "h3load: %s: bad number\n", a.c_str());
      return 2;
    }
  }
  if (cfg.uris.empty() || cfg.clients < 1 || cfg.streams < 1 || cfg.threads < 1) {
    usage();
    return 2;
  }
  if (cfg.threads > cfg.clients) cfg.threads = cfg.clients;
  gnutls_certificate_credentials_t cred;
  gnutls_certificate_allocate_credentials(&cred);

  run.remaining = static_cast<int64_t>(cfg.requests);
  run.start_ns = monotonic_ns();
  run.measure_from_ns = run.start_ns;
  if (cfg.duration > 0) {
    run.measure_from_ns = run.start_ns + static_cast<uint64_t>(cfg.warmup * 1e9);
    run.end_ns = run.measure_from_ns + static_cast<uint64_t>(cfg.duration * 1e9);
  }
  if (!cfg.json) {
    std::printf("starting benchmark...\n");
    std::printf("spawning thread #0: %d total client(s). %" PRIu64 " total requests\n",
                cfg.clients, cfg.requests);
  }
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < cfg.threads; ++t) {
    int n = cfg.clients / cfg.threads + (t < cfg.clients % cfg.threads ? 1 : 0);
    workers.push_back(std::make_unique<Worker>(run, n, cred));
  }
  std::vector<std::thread> threads;
  for (auto &w : workers) threads.emplace_back([&w] { w->run_thread(); });
  for (auto &t : threads) t.join();
  uint64_t end = monotonic_ns();
  uint64_t window = (run.end_ns ? std::min(end, run.end_ns) : end) - run.measure_from_ns;
  double secs = window / 1e9;
  Stats st;
  for (auto &w : workers) st.merge(w->stats());
  gnutls_certificate_free_credentials(cred);
  auto req = summarize(st.request_us);
  auto ttfb = summarize(st.ttfb_us);
  auto conn = summarize(st.connect_us);
  double rps = secs > 0 ? st.succeeded / secs : 0;
  if (cfg.json) {
    std::printf("{\"duration_s\":%.6f,\"requests\":{\"total\":%" PRIu64 ",\"started\":%" PRIu64
                ",\"done\":%" PRIu64 ",\"succeeded\":%" PRIu64 ",\"failed\":%" PRIu64
                ",\"errored\":%" PRIu64 ",\"timeout\":%" PRIu64 "},",
                secs, cfg.duration > 0 ? st.done : cfg.requests, st.started, st.done,
                st.succeeded, st.failed, st.errored, st.timeout);
    std::printf("\"status\":{\"2xx\":%" PRIu64 ",\"3xx\":%" PRIu64 ",\"4xx\":%" PRIu64
                ",\"5xx\":%" PRIu64 "},",
                st.status[2], st.status[3], st.status[4], st.status[5]);
    std::printf("\"req_per_s\":%.2f,\"bytes_per_s\":%.2f,\"bytes_total\":%" PRIu64
                ",\"bytes_body\":%" PRIu64 ",\"connections\":%" PRIu64
                ",\"connect_failures\":%" PRIu64 ",\"retried\":%" PRIu64 ",",
                rps, secs > 0 ? st.bytes_total / secs : 0, st.bytes_total, st.bytes_body,
                st.connections, st.connect_failures, st.retried);
    auto js = [](const char *name, const Summary &s, bool last) {
      std::printf("\"%s\":{\"min\":%.0f,\"max\":%.0f,\"mean\":%.1f,\"sd\":%.1f,\"p50\":%.0f,"
                  "\"p90\":%.0f,\"p99\":%.0f,\"p999\":%.0f}%s",
                  name, s.min, s.max, s.mean, s.sd, s.p50, s.p90, s.p99, s.p999, last ? "" : ",");
    };
    std::printf("\"server_cert_sha256\":\"%s\",", st.server_cert_sha256.c_str());
    std::printf("\"latency_us\":{");
    js("request", req, false);
    js("ttfb", ttfb, false);
    js("connect", conn, true);
    std::printf("}}\n");
  } else {
    std::printf("\nfinished in %s, %.2f req/s, %s/s\n", fmt_us(secs * 1e6).c_str(), rps,
                fmt_bytes(secs > 0 ? st.bytes_total / secs : 0).c_str());
    std::printf("requests: %" PRIu64 " total, %" PRIu64 " started, %" PRIu64 " done, %" PRIu64
                " succeeded, %" PRIu64 " failed, %" PRIu64 " errored, %" PRIu64 " timeout\n",
                cfg.duration > 0 ? st.done : cfg.requests, st.started, st.done, st.succeeded,
                st.failed, st.errored, st.timeout);
    std::printf("status codes: %" PRIu64 " 2xx, %" PRIu64 " 3xx, %" PRIu64 " 4xx, %" PRIu64
                " 5xx\n",
                st.status[2], st.status[3], st.status[4], st.status[5]);
    std::printf("traffic: %s (%" PRIu64 ") total, %s (%" PRIu64 ") data\n",
                fmt_bytes(st.bytes_total).c_str(), st.bytes_total, fmt_bytes(st.bytes_body).c_str(),
                st.bytes_body);
    std::printf("                     min         max         mean         sd        +/- sd\n");
    auto line = [](const char *name, const Summary &s) {
      std::printf("%-17s %9s   %9s   %9s   %9s   %7.2f%%\n", name, fmt_us(s.min).c_str(),
                  fmt_us(s.max).c_str(), fmt_us(s.mean).c_str(), fmt_us(s.sd).c_str(),
                  s.within_sd);
    };
    line("time for request:", req);
    line("time for connect:", conn);
    line("time to 1st byte:", ttfb);
    std::printf("percentiles      p50 %s, p90 %s, p99 %s, p99.9 %s (request)\n",
                fmt_us(req.p50).c_str(), fmt_us(req.p90).c_str(), fmt_us(req.p99).c_str(),
                fmt_us(req.p999).c_str());
    std::printf("                 p50 %s, p90 %s, p99 %s, p99.9 %s (time to 1st byte)\n",
                fmt_us(ttfb.p50).c_str(), fmt_us(ttfb.p90).c_str(), fmt_us(ttfb.p99).c_str(),
                fmt_us(ttfb.p999).c_str());
  }
  return st.errored + st.failed + st.connect_failures > 0 ? 1 : 0;
}
