#include "control/counters.h"

#include "base/utf8.h"
#include "dataplane/xdp_program.h"

#include <dlfcn.h>

#include <cstdio>
#include <sstream>

namespace xdpq::control {

namespace {

template <typename Stats>
void add_group(Counters &out, const Stats &stats, const char *prefix, bool gauge = false) {
  stats.visit([&](const char *name, const char *help, uint64_t v) {
    out.push_back(Counter{std::string(prefix) + name, v, help, gauge});
  });
}

std::string fmt_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g", s);
  return b;
}

// A histogram's sum to the nanosecond: "%g" keeps six digits, so past
// 10^6 s a rate of the sum moved in steps of 10 s or more.
std::string fmt_sum_seconds(uint64_t ns) {
  char b[32];
  std::snprintf(b, sizeof(b), "%llu.%09llu", static_cast<unsigned long long>(ns / 1'000'000'000),
                static_cast<unsigned long long>(ns % 1'000'000'000));
  return b;
}

// A Prometheus label value: backslash, double quote and newline escaped;
// bytes that are not UTF-8 (a scraper refuses the page) given as U+FFFD.
std::string label_value(std::string_view v) {
  std::string o;
  append_utf8(o, v, [](std::string &out, char c) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  });
  return o;
}

// One histogram's _bucket (cumulative), _sum and _count lines. bound(i)
// is bucket i's upper bound in ns for i < finite; the last is +Inf.
template <typename H, typename Bound>
void write_histogram(std::ostringstream &t, const std::string &name, const std::string &labels,
                     const H &h, size_t finite, Bound bound) {
  uint64_t cum = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cum += h.counts[i];
    std::string le = i < finite ? fmt_seconds(static_cast<double>(bound(i)) / 1e9) : "+Inf";
    t << name << "_bucket{" << labels << (labels.empty() ? "" : ",") << "le=\"" << le << "\"} "
      << cum << "\n";
  }
  t << name << "_sum{" << labels << "} " << fmt_sum_seconds(h.sum_ns) << "\n";
  t << name << "_count{" << labels << "} " << cum << "\n";
}

void add_upstream(http::UpstreamStats &a, const http::UpstreamStats &b) {
#define XDPQ_ADD_(name, help) a.name += b.name;
  XDPQ_UPSTREAM_COUNTERS(XDPQ_ADD_)
  XDPQ_UPSTREAM_GAUGES(XDPQ_ADD_)
#undef XDPQ_ADD_
  a.connect_time.merge(b.connect_time);
  a.head_latency.merge(b.head_latency);
}

std::string fmt_ms(uint64_t ns) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", static_cast<double>(ns) / 1e6);
  return b;
}

// {"count":N,"sum_s":S,"p50_s":A,"p99_s":B,"buckets":[[le_s,cumulative],...]}
std::string histogram_json(const dataplane::Log2Histogram &h) {
  std::string j = "{\"count\":" + std::to_string(h.count()) +
                  ",\"sum_s\":" + fmt_sum_seconds(h.sum_ns) +
                  ",\"p50_s\":" + fmt_seconds(static_cast<double>(h.quantile(0.5)) / 1e9) +
                  ",\"p99_s\":" + fmt_seconds(static_cast<double>(h.quantile(0.99)) / 1e9) +
                  ",\"buckets\":[";
  uint64_t cum = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cum += h.counts[i];
    j += (i ? ",[" : "[") +
         (i < dataplane::Log2Histogram::FINITE
              ? fmt_seconds(static_cast<double>(dataplane::Log2Histogram::bound_ns(i)) / 1e9)
              : std::string("null")) +
         "," + std::to_string(cum) + "]";
  }
  return j + "]}";
}

} // namespace

