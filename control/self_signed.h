#pragma once
// A self-signed certificate for when the operator gives none (demo, tests).

#include <string>

namespace xdpq::control {

struct CertificatePair {
  std::string cert_pem;
  std::string key_pem;
  std::string sha256_fingerprint; // "AB:CD:..."
};

// ECDSA P-256, valid for a year, SAN localhost, 127.0.0.1 and ::1.
// Throws std::runtime_error if OpenSSL fails.
CertificatePair make_self_signed();

// Fingerprint of the first certificate in a PEM chain ("" if unparsable).
std::string certificate_fingerprint(const std::string &cert_pem);

} // namespace xdpq::control
