#pragma once
// The one list of every counter and gauge a worker exports, derived from
// the X-macro lists next to each stats struct (base/counters.h), and the
// formats made from it: the exit log line, `xdpqctl stats` (text, JSON) and
// Prometheus metrics. Nothing here lists a counter by hand.

#include "control/worker.h"

#include <string>
#include <vector>

namespace xdpq::control {

struct Counter {
  std::string name;   // e.g. "tcp_requests"
  uint64_t value = 0;
  const char *help = "";
  bool gauge = false; // a level (connections), not a running total
};
using Counters = std::vector<Counter>;

// Every counter of one worker, in a stable order.
Counters counters_of(const WorkerSnapshot &s);
// Element-wise sum over workers (same order as counters_of).
Counters sum(const std::vector<WorkerSnapshot> &snaps);
// The XDP program's per-CPU counters summed (empty without AF_XDP).
Counters xdp_counters(const dataplane::XdpProgram *program);

// {"name":value,...}
std::string counters_json(const Counters &c);
// "name=value name=value" of the nonzero ones (the exit log line).
std::string counters_line(const Counters &c);
// `xdpqctl stats` text: a table with a total column and one per worker.
std::string counters_table(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp);
// Prometheus text exposition of counters, gauges and latency histograms.
std::string prometheus_text(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp);
// This thread's malloc calls, when the counting shim is preloaded.
uint64_t thread_malloc_count();

} // namespace xdpq::control
