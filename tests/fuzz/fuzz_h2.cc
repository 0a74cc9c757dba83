// The HTTP/2 session (nghttp2 and our callbacks: limits, budgets, the
// protocol-error budget, routing), after a valid client preface and SETTINGS.

#include "fuzz_tcp_session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const uint8_t PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                   "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
  xdpq::fuzz::run_tcp_session(xdpq::http::make_h2_session, PREFACE, sizeof(PREFACE) - 1, data,
                              size);
  return 0;
}
