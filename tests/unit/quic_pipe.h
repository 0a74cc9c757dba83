#pragma once
// An in-memory HTTP/3 client (ngtcp2 + nghttp3 + GnuTLS) and a pipe that
// moves datagrams between it and a server Endpoint, with a ManualClock.
// No sockets: the server's packets land in a MemorySink.

#include "dataplane/datagram_port.h"
#include "dataplane/timer_wheel.h"
#include "http/h3_client.h"
#include "http/h3_session.h"
#include "quic/clock.h"
#include "quic/endpoint.h"

#include <gnutls/gnutls.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace xdpq::testing {

// The link address the test client's datagrams arrive with (as AF_XDP
// would report its MAC); tests forge others.
constexpr uint64_t CLIENT_LINK = 0x0201'0000'00aa'bbccull;

struct Datagram {
  dataplane::Path path;
  uint8_t ecn = 0;
  std::vector<uint8_t> data;
  uint64_t link = CLIENT_LINK;
};

// A peer_verified() report from the endpoint.
struct Verified {
  dataplane::Path path;
  uint64_t link;
  bool strong;
};

class MemorySink final : public dataplane::TxSink {
public:
  std::span<uint8_t> tx_alloc(size_t max_len) override;
  void tx_commit(const dataplane::Path &path, uint8_t ecn, size_t len) override;
  void peer_verified(const dataplane::Path &path, uint64_t link, bool strong) override {
    verified.push_back(Verified{path, link, strong});
  }
  std::vector<Datagram> out;
  std::vector<Verified> verified;

private:
  std::vector<uint8_t> buf_;
};

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  bool done = false;
  uint64_t reset_code = 0;
  bool reset = false;
};

class TestClient final : public http::H3ClientConn::Events {
public:
  // A fixed_window other than 0 is the connection's flow-control window,
  // never extended (a client that stops reading).
  // A stream_window other than 0 is each response stream's flow-control
  // window; with shut_streams, 0 (nothing can be sent on them).
  // qpack_table_capacity: the QPACK dynamic table offered to the server.
  // hello_padding: bytes of an unknown extension added to the ClientHello,
  // so that it takes more than one datagram (as post-quantum key shares
  // make browsers' do).
  // token: a NEW_TOKEN token its Initials carry.
  // A stream_window other than 0 is each response stream's window, never
  // extended. dcid: its first Initial's DCID (empty: random).
  TestClient(quic::ManualClock &clock, const dataplane::Path &path, uint64_t fixed_window = 0,
             bool shut_streams = false, size_t qpack_table_capacity = 0,
             size_t hello_padding = 0, std::span<const uint8_t> token = {},
             uint64_t stream_window = 0, std::span<const uint8_t> dcid = {},
             uint64_t max_ack_delay = 0);
  ~TestClient();
  TestClient(const TestClient &) = delete;
  TestClient &operator=(const TestClient &) = delete;

  // Datagrams to send to the server now.
  std::vector<Datagram> write();
  void read(const Datagram &dg);
  void handle_expiry();
  uint64_t expiry() const;

  // Opens a request stream; returns its id or -1. With end_stream false
  // the body is sent and the stream stays open (a client that never ends).
  int64_t request(const std::string &method, const std::string &path,
                  const std::vector<std::pair<std::string, std::string>> &headers = {},
                  const std::string &body = {}, bool end_stream = true);

  // Active migration to a new local port (and address, when given): the
  // client moves to an unused CID of the server's. Returns ngtcp2's result.
  int migrate(uint16_t new_port, const std::string &new_ip = {});
  // Resets the request stream both ways (RESET_STREAM, STOP_SENDING).
  void cancel(int64_t sid);
  // Ends a request sent with end_stream false (its FIN in a frame of its
  // own when the body is empty).
  void end(int64_t sid);
  // The client closes its connection: the CONNECTION_CLOSE to send.
  Datagram close_connection(uint64_t app_error);
  // Opens a request stream that nghttp3 does not know and sends bytes on
  // it as they are (a hand-made HTTP/3 frame): the datagram to send (empty
  // if the client may not send now: its pacing, flow control). The
  // stream's id goes to *sid when given; fin ends the stream with them.
  Datagram raw_request_stream(const std::string &bytes, int64_t *sid = nullptr, bool fin = false);

