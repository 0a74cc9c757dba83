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

TestClient &cl(void *ud) { return *static_cast<TestClient *>(ud); }

ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref) {
  return static_cast<TestClient *>(ref->user_data)->conn();
}

int recv_stream_data_cb(ngtcp2_conn *, uint32_t flags, int64_t sid, uint64_t, const uint8_t *data,
                        size_t len, void *ud, void *) {
  return cl(ud).on_stream_data(sid, data, len, flags & NGTCP2_STREAM_DATA_FLAG_FIN);
}

int acked_cb(ngtcp2_conn *, int64_t sid, uint64_t, uint64_t len, void *ud, void *) {
  if (cl(ud).h3()) nghttp3_conn_add_ack_offset(cl(ud).h3(), sid, len);
  return 0;
}

int stream_close_cb(ngtcp2_conn *, uint32_t flags, int64_t sid, uint64_t code, void *ud, void *) {
  if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET)) code = NGHTTP3_H3_NO_ERROR;
  if (cl(ud).h3()) nghttp3_conn_close_stream(cl(ud).h3(), sid, code);
  return cl(ud).on_stream_close(sid, code);
}

int stream_reset_cb(ngtcp2_conn *, int64_t sid, uint64_t, uint64_t, void *ud, void *) {
  if (cl(ud).h3()) nghttp3_conn_shutdown_stream_read(cl(ud).h3(), sid);
  return 0;
}

int extend_max_stream_data_cb(ngtcp2_conn *, int64_t sid, uint64_t, void *ud, void *) {
  if (cl(ud).h3()) nghttp3_conn_unblock_stream(cl(ud).h3(), sid);
  return 0;
}

int handshake_completed_cb(ngtcp2_conn *, void *ud) { return cl(ud).on_handshake_completed(); }

int h3_recv_header(nghttp3_conn *, int64_t sid, int32_t, nghttp3_rcbuf *name, nghttp3_rcbuf *value,
                   uint8_t, void *ud, void *) {
  return cl(ud).on_header(sid, name, value);
}

int h3_recv_data(nghttp3_conn *, int64_t sid, const uint8_t *data, size_t len, void *ud, void *) {
  return cl(ud).on_body(sid, data, len);
}

int h3_deferred_consume(nghttp3_conn *, int64_t sid, size_t n, void *ud, void *) {
  ngtcp2_conn_extend_max_stream_offset(cl(ud).conn(), sid, n);
  ngtcp2_conn_extend_max_offset(cl(ud).conn(), n);
  return 0;
}

int h3_end_stream(nghttp3_conn *, int64_t sid, void *ud, void *) {
  return cl(ud).on_end_stream(sid);
}

int h3_reset_stream(nghttp3_conn *, int64_t sid, uint64_t code, void *ud, void *) {
  ngtcp2_conn_shutdown_stream_write(cl(ud).conn(), 0, sid, code);
  return 0;
}

int h3_stop_sending(nghttp3_conn *, int64_t sid, uint64_t code, void *ud, void *) {
  ngtcp2_conn_shutdown_stream_read(cl(ud).conn(), 0, sid, code);
  return 0;
}

nghttp3_ssize read_upload(nghttp3_conn *, int64_t sid, nghttp3_vec *vec, size_t veccnt,
                          uint32_t *flags, void *ud, void *) {
  auto &c = cl(ud);
  auto &body = c.upload_[sid];
  auto &pos = c.upload_pos_[sid];
  if (veccnt == 0) return 0;
  bool end = !c.unended_.count(sid);
  if (pos == body.size() && !end) return NGHTTP3_ERR_WOULDBLOCK; // hold the stream open
  vec[0].base = reinterpret_cast<uint8_t *>(body.data()) + pos;
  vec[0].len = body.size() - pos;
  pos = body.size();
  if (end) *flags |= NGHTTP3_DATA_FLAG_EOF;
  return 1;
}

ngtcp2_path to_np(const dataplane::Path &p) {
  ngtcp2_path np{};
  np.local.addr = const_cast<sockaddr *>(&p.remote.u.sa); // client's view
  np.local.addrlen = p.remote.len;
  np.remote.addr = const_cast<sockaddr *>(&p.local.u.sa);
  np.remote.addrlen = p.local.len;
  return np;
}

} // namespace

