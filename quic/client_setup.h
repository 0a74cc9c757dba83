#pragma once
// What every ngtcp2 + GnuTLS HTTP/3 client needs, shared by h3load and the
// tests' in-memory client: the crypto-helper callbacks and the TLS session.

#include <gnutls/gnutls.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

namespace xdpq::quic {

// Sets the callbacks a client takes from ngtcp2's crypto helper, plus random
// bytes and new connection IDs. The caller adds its stream callbacks.
void set_client_crypto_callbacks(ngtcp2_callbacks &cb);

// A TLS 1.3 client session for QUIC (ALPN h3, SNI sni) whose crypto helper
// finds the connection through ref; nullptr on failure. No certificate
// verification: for load generators and tests only.
gnutls_session_t new_client_session(gnutls_certificate_credentials_t cred,
                                    ngtcp2_crypto_conn_ref *ref, const char *sni);

} // namespace xdpq::quic
