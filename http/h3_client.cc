#include "http/h3_client.h"

#include "quic/client_setup.h"

#include <gnutls/crypto.h>

#include <stdexcept>

namespace xdpq::http {

H3ClientConn::H3ClientConn(const Options &opts, Events &events)
    : events_(events), max_udp_payload_(opts.max_udp_payload), grant_data_(opts.grant_data),
      grant_streams_(opts.grant_streams),
      qpack_table_capacity_(opts.qpack_table_capacity) {
  ref_.user_data = this;
  ref_.get_conn = [](ngtcp2_crypto_conn_ref *r) { return self(r->user_data).conn_; };

  ngtcp2_callbacks cb{};
  quic::set_client_crypto_callbacks(cb);
  cb.handshake_completed = [](ngtcp2_conn *, void *ud) { return self(ud).start_h3(); };
  cb.recv_new_token = [](ngtcp2_conn *, const uint8_t *token, size_t len, void *ud) {
    self(ud).new_tokens_ += 1;
    self(ud).last_token_.assign(token, token + len);
    return 0;
  };
  cb.recv_stream_data = [](ngtcp2_conn *, uint32_t flags, int64_t sid, uint64_t,
                           const uint8_t *data, size_t len, void *ud, void *) {
    return self(ud).on_stream_data(sid, data, len, flags & NGTCP2_STREAM_DATA_FLAG_FIN);
  };
  cb.acked_stream_data_offset = [](ngtcp2_conn *, int64_t sid, uint64_t, uint64_t len, void *ud,
                                   void *) {
    if (auto *h3 = self(ud).h3_) nghttp3_conn_add_ack_offset(h3, sid, len);
    return 0;
  };
  cb.stream_close = [](ngtcp2_conn *, uint32_t flags, int64_t sid, uint64_t code, void *ud,
                       void *) {
    if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET)) code = NGHTTP3_H3_NO_ERROR;
    if (auto *h3 = self(ud).h3_) nghttp3_conn_close_stream(h3, sid, code);
    return self(ud).events_.on_stream_close(sid, code);
  };
  cb.stream_reset = [](ngtcp2_conn *, int64_t sid, uint64_t, uint64_t, void *ud, void *) {
    if (auto *h3 = self(ud).h3_) nghttp3_conn_shutdown_stream_read(h3, sid);
    return 0;
  };
  cb.extend_max_stream_data = [](ngtcp2_conn *, int64_t sid, uint64_t, void *ud, void *) {
    if (auto *h3 = self(ud).h3_) nghttp3_conn_unblock_stream(h3, sid);
    return 0;
  };
  cb.extend_max_local_streams_bidi = [](ngtcp2_conn *, uint64_t, void *ud) {
    return self(ud).h3_ ? self(ud).events_.on_extend_max_streams() : 0;
  };

  ngtcp2_cid dcid, scid;
  if (opts.dcid.size() >= 8 && opts.dcid.size() <= NGTCP2_MAX_CIDLEN) {
    ngtcp2_cid_init(&dcid, opts.dcid.data(), opts.dcid.size());
  } else {
    dcid.datalen = 18;
    gnutls_rnd(GNUTLS_RND_NONCE, dcid.data, dcid.datalen);
  }
  scid.datalen = 17;
  gnutls_rnd(GNUTLS_RND_NONCE, scid.data, scid.datalen);
  ngtcp2_settings s;
  ngtcp2_settings_default(&s);
  s.initial_ts = opts.now;
  s.max_tx_udp_payload_size = opts.max_udp_payload;
  s.no_pmtud = !opts.pmtud;
  // Acknowledge a response in the next packet written, which is the next
  // request's: with ngtcp2's default of two, that packet leaves before its
  // ACK is due and an ACK-only packet follows it (as on the server side).
  s.ack_thresh = 1;
  if (opts.max_window) s.max_window = opts.max_window;
  s.token = opts.token.data();
  s.tokenlen = opts.token.size();
  if (opts.max_stream_window) s.max_stream_window = opts.max_stream_window;
  ngtcp2_transport_params p;
  ngtcp2_transport_params_default(&p);
  p.initial_max_stream_data_bidi_local = opts.stream_window;
  p.initial_max_stream_data_uni = 1 << 20;
  p.initial_max_data = opts.max_data;
  p.initial_max_streams_uni = 3;
  p.max_idle_timeout = opts.idle_timeout;
  if (opts.max_ack_delay) p.max_ack_delay = opts.max_ack_delay;
  if (ngtcp2_conn_client_new(&conn_, &dcid, &scid, &opts.path, NGTCP2_PROTO_VER_V1, &cb, &s, &p,
                             nullptr, this) != 0) {
    throw std::runtime_error("ngtcp2_conn_client_new failed");
  }
  tls_ = quic::new_client_session(opts.cred, &ref_, opts.sni);
  if (!tls_) {
    ngtcp2_conn_del(conn_);
    throw std::runtime_error("cannot set up the client's TLS session");
  }
  ngtcp2_conn_set_tls_native_handle(conn_, tls_);
}

H3ClientConn::~H3ClientConn() {
  if (h3_) nghttp3_conn_del(h3_);
  ngtcp2_conn_del(conn_);
  gnutls_deinit(tls_);
}

