#include "quic_pipe.h"

#include "control/self_signed.h"
#include "http/router.h"
#include "quic/client_setup.h"

#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include <arpa/inet.h>

#include <cstring>
#include <stdexcept>

namespace xdpq::testing {

std::span<uint8_t> MemorySink::tx_alloc(size_t max_len) {
  buf_.resize(max_len);
  return {buf_.data(), max_len};
}

void MemorySink::tx_commit(const dataplane::Path &path, uint8_t ecn, size_t len) {
  out.push_back(Datagram{path, ecn, std::vector<uint8_t>(buf_.begin(), buf_.begin() + len), 0});
}

dataplane::Path make_test_path(uint16_t client_port) {
  dataplane::Path p;
  p.local = *dataplane::parse_address("10.0.0.1:443");
  p.remote = *dataplane::parse_address("10.0.0.2:" + std::to_string(client_port));
  return p;
}

std::string pattern_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + i % 26);
  return s;
}

namespace {

ngtcp2_path to_np(const dataplane::Path &p) {
  ngtcp2_path np{};
  np.local.addr = const_cast<sockaddr *>(&p.remote.u.sa); // client's view
  np.local.addrlen = p.remote.len;
  np.remote.addr = const_cast<sockaddr *>(&p.local.u.sa);
  np.remote.addrlen = p.local.len;
  return np;
}

} // namespace

TestClient::TestClient(quic::ManualClock &clock, const dataplane::Path &path,
                       uint64_t fixed_window, bool shut_streams, size_t qpack_table_capacity,
                       size_t hello_padding, std::span<const uint8_t> token,
                       uint64_t stream_window, std::span<const uint8_t> dcid,
                       uint64_t max_ack_delay)
    : clock_(clock), path_(path) {
  gnutls_certificate_allocate_credentials(&cred_);
  http::H3ClientConn::Options o;
  o.path = to_np(path_);
  o.now = clock_.now();
  o.cred = cred_;
  o.pmtud = false;
  o.idle_timeout = 60'000'000'000ull;
  if (fixed_window != 0) {
    o.max_data = fixed_window;
    o.grant_data = false;
  }
  if (shut_streams) o.stream_window = 0;
  if (stream_window != 0) {
    o.stream_window = stream_window;
    o.grant_streams = false;
  }
  o.qpack_table_capacity = qpack_table_capacity;
  o.token = token;
  o.dcid = dcid;
  o.max_ack_delay = max_ack_delay;
  try {
    h3c_ = std::make_unique<http::H3ClientConn>(o, *this);
  } catch (...) {
    gnutls_certificate_free_credentials(cred_);
    throw;
  }
  if (hello_padding) pad_client_hello(hello_padding);
}

namespace {
thread_local size_t t_hello_padding = 0;
}

void TestClient::pad_client_hello(size_t n) {
  auto *tls = static_cast<gnutls_session_t>(ngtcp2_conn_get_tls_native_handle(conn()));
  t_hello_padding = n;
  auto send = [](gnutls_session_t, gnutls_buffer_t out) -> int {
    std::vector<uint8_t> junk(t_hello_padding, 0x5a);
    if (gnutls_buffer_append_data(out, junk.data(), junk.size()) != 0) return -1;
    return static_cast<int>(junk.size());
  };
  auto recv = [](gnutls_session_t, const unsigned char *, size_t) -> int { return 0; };
  if (gnutls_session_ext_register(tls, "xdpq-test-padding", 65000, GNUTLS_EXT_TLS, recv, send,
                                  nullptr, nullptr, nullptr,
                                  GNUTLS_EXT_FLAG_CLIENT_HELLO | GNUTLS_EXT_FLAG_TLS) != 0) {
    throw std::runtime_error("cannot pad the ClientHello");
  }
}

TestClient::~TestClient() {
  h3c_.reset();
  gnutls_certificate_free_credentials(cred_);
}

int TestClient::on_header(int64_t sid, std::string_view name, std::string_view value) {
  auto &r = responses[sid];
  if (name == ":status") r.status = std::stoi(std::string(value));
  r.headers[std::string(name)] = std::string(value);
  return 0;
}

