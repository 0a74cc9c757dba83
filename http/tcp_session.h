#pragma once
// A protocol on a TCP connection (HTTP/2 or HTTP/1.1), fed with decrypted
// bytes and asked for bytes to send. The connection owns TLS, the socket and
// the timeouts; the session owns framing and the requests.

#include "base/clock.h"
#include "base/counters.h"
#include "dataplane/histogram.h"
#include "http/access_log.h"
#include "http/memory_budget.h"
#include "http/message.h"
#include "http/proxy.h"
#include "http/router.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xdpq::http {

struct TcpLimits {
  size_t max_header_size = 16384;    // enforced: 431
  size_t max_header_fields = 128;    // enforced: 431
  size_t max_request_body = 16u << 20; // 413
  // Request bodies and the responses made from them held per connection;
  // over it (or the worker's budget) a request is refused.
  size_t max_body_per_connection = 16u << 20;
  uint32_t max_concurrent_streams = 100;
  size_t max_pipelined = 32;         // HTTP/1.1 requests queued before reading pauses
  uint32_t max_protocol_errors = 100; // per connection, before GOAWAY (MadeYouReset class)
  uint32_t rst_burst = 100;          // nghttp2 incoming RST_STREAM rate limit
  uint32_t rst_rate = 33;
  size_t max_continuations = 8;
};

#define XDPQ_TCP_COUNTERS(X)                                                           \
  X(accepted, "TCP connections accepted")                                              \
  X(refused_conn_limit, "TCP connections refused: too many")                           \
  X(accept_paused, "accept() paused: out of descriptors or memory (EMFILE, ENFILE)")   \
  X(refused_no_resources, "TCP connections refused: no memory or epoll space for them")   \
  X(refused_source_limit, "TCP connections refused: the source holds its connection cap") \
  X(refused_source_rate, "TCP connections refused: the source connects too fast")      \
  X(tls_handshake_failed, "TLS handshakes that failed")                                \
  X(plaintext_on_tls, "plain-text clients on the TLS port (answered 400)")             \
  X(h2_connections, "HTTP/2 sessions")                                                 \
  X(h1_connections, "HTTP/1.1 sessions")                                               \
  X(requests, "HTTP/2 and HTTP/1.1 requests")                                          \
  X(responses_1xx, "TCP-side responses 1xx")                                           \
  X(responses_2xx, "TCP-side responses 2xx")                                           \
  X(responses_3xx, "TCP-side responses 3xx")                                           \
  X(responses_4xx, "TCP-side responses 4xx")                                           \
  X(responses_5xx, "TCP-side responses 5xx")                                           \
  X(header_limit_rejects, "requests refused with 431")                                 \
  X(body_limit_rejects, "requests refused with 413")                                   \
  X(body_budget_refusals, "requests refused: body budget of the connection or worker spent") \
  X(bad_requests, "malformed HTTP/1.1 requests (400)")                                 \
  X(continues_sent, "HTTP/1.1 100 Continue sent to requests that expected it")          \
  X(expectation_failures, "HTTP/1.1 requests refused with 417 (an Expect other than 100-continue)") \
  X(goaways_sent, "HTTP/2 GOAWAY frames sent")                                         \
  X(protocol_error_closes, "connections closed after too many client-caused errors")   \
  X(timeouts_handshake, "connections closed: TLS handshake deadline")                  \
  X(timeouts_headers, "connections closed: request headers deadline (slow client)")    \
  X(timeouts_idle, "connections closed: idle")                                         \
  X(timeouts_write, "connections closed: output stalled (client not reading)")         \
  X(closed, "TCP connections closed")                                                  \
  X(tls_writes, "TLS or socket writes")                                                \
  X(reads_capped, "reads that stopped at the records-per-event limit (tiny TLS records)") \
  X(bytes_in, "bytes received (decrypted)")                                            \
  X(bytes_out, "bytes sent (before encryption)")

struct TcpStats {
  XDPQ_COUNTER_FIELDS(XDPQ_TCP_COUNTERS)
  dataplane::Histogram request_latency; // request complete to response queued/closed
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_TCP_COUNTERS) }
  void count_response(int status) { count_status_class(*this, status); }
};

