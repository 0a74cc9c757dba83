#pragma once
// Reads a Response body back into a string (test helper).

#include "http/message.h"

#include <string>

namespace xdpq::testing {

inline std::string body_of(const http::Response &r) {
  std::string s;
  if (!r.body) return s;
  for (uint64_t off = 0; off < r.body->size();) {
    auto c = r.body->chunk(off);
    s.append(reinterpret_cast<const char *>(c.data()), c.size());
    off += c.size();
  }
  return s;
}

} // namespace xdpq::testing
