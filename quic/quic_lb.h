#pragma once
// QUIC-LB connection IDs (draft-ietf-quic-load-balancers-21): a CID a
// load balancer that holds the same configuration can route to the node
// that issued it, with no per-connection state, however the client's
// address changes.
//
//   first octet: config rotation (3 high bits) | length - 1 or random (5)
//   then L = server ID length + nonce length bytes: server ID || nonce,
//   in the clear (no key) or encrypted with a shared AES-128 key: one AES
//   block when L == 16, otherwise a four-pass Feistel network of AES.
//
// Codepoint 0b111 marks a CID no balancer configuration covers
// ("unroutable"); such CIDs encode their length.

#include <nettle/aes.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xdpq::quic {

struct QuicLbConfig {
  static constexpr uint8_t UNROUTABLE = 7; // config rotation codepoint 0b111
  uint8_t config_id = 0;                   // 0..6
  std::vector<uint8_t> server_id;          // 1..15 bytes (xdpqd's options: 1..11)
  size_t nonce_len = 0;                    // 4..18 (xdpqd's: 8..18); server ID + nonce <= 19
  bool encode_length = true;               // the first octet's low bits: length - 1
  std::optional<std::array<uint8_t, 16>> key; // none: plaintext

  // Empty when valid; otherwise what is wrong, for a message.
  std::string problem() const;
};

class QuicLbCodec {
public:
  static constexpr size_t MAX_PLAINTEXT = 19;

  // Throws std::invalid_argument with cfg.problem().
  explicit QuicLbCodec(const QuicLbConfig &cfg);

  const QuicLbConfig &config() const { return cfg_; }
  // Bytes of every CID of this configuration (first octet included).
  size_t cid_len() const { return 1 + plain_len_; }
  size_t plaintext_len() const { return plain_len_; }

  // Writes cid_len() bytes: the first octet (random_bits fill its low five
  // bits unless the length is encoded), then our server ID and nonce
  // (nonce_len bytes), encrypted when there is a key.
  void encode(const uint8_t *nonce, uint8_t random_bits, uint8_t *cid) const;
  // The server ID and nonce (plaintext_len() bytes into plain) of a CID of
  // this configuration. False, with plain untouched, when cid is not one:
  // another length, config rotation codepoint or (when encoded) length.
  bool decode(const uint8_t *cid, size_t len, uint8_t *plain) const;
  // decode() and the server ID is ours.
  bool is_ours(const uint8_t *cid, size_t len, uint8_t *plain) const;

private:
  using Block = std::array<uint8_t, 16>;
  // AES(expand(L, pass, half)) truncated into out (half_len_ bytes, XORed).
  void round(uint8_t pass, const uint8_t *half, uint8_t *out) const;
  void mask_left(uint8_t *half) const;
  void mask_right(uint8_t *half) const;
  // The Feistel network over L bytes, its passes in the order given.
  void four_pass(const uint8_t *in, const uint8_t (&passes)[4], uint8_t *out) const;
  uint8_t first_octet(uint8_t random_bits) const;

  QuicLbConfig cfg_;
  size_t plain_len_;
  size_t half_len_;
  bool odd_;
  aes128_ctx enc_{};
  aes128_ctx dec_{};
};

} // namespace xdpq::quic