struct SessionEnv {
  std::shared_ptr<const Router> router;
  TcpLimits limits;
  TcpStats *stats = nullptr;
  MemoryBudget *budget = nullptr; // the worker's; null: per-connection limit only
  std::string alt_svc; // value of the alt-svc header; empty: none
  Proxy *proxy = nullptr; // the worker's reverse proxy; null: none configured
  AccessLogBuffer *access_log = nullptr; // the worker's; null: none
  const std::vector<Header> *response_headers = nullptr; // configured fields; null: none
};

// What a session may ask of the connection under it.
class SessionHost {
public:
  // Output became ready outside on_input() (a proxied response moved):
  // produce and write again, at the end of this pass.
  virtual void session_wake() = 0;
  // The client's address, or null if unknown.
  virtual const dataplane::Address *session_peer() const = 0;
  // The connection is TLS (not the cleartext benchmark port).
  virtual bool session_tls() const = 0;

protected:
  ~SessionHost() = default;
};

class TcpSession {
public:
  virtual ~TcpSession() = default;
  // The connection under the session (null in tests: nothing to wake).
  void set_host(SessionHost *h) { host_ = h; }
  // Consumes decrypted input; now_ns times header arrival (slowloris).
  virtual void on_input(const uint8_t *data, size_t len, uint64_t now_ns) = 0;
  // Appends bytes to send until out reaches limit or nothing is left.
  virtual void produce(std::vector<uint8_t> &out, size_t limit) = 0;
  // Nothing more will be read or written: close once output is flushed.
  virtual bool finished() const = 0;
  // The last answer was cut short where only the close could delimit it:
  // the connection must not end in a way that makes it look whole (no
  // TLS close_notify).
  virtual bool cut_short() const { return false; }
  // Heap bytes the idle stream slots keep for reuse (HTTP/2).
  virtual size_t idle_slot_bytes() const { return 0; }
  // Reading should pause (too much queued): backpressure.
  virtual bool input_paused() const = 0;
  // Input kept while paused is ready to parse: call on_input(nullptr, 0).
  virtual bool has_buffered_input() const { return false; }
  // The peer closed its side (or the TLS session ended): no more input.
  virtual void input_ended() {}
  // When the oldest request whose headers are incomplete began, or 0.
  virtual uint64_t headers_started() const = 0;
  // True while requests are open (not idle).
  virtual bool busy() const = 0;
  // Busy, but with deadlines of its own (a WebSocket tunnel): the
  // connection's write deadline applies only while output is pending.
  virtual bool timed_by_session() const { return false; }
  // A count that moves when requests or responses do (HTTP/2: HEADERS and
  // DATA with data, either way), for a protocol whose control frames
  // (PING, SETTINGS, WINDOW_UPDATE) must not keep a stalled or idle
  // connection alive. Without one (false), any byte either way counts.
  virtual bool counts_activity() const { return false; }
  virtual uint64_t activity() const { return 0; }
  // Graceful shutdown: GOAWAY / "Connection: close" after the current ones.
  virtual void shutdown() = 0;

protected:
  // A proxied request: the worker's proxy takes it on route.
  // upgrade: an HTTP/1.1 client's Upgrade, to tunnel (Proxy::Client).
  std::unique_ptr<ProxyExchange> start_proxy(int route, Request &req, bool body_follows,
                                             ProxyListener *l, void *tag, BudgetAccount &budget,
                                             const SessionEnv &env,
                                             std::string_view upgrade = {}) {
    Proxy::Client client;
    client.upgrade = upgrade;
    if (host_) {
      client.peer = host_->session_peer();
      client.tls = host_->session_tls();
    }
    return env.proxy->start(route, req, body_follows, client, l, tag, &budget);
  }
  // One request to the access log (when there is one).
  void log_request(const SessionEnv &env, const Request &req, std::string_view proto, int status,
                   uint64_t bytes, uint64_t begun_ns) {
    if (!env.access_log) return;
    env.access_log->record(host_ ? host_->session_peer() : nullptr, req, proto, status, bytes,
                           monotonic_ns() - begun_ns);
  }
  SessionHost *host_ = nullptr;
};

std::unique_ptr<TcpSession> make_h2_session(const SessionEnv &env);
std::unique_ptr<TcpSession> make_h1_session(const SessionEnv &env);
// Sets http-parser's process-wide limits (once; a session's construction
// does too): call before threads that parse start.
void init_h1_parsing();

} // namespace xdpq::http