namespace {

// The upstreams' counters and gauges per worker, and their latency
// histograms summed over workers, labelled by route and upstream URL: each
// metric's lines together, as the exposition format wants.
void upstream_metrics(std::ostringstream &t, const std::vector<WorkerSnapshot> &snaps,
                      const http::ProxyConfig &proxy) {
  const auto labels = upstream_labels(proxy);
  if (labels.empty() || snaps.empty()) return;
  std::vector<std::string> sel;
  for (const auto &l : labels) {
    sel.push_back("route=\"" + label_value(l.route) + "\",upstream=\"" + label_value(l.url) +
                  "\"");
  }
  struct Field {
    const char *name;
    const char *help;
    bool gauge;
  };
  std::vector<Field> fields;
  const http::UpstreamStats none;
  none.visit([&](const char *n, const char *h, uint64_t) { fields.push_back({n, h, false}); });
  none.visit_gauges([&](const char *n, const char *h, uint64_t) {
    fields.push_back({n, h, true});
  });
  // values[w][u] lists worker w's upstream u in the order of fields.
  std::vector<std::vector<std::vector<uint64_t>>> values(snaps.size());
  for (size_t w = 0; w < snaps.size(); ++w) {
    for (size_t u = 0; u < labels.size(); ++u) {
      std::vector<uint64_t> v;
      if (u < snaps[w].upstreams.size()) {
        const auto &s = snaps[w].upstreams[u];
        s.visit([&](const char *, const char *, uint64_t x) { v.push_back(x); });
        s.visit_gauges([&](const char *, const char *, uint64_t x) { v.push_back(x); });
      }
      v.resize(fields.size());
      values[w].push_back(std::move(v));
    }
  }
  for (size_t f = 0; f < fields.size(); ++f) {
    const std::string metric =
        std::string("xdpq_upstream_") + fields[f].name + (fields[f].gauge ? "" : "_total");
    t << "# HELP " << metric << " " << fields[f].help << "\n";
    t << "# TYPE " << metric << (fields[f].gauge ? " gauge\n" : " counter\n");
    for (size_t u = 0; u < labels.size(); ++u) {
      for (size_t w = 0; w < snaps.size(); ++w) {
        t << metric << "{worker=\"" << snaps[w].id << "\"," << sel[u] << "} " << values[w][u][f]
          << "\n";
      }
    }
  }
  std::vector<http::UpstreamStats> totals;
  for (size_t u = 0; u < labels.size(); ++u) totals.push_back(upstream_total(snaps, u));
  const auto bound = [](size_t i) { return dataplane::Log2Histogram::bound_ns(i); };
  const struct {
    const char *name, *help;
    dataplane::Log2Histogram http::UpstreamStats::*h;
  } hists[] = {
      {"xdpq_upstream_connect_duration_seconds", "connect started to connected (all workers)",
       &http::UpstreamStats::connect_time},
      {"xdpq_upstream_response_head_duration_seconds",
       "request started out (connected) to its response head parsed (all workers)",
       &http::UpstreamStats::head_latency},
  };
  for (const auto &h : hists) {
    t << "# HELP " << h.name << " " << h.help << "\n# TYPE " << h.name << " histogram\n";
    for (size_t u = 0; u < labels.size(); ++u) {
      write_histogram(t, h.name, sel[u], totals[u].*(h.h), dataplane::Log2Histogram::FINITE,
                      bound);
    }
  }
}

} // namespace

uint64_t thread_malloc_count() {
  using Fn = uint64_t (*)();
  static const Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "xdpq_thread_malloc_count"));
  return fn ? fn() : 0;
}