int TestClient::on_body(int64_t sid, const uint8_t *data, size_t len) {
  responses[sid].body.append(reinterpret_cast<const char *>(data), len);
  return 0;
}

int TestClient::on_end_stream(int64_t sid) {
  responses[sid].done = true;
  return 0;
}

int TestClient::on_stream_close(int64_t sid, uint64_t code) {
  if (ngtcp2_is_bidi_stream(sid) && code != NGHTTP3_H3_NO_ERROR && !responses[sid].done) {
    responses[sid].reset = true;
    responses[sid].reset_code = code;
  }
  return 0;
}

nghttp3_ssize TestClient::read_body(int64_t sid, nghttp3_vec *vec, size_t veccnt,
                                    uint32_t *flags) {
  auto &body = upload_[sid];
  auto &pos = upload_pos_[sid];
  if (veccnt == 0) return 0;
  bool end = !unended_.count(sid);
  if (pos == body.size() && !end) return NGHTTP3_ERR_WOULDBLOCK; // hold the stream open
  vec[0].base = reinterpret_cast<uint8_t *>(body.data()) + pos;
  vec[0].len = body.size() - pos;
  pos = body.size();
  if (end) *flags |= NGHTTP3_DATA_FLAG_EOF;
  return 1;
}

int64_t TestClient::request(const std::string &method, const std::string &path,
                            const std::vector<std::pair<std::string, std::string>> &headers,
                            const std::string &body, bool end_stream) {
  std::vector<std::pair<std::string, std::string>> all = {
      {":method", method}, {":scheme", "https"}, {":authority", "localhost"}, {":path", path}};
  all.insert(all.end(), headers.begin(), headers.end());
  std::vector<nghttp3_nv> nva;
  for (auto &[k, v] : all) {
    nva.push_back(nghttp3_nv{reinterpret_cast<uint8_t *>(k.data()),
                             reinterpret_cast<uint8_t *>(v.data()), k.size(), v.size(),
                             NGHTTP3_NV_FLAG_NONE});
  }
  // nghttp3 reads the body when it writes the stream, not in submit.
  int64_t sid = h3c_->submit_request(nva, !body.empty() || !end_stream);
  if (sid < 0) return -1;
  if (!body.empty()) upload_[sid] = body;
  if (!end_stream) unended_.insert(sid);
  responses[sid] = Response{};
  return sid;
}

void TestClient::end(int64_t sid) {
  unended_.erase(sid);
  h3c_->resume_stream(sid);
}

std::vector<Datagram> TestClient::write() {
  std::vector<Datagram> out;
  if (closed_) return out;
  std::vector<uint8_t> buf(1500);
  for (int i = 0; i < 256; ++i) {
    ngtcp2_pkt_info pi{};
    auto n = h3c_->write_packet(buf.data(), 1452, pi, clock_.now());
    if (n < 0) {
      closed_ = true;
      break;
    }
    if (n == 0) break;
    Datagram dg;
    dg.path = path_; // client → server, in the server's orientation
    dg.ecn = static_cast<uint8_t>(pi.ecn);
    dg.data.assign(buf.begin(), buf.begin() + n);
    out.push_back(std::move(dg));
  }
  h3c_->written(clock_.now());
  return out;
}

int TestClient::migrate(uint16_t new_port, const std::string &new_ip) {
  dataplane::Path next = make_test_path(new_port);
  next.local = path_.local;
  if (!new_ip.empty()) {
    next.remote = *dataplane::parse_address(new_ip + ":" + std::to_string(new_port));
  }
  ngtcp2_path np = to_np(next);
  int rv = ngtcp2_conn_initiate_immediate_migration(conn(), &np, clock_.now());
  if (rv == 0) path_ = next;
  return rv;
}

void TestClient::cancel(int64_t sid) {
  ngtcp2_conn_shutdown_stream(conn(), 0, sid, NGHTTP3_H3_REQUEST_CANCELLED);
}

Datagram TestClient::close_connection(uint64_t app_error) {
  ngtcp2_ccerr err;
  ngtcp2_ccerr_set_application_error(&err, app_error, nullptr, 0);
  std::vector<uint8_t> buf(1452);
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  auto n = ngtcp2_conn_write_connection_close(conn(), &ps.path, &pi, buf.data(), buf.size(),
                                              &err, clock_.now());
  closed_ = true;
  Datagram dg;
  dg.path = path_;
  if (n > 0) dg.data.assign(buf.begin(), buf.begin() + n);
  return dg;
}

