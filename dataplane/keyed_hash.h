#pragma once
// A keyed hash for tables whose keys a peer chooses (source addresses,
// neighbours): SipHash-1-3 over 16 bytes with a random 128-bit key per
// table, so nobody outside can aim many keys at one bucket or slot.

#include <sys/random.h>

#include <cstdint>
#include <cstring>

namespace xdpq::dataplane {

class KeyedHash {
public:
  // A key from the system's random source.
  KeyedHash() {
    uint64_t k[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    // getrandom() on a booted system does not fail for 16 bytes; if it
    // ever did, the fixed key above is still a good (if guessable) mix.
    [[maybe_unused]] auto n = getrandom(k, sizeof(k), 0);
    k0_ = k[0];
    k1_ = k[1];
  }
  KeyedHash(uint64_t k0, uint64_t k1) : k0_(k0), k1_(k1) {}

  // Hash of 16 bytes (shorter keys zero-padded by the caller).
  uint64_t operator()(const uint8_t (&in)[16]) const {
    uint64_t m0, m1;
    std::memcpy(&m0, in, 8);
    std::memcpy(&m1, in + 8, 8);
    uint64_t v0 = k0_ ^ 0x736f6d6570736575ull, v1 = k1_ ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0_ ^ 0x6c7967656e657261ull, v3 = k1_ ^ 0x7465646279746573ull;
    auto round = [&] {
      v0 += v1;
      v1 = rotl(v1, 13) ^ v0;
      v0 = rotl(v0, 32);
      v2 += v3;
      v3 = rotl(v3, 16) ^ v2;
      v0 += v3;
      v3 = rotl(v3, 21) ^ v0;
      v2 += v1;
      v1 = rotl(v1, 17) ^ v2;
      v2 = rotl(v2, 32);
    };
    for (uint64_t m : {m0, m1, uint64_t{16} << 56}) {
      v3 ^= m;
      round();
      v0 ^= m;
    }
    v2 ^= 0xff;
    round();
    round();
    round();
    return v0 ^ v1 ^ v2 ^ v3;
  }

private:
  static uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }
  uint64_t k0_, k1_;
};

} // namespace xdpq::dataplane
