#include "quic/endpoint.h"

#include "base/log.h"
#include "bpf/xdpq_shared.h"
#include "quic/connection.h"

#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace xdpq::quic {

namespace {
constexpr size_t MIN_INITIAL_DATAGRAM = 1200;
// Shortest datagram a stateless reset may answer: it must look like a short
// header packet with our CID length, and be longer than the reset we send.
constexpr size_t RESET_TRIGGER_OVERHEAD = 22;
// First octet of our CIDs without a QUIC-LB configuration: codepoint 0b111
// ("unroutable": a balancer routes them by address) and, as such CIDs
// must, their length.
constexpr uint8_t UNROUTABLE_FIRST_OCTET =
    QuicLbConfig::UNROUTABLE << 5 | (Endpoint::UNROUTABLE_CID_LEN - 1);

// A long header's packet type is Initial (RFC 9000 17.2; RFC 9369 3.2
// renumbered the types for version 2).
bool is_initial(uint8_t first, uint32_t version) {
  const uint8_t type = (first & 0x30) >> 4;
  return version == NGTCP2_PROTO_VER_V2 ? type == 1 : type == 0;
}
// ... or a 0-RTT packet: the two a client sends with the DCID it chose.
bool is_initial_or_0rtt(uint8_t first, uint32_t version) {
  const uint8_t type = (first & 0x30) >> 4;
  return version == NGTCP2_PROTO_VER_V2 ? type == 1 || type == 2 : type == 0 || type == 1;
}
} // namespace

CidKey CidKey::from(const uint8_t *p, size_t n) {
  CidKey k;
  k.len = static_cast<uint8_t>(n > NGTCP2_MAX_CIDLEN ? NGTCP2_MAX_CIDLEN : n);
  std::memcpy(k.data, p, k.len);
  return k;
}

bool CidKey::operator==(const CidKey &o) const {
  return len == o.len && std::memcmp(data, o.data, len) == 0;
}

size_t CidKeyHash::operator()(const CidKey &k) const {
  // Up to 20 bytes and the length, chained through two blocks: an
  // injective input, so only a collision of the keyed hash collides.
  uint8_t a[16] = {}, b[16] = {};
  std::memcpy(a, k.data, k.len < 16 ? k.len : 16);
  if (k.len > 16) std::memcpy(b, k.data + 16, k.len - 16u);
  b[15] = k.len;
  uint64_t h = keyed(a);
  for (int i = 0; i < 8; ++i) b[4 + i] ^= static_cast<uint8_t>(h >> (8 * i));
  return static_cast<size_t>(keyed(b));
}

Endpoint::Endpoint(const EndpointConfig &cfg, TlsContext &tls, const Secrets &secrets,
                   ApplicationFactory &app, dataplane::TimerWheel &timers, const Clock &clock,
                   dataplane::TxSink &tx)
    : cfg_(cfg), cid_len_(cfg.quic_lb ? cfg.quic_lb->cid_len() : UNROUTABLE_CID_LEN), tls_(&tls), secrets_(secrets), app_(app), timers_(timers), clock_(clock), tx_(tx),
      sources_(cfg.per_source) {
  scratch_.resize(MIN_INITIAL_DATAGRAM);
}

Endpoint::~Endpoint() {
  // Connections unregister from the wheel in their destructors.
  conns_.clear();
}

std::optional<size_t> Endpoint::visible_worker_offset(const QuicLbCodec *lb) {
  if (lb == nullptr) return 1;
  if (lb->config().key) return std::nullopt;
  return 1 + lb->config().server_id.size();
}

