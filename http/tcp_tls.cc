#include "http/tcp_tls.h"

#include "base/small_alloc.h"

#include "base/guard.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

namespace xdpq::http {

namespace {
void *ossl_malloc(size_t n, const char *, int) {
  return small_alloc::allocate(n);
}
void *ossl_realloc(void *p, size_t n, const char *, int) {
  return small_alloc::reallocate(p, n);
}
void ossl_free(void *p, const char *, int) {
  small_alloc::deallocate(p);
}
} // namespace

bool use_block_cache_for_openssl() {
  return CRYPTO_set_mem_functions(ossl_malloc, ossl_realloc, ossl_free) == 1;
}

namespace {

std::atomic<TcpKeylogSink> g_keylog{nullptr};

void keylog_cb(const SSL *, const char *line) {
  if (auto sink = g_keylog.load(std::memory_order_relaxed))
    guarded_void([&] { sink(line); });
}

std::string ssl_error(const char *what) {
  char buf[256];
  unsigned long e = ERR_get_error();
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return std::string(what) + ": " + (e ? buf : "unknown error");
}

int select_alpn(SSL *, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                unsigned int inlen, void *) {
  // Prefer h2, then http/1.1; without a match, continue without ALPN (the
  // client then speaks HTTP/1.1).
  static const unsigned char ours[] = "\x02h2\x08http/1.1";
  unsigned char *sel = nullptr;
  if (SSL_select_next_proto(&sel, outlen, ours, sizeof(ours) - 1, in, inlen) ==
      OPENSSL_NPN_NEGOTIATED) {
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

} // namespace

void set_tcp_keylog_sink(TcpKeylogSink sink) { g_keylog.store(sink); }

std::array<uint8_t, 80> derive_ticket_keys(const std::array<uint8_t, 64> &secret) {
  // Each part from its own label: the name travels in the clear in every
  // ticket, so no byte of it may also be a byte of a key.
  std::array<uint8_t, 80> keys{};
  auto part = [&secret](const char *label, uint8_t *out, size_t len) {
    uint8_t in[80] = {};
    size_t l = std::strlen(label);
    std::memcpy(in, label, l);
    std::memcpy(in + l, secret.data(), secret.size());
    unsigned char d[32];
    unsigned int n = 0;
    EVP_Digest(in, l + secret.size(), d, &n, EVP_sha256(), nullptr);
    std::memcpy(out, d, len);
  };
  part("xdpq ticket name", keys.data(), 16);
  part("xdpq ticket hmac", keys.data() + 16, 32);
  part("xdpq ticket aes!", keys.data() + 48, 32);
  return keys;
}

SSL_CTX *TcpTlsContext::build(const std::string &cert_pem, const std::string &key_pem,
                              const std::array<uint8_t, 64> &ticket_secret) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) throw std::runtime_error(ssl_error("SSL_CTX_new"));
  auto fail = [ctx](const char *what) {
    std::string e = ssl_error(what);
    SSL_CTX_free(ctx);
    throw std::runtime_error(e);
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // A client that closes its side with a TCP FIN and no close_notify
  // (scripts, `nc -N`, many HTTP/1.0-style clients) has still sent a
  // whole request: its end of input is an end, not a fatal TLS error
  // that would leave the answer unsendable. Request framing, not TLS,
  // tells a cut request from a complete one.
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                               SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  // TLS 1.2 ciphers: AEAD with forward secrecy only.
  SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20");
  // TLS 1.3, in our order (server preference): AES-128-GCM first, whose
  // SHA-256 key schedule has hardware support (SHA-NI) where SHA-384 has
  // none; X25519 first for the key exchange.
  if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                    "TLS_CHACHA20_POLY1305_SHA256") != 1 ||
      SSL_CTX_set1_groups_list(ctx, "X25519:P-256:P-384") != 1) {
    fail("TLS 1.3 cipher suites / groups");
  }
  BIO *cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509 *leaf = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  if (!leaf) {
    BIO_free(cb);
    fail("certificate");
  }
  bool ok = SSL_CTX_use_certificate(ctx, leaf) == 1;
  X509_free(leaf);
  while (ok) { // the rest of the chain
    X509 *extra = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
    if (!extra) break;
    ok = SSL_CTX_add_extra_chain_cert(ctx, extra) == 1;
  }
  ERR_clear_error(); // end of PEM input is not an error
  BIO_free(cb);
  if (!ok) fail("certificate chain");
  BIO *kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY *key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(kb);
  if (!key) fail("private key");
  ok = SSL_CTX_use_PrivateKey(ctx, key) == 1;
  EVP_PKEY_free(key);
  if (!ok || SSL_CTX_check_private_key(ctx) != 1) fail("private key does not match certificate");
  SSL_CTX_set_alpn_select_cb(ctx, select_alpn, nullptr);
  SSL_CTX_set_keylog_callback(ctx, keylog_cb);
  auto keys = derive_ticket_keys(ticket_secret);
  SSL_CTX_set_tlsext_ticket_keys(ctx, keys.data(), keys.size());
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF); // stateless tickets only
  SSL_CTX_set_num_tickets(ctx, 1);
  return ctx;
}

TcpTlsContext::TcpTlsContext(const std::string &cert_pem, const std::string &key_pem,
                             const std::array<uint8_t, 64> &ticket_secret)
    : ticket_secret_(ticket_secret), ctx_(build(cert_pem, key_pem, ticket_secret)) {}

TcpTlsContext::~TcpTlsContext() { SSL_CTX_free(ctx_); }

SSL *TcpTlsContext::new_ssl() const {
  std::lock_guard lock(mu_);
  return SSL_new(ctx_);
}

void TcpTlsContext::reload(const std::string &cert_pem, const std::string &key_pem) {
  SSL_CTX *fresh = build(cert_pem, key_pem, ticket_secret_);
  std::lock_guard lock(mu_);
  SSL_CTX_free(ctx_); // established SSLs hold their own reference
  ctx_ = fresh;
}

} // namespace xdpq::http
