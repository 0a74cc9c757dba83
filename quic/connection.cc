// One QUIC connection: ngtcp2 and its TLS session, the C callbacks that
// trampoline into it, its timer, and its write loop. Longer than the house's
// ~600 lines because ngtcp2's callback table and the members they call read
// best side by side; splitting them would only add a header between them.

#include "quic/connection.h"

#include "base/guard.h"
#include "base/log.h"
#include "base/small_alloc.h"
#include "quic/endpoint.h"

#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <algorithm>
#include <random>

namespace xdpq::quic {

namespace {

Connection &self(void *user_data) { return *static_cast<Connection *>(user_data); }

ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref) {
  return static_cast<Connection *>(ref->user_data)->conn();
}

int cb_recv_stream_data(ngtcp2_conn *, uint32_t flags, int64_t stream_id, uint64_t,
                        const uint8_t *data, size_t len, void *ud, void *) {
  return guarded([&] { return self(ud).on_recv_stream_data(flags, stream_id, data, len); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_acked_stream_data_offset(ngtcp2_conn *, int64_t stream_id, uint64_t, uint64_t len,
                                void *ud, void *) {
  return guarded([&] { return self(ud).on_acked_stream_data(stream_id, len); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_stream_close(ngtcp2_conn *, uint32_t flags, int64_t stream_id, uint64_t app_error,
                    void *ud, void *) {
  return guarded([&] { return self(ud).on_stream_close(flags, stream_id, app_error); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_stream_reset(ngtcp2_conn *, int64_t stream_id, uint64_t, uint64_t, void *ud, void *) {
  return guarded([&] { return self(ud).on_stream_reset(stream_id); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

// ngtcp2 calls this when this side stops reading a stream (our
// STOP_SENDING), not for the peer's.
int cb_stream_stop_sending(ngtcp2_conn *, int64_t stream_id, uint64_t, void *ud, void *) {
  return guarded([&] { return self(ud).on_stream_stop_sending(stream_id); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_extend_max_stream_data(ngtcp2_conn *, int64_t stream_id, uint64_t, void *ud, void *) {
  return guarded([&] { return self(ud).on_extend_max_stream_data(stream_id); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_stream_open(ngtcp2_conn *, int64_t stream_id, void *ud) {
  return guarded([&] { return self(ud).on_stream_open(stream_id); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_extend_max_remote_streams_bidi(ngtcp2_conn *, uint64_t max_streams, void *ud) {
  return guarded([&] { return self(ud).on_extend_max_remote_streams_bidi(max_streams); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_handshake_completed(ngtcp2_conn *, void *ud) {
  return guarded([&] { return self(ud).on_handshake_completed(); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_get_new_connection_id(ngtcp2_conn *, ngtcp2_cid *cid, uint8_t *token, size_t cidlen,
                             void *ud) {
  return guarded([&] { return self(ud).on_new_cid(cid, token, cidlen); },
                 int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_remove_connection_id(ngtcp2_conn *, const ngtcp2_cid *cid, void *ud) {
  return guarded([&] { return self(ud).on_remove_cid(cid); }, int{NGTCP2_ERR_CALLBACK_FAILURE});
}

int cb_recv_tx_key(ngtcp2_conn *, ngtcp2_encryption_level level, void *ud) {
  return guarded([&] { return self(ud).on_recv_tx_key(level); }, int{NGTCP2_ERR_CALLBACK_FAILURE});
}

// The connection whose datagram ngtcp2 is reading on this thread: the
// decrypt callback has no user data, and key updates are seen there.
thread_local Connection *t_reading = nullptr;

int cb_update_key(ngtcp2_conn *conn, uint8_t *rx_secret, uint8_t *tx_secret,
                  ngtcp2_crypto_aead_ctx *rx_aead_ctx, uint8_t *rx_iv,
                  ngtcp2_crypto_aead_ctx *tx_aead_ctx, uint8_t *tx_iv,
                  const uint8_t *current_rx_secret, const uint8_t *current_tx_secret,
                  size_t secretlen, void *ud) {
  int rv = ngtcp2_crypto_update_key_cb(conn, rx_secret, tx_secret, rx_aead_ctx, rx_iv,
                                       tx_aead_ctx, tx_iv, current_rx_secret, current_tx_secret,
                                       secretlen, ud);
  if (rv == 0) self(ud).next_rx_key = rx_aead_ctx->native_handle;
  return rv;
}

int cb_decrypt(uint8_t *dest, const ngtcp2_crypto_aead *aead,
               const ngtcp2_crypto_aead_ctx *aead_ctx, const uint8_t *ciphertext,
               size_t ciphertextlen, const uint8_t *nonce, size_t noncelen, const uint8_t *aad,
               size_t aadlen) {
  int rv = ngtcp2_crypto_decrypt_cb(dest, aead, aead_ctx, ciphertext, ciphertextlen, nonce,
                                    noncelen, aad, aadlen);
  Connection *c = t_reading;
  if (rv == 0 && c) {
    // ngtcp2 drops what fails to decrypt and still returns success from
    // read_pkt: this is how we know something in the datagram was genuine.
    c->decrypted = true;
    // It also decrypts a duplicate before it drops it: a replay of a
    // genuine packet decrypts too. A short-header packet numbered above
    // every one before it is not a replay (the AAD is the unprotected
    // header, ending in the truncated packet number).
    if (aadlen > 0 && !(aad[0] & 0x80)) c->saw_1rtt_packet(aad, aadlen);
    // A packet that opens with the next generation's key: the peer updated.
    if (c->next_rx_key && aead_ctx->native_handle == c->next_rx_key) {
      c->next_rx_key = nullptr;
      c->on_key_update();
    }
  }
  return rv;
}

int cb_path_validation(ngtcp2_conn *, uint32_t flags, const ngtcp2_path *path, const ngtcp2_path *,
                       ngtcp2_path_validation_result res, void *ud) {
  guarded_void([&] {
    self(ud).on_path_validation(res == NGTCP2_PATH_VALIDATION_RESULT_SUCCESS, path,
                                flags & NGTCP2_PATH_VALIDATION_FLAG_NEW_TOKEN);
  });
  return 0;
}

void cb_rand(uint8_t *dest, size_t len, const ngtcp2_rand_ctx *) {
  // Padding and packet-number skips: not secret, so a fast per-thread PRNG.
  thread_local std::mt19937_64 rng = [] {
    uint64_t seed;
    gnutls_rnd(GNUTLS_RND_NONCE, &seed, sizeof(seed));
    return std::mt19937_64(seed);
  }();
  for (size_t i = 0; i < len; ++i) dest[i] = static_cast<uint8_t>(rng());
}

ngtcp2_path make_path(const dataplane::Path &p) {
  ngtcp2_path np{};
  np.local.addr = const_cast<sockaddr *>(&p.local.u.sa);
  np.local.addrlen = p.local.len;
  np.remote.addr = const_cast<sockaddr *>(&p.remote.u.sa);
  np.remote.addrlen = p.remote.len;
  return np;
}

dataplane::Path from_ngtcp2(const ngtcp2_path &np) {
  dataplane::Path p;
  p.local = dataplane::Address::from(np.local.addr, np.local.addrlen);
  p.remote = dataplane::Address::from(np.remote.addr, np.remote.addrlen);
  return p;
}

} // namespace

Connection::Connection(Endpoint &ep) : ep_(ep), timer_(timer_fired, this) {
  conn_ref_.get_conn = get_conn;
  conn_ref_.user_data = this;
  ngtcp2_ccerr_default(&last_error_);
}

Connection::~Connection() {
  ep_.timers().cancel(timer_);
  app_.reset();
  if (conn_) ngtcp2_conn_del(conn_);
  if (tls_) tls_ctx_->end_session(tls_);
}

int Connection::init(const ngtcp2_pkt_hd &hd, const dataplane::Path &path,
                     const ngtcp2_cid *odcid, const ngtcp2_vec &token) {
  const auto &cfg = ep_.config();
  started_at_ = ep_.clock().now();

  ngtcp2_callbacks cb{};
  cb.recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb.handshake_completed = cb_handshake_completed;
  cb.encrypt = ngtcp2_crypto_encrypt_cb;
  cb.decrypt = cb_decrypt;
  cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb.recv_stream_data = cb_recv_stream_data;
  cb.acked_stream_data_offset = cb_acked_stream_data_offset;
  cb.stream_close = cb_stream_close;
  cb.rand = cb_rand;
  cb.get_new_connection_id = cb_get_new_connection_id;
  cb.remove_connection_id = cb_remove_connection_id;
  cb.update_key = cb_update_key;
  cb.path_validation = cb_path_validation;
  cb.stream_reset = cb_stream_reset;
  cb.extend_max_remote_streams_bidi = cb_extend_max_remote_streams_bidi;
  cb.stream_open = cb_stream_open;
  cb.extend_max_stream_data = cb_extend_max_stream_data;
  cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb.stream_stop_sending = cb_stream_stop_sending;
  cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb.recv_tx_key = cb_recv_tx_key;

  ngtcp2_settings settings;
  ngtcp2_settings_default(&settings);
  settings.initial_ts = started_at_;
  // Datagrams start at QUIC's 1200 bytes and grow to max_udp_payload only
  // as far as ngtcp2's path MTU probes confirm (RFC 9000 14.3): a path with
  // a smaller MTU (a VPN, PPPoE) must not lose every full-size packet.
  settings.max_tx_udp_payload_size = cfg.max_udp_payload;
  settings.handshake_timeout = cfg.handshake_timeout;
  settings.max_window = cfg.max_conn_window;
  settings.max_stream_window = cfg.max_stream_window;
  settings.cc_algo = NGTCP2_CC_ALGO_CUBIC;
  // Acknowledge every ack-eliciting packet in the next packet we write.
  // With ngtcp2's default of two, a request's packet waits for the ACK
  // timer (srtt/8): the response leaves at once without the ACK, and the
  // timer sends an ACK-only packet after it, one more datagram per request
  // each way (the client acknowledges nothing, but it pays the receive).
  // A packet that draws no response still gets its ACK after a pass, not
  // after srtt/8: more ACKs on a pure upload, none more on requests.
  settings.ack_thresh = 1;
  // ngtcp2 copies it; a validated token lifts the 3x limit.
  settings.token = token.base;
  settings.tokenlen = token.len;
  settings.token_type = odcid ? NGTCP2_TOKEN_TYPE_RETRY : NGTCP2_TOKEN_TYPE_NEW_TOKEN;

  ngtcp2_transport_params params;
  ngtcp2_transport_params_default(&params);
  params.initial_max_stream_data_bidi_local = cfg.stream_window;
  params.initial_max_stream_data_bidi_remote = cfg.stream_window;
  params.initial_max_stream_data_uni = cfg.stream_window;
  params.initial_max_data = cfg.conn_window;
  params.initial_max_streams_bidi = cfg.max_streams_bidi;
  client_streams_granted_ = cfg.max_streams_bidi;
  params.initial_max_streams_uni = 3;
  params.max_idle_timeout = cfg.idle_timeout;
  params.active_connection_id_limit = 7;
  if (odcid) {
    params.original_dcid = *odcid;
    params.retry_scid = hd.dcid;
    params.retry_scid_present = 1;
  } else {
    params.original_dcid = hd.dcid;
  }
  params.original_dcid_present = 1;

  ngtcp2_cid scid;
  ep_.make_cid(scid);
  params.stateless_reset_token_present = 1;
  ngtcp2_crypto_generate_stateless_reset_token(params.stateless_reset_token,
                                               ep_.secrets().reset_key.data(),
                                               ep_.secrets().reset_key.size(), &scid);

  ngtcp2_path np = make_path(path);
  // ngtcp2's buffers come from the worker's per-thread block cache, counted
  // for this connection and the worker.
  mem_ = small_alloc::counted_table<ngtcp2_mem>(this);
  if (ngtcp2_conn_server_new(&conn_, &hd.scid, &scid, &np, hd.version, &cb, &settings, &params,
                             &mem_, this) != 0) {
    return -1;
  }
  tls_ctx_ = &ep_.tls();
  tls_ = tls_ctx_->new_session(&conn_ref_);
  if (!tls_) return -1;
  ngtcp2_conn_set_tls_native_handle(conn_, tls_);
  ep_.add_cid(scid, this);
  return 0;
}

void Connection::on_datagram(const dataplane::RxDatagram &dg) {
  const auto &path = dg.path;
  const uint8_t *data = dg.data;
  size_t len = dg.len;
  if (state_ == State::closing) {
    // Repeat our CONNECTION_CLOSE, exponentially less often (RFC 9000 10.2.1).
    ++close_received_;
    if ((close_received_ & (close_received_ - 1)) == 0) send_close_packet();
    ep_.mutable_stats().drop_closing += 1;
    return;
  }
  if (state_ != State::active) {
    ep_.mutable_stats().drop_closing += 1;
    return;
  }
  bytes_in_ += len;
  ngtcp2_path np = make_path(path);
  ngtcp2_pkt_info pi{dg.ecn};
  t_reading = this;
  decrypted = false;
  const uint64_t ts = ep_.clock().now();
  newest_1rtt = false;
  int rv = settle_pacer(ts);
  if (rv == 0) rv = ngtcp2_conn_read_pkt(conn_, &np, &pi, data, len, ts);
  t_reading = nullptr;
  if (rv != 0) {
    switch (rv) {
    case NGTCP2_ERR_DRAINING:
      enter_draining();
      return;
    case NGTCP2_ERR_RETRY:
      // The first Initial carried only CRYPTO data past the ClientHello's
      // start (its datagrams reordered): ngtcp2 asks for a Retry, which the
      // endpoint sends; the client comes back with a token at once instead
      // of after its retransmission timeout.
      wants_retry_ = true;
      retire();
      return;
    case NGTCP2_ERR_DROP_CONN:
      retire();
      return;
    case NGTCP2_ERR_CRYPTO:
      if (last_error_.error_code == 0) {
        ngtcp2_ccerr_set_tls_alert(
            &last_error_, ngtcp2_conn_get_tls_alert(conn_), nullptr, 0);
      }
      fail();
      return;
    default:
      if (last_error_.error_code == 0) {
        ngtcp2_ccerr_set_liberr(&last_error_, rv, nullptr, 0);
      }
      fail();
      return;
    }
  }
  // A connection whose HTTP/3 session began after the drain did (its
  // ClientHello took more than one datagram) is told now.
  if (!drain_told_ && app_ && ep_.draining()) shutdown_notice();
  // Authenticated: the dataplane may learn where this peer is. A new 1-RTT
  // packet (after the handshake) from an address the connection validated
  // proves the sender holds the keys there. Handshake packets, replays of
  // a genuine packet (from another link: anyone on it can capture one),
  // and packets from an address not yet validated (a client with the keys
  // can write any source address) are weak: the dataplane learns nothing
  // from them (NeighborCache::learn).
  // Told once per change: a weak packet after a strong one from the same
  // link and address says nothing new.
  const bool changed = dg.link != verified_link_ || !(path.remote == verified_remote_);
  if (decrypted && dg.link != 0 && (changed || !verified_strong_)) {
    const bool strong = handshake_done_ && newest_1rtt && path.remote == validated_remote_;
    if (changed || strong) {
      ep_.tx().peer_verified(path, dg.link, strong);
      verified_link_ = dg.link;
      verified_remote_ = path.remote;
      verified_strong_ = strong;
    }
  }
  if (hold_ack(ts)) return;
  ep_.want_write(this);
}

// ACK frequency (RFC 9000 13.2.1): with ack_thresh 1 every ack-eliciting
// packet gets its ACK in the next packet written, which is what lets a
// response that leaves in the same pass carry it. A request whose answer
// comes later (from an upstream) would get an ACK-only packet now and the
// response after it: two datagrams out for one request, and two reads for
// the client. So when a read leaves nothing to send but the ACK while the
// application awaits an answer, the write waits for the answer, for at
// most ACK_HOLD (within the max_ack_delay we advertise). ngtcp2's own ACK
// timer (srtt/8) is what the hold stretches: update_timer() puts the hold's
// end in its place; every other timer of the connection fires as before,
// and anything at all that the read queued (frames ngtcp2 found lost) leaves
// by the hold's end at the latest. Only one datagram is held this way: a
// second one before the write is acknowledged at once.
bool Connection::hold_ack(uint64_t read_ts) {
  if (pending_write || ack_held_ || !app_drained_ || !app_ || !app_->answer_pending())
    return false;
  ngtcp2_conn_info ci;
  ngtcp2_conn_get_conn_info(conn_, &ci);
  const uint64_t max_delay = ngtcp2_conn_get_local_transport_params(conn_)->max_ack_delay;
  // ngtcp2's ACK timer for a packet read at read_ts: min(max_ack_delay,
  // max(srtt/8, 1 ns)) after it. Should this ever differ from ngtcp2's,
  // its timer fires as it would without the hold.
  ack_timer_at_ = read_ts + std::min<uint64_t>(max_delay, std::max<uint64_t>(ci.smoothed_rtt / 8, 1));
  uint64_t expiry = ngtcp2_conn_get_expiry(conn_);
  if (expiry <= read_ts) {
    // A deadline already due, the timer not yet run: usually the pacer's
    // instant after the last response. Handled now, as the timer would.
    if (ngtcp2_conn_handle_expiry(conn_, read_ts) != 0) return false; // the timer ends it
    expiry = ngtcp2_conn_get_expiry(conn_);
  }
  // The read was ack-eliciting and that ACK is ngtcp2's next deadline;
  // otherwise (a bare ACK from the client, a sooner timer) no hold.
  if (expiry != ack_timer_at_) return false;
  hold_until_ = read_ts + std::min<uint64_t>(ACK_HOLD, max_delay / 2);
  ack_held_ = true;
  ep_.mutable_stats().acks_held += 1;
  update_timer();
  return true;
}

bool Connection::write() {
  if (state_ != State::active) return true;
  ack_held_ = false;
  app_drained_ = false;
  auto &tx = ep_.tx();
  const uint64_t ts = ep_.clock().now();
  if (int rv = settle_pacer(ts); rv != 0) {
    ngtcp2_ccerr_set_liberr(&last_error_, rv, nullptr, 0);
    fail();
    return true;
  }
  const size_t max_udp = ngtcp2_conn_get_max_tx_udp_payload_size(conn_);
  // ngtcp2 writes a path MTU probe (a datagram of padding up to
  // max_udp_payload) only into room as large as the probe. A connection
  // gets that room once it has carried enough to gain from larger
  // datagrams: until then its room is the size the path has confirmed, so
  // that one request on a new connection costs no probe and no
  // acknowledgement of it. Every other packet is that size anyway.
  const size_t room = bytes_out_ >= PMTU_PROBE_AFTER
                          ? max_udp
                          : ngtcp2_conn_get_path_max_tx_udp_payload_size(conn_);
  size_t max_pkts = ngtcp2_conn_get_send_quantum(conn_) / max_udp;
  if (max_pkts == 0) max_pkts = 1;
  if (max_pkts > 64) max_pkts = 64;

  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  std::span<uint8_t> buf;
  size_t written = 0;
  bool ok = true;
  if (app_) {
    if (int64_t rv = app_->before_write(); rv < 0) {
      ngtcp2_ccerr_set_application_error(&last_error_, app_->app_error_code(rv), nullptr, 0);
      fail();
      return true;
    }
  }
  for (;;) {
    int64_t stream_id = -1;
    int fin = 0;
    ngtcp2_vec vec[16];
    int64_t nvec = 0;
    bool asked = false;
    if (app_ && ngtcp2_conn_get_max_data_left(conn_)) {
      asked = true;
      nvec = app_->writev_stream(stream_id, fin, vec, 16);
      if (nvec < 0) {
        ngtcp2_ccerr_set_application_error(&last_error_, app_->app_error_code(nvec), nullptr, 0);
        fail();
        return true;
      }
      // A packet is leaving anyway: the stream credit goes in it.
      if (stream_id >= 0)
        release_stream_credit();
    }
    if (buf.empty()) {
      buf = tx.tx_alloc(max_udp);
      if (buf.empty()) {
        // Out of room: the endpoint retries after the sink drains. Any
        // stream data the application offered is offered again then.
        ok = false;
        break;
      }
    }
    uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_MORE;
    if (fin) flags |= NGTCP2_WRITE_STREAM_FLAG_FIN;
    ngtcp2_ssize ndatalen = -1;
    ngtcp2_ssize nwrite =
        ngtcp2_conn_writev_stream(conn_, &ps.path, &pi, buf.data(), room, &ndatalen, flags,
                                  stream_id, vec, static_cast<size_t>(nvec), ts);
    if (nwrite < 0) {
      switch (nwrite) {
      case NGTCP2_ERR_STREAM_DATA_BLOCKED:
        app_->block_stream(stream_id);
        continue;
      case NGTCP2_ERR_STREAM_SHUT_WR:
      case NGTCP2_ERR_STREAM_NOT_FOUND: // closed at the transport already
        app_->shutdown_stream_write(stream_id);
        continue;
      case NGTCP2_ERR_WRITE_MORE:
        app_->add_write_offset(stream_id, static_cast<size_t>(ndatalen));
        continue;
      default:
        ngtcp2_ccerr_set_liberr(
            &last_error_, static_cast<int>(nwrite), nullptr, 0);
        fail();
        return true;
      }
    }
    if (ndatalen >= 0 && app_) {
      app_->add_write_offset(stream_id, static_cast<size_t>(ndatalen));
    }
    if (nwrite == 0) {
      // Nothing more, or congestion/pacing limited.
      app_drained_ = asked && stream_id < 0;
      break;
    }
    tx.tx_commit(from_ngtcp2(ps.path), static_cast<uint8_t>(pi.ecn),
                 static_cast<size_t>(nwrite));
    bytes_out_ += static_cast<uint64_t>(nwrite);
    buf = {};
    ep_.mutable_stats().packets_out += 1;
    if (++written >= max_pkts) break;
  }
  // Every packet written left with the pacer open (ngtcp2 refuses the
  // first one otherwise), so before the pacer's next instant is set the
  // expiry is every other deadline. With nothing left to send that instant
  // only says when a later packet may leave: whatever brings one (a read,
  // the application) calls write(), which waits for it if still ahead.
  // Waking for it would cost a timer and a loop pass per response.
  const bool finished = written > 0 && app_drained_;
  const uint64_t others = finished ? ngtcp2_conn_get_expiry(conn_) : 0;
  ngtcp2_conn_update_pkt_tx_time(conn_, ts);
  const uint64_t expiry = ngtcp2_conn_get_expiry(conn_);
  if (finished && expiry < others) {
    pacer_at_ = expiry;
    ep_.mutable_stats().pacer_wakeups_skipped += 1;
    update_timer(others);
  } else {
    update_timer(expiry);
  }
  if (app_) app_->after_write();
  return ok;
}

// The pacer's instant that write() armed no timer for: past it, ngtcp2
// hears of it now as its timer would have told it then, at that instant,
// so the pacer does not count the idle time since as lateness to make up
// (it would then send a later burst unpaced). Ahead of it, ngtcp2 still
// has it, and its expiry says so again. Before any other call that gives
// ngtcp2 the time.
int Connection::settle_pacer(uint64_t now) {
  const uint64_t at = pacer_at_;
  if (at == UINT64_MAX) return 0;
  pacer_at_ = UINT64_MAX;
  return now >= at ? ngtcp2_conn_handle_expiry(conn_, at) : 0;
}

void Connection::shutdown_notice() {
  if (state_ != State::active || !app_)
    return;
  if (goaway_pending() || drain_told_) return;
  drain_told_ = true;
  // HTTP/3: the two-step GOAWAY (RFC 9114 5.2); streams in flight complete.
  // The final one waits a probe timeout (about a round trip), so requests
  // the peer sent before it saw the first one are served, not refused.
  app_->shutdown_notice();
  goaway_at_ = ep_.clock().now() + ngtcp2_conn_get_pto(conn_);
  update_timer(ngtcp2_conn_get_expiry(conn_));
  ep_.want_write(this);
}

ConnInfo Connection::info() const {
  ConnInfo ci;
  if (conn_) {
    const ngtcp2_path *p = ngtcp2_conn_get_path(conn_);
    ci.peer = dataplane::Address::from(p->remote.addr, p->remote.addrlen).to_string();
    ngtcp2_conn_info cs;
    ngtcp2_conn_get_conn_info(conn_, &cs);
    ci.rtt_us = cs.smoothed_rtt / 1000;
  }
  ci.age_ms = (ep_.clock().now() - started_at_) / 1'000'000;
  ci.bytes_in = bytes_in_;
  ci.bytes_out = bytes_out_;
  ci.streams = active_streams();
  ci.state = state_ == State::active ? (handshake_done_ ? "established" : "handshake")
             : state_ == State::closing ? "closing"
             : state_ == State::draining ? "draining" : "closed";
  return ci;
}

void Connection::charge_memory(int64_t bytes) {
  memory_ += bytes;
  ep_.charge_memory(bytes);
}

void Connection::abandon(uint64_t app_error) {
  close(app_error); // CONNECTION_CLOSE goes once
  retire();
}

void Connection::close(uint64_t app_error) {
  if (state_ != State::active) return;
  ngtcp2_ccerr_set_application_error(&last_error_, app_error, nullptr, 0);
  fail();
}

bool Connection::fail() {
  if (state_ != State::active) return false;
  if (last_error_.type == NGTCP2_CCERR_TYPE_IDLE_CLOSE) {
    ep_.mutable_stats().conns_idle_closed += 1;
    retire();
    return false;
  }
  if (!(last_error_.type == NGTCP2_CCERR_TYPE_APPLICATION &&
        last_error_.error_code == ep_.app_factory().no_error_code())) {
    ep_.mutable_stats().conn_errors += 1;
    LOG_DEBUG("connection closed: error type %d code 0x%llx", static_cast<int>(last_error_.type),
              static_cast<unsigned long long>(last_error_.error_code));
  }
  close_packet_.resize(ep_.config().max_udp_payload);
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  ngtcp2_ssize n = ngtcp2_conn_write_connection_close(
      conn_, &ps.path, &pi, close_packet_.data(), close_packet_.size(), &last_error_,
      ep_.clock().now());
  if (n <= 0) {
    retire();
    return false;
  }
  close_packet_.resize(static_cast<size_t>(n));
  close_path_ = from_ngtcp2(ps.path);
  state_ = State::closing;
  ep_.app_finished(this);
  send_close_packet();
  ep_.timers().schedule(timer_, ep_.clock().now() + 3 * ngtcp2_conn_get_pto(conn_));
  return false;
}

void Connection::send_close_packet() {
  auto buf = ep_.tx().tx_alloc(close_packet_.size());
  if (buf.empty()) return; // lost like any packet; the peer retransmits
  std::copy(close_packet_.begin(), close_packet_.end(), buf.begin());
  ep_.tx().tx_commit(close_path_, 0, close_packet_.size());
  ep_.mutable_stats().packets_out += 1;
}

void Connection::enter_draining() {
  state_ = State::draining;
  ep_.app_finished(this);
  const uint64_t period = 3 * ngtcp2_conn_get_pto(conn_);
  // A client that closed after its handshake leaves its source's connection
  // cap as it drains (a load generator opens and closes thousands a
  // second), if the period is short. The client's max_ack_delay counts in
  // the probe timeout (up to 16 s): a period it stretched keeps its place,
  // or one host could fill the worker's table with closed connections.
  if (handshake_done_ && period <= ep_.config().source_free_draining) ep_.source_left(this);
  ep_.timers().schedule(timer_, ep_.clock().now() + period);
}

void Connection::retire() {
  if (state_ == State::dead) return;
  state_ = State::dead;
  ep_.timers().cancel(timer_);
  if (!handshake_done_) {
    if (!wants_retry_) ep_.mutable_stats().handshakes_failed += 1;
    ep_.handshake_done(this);
  }
  ep_.retire(this);
}

void Connection::timer_fired(dataplane::Timer &t) {
  static_cast<Connection *>(t.owner())->on_timer();
}

void Connection::on_timer() {
  if (state_ == State::closing || state_ == State::draining) {
    retire(); // end of the closing/draining period
    return;
  }
  if (state_ != State::active) return;
  const uint64_t now = ep_.clock().now();
  if (ack_held_ && now >= hold_until_)
    ep_.mutable_stats().acks_held_expired += 1; // the answer took longer: the ACK leaves alone
  if (now >= credit_deadline_)
    release_stream_credit(); // no response came to carry it
  if (now >= app_wake_at_) app_wake_at_ = UINT64_MAX; // the write below is the one asked for
  if (now >= goaway_at_) {
    goaway_at_ = UINT64_MAX;
    app_->shutdown_final();
  }
  int rv = settle_pacer(now);
  if (rv == 0) rv = ngtcp2_conn_handle_expiry(conn_, now);
  if (rv != 0) {
    ngtcp2_ccerr_set_liberr(&last_error_, rv, nullptr, 0);
    fail();
    return;
  }
  ep_.want_write(this);
}

void Connection::update_timer(uint64_t expiry) {
  if (state_ != State::active) return;
  if (ack_held_) expiry = expiry == ack_timer_at_ ? hold_until_ : std::min(expiry, hold_until_);
  expiry = std::min({expiry, credit_deadline_, goaway_at_, app_wake_at_});
  if (expiry == UINT64_MAX) {
    ep_.timers().cancel(timer_);
  } else {
    ep_.timers().schedule(timer_, expiry);
  }
}

int Connection::setup_app() {
  if (app_)
    return 0;
  if (ngtcp2_conn_get_streams_uni_left(conn_) < 3) return NGTCP2_ERR_CALLBACK_FAILURE;
  try {
    app_ = ep_.app_factory().create(*this);
  } catch (const std::exception &) {
    // Called from inside ngtcp2: nothing may unwind through C frames.
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  if (app_->start(ep_.config().max_streams_bidi) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

int64_t Connection::app_open_uni_stream() {
  int64_t id = -1;
  if (ngtcp2_conn_open_uni_stream(conn_, &id, nullptr) != 0)
    return -1;
  return id;
}

int Connection::on_recv_tx_key(ngtcp2_encryption_level level) {
  if (level != NGTCP2_ENCRYPTION_LEVEL_1RTT) return 0;
  return setup_app() == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

int Connection::on_recv_stream_data(uint32_t flags, int64_t stream_id, const uint8_t *data,
                                    size_t len) {
  if (!app_ && setup_app() != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  if ((flags & NGTCP2_STREAM_DATA_FLAG_0RTT) && !handshake_done_) {
    // Request bytes that arrived in 0-RTT (counted once per connection).
    if (!early_counted_) {
      early_counted_ = true;
      ep_.mutable_stats().early_data_accepted += 1;
    }
  }
  auto n = app_->read_stream(stream_id, data, len, flags & NGTCP2_STREAM_DATA_FLAG_FIN,
                             (flags & NGTCP2_STREAM_DATA_FLAG_0RTT) != 0);
  if (n < 0) {
    ngtcp2_ccerr_set_application_error(&last_error_, app_->app_error_code(n), nullptr, 0);
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  ngtcp2_conn_extend_max_stream_offset(conn_, stream_id, static_cast<uint64_t>(n));
  ngtcp2_conn_extend_max_offset(conn_, static_cast<uint64_t>(n));
  return 0;
}

int Connection::on_acked_stream_data(int64_t stream_id, uint64_t len) {
  if (app_ && app_->add_ack_offset(stream_id, len) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

int Connection::on_stream_close(uint32_t flags, int64_t stream_id, uint64_t app_error) {
  const bool reset = flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET;
  if (!reset) {
    app_error = ep_.app_factory().no_error_code();
  }
  if (request_stream(stream_id)) {
    auto seen = std::find(resets_seen_.begin(), resets_seen_.end(), stream_id);
    const bool accounted = seen != resets_seen_.end();
    if (accounted) resets_seen_.erase(seen);
    // Reset, and neither by us nor by a RESET_STREAM charged already: the
    // peer's STOP_SENDING had ngtcp2 reset our side (also on a request we
    // had stopped reading: one left without its end). A cancel like a
    // RESET_STREAM, limited alike, unless our whole answer was handed over
    // already (ngtcp2 sets the code then too, while it is not all
    // acknowledged).
    if (reset && !accounted && !(app_ && app_->answered(stream_id)) && !take_reset_token()) {
      ep_.mutable_stats().stream_reset_closes += 1;
      ngtcp2_ccerr_set_application_error(&last_error_, ep_.app_factory().excessive_load_code(),
                                         nullptr, 0);
      return NGTCP2_ERR_CALLBACK_FAILURE;
    }
  }
  if (app_) {
    int rv = app_->close_stream(stream_id, app_error);
    if (rv != 0) {
      ngtcp2_ccerr_set_application_error(&last_error_, app_->app_error_code(rv), nullptr, 0);
      return NGTCP2_ERR_CALLBACK_FAILURE;
    }
  }
  // A finished client request stream frees a slot for the next one; the
  // credit rides with the next response (see stream_credit_).
  if (ngtcp2_is_bidi_stream(stream_id) && !(stream_id & 1)) {
    std::erase(stopped_reading_, stream_id);
    if (stream_credit_ == 0)
      credit_deadline_ = ep_.clock().now() + STREAM_CREDIT_DELAY;
    stream_credit_ += 1;
    // A client at its limit waits for nothing; nor does half the limit.
    if (client_streams_opened_ >= client_streams_granted_ ||
        stream_credit_ >= std::max<uint64_t>(1, ep_.config().max_streams_bidi / 2))
      release_stream_credit();
  }
  return 0;
}

void Connection::release_stream_credit() {
  if (stream_credit_ == 0)
    return;
  ngtcp2_conn_extend_max_streams_bidi(conn_, stream_credit_);
  stream_credit_ = 0;
  credit_deadline_ = UINT64_MAX;
}

// Both may leave something to send that the last write did not have (a
// stream unblocked, a reset to answer): no ACK hold after this read.
int Connection::on_stream_reset(int64_t stream_id) {
  // The peer reset a request stream (bidirectional, client-initiated):
  // limited, as a flood of them would have the server start and drop work
  // for each ("rapid reset").
  // A RESET_STREAM answering our STOP_SENDING (RFC 9000 3.5 requires it:
  // a 413, a 425, an answer before the request's end) is no cancel.
  auto asked = std::find(stopped_reading_.begin(), stopped_reading_.end(), stream_id);
  const bool answer = asked != stopped_reading_.end();
  if (answer) stopped_reading_.erase(asked);
  // Charged here (once per stream): the close does not charge it again.
  if (!answer && request_stream(stream_id)) reset_seen(stream_id);
  if (!answer && request_stream(stream_id) && !take_reset_token()) {
    ep_.mutable_stats().stream_reset_closes += 1;
    ngtcp2_ccerr_set_application_error(&last_error_, ep_.app_factory().excessive_load_code(),
                                       nullptr, 0);
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  if (app_) app_->peer_reset(stream_id);
  ep_.want_write(this);
  return 0;
}

int Connection::on_stream_stop_sending(int64_t stream_id) {
  // Open client request streams only, so at most max_streams of them.
  if (ngtcp2_is_bidi_stream(stream_id) && !(stream_id & 1)) stopped_reading_.push_back(stream_id);
  return on_stream_read_shut(stream_id);
}

int Connection::on_stream_read_shut(int64_t stream_id) {
  if (app_)
    app_->shutdown_stream_read(stream_id);
  ep_.want_write(this);
  return 0;
}

bool Connection::take_reset_token() {
  const auto &cfg = ep_.config();
  return resets_.take(1, cfg.stream_reset_rate, cfg.stream_reset_burst, ep_.clock().now());
}

int Connection::on_extend_max_stream_data(int64_t stream_id) {
  if (app_ && app_->unblock_stream(stream_id) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  ep_.want_write(this);
  return 0;
}

int Connection::on_stream_open(int64_t stream_id) {
  // A client's request stream; opening one opens every lower one too.
  if (ngtcp2_is_bidi_stream(stream_id) && !(stream_id & 1)) {
    client_streams_opened_ =
        std::max(client_streams_opened_, static_cast<uint64_t>(stream_id) / 4 + 1);
    if (app_) app_->stream_opened(stream_id);
  }
  return 0;
}

int Connection::on_extend_max_remote_streams_bidi(uint64_t max_streams) {
  client_streams_granted_ = max_streams;
  if (app_)
    app_->set_max_client_streams_bidi(max_streams);
  return 0;
}

int Connection::on_handshake_completed() {
  handshake_done_ = true;
  ep_.handshake_done(this);
  ep_.source_proven(this);
  auto &st = ep_.mutable_stats();
  st.handshakes_completed += 1;
  st.handshake_time.record(ep_.clock().now() - started_at_);
  if (gnutls_session_is_resumed(tls_)) st.sessions_resumed += 1;
  // Tickets are sent by hand (GNUTLS_NO_AUTO_SEND_TICKET): only after the
  // handshake, so a client always gets one.
  if (gnutls_session_ticket_send(tls_, 1, 0) != 0) {
    LOG_DEBUG("could not send a session ticket");
  }
  const ngtcp2_path *path = ngtcp2_conn_get_path(conn_);
  // The handshake validated this address (RFC 9000 8.1).
  validated_remote_ = dataplane::Address::from(path->remote.addr, path->remote.addrlen);
  submit_address_token(*path);
  LOG_DEBUG("handshake completed in %llu us (resumed=%d)",
            static_cast<unsigned long long>((ep_.clock().now() - started_at_) / 1000),
            gnutls_session_is_resumed(tls_) ? 1 : 0);
  return 0;
}

int Connection::on_new_cid(ngtcp2_cid *cid, uint8_t *token, size_t) {
  // ngtcp2 asks for our SCID's length: every CID of ours has it.
  ep_.make_cid(*cid);
  ngtcp2_crypto_generate_stateless_reset_token(token, ep_.secrets().reset_key.data(),
                                               ep_.secrets().reset_key.size(), cid);
  ep_.add_cid(*cid, this);
  return 0;
}

int Connection::on_remove_cid(const ngtcp2_cid *cid) {
  ep_.remove_cid(*cid, this);
  return 0;
}

void Connection::on_key_update() { ep_.mutable_stats().key_updates += 1; }

void Connection::saw_1rtt_packet(const uint8_t *header, size_t len) {
  const size_t pn_len = (header[0] & 3u) + 1;
  if (len < 1 + pn_len) return;
  uint64_t truncated = 0;
  for (size_t i = len - pn_len; i < len; ++i) truncated = truncated << 8 | header[i];
  // RFC 9000 A.3: the number closest to the next one expected.
  const uint64_t win = 1ull << (8 * pn_len), hwin = win / 2;
  const uint64_t expected = static_cast<uint64_t>(largest_1rtt_pn_ + 1);
  uint64_t pn = (expected & ~(win - 1)) | truncated;
  if (pn + hwin <= expected && pn < (1ull << 62) - win) {
    pn += win;
  } else if (pn > expected + hwin && pn >= win) {
    pn -= win;
  }
  if (static_cast<int64_t>(pn) > largest_1rtt_pn_) {
    largest_1rtt_pn_ = static_cast<int64_t>(pn);
    newest_1rtt = true;
  }
}

// A NEW_TOKEN token for the address path's client was proven at: its next
// connection from there skips the Retry a server under load asks for.
void Connection::submit_address_token(const ngtcp2_path &path) {
  uint8_t token[NGTCP2_CRYPTO_MAX_REGULAR_TOKENLEN];
  auto n = ngtcp2_crypto_generate_regular_token(
      token, ep_.secrets().token_key.data(), ep_.secrets().token_key.size(), path.remote.addr,
      path.remote.addrlen, ep_.clock().wall());
  if (n > 0) ngtcp2_conn_submit_new_token(conn_, token, static_cast<size_t>(n));
}

void Connection::on_path_validation(bool ok, const ngtcp2_path *path, bool new_token) {
  auto &st = ep_.mutable_stats();
  if (ok) {
    st.path_validations_ok += 1;
    validated_remote_ = dataplane::Address::from(path->remote.addr, path->remote.addrlen);
    // The client moved there: its token for the old address would not
    // pass there (tokens are bound to the address).
    if (new_token) submit_address_token(*path);
  } else {
    st.path_validations_failed += 1;
  }
}

void Connection::app_consume_stream(int64_t stream_id, uint64_t n) {
  ngtcp2_conn_extend_max_stream_offset(conn_, stream_id, n);
}

void Connection::app_consume_conn(uint64_t n) { ngtcp2_conn_extend_max_offset(conn_, n); }

void Connection::app_stop_reading(int64_t stream_id, uint64_t app_error) {
  // Not marked as seen: the RESET_STREAM that answers it is no cancel (see
  // on_stream_reset), but a STOP_SENDING the client adds to cut our answer
  // short is one (see on_stream_close).
  ngtcp2_conn_shutdown_stream_read(conn_, 0, stream_id, app_error);
}

void Connection::app_reset_writing(int64_t stream_id, uint64_t app_error) {
  if (request_stream(stream_id)) reset_seen(stream_id);
  ngtcp2_conn_shutdown_stream_write(conn_, 0, stream_id, app_error);
}

bool Connection::app_charge_cancel() {
  if (take_reset_token()) return true;
  ep_.mutable_stats().stream_reset_closes += 1;
  return false;
}

void Connection::reset_seen(int64_t stream_id) {
  // Open streams only (erased as they close): at most max_streams_bidi.
  if (std::find(resets_seen_.begin(), resets_seen_.end(), stream_id) == resets_seen_.end())
    resets_seen_.push_back(stream_id);
}

void Connection::app_want_write() {
  if (state_ == State::active) ep_.want_write(this);
}

uint64_t Connection::app_stream_credit(int64_t stream_id) const {
  return ngtcp2_conn_get_max_stream_data_left(conn_, stream_id);
}

uint64_t Connection::app_conn_credit() const { return ngtcp2_conn_get_max_data_left(conn_); }

uint64_t Connection::app_now() const { return ep_.clock().now(); }

void Connection::app_charge_memory(int64_t bytes) { charge_memory(bytes); }

void Connection::app_wake_at(uint64_t at_ns) {
  app_wake_at_ = at_ns;
  update_timer();
}

bool Connection::app_awaits_acks() const {
  ngtcp2_conn_info ci;
  ngtcp2_conn_get_conn_info(conn_, &ci);
  return ci.bytes_in_flight > 0;
}

const dataplane::Address *Connection::app_peer() const {
  // Not ngtcp2's current path: ngtcp2 moves it to a new address at that
  // address's first 1-RTT packet, before validating it.
  if (app_peer_proven()) return &validated_remote_;
  const ngtcp2_path *p = ngtcp2_conn_get_path(conn_);
  peer_ = dataplane::Address::from(p->remote.addr, p->remote.addrlen);
  return &peer_;
}

} // namespace xdpq::quic