Counters counters_of(const WorkerSnapshot &s, bool with_upstreams) {
  Counters c;
  c.reserve(128);
  add_group(c, s.port, "");
  add_group(c, s.endpoint, "");
  add_group(c, s.h3, "");
  add_group(c, s.gauges, "", true);
  add_group(c, s.heap, "");
  add_group(c, s.handoff, "");
  add_group(c, s.passes, "");
  add_group(c, s.loop, "");
  // Groups a worker may lack are still listed (as zeros), so every worker
  // exports the same names in the same order.
  add_group(c, s.tcp, "tcp_");
  add_group(c, s.proxy, "");
#ifdef XDPQ_HAVE_AFXDP
  add_group(c, s.afxdp, "afxdp_");
  add_group(c, s.next_hops, "");
#endif
  // Upstreams by position in the configuration (`xdpqctl status` names
  // them), last: the one part whose length varies. Workers have the same
  // list, except for a moment around a reload that changes it (a snapshot
  // begun before, a worker that exited with the old list).
  for (size_t i = 0; with_upstreams && i < s.upstreams.size(); ++i) {
    const std::string prefix = "upstream" + std::to_string(i) + "_";
    add_group(c, s.upstreams[i], prefix.c_str());
    s.upstreams[i].visit_gauges([&](const char *name, const char *help, uint64_t v) {
      c.push_back(Counter{prefix + name, v, help, true});
    });
  }
  return c;
}

Counters sum(const std::vector<WorkerSnapshot> &snaps) {
  Counters total;
  for (const auto &s : snaps) {
    auto c = counters_of(s);
    // The same names in the same order, but for the upstreams at the end:
    // a longer list adds its upstreams.
    for (size_t i = 0; i < c.size(); ++i) {
      if (i < total.size()) total[i].value += c[i].value;
      else total.push_back(std::move(c[i]));
    }
  }
  return total;
}

Counters xdp_counters(const dataplane::XdpProgram *program) {
  Counters c;
#ifdef XDPQ_HAVE_AFXDP
  if (program) {
    auto v = program->counters();
    for (size_t i = 0; i < v.size(); ++i) {
      c.push_back(Counter{dataplane::XDP_COUNTER_NAMES[i], v[i], "XDP program verdicts (all CPUs)",
                          false});
    }
  }
#else
  (void)program;
#endif
  return c;
}

std::string counters_json(const Counters &c) {
  std::string j = "{";
  for (size_t i = 0; i < c.size(); ++i) {
    j += (i ? ",\"" : "\"") + c[i].name + "\":" + std::to_string(c[i].value);
  }
  return j + "}";
}

std::string counters_line(const Counters &c) {
  std::string line;
  for (const auto &k : c) {
    if (k.value == 0) continue;
    if (!line.empty()) line += ' ';
    line += k.name + "=" + std::to_string(k.value);
  }
  return line.empty() ? "(all zero)" : line;
}

std::string counters_table(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp) {
  Counters total = sum(snaps);
  std::vector<Counters> per;
  for (const auto &s : snaps) per.push_back(counters_of(s));
  std::ostringstream t;
  t << "counter                          total";
  for (const auto &s : snaps) t << "   worker" << s.id;
  t << "\n";
  char line[128];
  for (size_t i = 0; i < total.size(); ++i) {
    std::snprintf(line, sizeof(line), "%-28s %9llu", total[i].name.c_str(),
                  static_cast<unsigned long long>(total[i].value));
    t << line;
    for (const auto &p : per) {
      std::snprintf(line, sizeof(line), " %9llu",
                    static_cast<unsigned long long>(i < p.size() ? p[i].value : 0));
      t << line;
    }
    t << "\n";
  }
  for (const auto &k : xdp) {
    std::snprintf(line, sizeof(line), "%-28s %9llu  (XDP program, all CPUs)\n", k.name.c_str(),
                  static_cast<unsigned long long>(k.value));
    t << line;
  }
  return t.str();
}

std::vector<UpstreamLabel> upstream_labels(const http::ProxyConfig &cfg) {
  std::vector<UpstreamLabel> out;
  for (const auto &r : cfg.routes) {
    for (size_t i = 0; i < r.upstreams.size(); ++i) {
      UpstreamLabel l{r.prefix, r.upstreams[i].text};
      // The same URL twice in a route (a crude weight) needs its own series.
      size_t seen = 0;
      for (size_t k = 0; k < i; ++k) seen += r.upstreams[k].text == l.url;
      if (seen) l.url += "#" + std::to_string(seen + 1);
      out.push_back(std::move(l));
    }
  }
  return out;
}