  bool handshake_completed() const { return h3c_ && h3c_->handshake_completed(); }
  bool closed() const { return closed_; }
  uint16_t port() const { return path_.remote.port(); } // its source port, as the server sees it
  ngtcp2_conn *conn() const { return h3c_->conn(); }
  uint64_t server_uni_bytes() const { return h3c_->server_uni_bytes(); }
  size_t new_tokens() const { return h3c_->new_tokens(); }
  const std::vector<uint8_t> &last_token() const { return h3c_->last_token(); }
  std::map<int64_t, Response> responses;
  int64_t goaway_id = -1; // the last GOAWAY's stream id (-1: none came)

private:
  // H3ClientConn::Events
  void on_goaway(int64_t id) override { goaway_id = id; }
  int on_header(int64_t sid, std::string_view name, std::string_view value) override;
  int on_body(int64_t sid, const uint8_t *data, size_t len) override;
  int on_end_stream(int64_t sid) override;
  int on_stream_close(int64_t sid, uint64_t app_error) override;
  nghttp3_ssize read_body(int64_t sid, nghttp3_vec *vec, size_t veccnt, uint32_t *flags) override;

  quic::ManualClock &clock_;
  void pad_client_hello(size_t n);
  dataplane::Path path_;
  gnutls_certificate_credentials_t cred_ = nullptr;
  std::unique_ptr<http::H3ClientConn> h3c_;
  std::map<int64_t, std::string> upload_; // request bodies
  std::map<int64_t, size_t> upload_pos_;
  std::set<int64_t> unended_;
  bool closed_ = false;
};

// Server side of the pipe: an Endpoint with its own wheel, sink and TLS.
struct TestServer {
  TestServer(quic::ManualClock &clock, const quic::EndpointConfig &cfg,
             const quic::Secrets &secrets, const http::H3Limits &h3 = {},
             const std::string &docroot = {});
  quic::ManualClock &clock;
  dataplane::TimerWheel wheel;
  MemorySink sink;
  std::unique_ptr<quic::TlsContext> tls;
  std::unique_ptr<http::H3ApplicationFactory> app; // HTTP/3 on the server's connections
  std::unique_ptr<quic::Endpoint> endpoint;
  // When set, the client's datagrams arrive from this source port instead
  // (a NAT rebinding the client does not know about).
  uint16_t nat_port = 0;
  // When set, the server's datagrams larger than this are lost on the way
  // (a path with a smaller MTU: a VPN, PPPoE).
  size_t drop_above = 0;
  // The server's datagrams larger than QUIC's 1200 bytes (path MTU probes
  // and what they confirmed), lost or not.
  size_t sent_over_1200 = 0;
  // Feeds a datagram, runs end_of_pass; returns what the server sent.
  std::vector<Datagram> deliver(const Datagram &dg);
  std::vector<Datagram> tick(); // runs due timers and writes
  void on_the_way(std::vector<Datagram> &out);
};

// One exchange of datagrams both ways; when nothing moved, the clock goes
// to the next timer (a pacer's, a loss timer's), or max_wait on. False
// when nothing moved and no timer is set.
inline bool exchange_or_wait(TestClient &client, TestServer &server, quic::ManualClock &clock,
                             uint64_t max_wait = UINT64_MAX) {
  bool moved = false;
  for (auto &dg : client.write()) {
    moved = true;
    for (auto &back : server.deliver(dg)) client.read(back);
  }
  for (auto &back : server.tick()) {
    moved = true;
    client.read(back);
  }
  if (!moved) {
    uint64_t next = std::min(client.expiry(), server.wheel.next_expiry());
    if (next == UINT64_MAX) return false;
    next = std::min(next, clock.now() + std::min(max_wait, UINT64_MAX - clock.now()));
    if (next > clock.now()) clock.set(next);
    client.handle_expiry();
  }
  return true;
}

// Exchanges datagrams until nothing moves, advancing the clock to the next
// timer when idle, up to max_steps. Returns when pred() holds (true) or
// the budget runs out (false).
template <typename Pred>
bool run_until(TestClient &client, TestServer &server, quic::ManualClock &clock, Pred pred,
               int max_steps = 2000) {
  for (int step = 0; step < max_steps; ++step) {
    if (pred()) return true;
    if (!exchange_or_wait(client, server, clock)) return pred();
  }
  return pred();
}

dataplane::Path make_test_path(uint16_t client_port = 50000);
std::string pattern_bytes(size_t n);

} // namespace xdpq::testing