void Endpoint::make_cid(ngtcp2_cid &cid) {
  cid.datalen = cid_len_;
  // A short QUIC-LB nonce (the draft allows 4 bytes: 3 random after our
  // worker byte) can repeat while the first CID is alive; a few draws make
  // a live duplicate practically impossible.
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (!cfg_.quic_lb) {
      cid.data[0] = UNROUTABLE_FIRST_OCTET;
      cid.data[1] = worker_byte();
      gnutls_rnd(GNUTLS_RND_NONCE, cid.data + 2, cid_len_ - 2);
    } else {
      // The nonce: our worker byte, then random bytes; one more random
      // byte for the first octet's low bits.
      uint8_t nonce[QuicLbCodec::MAX_PLAINTEXT + 1];
      const size_t n = cfg_.quic_lb->config().nonce_len;
      nonce[0] = worker_byte();
      gnutls_rnd(GNUTLS_RND_NONCE, nonce + 1, n);
      cfg_.quic_lb->encode(nonce, nonce[n], cid.data);
    }
    if (!cids_.contains(CidKey::from(cid))) return;
  }
}

int Endpoint::owner_of(const uint8_t *dcid, size_t len) const {
  uint8_t worker;
  if (!cfg_.quic_lb) {
    if (len != UNROUTABLE_CID_LEN || dcid[0] != UNROUTABLE_FIRST_OCTET) return -1;
    worker = dcid[1];
  } else {
    uint8_t plain[QuicLbCodec::MAX_PLAINTEXT];
    if (!cfg_.quic_lb->is_ours(dcid, len, plain)) return -1;
    worker = plain[cfg_.quic_lb->config().server_id.size()];
  }
  const bool ours = worker >> 7 == cfg_.generation;
  return (worker & 0x7f) < (ours ? cfg_.worker_count : other_generation_workers_) ? worker : -1;
}

void Endpoint::add_cid(const ngtcp2_cid &cid, Connection *c, bool long_only) {
  auto key = CidKey::from(cid);
  // A key routed already (another client's DCID, reused) stays its owner's.
  if (cids_.try_emplace(key, Route{c, long_only}).second) c->routes.push_back(key);
}

void Endpoint::drop_routes(Connection *c) {
  for (const auto &key : c->routes) {
    auto it = cids_.find(key);
    if (it != cids_.end() && it->second.conn == c) cids_.erase(it);
  }
  c->routes.clear();
}

void Endpoint::remove_cid(const ngtcp2_cid &cid, Connection *c) {
  auto key = CidKey::from(cid);
  auto it = cids_.find(key);
  if (it != cids_.end() && it->second.conn == c) cids_.erase(it);
  std::erase(c->routes, key);
}

void Endpoint::want_write(Connection *c) {
  if (!c->pending_write && !c->retired) {
    c->pending_write = true;
    pending_writes_.push_back(c);
  }
}

void Endpoint::retire(Connection *c) {
  if (c->retired) return;
  c->retired = true;
  retired_.push_back(c);
}

void Endpoint::app_finished(Connection *c) { apps_finished_.push_back(c); }

void Endpoint::handshake_done(Connection *) {
  if (handshakes_in_progress_ > 0) --handshakes_in_progress_;
}

void Endpoint::source_left(Connection *c) {
  if (c->source_unproven) return; // forged Initials can close too: theirs stays until retired
  sources_.release(c->source_slot);
  c->source_slot = dataplane::SourceLimiter::NONE;
}

void Endpoint::source_proven(Connection *c) {
  if (!c->source_unproven) return;
  c->source_unproven = false;
  sources_.proven(c->source_slot);
}

