#include "control/counters.h"

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

} // namespace

uint64_t thread_malloc_count() {
  using Fn = uint64_t (*)();
  static const Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "xdpq_thread_malloc_count"));
  return fn ? fn() : 0;
}

Counters counters_of(const WorkerSnapshot &s) {
  Counters c;
  c.reserve(128);
  add_group(c, s.port, "");
  add_group(c, s.endpoint, "");
  add_group(c, s.h3, "");
  add_group(c, s.gauges, "", true);
  add_group(c, s.heap, "");
  add_group(c, s.handoff, "");
  add_group(c, s.loop, "");
  // Groups a worker may lack are still listed (as zeros), so every worker
  // exports the same names in the same order.
  add_group(c, s.tcp, "tcp_");
  add_group(c, s.proxy, "");
  // Upstreams by position in the configuration (`xdpqctl status` names
  // them); every worker has the same list.
  for (size_t i = 0; i < s.upstreams.size(); ++i) {
    const std::string prefix = "upstream" + std::to_string(i) + "_";
    add_group(c, s.upstreams[i], prefix.c_str());
    s.upstreams[i].visit_gauges([&](const char *name, const char *help, uint64_t v) {
      c.push_back(Counter{prefix + name, v, help, true});
    });
  }
#ifdef XDPQ_HAVE_AFXDP
  add_group(c, s.afxdp, "afxdp_");
  add_group(c, s.next_hops, "");
#endif
  return c;
}

Counters sum(const std::vector<WorkerSnapshot> &snaps) {
  Counters total;
  for (const auto &s : snaps) {
    auto c = counters_of(s);
    if (total.empty()) {
      total = std::move(c);
      continue;
    }
    for (size_t i = 0; i < c.size() && i < total.size(); ++i) total[i].value += c[i].value;
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

std::string prometheus_text(const std::vector<WorkerSnapshot> &snaps, const Counters &xdp) {
  std::ostringstream t;
  std::vector<Counters> per;
  for (const auto &s : snaps) per.push_back(counters_of(s));
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
    uint64_t cum = 0;
    for (size_t i = 0; i < h.counts.size(); ++i) {
      cum += h.counts[i];
      std::string le = i < dataplane::Histogram::BOUNDS_NS.size()
                           ? fmt_seconds(static_cast<double>(dataplane::Histogram::BOUNDS_NS[i]) / 1e9)
                           : "+Inf";
      t << name << "_bucket{" << labels << (labels.empty() ? "" : ",") << "le=\"" << le << "\"} "
        << cum << "\n";
    }
    t << name << "_sum{" << labels << "} " << fmt_seconds(static_cast<double>(h.sum_ns) / 1e9)
      << "\n";
    t << name << "_count{" << labels << "} " << h.count << "\n";
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
  return t.str();
}

} // namespace xdpq::control