TestClient::TestClient(quic::ManualClock &clock, const dataplane::Path &path)
    : clock_(clock), path_(path) {
  ref_.get_conn = get_conn;
  ref_.user_data = this;
  ngtcp2_callbacks cb{};
  quic::set_client_crypto_callbacks(cb);
  cb.recv_stream_data = recv_stream_data_cb;
  cb.acked_stream_data_offset = acked_cb;
  cb.stream_close = stream_close_cb;
  cb.stream_reset = stream_reset_cb;
  cb.extend_max_stream_data = extend_max_stream_data_cb;
  cb.handshake_completed = handshake_completed_cb;

  ngtcp2_cid dcid, scid;
  dcid.datalen = 18;
  gnutls_rnd(GNUTLS_RND_NONCE, dcid.data, dcid.datalen);
  scid.datalen = 17;
  gnutls_rnd(GNUTLS_RND_NONCE, scid.data, scid.datalen);
  ngtcp2_settings settings;
  ngtcp2_settings_default(&settings);
  settings.initial_ts = clock_.now();
  settings.max_tx_udp_payload_size = 1452;
  settings.no_pmtud = 1;
  ngtcp2_transport_params params;
  ngtcp2_transport_params_default(&params);
  params.initial_max_stream_data_bidi_local = 4 << 20;
  params.initial_max_stream_data_uni = 1 << 20;
  params.initial_max_data = 16 << 20;
  params.initial_max_streams_uni = 3;
  params.max_idle_timeout = 60'000'000'000ull;
  ngtcp2_path np = to_np(path_);
  if (ngtcp2_conn_client_new(&conn_, &dcid, &scid, &np, NGTCP2_PROTO_VER_V1, &cb, &settings,
                             &params, nullptr, this) != 0) {
    throw std::runtime_error("ngtcp2_conn_client_new");
  }
  gnutls_certificate_allocate_credentials(&cred_);
  tls_ = quic::new_client_session(cred_, &ref_, "localhost");
  if (!tls_) throw std::runtime_error("client TLS session");
  ngtcp2_conn_set_tls_native_handle(conn_, tls_);
}

TestClient::~TestClient() {
  if (h3_) nghttp3_conn_del(h3_);
  ngtcp2_conn_del(conn_);
  gnutls_deinit(tls_);
  gnutls_certificate_free_credentials(cred_);
}

int TestClient::on_handshake_completed() {
  handshake_completed_ = true;
  nghttp3_callbacks cb{};
  cb.recv_header = h3_recv_header;
  cb.recv_data = h3_recv_data;
  cb.deferred_consume = h3_deferred_consume;
  cb.end_stream = h3_end_stream;
  cb.reset_stream = h3_reset_stream;
  cb.stop_sending = h3_stop_sending;
  nghttp3_settings s;
  nghttp3_settings_default(&s);
  nghttp3_conn_client_new(&h3_, &cb, &s, nullptr, this);
  int64_t ctrl, enc, dec;
  ngtcp2_conn_open_uni_stream(conn_, &ctrl, nullptr);
  ngtcp2_conn_open_uni_stream(conn_, &enc, nullptr);
  ngtcp2_conn_open_uni_stream(conn_, &dec, nullptr);
  nghttp3_conn_bind_control_stream(h3_, ctrl);
  nghttp3_conn_bind_qpack_streams(h3_, enc, dec);
  return 0;
}

int TestClient::on_stream_data(int64_t sid, const uint8_t *data, size_t len, bool fin) {
  if (!h3_) return 0;
  auto n = nghttp3_conn_read_stream(h3_, sid, data, len, fin);
  if (n < 0) return NGTCP2_ERR_CALLBACK_FAILURE;
  ngtcp2_conn_extend_max_stream_offset(conn_, sid, static_cast<uint64_t>(n));
  ngtcp2_conn_extend_max_offset(conn_, static_cast<uint64_t>(n));
  return 0;
}

int TestClient::on_header(int64_t sid, nghttp3_rcbuf *name, nghttp3_rcbuf *value) {
  auto n = nghttp3_rcbuf_get_buf(name);
  auto v = nghttp3_rcbuf_get_buf(value);
  std::string key(reinterpret_cast<char *>(n.base), n.len);
  std::string val(reinterpret_cast<char *>(v.base), v.len);
  auto &r = responses[sid];
  if (key == ":status") r.status = std::stoi(val);
  r.headers[key] = val;
  return 0;
}

