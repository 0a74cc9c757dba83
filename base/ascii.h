#pragma once
// ASCII case folding for protocol tokens (field names), without the C
// library's locale lookup per character: a field name is an RFC 9110 token,
// ASCII by definition, and a byte outside A-Z is left as it is.

#include <string>
#include <string_view>

namespace xdpq {

constexpr char ascii_lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + ('a' - 'A')) : c;
}

inline void ascii_lower_in_place(std::string &s) {
  for (auto &c : s) c = ascii_lower(c);
}

constexpr bool ascii_iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

// Without the optional whitespace (SP, HTAB) around a field value or a
// list element (RFC 9110 5.6.3).
constexpr std::string_view trim_ows(std::string_view v) {
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  return v;
}

} // namespace xdpq
