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

// Every counter of one worker, in a stable order; with_upstreams: the
// upstreams' too, as upstreamN_NAME.
Counters counters_of(const WorkerSnapshot &s, bool with_upstreams = true);
// The sum over workers, counter by counter (in counters_of's order; a
// longer upstream list adds its upstreams).
Counters sum(const std::vector<WorkerSnapshot> &snaps);
// The XDP program's per-CPU counters summed (empty without AF_XDP).
Counters xdp_counters(const dataplane::XdpProgram *program);

// {"name":value,...}
std::string counters_json(const Counters &c);
// "name=value name=value" of the nonzero ones (the exit log line).
std::string counters_line(const Counters &c);
// `xdpqctl stats` text: a table with a total column and one per worker.
std::string counters_table(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp);
// Prometheus text exposition of counters, gauges and latency histograms;
// the upstreams' labelled by route and URL from proxy (configuration order).
std::string prometheus_text(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp,
                            const http::ProxyConfig &proxy);

// An upstream's Prometheus labels: its route's prefix and its URL (a URL
// given twice in one route gets "#2", "#3"... so each series is distinct).
struct UpstreamLabel {
  std::string route;
  std::string url;
};
std::vector<UpstreamLabel> upstream_labels(const http::ProxyConfig &cfg);
// Upstream i (configuration order) summed over workers: counters, gauges
// (down: in how many workers) and histograms.
http::UpstreamStats upstream_total(const std::vector<WorkerSnapshot> &snaps, size_t i);
// Per upstream: connects and response heads timed, with p50/p99 estimates.
// names as Proxy::upstream_names(); empty without upstreams.
std::string upstream_latency_table(const std::vector<WorkerSnapshot> &snaps,
                                   const std::vector<std::string> &names);
// "connect_time":{...},"head_latency":{...}: count, sum, p50, p99, buckets.
std::string upstream_latency_json(const http::UpstreamStats &u);
// This thread's malloc calls, when the counting shim is preloaded.
uint64_t thread_malloc_count();

} // namespace xdpq::control
