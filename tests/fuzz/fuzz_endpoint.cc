// The QUIC endpoint's datagram input (before any authentication): header
// parsing, CID routing, the accept path, Retry tokens, stateless replies,
// and whatever connections the input manages to create, with time moving.
// Datagrams: selector byte (low 3 bits: source port; 0x80: advance the
// clock 50 ms), two-byte length, bytes.

#include "fuzz_input.h"

#include "../unit/quic_pipe.h"

using namespace xdpq;

namespace {

struct World {
  quic::ManualClock clock;
  quic::Secrets secrets = quic::Secrets::generate();
  std::unique_ptr<testing::TestServer> server;
  World() {
    quic::EndpointConfig cfg;
    cfg.retry = quic::RetryMode::automatic;
    cfg.retry_threshold = 4;
    cfg.retry_rate = 50;
    cfg.worker_count = 2;
    cfg.per_source = {64, 0, 0};
    server = std::make_unique<testing::TestServer>(clock, cfg, secrets);
  }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static World *w = new World(); // the endpoint lives across inputs, like a server
  fuzz::Input in(data, size);
  while (!in.empty()) {
    uint8_t sel = in.byte();
    auto bytes = in.take(in.u16() % 1500);
    testing::Datagram dg;
    dg.path = testing::make_test_path(static_cast<uint16_t>(40000 + (sel & 7)));
    dg.data.assign(bytes.begin(), bytes.end());
    w->server->deliver(dg);
    if (sel & 0x80) {
      w->clock.advance(50'000'000);
      w->server->tick();
    }
  }
  // Do not let state pile up across inputs: let everything time out.
  w->clock.advance(60'000'000'000ull);
  w->server->tick();
  w->server->sink.out.clear();
  w->server->sink.verified.clear();
  return 0;
}