// HTTP/3 starts at the handshake: the control stream and the two QPACK
// streams, then the owner may submit requests.
int H3ClientConn::start_h3() {
  nghttp3_callbacks cb{};
  cb.recv_header = [](nghttp3_conn *, int64_t sid, int32_t, nghttp3_rcbuf *name,
                      nghttp3_rcbuf *value, uint8_t, void *ud, void *) {
    auto n = nghttp3_rcbuf_get_buf(name);
    auto v = nghttp3_rcbuf_get_buf(value);
    return self(ud).events_.on_header(
        sid, {reinterpret_cast<const char *>(n.base), n.len},
        {reinterpret_cast<const char *>(v.base), v.len});
  };
  cb.recv_data = [](nghttp3_conn *, int64_t sid, const uint8_t *data, size_t len, void *ud,
                    void *) {
    self(ud).consumed(sid, len);
    return self(ud).events_.on_body(sid, data, len);
  };
  cb.deferred_consume = [](nghttp3_conn *, int64_t sid, size_t n, void *ud, void *) {
    self(ud).consumed(sid, n);
    return 0;
  };
  cb.end_stream = [](nghttp3_conn *, int64_t sid, void *ud, void *) {
    return self(ud).events_.on_end_stream(sid);
  };
  cb.reset_stream = [](nghttp3_conn *, int64_t sid, uint64_t code, void *ud, void *) {
    ngtcp2_conn_shutdown_stream_write(self(ud).conn_, 0, sid, code);
    return 0;
  };
  cb.stop_sending = [](nghttp3_conn *, int64_t sid, uint64_t code, void *ud, void *) {
    ngtcp2_conn_shutdown_stream_read(self(ud).conn_, 0, sid, code);
    return 0;
  };
  cb.shutdown = [](nghttp3_conn *, int64_t id, void *ud) {
    self(ud).events_.on_goaway(id);
    return 0;
  };
  nghttp3_settings st;
  nghttp3_settings_default(&st);
  st.qpack_max_dtable_capacity = qpack_table_capacity_;
  nghttp3_conn *h3 = nullptr;
  if (nghttp3_conn_client_new(&h3, &cb, &st, nullptr, this) != 0) {
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  int64_t ctrl, enc, dec;
  if (ngtcp2_conn_open_uni_stream(conn_, &ctrl, nullptr) != 0 ||
      ngtcp2_conn_open_uni_stream(conn_, &enc, nullptr) != 0 ||
      ngtcp2_conn_open_uni_stream(conn_, &dec, nullptr) != 0 ||
      nghttp3_conn_bind_control_stream(h3, ctrl) != 0 ||
      nghttp3_conn_bind_qpack_streams(h3, enc, dec) != 0) {
    nghttp3_conn_del(h3);
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  h3_ = h3;
  return events_.on_handshake_completed() == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

int H3ClientConn::on_stream_data(int64_t sid, const uint8_t *data, size_t len, bool fin) {
  if (!h3_) return 0;
  if ((sid & 0x3) == 0x3) server_uni_bytes_ += len;
  auto n = nghttp3_conn_read_stream(h3_, sid, data, len, fin);
  if (n < 0) return NGTCP2_ERR_CALLBACK_FAILURE;
  consumed(sid, static_cast<uint64_t>(n));
  return 0;
}

// Bytes nghttp3 (or the owner, for bodies) is done with: credit for the peer.
void H3ClientConn::consumed(int64_t sid, uint64_t n) {
  if (grant_streams_) ngtcp2_conn_extend_max_stream_offset(conn_, sid, n);
  if (grant_data_) ngtcp2_conn_extend_max_offset(conn_, n);
}

int64_t H3ClientConn::submit_request(std::span<const nghttp3_nv> fields, bool has_body) {
  if (!h3_) return -1;
  int64_t sid;
  if (ngtcp2_conn_open_bidi_stream(conn_, &sid, nullptr) != 0) return -1;
  nghttp3_data_reader dr{[](nghttp3_conn *, int64_t id, nghttp3_vec *vec, size_t veccnt,
                            uint32_t *flags, void *ud, void *) {
    return self(ud).events_.read_body(id, vec, veccnt, flags);
  }};
  if (nghttp3_conn_submit_request(h3_, sid, fields.data(), fields.size(),
                                  has_body ? &dr : nullptr, nullptr) != 0) {
    ngtcp2_conn_shutdown_stream(conn_, 0, sid, NGHTTP3_H3_INTERNAL_ERROR); // not left open
    return -1;
  }
  return sid;
}

ngtcp2_ssize H3ClientConn::write_packet(uint8_t *buf, size_t cap, ngtcp2_pkt_info &pi,
                                        uint64_t now) {
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  if (cap > max_udp_payload_) cap = max_udp_payload_;
  for (;;) {
    int64_t sid = -1;
    int fin = 0;
    nghttp3_vec vec[16];
    nghttp3_ssize nvec = 0;
    if (h3_ && ngtcp2_conn_get_max_data_left(conn_)) {
      nvec = nghttp3_conn_writev_stream(h3_, &sid, &fin, vec, 16);
      if (nvec < 0) return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    ngtcp2_ssize ndatalen = -1;
    uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_MORE | (fin ? NGTCP2_WRITE_STREAM_FLAG_FIN : 0);
    auto n = ngtcp2_conn_writev_stream(conn_, &ps.path, &pi, buf, cap, &ndatalen, flags, sid,
                                       reinterpret_cast<const ngtcp2_vec *>(vec),
                                       static_cast<size_t>(nvec), now);
    if (n == NGTCP2_ERR_STREAM_DATA_BLOCKED) {
      nghttp3_conn_block_stream(h3_, sid);
      continue;
    }
    if (n == NGTCP2_ERR_STREAM_SHUT_WR) {
      nghttp3_conn_shutdown_stream_write(h3_, sid);
      continue;
    }
    if (ndatalen >= 0 && h3_ &&
        nghttp3_conn_add_write_offset(h3_, sid, static_cast<size_t>(ndatalen)) != 0) {
      return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    if (n == NGTCP2_ERR_WRITE_MORE) continue; // room left in this packet
    return n;
  }
}

} // namespace xdpq::http
