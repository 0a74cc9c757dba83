#pragma once
// Long-lived server secrets: the key behind stateless reset tokens and
// address-validation tokens, and the TLS session ticket key. Kept in a
// file (mode 0600) so a restarted server can still reset its old clients,
// honour NEW_TOKEN tokens and resume sessions; the same file on every node
// behind a QUIC-LB balancer makes those work across nodes.

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace xdpq::quic {

struct Secrets {
  std::array<uint8_t, 32> reset_key{};  // stateless reset tokens
  std::array<uint8_t, 32> token_key{};  // Retry and NEW_TOKEN tokens
  std::array<uint8_t, 64> ticket_key{}; // GnuTLS session ticket key
  // QUIC-LB's AES-128 key for encrypted connection IDs (optional in the
  // file: written to new files, absent from files of older versions).
  std::optional<std::array<uint8_t, 16>> quic_lb_key;

  static Secrets generate();
  // Reads path; if it does not exist, generates secrets and writes them
  // there with mode 0600 (with create false, only checks that it could:
  // --check-config writes nothing). Throws std::runtime_error on a
  // malformed file, a file readable by others, or an I/O error, naming the
  // path.
  static Secrets load_or_create(const std::string &path, bool create = true);
};

} // namespace xdpq::quic
