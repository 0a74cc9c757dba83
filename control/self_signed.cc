#include "control/self_signed.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <stdexcept>

namespace xdpq::control {

namespace {

template <auto F> struct Deleter {
  template <typename T> void operator()(T *p) const { F(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free>>;

void ensure(bool ok, const char *what) {
  if (!ok) throw std::runtime_error(std::string("self-signed certificate: ") + what);
}

std::string bio_string(BIO *b) {
  char *data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string fingerprint(X509 *x) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (X509_digest(x, EVP_sha256(), md, &n) != 1) return "";
  static constexpr char HEX[] = "0123456789ABCDEF";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    if (i) s.push_back(':');
    s.push_back(HEX[md[i] >> 4]);
    s.push_back(HEX[md[i] & 15]);
  }
  return s;
}

} // namespace

CertificatePair make_self_signed() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  ensure(key != nullptr, "key generation failed");
  X509Ptr x(X509_new());
  ensure(x != nullptr, "X509_new failed");
  X509_set_version(x.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM *bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), 365L * 24 * 3600);
  X509_set_pubkey(x.get(), key.get());
  X509_NAME *name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char *>("xdpq self-signed"), -1, -1, 0);
  X509_set_issuer_name(x.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  X509_EXTENSION *ext = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name,
                                            "DNS:localhost,IP:127.0.0.1,IP:::1");
  ensure(ext != nullptr, "subjectAltName");
  X509_add_ext(x.get(), ext, -1);
  X509_EXTENSION_free(ext);
  ensure(X509_sign(x.get(), key.get(), EVP_sha256()) > 0, "signing failed");

  BioPtr cert_bio(BIO_new(BIO_s_mem()));
  BioPtr key_bio(BIO_new(BIO_s_mem()));
  ensure(PEM_write_bio_X509(cert_bio.get(), x.get()) == 1, "PEM certificate");
  ensure(PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr,
                                  nullptr) == 1,
         "PEM key");
  return CertificatePair{bio_string(cert_bio.get()), bio_string(key_bio.get()),
                         fingerprint(x.get())};
}

std::string certificate_fingerprint(const std::string &cert_pem) {
  BioPtr bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  X509Ptr x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  return x ? fingerprint(x.get()) : "";
}

} // namespace xdpq::control
