#pragma once
// OpenSSL 3 server context for the TCP side: TLS 1.2 and 1.3, ALPN h2 and
// http/1.1, session tickets keyed from the persistent secrets (so tickets
// survive restarts and work on every worker), the same PEM files as QUIC.
// One context is shared by all workers (OpenSSL makes SSL_CTX thread-safe
// for creating sessions); reload() builds a new one for new connections
// while established ones keep theirs.

#include <openssl/ssl.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

namespace xdpq::http {

// Key log lines from the TCP side's TLS (set once by the control plane).
// Routes OpenSSL's allocations through the per-thread block cache
// (base/small_alloc.h): with SSL_MODE_RELEASE_BUFFERS an idle connection
// holds no record buffers, and each request on a keep-alive connection
// takes them back from the cache instead of malloc. Call first thing in
// main(), before OpenSSL allocates anything; false if it was too late.
bool use_block_cache_for_openssl();

using TcpKeylogSink = void (*)(const std::string &line);
void set_tcp_keylog_sink(TcpKeylogSink sink);

class TcpTlsContext {
public:
  // Throws std::runtime_error with OpenSSL's reason.
  TcpTlsContext(const std::string &cert_pem, const std::string &key_pem,
                const std::array<uint8_t, 64> &ticket_secret);
  ~TcpTlsContext();
  TcpTlsContext(const TcpTlsContext &) = delete;
  TcpTlsContext &operator=(const TcpTlsContext &) = delete;

  // A new SSL for an accepted connection (nullptr on failure).
  SSL *new_ssl() const;
  // Swaps in a new certificate for new connections. Throws on bad input,
  // leaving the old one in place.
  void reload(const std::string &cert_pem, const std::string &key_pem);

private:
  static SSL_CTX *build(const std::string &cert_pem, const std::string &key_pem,
                        const std::array<uint8_t, 64> &ticket_secret);
  std::array<uint8_t, 64> ticket_secret_;
  mutable std::mutex mu_; // guards ctx_ swaps only: taken once per accept
  SSL_CTX *ctx_ = nullptr;
};

// The OpenSSL session-ticket keys (16-byte name, 32-byte HMAC key, 32-byte
// AES key) derived from the persistent secret: the same on every worker and
// after a restart, and independent of each other.
std::array<uint8_t, 80> derive_ticket_keys(const std::array<uint8_t, 64> &secret);

} // namespace xdpq::http