void Endpoint::on_datagram(const dataplane::RxDatagram &dg) {
  stats_.datagrams_in += 1;
  stats_.bytes_in += dg.len;
  if (xdpq_reflection_port(dg.path.remote.port())) {
    // No QUIC client sends from these; answering would make us a reflector
    // (the XDP program drops them too; this covers kernel sockets).
    stats_.drop_reflection += 1;
    return;
  }
  if (dg.len == 0) {
    // ngtcp2_pkt_decode_version_cid asserts on empty input.
    stats_.drop_unparsable += 1;
    return;
  }
  ngtcp2_version_cid vc;
  int rv = ngtcp2_pkt_decode_version_cid(&vc, dg.data, dg.len, cid_len_);
  if (rv == NGTCP2_ERR_VERSION_NEGOTIATION) {
    send_version_negotiation(dg, vc);
    return;
  }
  if (rv != 0) {
    stats_.drop_unparsable += 1;
    return;
  }
  const bool long_header = dg.data[0] & 0x80;
  auto it = cids_.find(CidKey::from(vc.dcid, vc.dcidlen));
  if (it != cids_.end() &&
      (!it->second.long_only || (long_header && is_initial_or_0rtt(dg.data[0], vc.version)))) {
    stats_.datagrams_routed += 1;
    it->second.conn->on_datagram(dg);
    return;
  }
  // Another worker's CID: a client whose new path (migration, NAT
  // rebinding, an RSS change) hashes to our queue. It is the owner's to
  // route, or to reset if it has no such connection; a reset from us would
  // kill a healthy connection. A new connection's Initial stays here: its
  // DCID is the client's choice and any worker may accept it.
  const int owner = long_header && is_initial(dg.data[0], vc.version)
                        ? -1
                        : owner_of(vc.dcid, vc.dcidlen);
  if (owner >= 0 && owner != worker_byte()) {
    if (handoff_ != nullptr && handoff_->hand_off(static_cast<uint8_t>(owner), dg)) {
      stats_.datagrams_handed_off += 1;
    } else {
      stats_.drop_other_worker += 1;
    }
    return;
  }
  if (long_header) {
    accept(dg, vc);
  } else {
    send_stateless_reset(dg, vc);
  }
}

