#pragma once
// UTF-8 checks for text that goes out in formats that must be UTF-8 (JSON,
// Prometheus label values) but comes from bytes no one checked: a command
// name, a path from the configuration.

#include <cstddef>
#include <string>
#include <string_view>

namespace xdpq {

// The length (1-4) of the well-formed UTF-8 sequence s starts with, or 0:
// no overlong forms, no surrogates, nothing past U+10FFFF (RFC 3629 4).
constexpr size_t utf8_sequence(std::string_view s) {
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf; // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return 0;
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  return n;
}

// Appends s to out with each byte that begins no well-formed sequence
// replaced by U+FFFD; put(out, c) appends an ASCII byte (its escaping).
template <typename Put> void append_utf8(std::string &out, std::string_view s, Put &&put) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s.substr(i));
    if (n == 1) put(out, s[i]);
    else if (n > 1) out.append(s.substr(i, n));
    else out += "\xef\xbf\xbd";
    i += n ? n : 1;
  }
}

} // namespace xdpq