http::UpstreamStats upstream_total(const std::vector<WorkerSnapshot> &snaps, size_t i) {
  http::UpstreamStats u;
  for (const auto &s : snaps) {
    if (i < s.upstreams.size()) add_upstream(u, s.upstreams[i]);
  }
  return u;
}

std::string upstream_latency_table(const std::vector<WorkerSnapshot> &snaps,
                                   const std::vector<std::string> &names) {
  if (names.empty()) return {};
  std::ostringstream t;
  t << "upstream    connects  connect p50/p99 ms      heads  head p50/p99 ms         route=url\n";
  for (size_t i = 0; i < names.size(); ++i) {
    const auto u = upstream_total(snaps, i);
    const auto p50_p99 = [](const dataplane::Log2Histogram &h) {
      return h.count() == 0 ? std::string("-")
                            : fmt_ms(h.quantile(0.5)) + " / " + fmt_ms(h.quantile(0.99));
    };
    char line[200];
    std::snprintf(line, sizeof(line), "upstream%-3zu %8llu  %-20s  %8llu  %-22s  ", i,
                  static_cast<unsigned long long>(u.connect_time.count()),
                  p50_p99(u.connect_time).c_str(),
                  static_cast<unsigned long long>(u.head_latency.count()),
                  p50_p99(u.head_latency).c_str());
    t << line << names[i] << "\n";
  }
  return t.str();
}

std::string upstream_latency_json(const http::UpstreamStats &u) {
  return "\"connect_time\":" + histogram_json(u.connect_time) +
         ",\"head_latency\":" + histogram_json(u.head_latency);
}

std::string prometheus_text(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp,
                            const http::ProxyConfig &proxy) {
  std::ostringstream t;
  std::vector<Counters> per;
  for (const auto &s : snaps) per.push_back(counters_of(s, false));
  if (!per.empty()) {
    for (size_t i = 0; i < per[0].size(); ++i) {
      const Counter &k = per[0][i];
      std::string metric = "xdpq_" + k.name + (k.gauge ? "" : "_total");
      t << "# HELP " << metric << " " << k.help << "\n";
      t << "# TYPE " << metric << (k.gauge ? " gauge\n" : " counter\n");
      for (size_t w = 0; w < per.size(); ++w) {
        t << metric << "{worker=\"" << snaps[w].id << "\"} " << per[w][i].value << "\n";
      }
    }
  }
  for (const auto &k : xdp) {
    std::string metric = "xdpq_" + k.name + "_total";
    t << "# HELP " << metric << " " << k.help << "\n";
    t << "# TYPE " << metric << " counter\n" << metric << " " << k.value << "\n";
  }
  auto histogram = [&t](const std::string &name, const char *help, const std::string &labels,
                        const dataplane::Histogram &h, bool header) {
    if (header) {
      t << "# HELP " << name << " " << help << "\n";
      t << "# TYPE " << name << " histogram\n";
    }
    write_histogram(t, name, labels, h, dataplane::Histogram::BOUNDS_NS.size(),
                    [](size_t i) { return dataplane::Histogram::BOUNDS_NS[i]; });
  };
  dataplane::Histogram h3, tcp, hs;
  for (const auto &s : snaps) {
    h3.merge(s.h3.request_latency);
    tcp.merge(s.tcp.request_latency);
    hs.merge(s.endpoint.handshake_time);
  }
  histogram("xdpq_request_duration_seconds", "request headers to response handed to transport",
            "proto=\"h3\"", h3, true);
  histogram("xdpq_request_duration_seconds", "", "proto=\"tcp\"", tcp, false);
  histogram("xdpq_quic_handshake_duration_seconds", "first Initial to handshake completed", "",
            hs, true);
  upstream_metrics(t, snaps, proxy);
  return t.str();
}

} // namespace xdpq::control
