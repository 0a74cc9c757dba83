#include "quic/tls_context.h"

#include "base/guard.h"

#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include <atomic>
#include <stdexcept>

namespace xdpq::quic {

namespace {

// GnuTLS's key for a hello is the start of its current recording window
// (12 bytes: seconds as two 32-bit halves, nanoseconds) followed by the
// PSK binder. The window starts differ between contexts (each rolls over on
// its own), so only the binder identifies the hello across workers.
constexpr size_t WINDOW_PREFIX = 12;
std::atomic<KeylogSink> g_keylog{nullptr};
std::atomic<KeylogActive> g_keylog_active{nullptr};

std::string hex(const unsigned char *p, size_t n) {
  static constexpr char H[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(H[p[i] >> 4]);
    s.push_back(H[p[i] & 15]);
  }
  return s;
}

int keylog_cb(gnutls_session_t session, const char *label, const gnutls_datum_t *secret) {
  KeylogSink sink = g_keylog.load(std::memory_order_relaxed);
  if (!sink) return 0;
  guarded_void([&] {
    gnutls_datum_t client_random{}, server_random{};
    gnutls_session_get_random(session, &client_random, &server_random);
    sink(std::string(label) + " " + hex(client_random.data, client_random.size) + " " +
         hex(secret->data, secret->size));
  });
  return 0;
}

int anti_replay_add(void *ptr, time_t expires, const gnutls_datum_t *key, const gnutls_datum_t *) {
  // Out of memory: refuse the early data rather than forget the hello.
  return guarded(
      [&] { return static_cast<TlsContext *>(ptr)->remember_client_hello(expires, key); },
      int{GNUTLS_E_DB_ENTRY_EXISTS});
}

void check(int rv, const char *what) {
  if (rv < 0) {
    throw std::runtime_error(std::string(what) + ": " + gnutls_strerror(rv));
  }
}

} // namespace

TlsContext::TlsContext(const TlsConfig &cfg, const Secrets &secrets,
                       std::shared_ptr<ReplayStore> replays)
    : cfg_(cfg), replays_(replays ? std::move(replays) : std::make_shared<ReplayStore>()) {
  try {
    init(secrets);
  } catch (...) {
    release(); // the destructor does not run for a throwing constructor
    throw;
  }
}

void TlsContext::init(const Secrets &secrets) {
  check(gnutls_certificate_allocate_credentials(&cred_), "TLS credentials");
  gnutls_datum_t cert{reinterpret_cast<unsigned char *>(cfg_.cert_pem.data()),
                      static_cast<unsigned>(cfg_.cert_pem.size())};
  gnutls_datum_t key{reinterpret_cast<unsigned char *>(cfg_.key_pem.data()),
                     static_cast<unsigned>(cfg_.key_pem.size())};
  check(gnutls_certificate_set_x509_key_mem(cred_, &cert, &key, GNUTLS_X509_FMT_PEM),
        "certificate/key");
  const char *err = nullptr;
  int rv = gnutls_priority_init(&priority_, cfg_.priority.c_str(), &err);
  if (rv < 0) {
    throw std::runtime_error("TLS priority string near '" + std::string(err ? err : "?") +
                             "': " + gnutls_strerror(rv));
  }
  ticket_key_bytes_ = secrets.ticket_key;
  ticket_key_.data = ticket_key_bytes_.data();
  ticket_key_.size = static_cast<unsigned>(ticket_key_bytes_.size());
  check(gnutls_anti_replay_init(&anti_replay_), "anti-replay");
  gnutls_anti_replay_set_add_function(anti_replay_, anti_replay_add);
  gnutls_anti_replay_set_ptr(anti_replay_, this);
}

TlsContext::~TlsContext() { release(); }

void TlsContext::release() {
  if (anti_replay_) gnutls_anti_replay_deinit(anti_replay_);
  if (priority_) gnutls_priority_deinit(priority_);
  if (cred_) gnutls_certificate_free_credentials(cred_);
  anti_replay_ = nullptr;
  priority_ = nullptr;
  cred_ = nullptr;
}

bool ReplayStore::remember(std::string_view id, time_t expires, time_t now) {
  std::lock_guard lock(mu_);
  if (seen_.size() >= capacity_) {
    // A sweep reads every entry; entries expire by the second, so one a
    // second finds all there is to find. (Each early-data hello on a full
    // store used to pay for a sweep of its own.)
    if (now != last_sweep_) {
      last_sweep_ = now;
      sweeps_ += 1;
      std::erase_if(seen_, [now](const auto &kv) { return kv.second < now; });
    }
    if (seen_.size() >= capacity_) return false; // full of live entries
  }
  auto [it, inserted] = seen_.try_emplace(std::string(id), expires);
  if (!inserted) {
    if (it->second >= now) return false;
    it->second = expires;
  }
  return true;
}

uint64_t ReplayStore::sweeps() const {
  std::lock_guard lock(mu_);
  return sweeps_;
}

int TlsContext::remember_client_hello(time_t expires, const gnutls_datum_t *key) {
  std::string_view id(reinterpret_cast<const char *>(key->data), key->size);
  if (id.size() > WINDOW_PREFIX) id.remove_prefix(WINDOW_PREFIX);
  if (replays_->remember(id, expires, time(nullptr))) return 0;
  replays_refused_ += 1;
  return GNUTLS_E_DB_ENTRY_EXISTS;
}

void set_keylog_sink(KeylogSink sink, KeylogActive active) {
  g_keylog_active.store(active);
  g_keylog.store(sink);
}

gnutls_session_t TlsContext::new_session(void *conn_ref) const {
  gnutls_session_t s = nullptr;
  unsigned flags = GNUTLS_SERVER | GNUTLS_NO_AUTO_SEND_TICKET | GNUTLS_NO_END_OF_EARLY_DATA;
  if (cfg_.early_data) flags |= GNUTLS_ENABLE_EARLY_DATA;
  if (gnutls_init(&s, flags) != 0) return nullptr;
  gnutls_datum_t alpn{reinterpret_cast<unsigned char *>(const_cast<char *>("h3")), 2};
  if (gnutls_priority_set(s, priority_) != 0 ||
      gnutls_session_ticket_enable_server(s, &ticket_key_) != 0 ||
      ngtcp2_crypto_gnutls_configure_server_session(s) != 0 ||
      gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, cred_) != 0 ||
      gnutls_alpn_set_protocols(s, &alpn, 1,
                                GNUTLS_ALPN_MANDATORY | GNUTLS_ALPN_SERVER_PRECEDENCE) != 0) {
    gnutls_deinit(s);
    return nullptr;
  }
  if (cfg_.early_data) {
    gnutls_anti_replay_enable(s, anti_replay_);
    gnutls_record_set_max_early_data_size(s, 0xffffffffu);
  }
  // A handshake message is buffered until it is whole (GnuTLS's default
  // bound: 128 KiB), outside the connection's counted memory. A ClientHello
  // is a few KiB, a post-quantum key share included: 32 KiB is plenty.
  gnutls_handshake_set_max_packet_length(s, MAX_HANDSHAKE_MESSAGE);
  gnutls_session_set_ptr(s, conn_ref);
  if (auto active = g_keylog_active.load(std::memory_order_relaxed); active && active()) {
    gnutls_session_set_keylog_function(s, keylog_cb);
  }
  sessions_ += 1;
  return s;
}

void TlsContext::end_session(gnutls_session_t s) const {
  gnutls_deinit(s);
  sessions_ -= 1;
}

} // namespace xdpq::quic
