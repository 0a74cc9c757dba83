#pragma once
// GnuTLS server configuration for QUIC: certificate, session ticket key,
// 0-RTT anti-replay and the TLS 1.3 priorities. One per worker; every
// worker loads the same PEM data and the same ticket key, so a ticket
// issued by one worker resumes on another. The anti-replay store is the
// one thing the workers share: a hello replayed to another worker is a
// replay there too.

#include "quic/secrets.h"

#include <gnutls/gnutls.h>

#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace xdpq::quic {

struct TlsConfig {
  std::string cert_pem; // certificate chain, PEM
  std::string key_pem;  // private key, PEM
  // GnuTLS priority string for QUIC's TLS 1.3 handshake. Our order wins
  // (%SERVER_PRECEDENCE): AES-128-GCM, whose SHA-256 key schedule has
  // hardware support (SHA-NI) where SHA-384's has none, and X25519. With
  // the client's order (GnuTLS's NORMAL: AES-256-GCM first) a handshake
  // cost ~22 % more server CPU (h3load, new connection per request).
  std::string priority =
      "%DISABLE_TLS13_COMPAT_MODE:%SERVER_PRECEDENCE:NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:"
      "+AES-256-GCM:+CHACHA20-POLY1305:+AES-128-CCM:-GROUP-ALL:+GROUP-X25519:"
      "+GROUP-SECP256R1:+GROUP-SECP384R1:+GROUP-SECP521R1";
  bool early_data = true;
};

// Where TLS secrets go when key logging is on (NSS key log lines); set once
// by the control plane. active() says whether logging is on: sessions begun
// while it is off format no secrets at all.
using KeylogSink = void (*)(const std::string &line);
using KeylogActive = bool (*)();
void set_keylog_sink(KeylogSink sink, KeylogActive active);

// The ClientHellos that carried early data, until their window expires:
// one store for the whole process (every worker, and the contexts a reload
// replaced), so that a hello replayed to any of them is refused.
// Thread-safe; taken only for early-data hellos.
class ReplayStore {
public:
  explicit ReplayStore(size_t capacity = 65536) : capacity_(capacity) {}
  // Records the hello identified by id until expires. False if it was seen
  // and has not expired (a replay), or the store is full of live entries
  // (early data is then refused rather than a hello forgotten).
  bool remember(std::string_view id, time_t expires, time_t now);
  // Times the full store was swept for expired hellos.
  uint64_t sweeps() const;

private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, time_t> seen_;
  time_t last_sweep_ = 0;
  uint64_t sweeps_ = 0;
};

class TlsContext {
public:
  // Throws std::runtime_error with GnuTLS's reason if the certificate or key
  // cannot be used. replays: the process's anti-replay store (one of its
  // own if none is given).
  TlsContext(const TlsConfig &cfg, const Secrets &secrets,
             std::shared_ptr<ReplayStore> replays = nullptr);
  ~TlsContext();
  TlsContext(const TlsContext &) = delete;
  TlsContext &operator=(const TlsContext &) = delete;

  // Creates a server session for one QUIC connection; conn_ref must outlive
  // it (ngtcp2's crypto helper finds the connection through it). Returns
  // nullptr on failure.
  gnutls_session_t new_session(void *conn_ref) const;
  // Frees a session new_session() made.
  void end_session(gnutls_session_t s) const;
  // The largest handshake message a session takes from a client (a
  // ClientHello): GnuTLS holds one until it is whole.
  static constexpr size_t MAX_HANDSHAKE_MESSAGE = 32 * 1024;
  // Sessions made and not yet ended: a context a reload replaced is freed
  // once none is left.
  size_t sessions() const { return sessions_; }

  // Anti-replay check (called by GnuTLS through a C callback).
  int remember_client_hello(time_t expires, const gnutls_datum_t *key);
  const ReplayStore &replay_store() const { return *replays_; }
  // Early-data hellos this context refused as replays (or for a full store).
  uint64_t replays_refused() const { return replays_refused_; }

private:
  void init(const Secrets &secrets);
  void release();

  TlsConfig cfg_;
  gnutls_certificate_credentials_t cred_ = nullptr;
  gnutls_priority_t priority_ = nullptr;
  gnutls_anti_replay_t anti_replay_ = nullptr;
  gnutls_datum_t ticket_key_{};
  std::array<uint8_t, 64> ticket_key_bytes_{};
  std::shared_ptr<ReplayStore> replays_;
  mutable size_t sessions_ = 0;
  uint64_t replays_refused_ = 0;
};

} // namespace xdpq::quic