Datagram TestClient::raw_request_stream(const std::string &bytes, int64_t *sid_out, bool fin) {
  Datagram dg;
  int64_t sid = -1;
  if (ngtcp2_conn_open_bidi_stream(conn(), &sid, nullptr) != 0) return dg;
  if (sid_out) *sid_out = sid;
  std::vector<uint8_t> buf(1452);
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  ngtcp2_vec v{reinterpret_cast<uint8_t *>(const_cast<char *>(bytes.data())), bytes.size()};
  ngtcp2_ssize taken = 0;
  auto n = ngtcp2_conn_writev_stream(conn(), &ps.path, &pi, buf.data(), buf.size(), &taken,
                                     fin ? NGTCP2_WRITE_STREAM_FLAG_FIN : NGTCP2_WRITE_STREAM_FLAG_NONE,
                                     sid, &v, 1, clock_.now());
  ngtcp2_conn_update_pkt_tx_time(conn(), clock_.now());
  dg.path = path_;
  if (n > 0 && taken == static_cast<ngtcp2_ssize>(bytes.size()))
    dg.data.assign(buf.begin(), buf.begin() + n);
  return dg;
}

void TestClient::read(const Datagram &dg) {
  if (closed_) return;
  ngtcp2_path np = to_np(path_);
  ngtcp2_pkt_info pi{dg.ecn};
  int rv = h3c_->read_packet(np, pi, dg.data.data(), dg.data.size(), clock_.now());
  if (rv == NGTCP2_ERR_DRAINING || rv == NGTCP2_ERR_CLOSING || (rv != 0 && ngtcp2_err_is_fatal(rv))) {
    closed_ = true;
  }
}

uint64_t TestClient::expiry() const { return closed_ ? UINT64_MAX : ngtcp2_conn_get_expiry(conn()); }

void TestClient::handle_expiry() {
  if (closed_) return;
  if (ngtcp2_conn_get_expiry(conn()) <= clock_.now() &&
      ngtcp2_conn_handle_expiry(conn(), clock_.now()) != 0) {
    closed_ = true;
  }
}

TestServer::TestServer(quic::ManualClock &c, const quic::EndpointConfig &cfg,
                       const quic::Secrets &secrets, const http::H3Limits &h3,
                       const std::string &docroot)
    : clock(c), wheel(c.now()) {
  static const control::CertificatePair cert = control::make_self_signed();
  quic::TlsConfig tcfg;
  tcfg.cert_pem = cert.cert_pem;
  tcfg.key_pem = cert.key_pem;
  tls = std::make_unique<quic::TlsContext>(tcfg, secrets);
  app = std::make_unique<http::H3ApplicationFactory>(
      http::make_default_router([&] {
        http::RouterConfig rc;
        rc.docroot = docroot;
        return rc;
      }()),
      h3);
  endpoint = std::make_unique<quic::Endpoint>(cfg, *tls, secrets, *app, wheel, clock, sink);
}

std::vector<Datagram> TestServer::deliver(const Datagram &dg) {
  dataplane::RxDatagram rx{const_cast<uint8_t *>(dg.data.data()), dg.data.size(), dg.path, dg.ecn,
                           dg.link};
  if (nat_port != 0) rx.path.remote.set_port(nat_port);
  endpoint->on_datagram(rx);
  endpoint->end_of_pass();
  std::vector<Datagram> out;
  out.swap(sink.out);
  on_the_way(out);
  return out;
}

void TestServer::on_the_way(std::vector<Datagram> &out) {
  for (const auto &d : out) sent_over_1200 += d.data.size() > 1200;
  if (drop_above) std::erase_if(out, [&](const Datagram &d) { return d.data.size() > drop_above; });
}

std::vector<Datagram> TestServer::tick() {
  wheel.run(clock.now());
  endpoint->end_of_pass();
  std::vector<Datagram> out;
  out.swap(sink.out);
  on_the_way(out);
  return out;
}

} // namespace xdpq::testing
