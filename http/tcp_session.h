#pragma once
// A protocol on a TCP connection (HTTP/2 or HTTP/1.1), fed with decrypted
// bytes and asked for bytes to send. The connection owns TLS, the socket and
// the timeouts; the session owns framing and the requests.

#include "dataplane/histogram.h"
#include "http/message.h"
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
  uint32_t max_concurrent_streams = 100;
  size_t max_pipelined = 32;         // HTTP/1.1 requests queued before reading pauses
  uint32_t max_protocol_errors = 100; // per connection, before GOAWAY (MadeYouReset class)
  uint32_t rst_burst = 100;          // nghttp2 incoming RST_STREAM rate limit
  uint32_t rst_rate = 33;
  size_t max_continuations = 8;
};

struct TcpStats {
  uint64_t accepted = 0;
  uint64_t refused_conn_limit = 0;
  uint64_t tls_handshake_failed = 0;
  uint64_t plaintext_on_tls = 0;
  uint64_t h2_connections = 0;
  uint64_t h1_connections = 0;
  uint64_t requests = 0;
  uint64_t responses_by_class[6] = {};
  uint64_t header_limit_rejects = 0;
  uint64_t body_limit_rejects = 0;
  uint64_t bad_requests = 0;
  uint64_t goaways_sent = 0;
  uint64_t protocol_error_closes = 0; // GOAWAY after too many client-caused errors
  uint64_t timeouts_handshake = 0;
  uint64_t timeouts_headers = 0;
  uint64_t timeouts_idle = 0;
  uint64_t timeouts_write = 0;
  uint64_t closed = 0;
  uint64_t tls_writes = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  dataplane::Histogram request_latency; // request complete to response queued/closed
};

struct SessionEnv {
  std::shared_ptr<const Router> router;
  TcpLimits limits;
  TcpStats *stats = nullptr;
  std::string alt_svc; // value of the alt-svc header; empty: none
};

class TcpSession {
public:
  virtual ~TcpSession() = default;
  // Consumes decrypted input; now_ns times header arrival (slowloris).
  virtual void on_input(const uint8_t *data, size_t len, uint64_t now_ns) = 0;
  // Appends bytes to send until out reaches limit or nothing is left.
  virtual void produce(std::vector<uint8_t> &out, size_t limit) = 0;
  // Nothing more will be read or written: close once output is flushed.
  virtual bool finished() const = 0;
  // Reading should pause (too much queued): backpressure.
  virtual bool input_paused() const = 0;
  // Input kept while paused is ready to parse: call on_input(nullptr, 0).
  virtual bool has_buffered_input() const { return false; }
  // When the oldest request whose headers are incomplete began, or 0.
  virtual uint64_t headers_started() const = 0;
  // True while requests are open (not idle).
  virtual bool busy() const = 0;
  // Graceful shutdown: GOAWAY / "Connection: close" after the current ones.
  virtual void shutdown() = 0;
};

std::unique_ptr<TcpSession> make_h2_session(const SessionEnv &env);
std::unique_ptr<TcpSession> make_h1_session(const SessionEnv &env);

// Adds server, alt-svc and the given response's headers; shared by both.
void count_response(TcpStats &st, int status);

} // namespace xdpq::http
