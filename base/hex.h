#pragma once
// Hex text for keys and IDs in configuration and secrets files.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq {

inline std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char HEX[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    s.push_back(HEX[b >> 4]);
    s.push_back(HEX[b & 15]);
  }
  return s;
}

// Pairs of hex digits, either case, with nothing else (an optional "0x"
// prefix aside); nullopt for anything else, including an odd count.
inline std::optional<std::vector<uint8_t>> parse_hex(std::string_view s) {
  if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  if (s.size() % 2 != 0) return std::nullopt;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

// Exactly N bytes of hex into out; false (out untouched) otherwise.
template <size_t N> bool parse_hex_into(std::string_view s, std::array<uint8_t, N> &out) {
  auto v = parse_hex(s);
  if (!v || v->size() != N) return false;
  std::copy(v->begin(), v->end(), out.begin());
  return true;
}

} // namespace xdpq
