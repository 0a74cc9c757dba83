#pragma once
// HTTP/2 frames for tests that drive a session with raw bytes: built by
// hand, and a server's output split back into frames.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq::testing {

inline std::string h2_frame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload) {
  std::string f;
  const size_t n = payload.size();
  f += static_cast<char>(n >> 16);
  f += static_cast<char>(n >> 8);
  f += static_cast<char>(n);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>(stream >> shift);
  f += payload;
  return f;
}

struct H2Frame {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t stream = 0;
  std::string payload;
  // The first four bytes of the payload as a number (an error code of
  // RST_STREAM; GOAWAY's starts at byte 4).
  uint32_t word(size_t at = 0) const {
    uint32_t v = 0;
    for (size_t k = at; k < at + 4 && k < payload.size(); ++k)
      v = v << 8 | static_cast<uint8_t>(payload[k]);
    return v;
  }
};

// The whole frames in out (a cut one at the end is left out).
inline std::vector<H2Frame> h2_frames(const std::string &out) {
  std::vector<H2Frame> frames;
  for (size_t i = 0; i + 9 <= out.size();) {
    const size_t len = (static_cast<uint8_t>(out[i]) << 16) |
                       (static_cast<uint8_t>(out[i + 1]) << 8) | static_cast<uint8_t>(out[i + 2]);
    if (i + 9 + len > out.size()) break;
    H2Frame f;
    f.type = static_cast<uint8_t>(out[i + 3]);
    f.flags = static_cast<uint8_t>(out[i + 4]);
    for (size_t k = 5; k < 9; ++k) f.stream = f.stream << 8 | static_cast<uint8_t>(out[i + k]);
    f.stream &= 0x7fffffffu;
    f.payload = out.substr(i + 9, len);
    frames.push_back(std::move(f));
    i += 9 + len;
  }
  return frames;
}

} // namespace xdpq::testing
