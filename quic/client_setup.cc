#include "quic/client_setup.h"

#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include <cstring>

namespace xdpq::quic {

namespace {

void rand_cb(uint8_t *dest, size_t len, const ngtcp2_rand_ctx *) {
  gnutls_rnd(GNUTLS_RND_NONCE, dest, len);
}

int new_cid_cb(ngtcp2_conn *, ngtcp2_cid *cid, uint8_t *token, size_t cidlen, void *) {
  gnutls_rnd(GNUTLS_RND_NONCE, cid->data, cidlen);
  cid->datalen = cidlen;
  gnutls_rnd(GNUTLS_RND_NONCE, token, NGTCP2_STATELESS_RESET_TOKENLEN);
  return 0;
}

} // namespace

void set_client_crypto_callbacks(ngtcp2_callbacks &cb) {
  cb.client_initial = ngtcp2_crypto_client_initial_cb;
  cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb.encrypt = ngtcp2_crypto_encrypt_cb;
  cb.decrypt = ngtcp2_crypto_decrypt_cb;
  cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb.recv_retry = ngtcp2_crypto_recv_retry_cb;
  cb.rand = rand_cb;
  cb.get_new_connection_id = new_cid_cb;
  cb.update_key = ngtcp2_crypto_update_key_cb;
  cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
}

gnutls_session_t new_client_session(gnutls_certificate_credentials_t cred,
                                    ngtcp2_crypto_conn_ref *ref, const char *sni) {
  gnutls_session_t s = nullptr;
  if (gnutls_init(&s, GNUTLS_CLIENT | GNUTLS_NO_END_OF_EARLY_DATA) != 0) return nullptr;
  gnutls_datum_t alpn{reinterpret_cast<unsigned char *>(const_cast<char *>("h3")), 2};
  if (gnutls_priority_set_direct(s, "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3",
                                 nullptr) != 0 ||
      ngtcp2_crypto_gnutls_configure_client_session(s) != 0 ||
      gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, cred) != 0 ||
      gnutls_alpn_set_protocols(s, &alpn, 1, 0) != 0 ||
      gnutls_server_name_set(s, GNUTLS_NAME_DNS, sni, std::strlen(sni)) != 0) {
    gnutls_deinit(s);
    return nullptr;
  }
  gnutls_session_set_ptr(s, ref);
  return s;
}

} // namespace xdpq::quic