int TestClient::on_body(int64_t sid, const uint8_t *data, size_t len) {
  responses[sid].body.append(reinterpret_cast<const char *>(data), len);
  ngtcp2_conn_extend_max_stream_offset(conn_, sid, len);
  ngtcp2_conn_extend_max_offset(conn_, len);
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

int64_t TestClient::request(const std::string &method, const std::string &path,
                            const std::vector<std::pair<std::string, std::string>> &headers,
                            const std::string &body, bool end_stream) {
  if (!h3_) return -1;
  int64_t sid;
  if (ngtcp2_conn_open_bidi_stream(conn_, &sid, nullptr) != 0) return -1;
  std::vector<std::pair<std::string, std::string>> all = {
      {":method", method}, {":scheme", "https"}, {":authority", "localhost"}, {":path", path}};
  all.insert(all.end(), headers.begin(), headers.end());
  std::vector<nghttp3_nv> nva;
  for (auto &[k, v] : all) {
    nva.push_back(nghttp3_nv{reinterpret_cast<uint8_t *>(k.data()),
                             reinterpret_cast<uint8_t *>(v.data()), k.size(), v.size(),
                             NGHTTP3_NV_FLAG_NONE});
  }
  nghttp3_data_reader dr{read_upload};
  if (!body.empty()) upload_[sid] = body;
  if (!end_stream) unended_.insert(sid);
  responses[sid] = Response{};
  if (nghttp3_conn_submit_request(h3_, sid, nva.data(), nva.size(), body.empty() ? nullptr : &dr,
                                  nullptr) != 0) {
    return -1;
  }
  return sid;
}

std::vector<Datagram> TestClient::write() {
  std::vector<Datagram> out;
  if (closed_) return out;
  std::vector<uint8_t> buf(1500);
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  for (int i = 0; i < 256; ++i) {
    int64_t sid = -1;
    int fin = 0;
    nghttp3_vec vec[16];
    nghttp3_ssize nvec = 0;
    if (h3_ && ngtcp2_conn_get_max_data_left(conn_)) {
      nvec = nghttp3_conn_writev_stream(h3_, &sid, &fin, vec, 16);
      if (nvec < 0) break;
    }
    ngtcp2_ssize ndatalen = -1;
    uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_MORE | (fin ? NGTCP2_WRITE_STREAM_FLAG_FIN : 0);
    auto n = ngtcp2_conn_writev_stream(conn_, &ps.path, &pi, buf.data(), 1452, &ndatalen, flags,
                                       sid, reinterpret_cast<const ngtcp2_vec *>(vec),
                                       static_cast<size_t>(nvec), clock_.now());
    if (n < 0) {
      if (n == NGTCP2_ERR_STREAM_DATA_BLOCKED) {
        nghttp3_conn_block_stream(h3_, sid);
        continue;
      }
      if (n == NGTCP2_ERR_STREAM_SHUT_WR) {
        nghttp3_conn_shutdown_stream_write(h3_, sid);
        continue;
      }
      if (n == NGTCP2_ERR_WRITE_MORE) {
        nghttp3_conn_add_write_offset(h3_, sid, static_cast<size_t>(ndatalen));
        continue;
      }
      closed_ = true;
      break;
    }
    if (ndatalen >= 0 && h3_) nghttp3_conn_add_write_offset(h3_, sid, static_cast<size_t>(ndatalen));
    if (n == 0) break;
    Datagram dg;
    dg.path = path_; // client → server, in the server's orientation
    dg.ecn = static_cast<uint8_t>(pi.ecn);
    dg.data.assign(buf.begin(), buf.begin() + n);
    out.push_back(std::move(dg));
  }
  ngtcp2_conn_update_pkt_tx_time(conn_, clock_.now());
  return out;
}

int TestClient::migrate(uint16_t new_port) {
  dataplane::Path next = make_test_path(new_port);
  next.local = path_.local;
  ngtcp2_path np = to_np(next);
  int rv = ngtcp2_conn_initiate_immediate_migration(conn_, &np, clock_.now());
  if (rv == 0) path_ = next;
  return rv;
}

void TestClient::read(const Datagram &dg) {
  if (closed_) return;
  ngtcp2_path np = to_np(path_);
  ngtcp2_pkt_info pi{dg.ecn};
  int rv = ngtcp2_conn_read_pkt(conn_, &np, &pi, dg.data.data(), dg.data.size(), clock_.now());
  if (rv == NGTCP2_ERR_DRAINING || rv == NGTCP2_ERR_CLOSING || (rv != 0 && ngtcp2_err_is_fatal(rv))) {
    closed_ = true;
  }
}

uint64_t TestClient::expiry() const { return closed_ ? UINT64_MAX : ngtcp2_conn_get_expiry(conn_); }

void TestClient::handle_expiry() {
  if (closed_) return;
  if (ngtcp2_conn_get_expiry(conn_) <= clock_.now() &&
      ngtcp2_conn_handle_expiry(conn_, clock_.now()) != 0) {
    closed_ = true;
  }
}

TestServer::TestServer(quic::ManualClock &c, const quic::EndpointConfig &cfg,
                       const quic::Secrets &secrets, const http::H3Limits &h3)
    : clock(c), wheel(c.now()) {
  static const control::CertificatePair cert = control::make_self_signed();
  quic::TlsConfig tcfg;
  tcfg.cert_pem = cert.cert_pem;
  tcfg.key_pem = cert.key_pem;
  tls = std::make_unique<quic::TlsContext>(tcfg, secrets);
  app = std::make_unique<http::H3ApplicationFactory>(
      http::make_default_router(http::RouterConfig{}), h3);
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
  return out;
}

std::vector<Datagram> TestServer::tick() {
  wheel.run(clock.now());
  endpoint->end_of_pass();
  std::vector<Datagram> out;
  out.swap(sink.out);
  return out;
}

} // namespace xdpq::testing
