// The HTTP/3 request path: our H3Session on nghttp3, fed stream data as a
// QUIC connection would (client control and QPACK streams, request
// streams), with a transport that records what the session asks of it.
// Chunks: selector byte (low 3 bits: which stream; 0x08: FIN), two-byte
// length, bytes.

#include "fuzz_input.h"

#include "http/h3_session.h"
#include "http/router.h"

using namespace xdpq;

namespace {

struct Transport final : quic::AppTransport {
  void app_consume_stream(int64_t, uint64_t) override {}
  void app_consume_conn(uint64_t) override {}
  void app_stop_reading(int64_t, uint64_t) override {}
  void app_reset_writing(int64_t, uint64_t) override {}
  int64_t app_open_uni_stream() override { return next_uni += 4; } // 3, 7, 11
  uint64_t app_now() const override { return 1; }
  bool app_awaits_acks() const override { return false; }
  void app_wake_at(uint64_t) override {}
  int64_t next_uni = -1;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // /bytes/N up to 64 KiB: a request for 64 MiB is legitimate, but only slow
  // here under the sanitizers, not interesting.
  static auto router = http::make_default_router(http::RouterConfig{"", 65536, {}});
  static http::H3Stats stats;
  static http::MemoryBudget budget(8u << 20);
  http::H3Limits limits;
  limits.max_request_body = 1u << 20;
  limits.max_body_per_connection = 2u << 20;
  limits.budget = &budget;
  Transport t;
  http::H3Session s(t, router, limits, stats);
  if (s.start(16) != 0)
    return 0; // opens our uni streams 3, 7 and 11
  // Client streams: control (2), QPACK encoder (6) and decoder (10), and
  // request streams 0, 4, 8, 12, 16.
  static const int64_t IDS[8] = {2, 6, 10, 0, 4, 8, 12, 16};
  fuzz::Input in(data, size);
  while (!in.empty()) {
    uint8_t sel = in.byte();
    auto chunk = in.take(in.u16() % 2048);
    int64_t id = IDS[sel & 7];
    int64_t n = s.read_stream(id, chunk.data(), chunk.size(), (sel & 0x08) != 0, sel & 0x10);
    if (n < 0)
      break; // the connection closes on any error (quic/connection.cc)
    // Drain what the session wants to send (acknowledging it at once).
    for (int i = 0; i < 64; ++i) {
      int64_t sid = -1;
      int fin = 0;
      ngtcp2_vec vec[16];
      auto nvec = s.writev_stream(sid, fin, vec, 16);
      if (nvec < 0 || sid < 0)
        break;
      size_t len = 0;
      for (int64_t k = 0; k < nvec; ++k)
        len += vec[k].len;
      if (s.add_write_offset(sid, len) != 0)
        break;
      s.add_ack_offset(sid, len);
      if (len == 0 && !fin)
        break;
    }
  }
  return 0;
}
