#pragma once
// Counters are defined once, as an X-macro list next to the struct that
// holds them, and everything else is derived from that list: the struct's
// fields, the exit log line, `xdpqctl stats` (text and JSON) and the
// Prometheus metrics. Adding a counter is one line.
//
//   #define XDPQ_FOO_COUNTERS(X)            (a backslash ends each line)
//     X(requests, "requests received")
//     X(drops, "datagrams dropped")
//   struct FooStats {
//     XDPQ_COUNTER_FIELDS(XDPQ_FOO_COUNTERS)
//     template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_FOO_COUNTERS) }
//   };
//
// visit(f) calls f(name, help, value) for every counter in list order.
// Fields are plain uint64_t with one writer (the worker that owns them).

#include <cstdint>

#define XDPQ_COUNTER_FIELD_(name, help) uint64_t name = 0;
#define XDPQ_COUNTER_VISIT_(name, help) f(#name, help, name);

#define XDPQ_COUNTER_FIELDS(LIST) LIST(XDPQ_COUNTER_FIELD_)
#define XDPQ_COUNTER_VISIT(LIST) LIST(XDPQ_COUNTER_VISIT_)

namespace xdpq {

// Counts an HTTP status in a stats struct's responses_Nxx fields.
template <typename Stats> void count_status_class(Stats &s, int status) {
  switch (status / 100) {
  case 1: s.responses_1xx += 1; break;
  case 2: s.responses_2xx += 1; break;
  case 3: s.responses_3xx += 1; break;
  case 4: s.responses_4xx += 1; break;
  case 5: s.responses_5xx += 1; break;
  default: break;
  }
}

} // namespace xdpq
