#pragma once
// Reads a Response body back into a string (test helper).

#include "http/message.h"

#include <string>

namespace xdpq::testing {

// A body whose content went away mid-way (chunk() empty) reads as what was
// there, followed by this marker.
constexpr const char *BODY_ABORTED = "<aborted>";

inline std::string body_of(const http::Response &r) {
  std::string s;
  if (!r.body) return s;
  for (uint64_t off = 0; off < r.body->size();) {
    auto c = r.body->chunk(off);
    if (c.empty())
      return s + BODY_ABORTED;
    s.append(reinterpret_cast<const char *>(c.data()), c.size());
    off += c.size();
    r.body->release(off);
  }
  return s;
}

} // namespace xdpq::testing