void Endpoint::accept(const dataplane::RxDatagram &dg, const ngtcp2_version_cid &vc) {
  if (dg.len < MIN_INITIAL_DATAGRAM) {
    // RFC 9000 14.1: Initials ride in datagrams of at least 1200 bytes.
    // Another long header (Handshake, 0-RTT) is for a connection we do
    // not have: counted as such, not as a small Initial.
    if (is_initial(dg.data[0], vc.version)) {
      stats_.drop_small_initial += 1;
    } else {
      stats_.drop_unknown_packet += 1;
    }
    return;
  }
  ngtcp2_pkt_hd hd;
  if (ngtcp2_accept(&hd, dg.data, dg.len) != 0) {
    // 0-RTT or Handshake for a connection we do not know, or junk.
    stats_.drop_unknown_packet += 1;
    return;
  }
  if (conns_.size() >= cfg_.max_connections || draining_) {
    stats_.drop_conn_limit += 1;
    send_close_without_state(dg, hd, NGTCP2_CONNECTION_REFUSED);
    return;
  }

  ngtcp2_cid odcid;
  const ngtcp2_cid *podcid = nullptr;
  ngtcp2_vec token{};
  bool new_token = false; // a valid NEW_TOKEN token (see below)
  const uint64_t wall = clock_.wall();
  if (hd.tokenlen > 0) {
    if (hd.token[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_RETRY) {
      if (ngtcp2_crypto_verify_retry_token(
              &odcid, hd.token, hd.tokenlen, secrets_.token_key.data(),
              secrets_.token_key.size(), hd.version, &dg.path.remote.u.sa, dg.path.remote.len,
              &hd.dcid, cfg_.retry_token_lifetime, wall) != 0) {
        stats_.drop_bad_token += 1;
        send_close_without_state(dg, hd, NGTCP2_INVALID_TOKEN);
        return;
      }
      podcid = &odcid;
      token = {const_cast<uint8_t *>(hd.token), hd.tokenlen};
    } else if (hd.token[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_REGULAR &&
               ngtcp2_crypto_verify_regular_token(
                   hd.token, hd.tokenlen, secrets_.token_key.data(),
                   secrets_.token_key.size(), &dg.path.remote.u.sa, dg.path.remote.len,
                   cfg_.new_token_lifetime, wall) == 0) {
      // A NEW_TOKEN token travels in the clear in every Initial, is bound
      // to the address only and lives an hour: whoever saw it can replay it
      // in Initials forged with that address (RFC 9000 8.1.3 asks that
      // replay be prevented or limited). It spares the client a Retry and
      // nothing more: not passed to ngtcp2, which would lift the 3x limit
      // for it, and not proof for the per-source limits.
      stats_.new_tokens_accepted += 1;
      new_token = true;
    }
  }
  // The address is proven by a Retry token (returned at once, from the
  // address the Retry went to).
  bool validated = token.len > 0;
  const uint64_t now = clock_.now();
  if (recent_at_ && now > recent_at_) {
    recent_handshakes_ *= std::exp(-static_cast<double>(now - recent_at_) * 1e-9);
  }
  recent_at_ = now;
  bool need_retry = cfg_.retry == RetryMode::on ||
                    (cfg_.retry == RetryMode::automatic &&
                     (handshakes_in_progress_ >= cfg_.retry_threshold ||
                      recent_handshakes_ >= cfg_.retry_rate));
  if (need_retry && !validated && !new_token) {
    send_retry(dg, hd);
    return;
  }
  uint32_t slot;
  // Over a per-source cap or rate. A proven address is refused outright, so
  // the client stops instead of retransmitting into a silent server. One
  // without proof may be forged (perhaps by someone filling this source's
  // share): one Retry packet (smaller than the Initial, no state), and a
  // real client comes back with a token and counts as proven.
  auto over = [&](uint64_t &refused, uint64_t &retried, uint64_t &dropped) {
    if (validated) {
      refused += 1;
      send_close_without_state(dg, hd, NGTCP2_CONNECTION_REFUSED);
    } else if (cfg_.retry != RetryMode::off) {
      retried += 1;
      send_retry(dg, hd);
    } else {
      dropped += 1;
    }
  };
  switch (sources_.admit(dg.path.remote, now, &slot,
                         validated ? dataplane::SourceLimiter::Proof::validated
                                   : dataplane::SourceLimiter::Proof::none)) {
  case dataplane::SourceLimiter::Verdict::ok: break;
  case dataplane::SourceLimiter::Verdict::too_many_connections:
    return over(stats_.refused_source_limit, stats_.retries_source_limit,
                stats_.drop_source_limit);
  case dataplane::SourceLimiter::Verdict::too_fast:
    return over(stats_.refused_source_rate, stats_.retries_source_rate, stats_.drop_source_rate);
  }
  recent_handshakes_ += 1;

  auto conn = std::make_unique<Connection>(*this);
  Connection *c = conn.get();
  c->source_slot = slot;
  c->source_unproven = !validated;
  if (c->init(hd, dg.path, podcid, token) != 0) {
    drop_routes(c);
    sources_.release(slot, !validated);
    stats_.drop_unparsable += 1; // no resources for it; the client retries
    return;
  }
  conns_.emplace(c, std::move(conn));
  ++handshakes_in_progress_;
  // The client's DCID routes its further Initials (and 0-RTT) until it
  // switches CIDs; never a Handshake or 1-RTT packet (Route::long_only).
  add_cid(hd.dcid, c, true);
  c->on_datagram(dg);
  // A connection given up for a Retry (ngtcp2 asked for one) is no
  // handshake started: the datagram's outcome is the Retry.
  if (c->wants_retry()) {
    send_retry(dg, hd);
  } else {
    stats_.handshakes_started += 1;
  }
}

bool Endpoint::send_stateless(const dataplane::RxDatagram &dg, const uint8_t *data, size_t len) {
  if (len > 3 * dg.len) {
    stats_.drop_amplification += 1;
    return false;
  }
  auto buf = tx_.tx_alloc(len);
  if (buf.empty()) {
    stats_.drop_tx_full += 1;
    return false;
  }
  std::memcpy(buf.data(), data, len);
  tx_.tx_commit_reply(dg, len);
  stats_.packets_out += 1;
  return true;
}

void Endpoint::send_version_negotiation(const dataplane::RxDatagram &dg,
                                        const ngtcp2_version_cid &vc) {
  if (dg.len < MIN_INITIAL_DATAGRAM) {
    // RFC 9000 6.1: no Version Negotiation for datagrams a client could
    // not have sent as a first Initial (and no cheap reflection).
    stats_.drop_small_initial += 1;
    return;
  }
  uint8_t grease;
  gnutls_rnd(GNUTLS_RND_NONCE, &grease, 1);
  uint32_t versions[] = {0x1a2a3a4au | ((grease & 0x70u) << 24), NGTCP2_PROTO_VER_V1};
  auto n = ngtcp2_pkt_write_version_negotiation(scratch_.data(), scratch_.size(), grease,
                                                vc.scid, vc.scidlen, vc.dcid, vc.dcidlen,
                                                versions, 2);
  if (n <= 0) {
    stats_.drop_unparsable += 1;
  } else if (send_stateless(dg, scratch_.data(), static_cast<size_t>(n))) {
    stats_.version_negotiations += 1;
  }
}

void Endpoint::send_retry(const dataplane::RxDatagram &dg, const ngtcp2_pkt_hd &hd) {
  ngtcp2_cid scid;
  make_cid(scid);
  uint8_t token[NGTCP2_CRYPTO_MAX_RETRY_TOKENLEN];
  auto tokenlen = ngtcp2_crypto_generate_retry_token(
      token, secrets_.token_key.data(), secrets_.token_key.size(), hd.version,
      &dg.path.remote.u.sa, dg.path.remote.len, &scid, &hd.dcid, clock_.wall());
  ngtcp2_ssize n = -1;
  if (tokenlen > 0) {
    n = ngtcp2_crypto_write_retry(scratch_.data(), scratch_.size(), hd.version, &hd.scid, &scid,
                                  &hd.dcid, token, static_cast<size_t>(tokenlen));
  }
  if (n <= 0) {
    stats_.drop_unparsable += 1;
  } else if (send_stateless(dg, scratch_.data(), static_cast<size_t>(n))) {
    stats_.retries_sent += 1;
  }
}

void Endpoint::send_close_without_state(const dataplane::RxDatagram &dg, const ngtcp2_pkt_hd &hd,
                                        uint64_t error_code) {
  auto n = ngtcp2_crypto_write_connection_close(scratch_.data(), scratch_.size(), hd.version,
                                                &hd.scid, &hd.dcid, error_code, nullptr, 0);
  if (n > 0) send_stateless(dg, scratch_.data(), static_cast<size_t>(n));
}

void Endpoint::send_stateless_reset(const dataplane::RxDatagram &dg,
                                    const ngtcp2_version_cid &vc) {
  if (dg.len < cid_len_ + RESET_TRIGGER_OVERHEAD) {
    stats_.drop_unparsable += 1;
    return;
  }
  // Token bucket: a flood of junk must not turn us into a reset cannon.
  const double rate = cfg_.stateless_resets_per_second;
  if (!resets_.take(1, rate, rate, clock_.now())) {
    stats_.drop_reset_rate += 1;
    return;
  }
  ngtcp2_cid dcid;
  ngtcp2_cid_init(&dcid, vc.dcid, vc.dcidlen);
  uint8_t token[NGTCP2_STATELESS_RESET_TOKENLEN];
  if (ngtcp2_crypto_generate_stateless_reset_token(token, secrets_.reset_key.data(),
                                                   secrets_.reset_key.size(), &dcid) != 0) {
    stats_.drop_unparsable += 1;
    return;
  }
  // Always shorter than the trigger (RFC 9000 10.3.3), so resets cannot loop.
  size_t randlen = dg.len - 1 - NGTCP2_STATELESS_RESET_TOKENLEN;
  if (randlen > 41) randlen = 41;
  uint8_t rand[41];
  gnutls_rnd(GNUTLS_RND_NONCE, rand, randlen);
  auto n = ngtcp2_pkt_write_stateless_reset(scratch_.data(), scratch_.size(), token, rand,
                                            randlen);
  if (n <= 0) {
    stats_.drop_unparsable += 1;
  } else if (send_stateless(dg, scratch_.data(), static_cast<size_t>(n))) {
    stats_.stateless_resets_sent += 1;
  }
}

void Endpoint::end_of_pass() {
  write_blocked_ = false;
  write_pending();
  // What closed in this pass is freed before the limit is checked: its
  // memory must not have others closed for it.
  bool freed = free_retired();
  if (cfg_.max_memory && memory() > cfg_.max_memory) {
    reap_memory();
    freed = free_retired() || freed;
  }
  // A connection freed just now may have let others go on (the file
  // read-ahead it held, an upstream connection): they write in this pass,
  // not at the next event.
  if (freed && !write_blocked_) write_pending();
}

bool Endpoint::free_retired() {
  if (retired_.empty() && apps_finished_.empty()) return false;
  // Out of every call chain of theirs: what the applications of connections
  // that closed hold (streams, bodies, read-ahead, upstream exchanges) goes
  // now, before any of them is freed below.
  for (Connection *c : apps_finished_) c->release_app();
  apps_finished_.clear();
  for (Connection *c : retired_) {
    drop_routes(c);
    sources_.release(c->source_slot, c->source_unproven);
    if (c->pending_write) {
      std::erase(pending_writes_, c);
    }
    stats_.conns_closed += 1;
    conns_.erase(c);
  }
  retired_.clear();
  return true;
}

void Endpoint::write_pending() {
  // A connection may queue others while it writes (not itself: it is still
  // marked pending): they are appended and written in this same walk. One
  // that finds the sink full stops the walk; it and the rest stay queued.
  size_t i = 0;
  for (; i < pending_writes_.size(); ++i) {
    Connection *c = pending_writes_[i];
    if (c->retired) {
      c->pending_write = false;
      continue;
    }
    if (!c->write()) {
      write_blocked_ = true;
      break;
    }
    c->pending_write = false;
  }
  pending_writes_.erase(pending_writes_.begin(), pending_writes_.begin() + static_cast<long>(i));
}

// Over the worker's QUIC memory: the connections holding the most are
// closed and freed at once (a peer that fills its receive window with
// out-of-order data holds up to the window in ngtcp2's buffers), until the
// rest fits, 64 at most per pass. Freed by the caller, in this pass. One
// walk of the connections, whatever their number.
void Endpoint::reap_memory() {
  static constexpr size_t MAX_PER_PASS = 64;
  int64_t over = static_cast<int64_t>(memory() - cfg_.max_memory);
  auto &picks = reap_scratch_;
  picks.clear();
  for (const auto &[c, owner] : conns_) {
    if (!c->retired) picks.emplace_back(c->memory(), c);
  }
  const size_t n = std::min(MAX_PER_PASS, picks.size());
  std::partial_sort(picks.begin(), picks.begin() + static_cast<long>(n), picks.end(),
                    [](const auto &a, const auto &b) { return a.first > b.first; });
  for (size_t k = 0; k < n && over > 0; ++k) {
    over -= static_cast<int64_t>(picks[k].first);
    stats_.memory_closes += 1;
    picks[k].second->abandon(app_.excessive_load_code());
  }
  picks.clear();
}

void Endpoint::start_drain() {
  draining_ = true;
  for (auto &[c, owner] : conns_) c->shutdown_notice();
}

size_t Endpoint::active_requests() const {
  size_t n = 0;
  for (const auto &[c, owner] : conns_) n += c->active_streams() + c->goaway_pending();
  return n;
}

void Endpoint::list_connections(std::vector<ConnInfo> &out) const {
  for (const auto &[c, owner] : conns_) out.push_back(c->info());
}

void Endpoint::close_all() {
  for (auto &[c, owner] : conns_) {
    c->close(app_.no_error_code());
  }
}

} // namespace xdpq::quic
