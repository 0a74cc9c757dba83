#pragma once
// Shared by the HTTP/2 and HTTP/1.1 harnesses: a session fed the input in
// chunks (two-byte lengths), its output drained after each, time moving.

#include "fuzz_input.h"

#include "http/router.h"
#include "http/tcp_session.h"

#include <memory>

namespace xdpq::fuzz {

inline void run_tcp_session(std::unique_ptr<http::TcpSession> (*make)(const http::SessionEnv &),
                            const uint8_t *prefix, size_t prefix_len, const uint8_t *data,
                            size_t size) {
  // /bytes/N up to 64 KiB: a request for 64 MiB is legitimate, but only slow
  // here under the sanitizers, not interesting.
  static auto router = http::make_default_router(http::RouterConfig{"", 65536, {}});
  static http::TcpStats stats;
  static http::MemoryBudget budget(8u << 20);
  http::SessionEnv env;
  env.router = router;
  env.stats = &stats;
  env.budget = &budget;
  env.limits.max_request_body = 1u << 20;
  env.limits.max_body_per_connection = 2u << 20;
  env.alt_svc = "h3=\":443\"; ma=86400";
  auto session = make(env);
  std::vector<uint8_t> out;
  uint64_t now = 1'000'000'000;
  auto drain = [&] {
    for (int i = 0; i < 64; ++i) {
      out.clear();
      session->produce(out, 256 * 1024);
      if (out.empty())
        break;
    }
  };
  if (prefix_len)
    session->on_input(prefix, prefix_len, now);
  Input in(data, size);
  while (!in.empty() && !session->finished()) {
    auto chunk = in.take(in.u16() % 4096 + 1);
    now += 1'000'000;
    if (!session->input_paused())
      session->on_input(chunk.data(), chunk.size(), now);
    drain();
    while (session->has_buffered_input()) {
      session->on_input(nullptr, 0, now);
      drain();
    }
  }
  session->shutdown();
  drain();
}

} // namespace xdpq::fuzz
