#pragma once
// Plain types shared by the endpoint and its connections.

#include "dataplane/keyed_hash.h"

#include <ngtcp2/ngtcp2.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace xdpq::quic {

// One live connection, for `xdpqctl conns`.
struct ConnInfo {
  std::string peer;
  uint64_t age_ms = 0;
  uint64_t rtt_us = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  size_t streams = 0;
  std::string state;
};

// A connection ID as a hash-map key.
struct CidKey {
  uint8_t len = 0;
  uint8_t data[NGTCP2_MAX_CIDLEN] = {};
  static CidKey from(const uint8_t *p, size_t n);
  static CidKey from(const ngtcp2_cid &c) { return from(c.data, c.datalen); }
  bool operator==(const CidKey &o) const;
};
// Keyed (SipHash, a random key per table): the table also holds the DCIDs
// clients chose for their first Initials, so nobody may aim many keys at
// one bucket.
struct CidKeyHash {
  dataplane::KeyedHash keyed;
  size_t operator()(const CidKey &k) const;
};

} // namespace xdpq::quic
