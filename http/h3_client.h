#pragma once
// The client side of one HTTP/3 connection: ngtcp2 + nghttp3 + GnuTLS glued
// together once, for h3load and for the tests' in-memory client. It owns
// the three library objects and moves data between them (stream data to
// nghttp3, flow-control credit back to ngtcp2, acknowledgements, blocked
// and closed streams, the control and QPACK streams at handshake); the
// caller owns the socket, the clock and what a response means.
//
// Not part of xdpqd: no certificate verification (load generator, tests).

#include <gnutls/gnutls.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace xdpq::http {

class H3ClientConn {
public:
  // What the connection tells its owner. Returning non-zero from an int
  // callback fails the connection (ngtcp2/nghttp3 callback failure).
  class Events {
  public:
    virtual int on_handshake_completed() { return 0; }
    virtual int on_header(int64_t, std::string_view /*name*/, std::string_view /*value*/) {
      return 0;
    }
    virtual int on_body(int64_t, const uint8_t *, size_t) { return 0; }
    virtual int on_end_stream(int64_t) { return 0; }
    // app_error: NGHTTP3_H3_NO_ERROR when the stream closed cleanly.
    virtual int on_stream_close(int64_t, uint64_t /*app_error*/) { return 0; }
    // The server's GOAWAY: requests at or above id will not be processed.
    virtual void on_goaway(int64_t /*id*/) {}
    virtual int on_extend_max_streams() { return 0; }
    // A request body (submit_request with a body): nghttp3's data-reader
    // contract (NGHTTP3_ERR_WOULDBLOCK holds the stream open).
    virtual nghttp3_ssize read_body(int64_t, nghttp3_vec *, size_t, uint32_t *flags) {
      *flags |= NGHTTP3_DATA_FLAG_EOF;
      return 0;
    }

  protected:
    ~Events() = default;
  };

  struct Options {
    ngtcp2_path path{};   // local and remote address, as the client sees them
    uint64_t now = 0;      // the caller's clock, nanoseconds
    gnutls_certificate_credentials_t cred = nullptr;
    const char *sni = "localhost";
    size_t max_udp_payload = 1452;
    bool pmtud = true;
    uint64_t max_window = 0;        // 0: ngtcp2's default
    uint64_t max_stream_window = 0; // 0: ngtcp2's default
    uint64_t idle_timeout = 30'000'000'000ull;
    uint64_t max_ack_delay = 0;   // advertised, nanoseconds (0: ngtcp2's, 25 ms)
    uint64_t max_data = 16 << 20; // the connection's flow-control window
    uint64_t stream_window = 4 << 20; // each response stream's (0: shut until extended)
    bool grant_data = true;       // false: never extended (a client that stops reading)
    bool grant_streams = true;    // false: stream windows never extended either
    size_t qpack_table_capacity = 0; // the QPACK dynamic table the server's encoder may use
    std::span<const uint8_t> token;  // a NEW_TOKEN token for the Initials (copied)
    std::span<const uint8_t> dcid;   // the first Initial's DCID, 8-20 bytes (empty: random)
  };

  // Throws std::runtime_error if ngtcp2 or GnuTLS refuse.
  H3ClientConn(const Options &opts, Events &events);
  ~H3ClientConn();
  H3ClientConn(const H3ClientConn &) = delete;
  H3ClientConn &operator=(const H3ClientConn &) = delete;

  // Opens a request stream and submits the header fields (and a body
  // through Events::read_body when has_body). The stream id, or -1 when no
  // stream is available or nghttp3 refused (before the handshake too).
  int64_t submit_request(std::span<const nghttp3_nv> fields, bool has_body);
  // A request body's data reader said it would block: ask it again.
  void resume_stream(int64_t sid) { nghttp3_conn_resume_stream(h3_, sid); }

  // The next packet into buf: its length, 0 when there is nothing to send,
  // a negative ngtcp2 error when the connection failed. pi gets its ECN.
  ngtcp2_ssize write_packet(uint8_t *buf, size_t cap, ngtcp2_pkt_info &pi, uint64_t now);
  // After a burst of write_packet() calls (pacing).
  void written(uint64_t now) { ngtcp2_conn_update_pkt_tx_time(conn_, now); }
  // ngtcp2_conn_read_pkt's result.
  int read_packet(const ngtcp2_path &path, const ngtcp2_pkt_info &pi, const uint8_t *data,
                  size_t len, uint64_t now) {
    return ngtcp2_conn_read_pkt(conn_, &path, &pi, data, len, now);
  }

  bool handshake_completed() const { return h3_ != nullptr; }
  // Bytes received on the server's unidirectional streams (control, QPACK).
  uint64_t server_uni_bytes() const { return server_uni_bytes_; }
  // NEW_TOKEN tokens the server sent, the last one kept.
  size_t new_tokens() const { return new_tokens_; }
  const std::vector<uint8_t> &last_token() const { return last_token_; }
  ngtcp2_conn *conn() const { return conn_; }
  nghttp3_conn *h3() const { return h3_; }
  gnutls_session_t tls() const { return tls_; }

private:
  int start_h3();
  int on_stream_data(int64_t sid, const uint8_t *data, size_t len, bool fin);
  void consumed(int64_t sid, uint64_t n);
  static H3ClientConn &self(void *ud) { return *static_cast<H3ClientConn *>(ud); }

  Events &events_;
  ngtcp2_conn *conn_ = nullptr;
  gnutls_session_t tls_ = nullptr;
  nghttp3_conn *h3_ = nullptr;
  ngtcp2_crypto_conn_ref ref_{};
  size_t max_udp_payload_;
  bool grant_data_;
  bool grant_streams_;
  size_t qpack_table_capacity_;
  uint64_t server_uni_bytes_ = 0;
  size_t new_tokens_ = 0;
  std::vector<uint8_t> last_token_;
};

} // namespace xdpq::http
