#include "quic/quic_lb.h"

#include <cstring>
#include <stdexcept>

namespace xdpq::quic {

std::string QuicLbConfig::problem() const {
  if (config_id >= UNROUTABLE) {
    return "config ID " + std::to_string(config_id) + ": expected 0 to 6 (7 is 'unroutable')";
  }
  if (server_id.empty() || server_id.size() > 15) {
    return "server ID of " + std::to_string(server_id.size()) + " bytes: expected 1 to 15";
  }
  if (nonce_len < 4 || nonce_len > 18) {
    return "nonce length " + std::to_string(nonce_len) + ": expected 4 to 18";
  }
  if (server_id.size() + nonce_len > QuicLbCodec::MAX_PLAINTEXT) {
    return "server ID (" + std::to_string(server_id.size()) + " bytes) and nonce (" +
           std::to_string(nonce_len) + ") exceed 19 bytes together (a CID holds 20)";
  }
  return {};
}

QuicLbCodec::QuicLbCodec(const QuicLbConfig &cfg) : cfg_(cfg) {
  if (auto p = cfg.problem(); !p.empty()) throw std::invalid_argument(p);
  plain_len_ = cfg.server_id.size() + cfg.nonce_len;
  half_len_ = (plain_len_ + 1) / 2;
  odd_ = plain_len_ % 2 != 0;
  if (cfg.key) {
    aes128_set_encrypt_key(&enc_, cfg.key->data());
    aes128_set_decrypt_key(&dec_, cfg.key->data());
  }
}

uint8_t QuicLbCodec::first_octet(uint8_t random_bits) const {
  const uint8_t low = cfg_.encode_length ? static_cast<uint8_t>(cid_len() - 1) : random_bits;
  return static_cast<uint8_t>(cfg_.config_id << 5 | (low & 0x1f));
}

// With an odd L the middle byte is split: its high nibble is the left
// half's, its low nibble the right half's; each half keeps only its own.
void QuicLbCodec::mask_left(uint8_t *half) const {
  if (odd_) half[half_len_ - 1] &= 0xf0;
}

void QuicLbCodec::mask_right(uint8_t *half) const {
  if (odd_) half[0] &= 0x0f;
}

void QuicLbCodec::round(uint8_t pass, const uint8_t *half, uint8_t *out) const {
  // expand(L, pass, half): the half, zeros, then L and the pass number in
  // the last two bytes.
  Block in{};
  std::memcpy(in.data(), half, half_len_);
  in[14] = static_cast<uint8_t>(plain_len_);
  in[15] = pass;
  Block f;
  aes128_encrypt(&enc_, f.size(), f.data(), in.data());
  for (size_t i = 0; i < half_len_; ++i) out[i] ^= f[i];
}

namespace {
// The halves back into L bytes (the split nibble's two parts joined).
void join(const uint8_t *left, const uint8_t *right, size_t half, bool odd, uint8_t *out) {
  if (!odd) {
    std::memcpy(out, left, half);
    std::memcpy(out + half, right, half);
    return;
  }
  std::memcpy(out, left, half - 1);
  out[half - 1] = static_cast<uint8_t>(left[half - 1] | right[0]);
  std::memcpy(out + half, right + 1, half - 1);
}
} // namespace

void QuicLbCodec::four_pass(const uint8_t *in, const uint8_t (&passes)[4], uint8_t *out) const {
  // Halves are at most 10 bytes; a whole block each keeps every index of
  // round()'s loop visibly in bounds.
  Block left{}, right{};
  std::memcpy(left.data(), in, half_len_);
  std::memcpy(right.data(), in + plain_len_ - half_len_, half_len_);
  mask_left(left.data());
  mask_right(right.data());
  // Odd passes change the right half from the left, even passes the left
  // from the right: 1, 2, 3, 4 encrypt and 4, 3, 2, 1 decrypt. (A
  // balancer may stop decrypting after three passes when the server ID
  // fits in the left half; we also want the nonce.)
  for (uint8_t pass : passes) {
    if (pass % 2 != 0) {
      round(pass, left.data(), right.data());
      mask_right(right.data());
    } else {
      round(pass, right.data(), left.data());
      mask_left(left.data());
    }
  }
  join(left.data(), right.data(), half_len_, odd_, out);
}

void QuicLbCodec::encode(const uint8_t *nonce, uint8_t random_bits, uint8_t *cid) const {
  cid[0] = first_octet(random_bits);
  uint8_t plain[MAX_PLAINTEXT];
  const size_t sid_len = cfg_.server_id.size();
  std::memcpy(plain, cfg_.server_id.data(), sid_len);
  std::memcpy(plain + sid_len, nonce, cfg_.nonce_len);
  if (!cfg_.key) {
    std::memcpy(cid + 1, plain, plain_len_);
  } else if (plain_len_ == 16) {
    aes128_encrypt(&enc_, 16, cid + 1, plain);
  } else {
    four_pass(plain, {1, 2, 3, 4}, cid + 1);
  }
}

bool QuicLbCodec::decode(const uint8_t *cid, size_t len, uint8_t *plain) const {
  if (len != cid_len() || cid[0] >> 5 != cfg_.config_id) return false;
  if (cfg_.encode_length && (cid[0] & 0x1f) != cid_len() - 1) return false;
  if (!cfg_.key) {
    std::memcpy(plain, cid + 1, plain_len_);
  } else if (plain_len_ == 16) {
    aes128_decrypt(&dec_, 16, plain, cid + 1);
  } else {
    four_pass(cid + 1, {4, 3, 2, 1}, plain);
  }
  return true;
}

bool QuicLbCodec::is_ours(const uint8_t *cid, size_t len, uint8_t *plain) const {
  return decode(cid, len, plain) &&
         std::memcmp(plain, cfg_.server_id.data(), cfg_.server_id.size()) == 0;
}

} // namespace xdpq::quic
