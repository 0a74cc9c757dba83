// The upstream response parser: an upstream's bytes (hostile: malformed
// heads, invalid chunk sizes, endless heads) in reads of any size, then
// the upstream's close. The first input byte picks HEAD or not (bit 0)
// and a tunnel request or not (bit 1, a client's Upgrade: a 101 switches
// and the rest is raw); each read is [two-byte length, bytes].

#include "http/upstream_response.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace {

struct Sink final : xdpq::http::UpstreamResponseParser::Handler {
  size_t body = 0;
  bool head = false, done = false;
  void on_head(const xdpq::http::UpstreamResponseParser &p) override {
    // The head's figures are read as the proxy reads them.
    if ((p.status() < 200 || p.status() > 599) && !(p.status() == 101 && p.switched()))
      std::abort();
    head = true;
  }
  void on_body(const uint8_t *, size_t n) override {
    if (!head || done) std::abort();
    body += n;
  }
  void on_complete() override { done = true; }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  xdpq::http::UpstreamResponseLimits limits;
  limits.max_head = 4096;
  limits.max_fields = 32;
  xdpq::http::UpstreamResponseParser p(limits);
  Sink sink;
  p.reset(&sink, (data[0] & 1) != 0, (data[0] & 2) != 0);
  size_t at = 1;
  while (at + 2 <= size) {
    size_t n = static_cast<size_t>(data[at]) << 8 | data[at + 1];
    at += 2;
    if (n > size - at) n = size - at;
    size_t total = sink.body;
    if (p.feed(data + at, n) != xdpq::http::UpstreamResponseParser::Result::ok) return 0;
    // Decoded body never exceeds the bytes read: the proxy's window relies on it.
    if (sink.body - total > n) std::abort();
    at += n;
  }
  p.finish();
  if (p.complete() && !sink.done) std::abort();
  return 0;
}
