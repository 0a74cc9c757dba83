#pragma once
// Plain types shared by the endpoint and its connections.

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

} // namespace xdpq::quic
