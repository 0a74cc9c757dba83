// The HTTP/1.1 session (http-parser, limits, pipelining, routing).

#include "fuzz_tcp_session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  xdpq::fuzz::run_tcp_session(xdpq::http::make_h1_session, nullptr, 0, data, size);
  return 0;
}
