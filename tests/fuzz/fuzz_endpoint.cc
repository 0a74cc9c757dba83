// The QUIC endpoint's datagram input (before any authentication): header
// parsing, CID routing, the accept path, Retry tokens, stateless replies,
// and whatever connections the input manages to create, with time moving.
// Datagrams: selector byte (low 3 bits: source port; 0x40: to the endpoint
// with encrypted QUIC-LB CIDs; 0x80: advance the clock 50 ms), two-byte
// length, bytes.

#include "fuzz_input.h"

#include "../unit/quic_pipe.h"

using namespace xdpq;

namespace {

struct World {
  quic::ManualClock clock;
  quic::Secrets secrets = quic::Secrets::generate();
  std::unique_ptr<testing::TestServer> server;
  std::unique_ptr<testing::TestServer> lb_server;
  World() {
    quic::EndpointConfig cfg;
    cfg.retry = quic::RetryMode::automatic;
    cfg.retry_threshold = 4;
    cfg.retry_rate = 50;
    cfg.worker_count = 2;
    cfg.per_source = {64, 0, 0};
    server = std::make_unique<testing::TestServer>(clock, cfg, secrets);
    quic::QuicLbConfig lb;
    lb.config_id = 1;
    lb.server_id = {0x01, 0x02, 0x03};
    lb.nonce_len = 6; // L = 9: four passes with a split byte
    lb.key.emplace();
    lb.key->fill(0x5a);
    cfg.quic_lb = std::make_shared<const quic::QuicLbCodec>(lb);
    lb_server = std::make_unique<testing::TestServer>(clock, cfg, secrets);
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
    auto &server = sel & 0x40 ? *w->lb_server : *w->server;
    server.deliver(dg);
    if (sel & 0x80) {
      w->clock.advance(50'000'000);
      w->server->tick();
      w->lb_server->tick();
    }
  }
  // Do not let state pile up across inputs: let everything time out.
  w->clock.advance(60'000'000'000ull);
  for (auto *server : {w->server.get(), w->lb_server.get()}) {
    server->tick();
    server->sink.out.clear();
    server->sink.verified.clear();
  }
  return 0;
}
