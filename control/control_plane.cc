// The control thread: signals, the control socket (xdpqctl), Prometheus
// metrics, the systemd watchdog, reload and drain. It never touches a
// worker's state: it asks through the worker's mailboxes.
//
// Control protocol (documented in README "Control socket"): the client
// sends one line, fields separated by TAB: FORMAT TAB COMMAND [TAB ARG...]
// where FORMAT is "json" or "text"; the server answers with one document in
// that format and closes. Errors: {"error": "..."} (json) or "error: ...".

#include "control/config.h"
#include "base/log.h"
#include "control/self_signed.h"
#include "control/server.h"
#include "control/systemd.h"
#include "control/worker.h"
#include "dataplane/xdp_program.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include "xdpq_version.h"

namespace xdpq::control {

namespace {

constexpr size_t MAX_REQUEST = 4096;

std::string json_escape(const std::string &s) {
  std::string o;
  for (char c : s) {
    switch (c) {
    case '"': o += "\\\""; break;
    case '\\': o += "\\\\"; break;
    case '\n': o += "\\n"; break;
    case '\t': o += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        snprintf(b, sizeof(b), "\\u%04x", c);
        o += b;
      } else {
        o += c;
      }
    }
  }
  return o;
}

// Name/value pairs of every counter of a snapshot, in a stable order.
using Counters = std::vector<std::pair<std::string, uint64_t>>;

Counters counters_of(const WorkerSnapshot &s) {
  Counters c;
  auto add = [&c](const char *n, uint64_t v) { c.emplace_back(n, v); };
#define P(f) add(#f, s.port.f)
  P(rx_datagrams); P(rx_bytes); P(tx_datagrams); P(tx_bytes); P(tx_sends); P(tx_gso_batches);
  P(tx_dropped); P(rx_truncated); P(rx_errors);
#undef P
#define E(f) add(#f, s.endpoint.f)
  E(datagrams_in); E(datagrams_routed); E(drop_unparsable); E(drop_small_initial);
  E(drop_unknown_packet); E(drop_bad_token); E(drop_conn_limit); E(drop_amplification);
  E(drop_reset_rate); E(drop_closing); E(drop_tx_full); E(version_negotiations);
  E(retries_sent); E(stateless_resets_sent); E(handshakes_started); E(handshakes_completed);
  E(handshakes_failed); E(sessions_resumed); E(early_data_accepted); E(new_tokens_accepted);
  E(conns_closed); E(conns_idle_closed); E(conn_errors); E(key_updates);
  E(path_validations_ok); E(path_validations_failed); E(packets_out);
#undef E
  add("requests", s.h3.requests);
  add("header_limit_rejects", s.h3.header_limit_rejects);
  add("body_limit_rejects", s.h3.body_limit_rejects);
  add("stream_errors", s.h3.stream_errors);
  add("responses_2xx", s.h3.responses_by_class[2]);
  add("responses_3xx", s.h3.responses_by_class[3]);
  add("responses_4xx", s.h3.responses_by_class[4]);
  add("responses_5xx", s.h3.responses_by_class[5]);
  add("quic_connections", s.quic_connections);
  if (s.has_tcp) {
#define T(f) add("tcp_" #f, s.tcp.f)
    T(accepted); T(refused_conn_limit); T(tls_handshake_failed); T(plaintext_on_tls);
    T(h2_connections); T(h1_connections); T(requests); T(header_limit_rejects);
    T(body_limit_rejects); T(bad_requests); T(goaways_sent); T(protocol_error_closes);
    T(timeouts_handshake); T(timeouts_headers); T(timeouts_idle); T(timeouts_write); T(closed);
    T(tls_writes); T(bytes_in); T(bytes_out);
#undef T
    add("tcp_responses_2xx", s.tcp.responses_by_class[2]);
    add("tcp_responses_3xx", s.tcp.responses_by_class[3]);
    add("tcp_responses_4xx", s.tcp.responses_by_class[4]);
    add("tcp_responses_5xx", s.tcp.responses_by_class[5]);
    add("tcp_connections", s.tcp_connections);
  }
#ifdef XDPQ_HAVE_AFXDP
  if (s.has_afxdp) {
    for (size_t i = 1; i < static_cast<size_t>(dataplane::ParseStatus::count_); ++i) {
      c.emplace_back(std::string("rx_invalid_") +
                         dataplane::parse_status_name(static_cast<dataplane::ParseStatus>(i)),
                     s.afxdp.rx_invalid[i]);
    }
#define A(f) add("afxdp_" #f, s.afxdp.f)
    A(tx_no_neighbor); A(tx_ring_full); A(tx_kicks); A(fill_starved); A(xdp_rx_dropped);
    A(xdp_rx_invalid_descs); A(xdp_tx_invalid_descs); A(xdp_rx_ring_full);
    A(xdp_rx_fill_ring_empty); A(xdp_tx_ring_empty);
#undef A
  }
#endif
  return c;
}

Counters sum(const std::vector<WorkerSnapshot> &snaps) {
  Counters total;
  for (const auto &s : snaps) {
    auto c = counters_of(s);
    if (total.empty()) {
      total = c;
      continue;
    }
    for (size_t i = 0; i < c.size() && i < total.size(); ++i) total[i].second += c[i].second;
  }
  return total;
}

std::string counters_json(const Counters &c) {
  std::string j = "{";
  for (size_t i = 0; i < c.size(); ++i) {
    j += (i ? ",\"" : "\"") + c[i].first + "\":" + std::to_string(c[i].second);
  }
  return j + "}";
}

bool read_line(int fd, std::string &line, int timeout_ms) {
  char buf[512];
  while (line.size() < MAX_REQUEST) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return false;
    line.append(buf, static_cast<size_t>(n));
    auto nl = line.find('\n');
    if (nl != std::string::npos) {
      line.resize(nl);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
  }
  return false;
}

void write_all(int fd, const std::string &s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string default_control_path() {
  if (geteuid() == 0) return "/run/xdpq/xdpqd.sock";
  const char *rt = getenv("XDG_RUNTIME_DIR");
  if (rt && *rt) return std::string(rt) + "/xdpqd.sock";
  return "/tmp/xdpqd-" + std::to_string(geteuid()) + ".sock";
}

} // namespace

std::string control_socket_path(const Options &o) {
  return o.control_socket.empty() ? default_control_path() : o.control_socket;
}

void Server::open_control() {
  started_at_ = dataplane::monotonic_ns();
  control_path_ = control_socket_path(opts_);
  auto slash = control_path_.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    mkdir(control_path_.substr(0, slash).c_str(), 0700); // may exist
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (control_path_.size() >= sizeof(addr.sun_path)) {
    throw UsageError("--control-socket " + control_path_ + ": path too long");
  }
  std::memcpy(addr.sun_path, control_path_.c_str(), control_path_.size());
  // A stale socket from a crashed run is replaced; a live one is refused.
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(probe, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0) {
    close(probe);
    throw UsageError("--control-socket " + control_path_ +
                     ": another xdpqd is listening there (use another path)");
  }
  close(probe);
  unlink(control_path_.c_str());
  control_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  mode_t old = umask(0177); // the socket file is created 0600: owner only
  int rv = bind(control_fd_, reinterpret_cast<sockaddr *>(&addr), sizeof(addr));
  umask(old);
  if (rv != 0 || listen(control_fd_, 16) != 0) {
    std::string why = strerror(errno);
    close(control_fd_);
    control_fd_ = -1;
    throw UsageError("--control-socket " + control_path_ + ": " + why);
  }
  if (opts_.metrics) {
    const auto &a = *opts_.metrics;
    metrics_fd_ = socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(metrics_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(metrics_fd_, &a.u.sa, a.len) != 0 || listen(metrics_fd_, 16) != 0) {
      std::string why = strerror(errno);
      close(metrics_fd_);
      metrics_fd_ = -1;
      throw UsageError("--metrics " + a.to_string() + ": " + why);
    }
  }
}

void Server::close_control() {
  if (control_fd_ >= 0) {
    close(control_fd_);
    unlink(control_path_.c_str());
    control_fd_ = -1;
  }
  if (metrics_fd_ >= 0) {
    close(metrics_fd_);
    metrics_fd_ = -1;
  }
}

std::vector<WorkerSnapshot> Server::snapshots(bool with_conns) {
  std::vector<WorkerSnapshot> v;
  for (auto &w : workers_) {
    WorkerSnapshot s;
    if (w->snapshot(s, with_conns, std::chrono::milliseconds(500))) v.push_back(std::move(s));
  }
  return v;
}

std::string Server::status_text(bool json) {
  uint64_t up = (dataplane::monotonic_ns() - started_at_) / 1'000'000'000ull;
  auto snaps = snapshots(false);
  std::string listen;
  for (const auto &a : listen_) listen += (listen.empty() ? "" : " ") + a.to_string();
  std::string xdp_mode, prog;
#ifdef XDPQ_HAVE_AFXDP
  if (program_) {
    xdp_mode = program_->mode();
    prog = std::to_string(program_->prog_id());
  }
#endif
  if (json) {
    std::string j = "{\"version\":\"" XDPQ_VERSION "\",\"pid\":" + std::to_string(getpid()) +
                    ",\"uptime_s\":" + std::to_string(up) + ",\"state\":\"" +
                    (draining_ ? "draining" : "running") + "\",\"dataplane\":\"" +
                    opts_.dataplane + "\",\"interface\":\"" + json_escape(opts_.interface) +
                    "\",\"xdp_mode\":\"" + xdp_mode + "\",\"prog_id\":" +
                    (prog.empty() ? "null" : prog) + ",\"listen\":\"" + listen +
                    "\",\"description\":\"" + json_escape(dataplane_info_) + "\",\"workers\":[";
    for (size_t i = 0; i < snaps.size(); ++i) {
      const auto &s = snaps[i];
      j += (i ? "," : "") + std::string("{\"id\":") + std::to_string(s.id) + ",\"cpu\":" +
           std::to_string(s.cpu);
#ifdef XDPQ_HAVE_AFXDP
      if (s.has_afxdp) {
        j += ",\"queue\":" + std::to_string(s.queue) + ",\"zerocopy\":" +
             (s.zerocopy ? "true" : "false");
      }
#endif
      j += ",\"quic_connections\":" + std::to_string(s.quic_connections) +
           ",\"tcp_connections\":" + std::to_string(s.tcp_connections) + "}";
    }
    return j + "]}";
  }
  std::ostringstream t;
  t << "xdpqd " XDPQ_VERSION " (pid " << getpid() << "), up " << up << " s, "
    << (draining_ ? "draining" : "running") << "\n"
    << "listen:     " << listen << "\n"
    << "dataplane:  "
    << (dataplane_info_.starts_with("dataplane ") ? dataplane_info_.substr(10) : dataplane_info_)
    << "\n";
  if (!xdp_mode.empty()) {
    t << "xdp:        " << opts_.interface << ", " << xdp_mode << " mode, program id " << prog
      << "\n";
  }
  t << "worker  cpu  queue  zero-copy  quic-conns  tcp-conns\n";
  for (const auto &s : snaps) {
    char line[128];
    std::string queue = "-", zc = "-";
#ifdef XDPQ_HAVE_AFXDP
    if (s.has_afxdp) {
      queue = std::to_string(s.queue);
      zc = s.zerocopy ? "yes" : "no";
    }
#endif
    snprintf(line, sizeof(line), "%6d  %3d  %5s  %9s  %10zu  %9zu\n", s.id, s.cpu, queue.c_str(),
             zc.c_str(), s.quic_connections, s.tcp_connections);
    t << line;
  }
  return t.str();
}

std::string Server::stats_text(const std::vector<WorkerSnapshot> &snaps, bool json) const {
  Counters total = sum(snaps);
  Counters xdp;
#ifdef XDPQ_HAVE_AFXDP
  if (program_) {
    auto c = program_->counters();
    for (size_t i = 0; i < c.size(); ++i) xdp.emplace_back(dataplane::XDP_COUNTER_NAMES[i], c[i]);
  }
#endif
  if (json) {
    Counters all = total;
    all.insert(all.end(), xdp.begin(), xdp.end());
    std::string j = "{\"total\":" + counters_json(all) + ",\"workers\":[";
    for (size_t i = 0; i < snaps.size(); ++i) {
      j += (i ? "," : "") + std::string("{\"id\":") + std::to_string(snaps[i].id) +
           ",\"counters\":" + counters_json(counters_of(snaps[i])) + "}";
    }
    return j + "]}";
  }
  std::ostringstream t;
  t << "counter                          total";
  for (const auto &s : snaps) t << "   worker" << s.id;
  t << "\n";
  std::vector<Counters> per;
  for (const auto &s : snaps) per.push_back(counters_of(s));
  for (size_t i = 0; i < total.size(); ++i) {
    char line[96];
    snprintf(line, sizeof(line), "%-28s %9llu", total[i].first.c_str(),
             static_cast<unsigned long long>(total[i].second));
    t << line;
    for (const auto &p : per) {
      snprintf(line, sizeof(line), " %9llu",
               static_cast<unsigned long long>(i < p.size() ? p[i].second : 0));
      t << line;
    }
    t << "\n";
  }
  for (const auto &[n, v] : xdp) {
    char line[96];
    snprintf(line, sizeof(line), "%-28s %9llu  (XDP program, all CPUs)\n", n.c_str(),
             static_cast<unsigned long long>(v));
    t << line;
  }
  return t.str();
}

std::string Server::conns_text(const std::vector<WorkerSnapshot> &snaps, bool json) const {
  std::ostringstream t;
  if (json) {
    t << "{\"connections\":[";
    bool first = true;
    for (const auto &s : snaps) {
      for (const auto &c : s.quic_conns) {
        t << (first ? "" : ",") << "{\"worker\":" << s.id << ",\"proto\":\"h3\",\"peer\":\""
          << c.peer << "\",\"state\":\"" << c.state << "\",\"age_ms\":" << c.age_ms
          << ",\"rtt_us\":" << c.rtt_us << ",\"bytes_in\":" << c.bytes_in
          << ",\"bytes_out\":" << c.bytes_out << ",\"streams\":" << c.streams << "}";
        first = false;
      }
      for (const auto &c : s.tcp_conns) {
        t << (first ? "" : ",") << "{\"worker\":" << s.id << ",\"proto\":\"" << c.proto
          << "\",\"peer\":\"" << c.peer << "\",\"state\":\"" << (c.busy ? "busy" : "idle")
          << "\",\"age_ms\":" << c.age_ms << ",\"rtt_us\":null,\"bytes_in\":" << c.bytes_in
          << ",\"bytes_out\":" << c.bytes_out << ",\"streams\":null}";
        first = false;
      }
    }
    t << "]}";
    return t.str();
  }
  t << "worker  proto      peer                                      state        age_ms"
       "    rtt_us    bytes_in   bytes_out  streams\n";
  for (const auto &s : snaps) {
    for (const auto &c : s.quic_conns) {
      char line[256];
      snprintf(line, sizeof(line), "%6d  %-9s  %-40s  %-11s %7llu %9llu %11llu %11llu %8zu\n",
               s.id, "h3", c.peer.c_str(), c.state.c_str(),
               static_cast<unsigned long long>(c.age_ms), static_cast<unsigned long long>(c.rtt_us),
               static_cast<unsigned long long>(c.bytes_in),
               static_cast<unsigned long long>(c.bytes_out), c.streams);
      t << line;
    }
    for (const auto &c : s.tcp_conns) {
      char line[256];
      snprintf(line, sizeof(line), "%6d  %-9s  %-40s  %-11s %7llu %9s %11llu %11llu %8s\n", s.id,
               c.proto.c_str(), c.peer.c_str(), c.busy ? "busy" : "idle",
               static_cast<unsigned long long>(c.age_ms), "-",
               static_cast<unsigned long long>(c.bytes_in),
               static_cast<unsigned long long>(c.bytes_out), "-");
      t << line;
    }
  }
  return t.str();
}

std::string Server::metrics_text(const std::vector<WorkerSnapshot> &snaps) const {
  std::ostringstream t;
  auto gauge = [](const std::string &n) {
    return n == "quic_connections" || n == "tcp_connections";
  };
  std::vector<Counters> per;
  for (const auto &s : snaps) per.push_back(counters_of(s));
  if (!per.empty()) {
    for (size_t i = 0; i < per[0].size(); ++i) {
      const std::string &n = per[0][i].first;
      std::string metric = "xdpq_" + n + (gauge(n) ? "" : "_total");
      t << "# TYPE " << metric << (gauge(n) ? " gauge\n" : " counter\n");
      for (size_t w = 0; w < per.size(); ++w) {
        t << metric << "{worker=\"" << snaps[w].id << "\"} " << per[w][i].second << "\n";
      }
    }
  }
#ifdef XDPQ_HAVE_AFXDP
  if (program_) {
    auto c = program_->counters();
    for (size_t i = 0; i < c.size(); ++i) {
      std::string metric = std::string("xdpq_") + dataplane::XDP_COUNTER_NAMES[i] + "_total";
      t << "# TYPE " << metric << " counter\n" << metric << " " << c[i] << "\n";
    }
  }
#endif
  auto histogram = [&t](const std::string &name, const std::string &labels,
                        const dataplane::Histogram &h, bool header) {
    if (header) t << "# TYPE " << name << " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < h.counts.size(); ++i) {
      cum += h.counts[i];
      std::string le = i < dataplane::Histogram::BOUNDS_NS.size()
                           ? std::to_string(dataplane::Histogram::BOUNDS_NS[i] / 1e9)
                           : "+Inf";
      if (le != "+Inf") {
        le.erase(le.find_last_not_of('0') + 1);
        if (le.back() == '.') le.pop_back();
      }
      t << name << "_bucket{" << labels << (labels.empty() ? "" : ",") << "le=\"" << le << "\"} "
        << cum << "\n";
    }
    t << name << "_sum{" << labels << "} " << h.sum_ns / 1e9 << "\n";
    t << name << "_count{" << labels << "} " << h.count << "\n";
  };
  dataplane::Histogram h3, tcp, hs;
  for (const auto &s : snaps) {
    h3.merge(s.h3.request_latency);
    tcp.merge(s.tcp.request_latency);
    hs.merge(s.endpoint.handshake_time);
  }
  histogram("xdpq_request_duration_seconds", "proto=\"h3\"", h3, true);
  histogram("xdpq_request_duration_seconds", "proto=\"tcp\"", tcp, false);
  histogram("xdpq_quic_handshake_duration_seconds", "", hs, true);
  return t.str();
}

std::string Server::reload() {
  sd_notify_state("RELOADING=1");
  std::string result;
  try {
    // Re-read the configuration file for what can change without a restart.
    if (!opts_.config_file.empty()) {
      std::vector<std::string> argv = {"xdpqd", "--config", opts_.config_file};
      std::vector<const char *> cargv;
      for (auto &a : argv) cargv.push_back(a.c_str());
      Options fresh = parse_options(static_cast<int>(cargv.size()), cargv.data());
      if (fresh.log_level != opts_.log_level) {
        log::set_level(*log::parse_level(fresh.log_level));
        opts_.log_level = fresh.log_level;
      }
      if (!fresh.cert_file.empty()) {
        opts_.cert_file = fresh.cert_file;
        opts_.key_file = fresh.key_file;
      }
      if (fresh.listen != opts_.listen || fresh.dataplane != opts_.dataplane ||
          fresh.workers != opts_.workers || fresh.queues != opts_.queues ||
          fresh.docroot != opts_.docroot) {
        LOG_WARN("reload: listen addresses, dataplane, workers, queues and docroot changes "
                 "need a restart; kept the running ones");
      }
    }
    if (opts_.cert_file.empty()) {
      result = "no --cert/--key: nothing to reload (self-signed certificate)";
    } else {
      auto read = [](const std::string &p) {
        std::ifstream in(p, std::ios::binary);
        if (!in) throw std::runtime_error(p + ": cannot read");
        std::ostringstream ss;
        ss << in.rdbuf();
        return ss.str();
      };
      auto cfg = std::make_shared<quic::TlsConfig>(tls_cfg_);
      cfg->cert_pem = read(opts_.cert_file);
      cfg->key_pem = read(opts_.key_file);
      quic::TlsContext probe(*cfg, secrets_); // throws on a bad pair: keep the old one
      if (tcp_tls_) tcp_tls_->reload(cfg->cert_pem, cfg->key_pem);
      for (auto &w : workers_) w->request_reload(cfg);
      tls_cfg_ = *cfg;
      result = "certificate reloaded, SHA-256 fingerprint " +
               certificate_fingerprint(cfg->cert_pem);
    }
    LOG_INFO("reload: %s", result.c_str());
  } catch (const std::exception &e) {
    result = std::string("error: ") + e.what();
    LOG_ERROR("reload failed, nothing changed: %s", e.what());
  }
  sd_notify_state("READY=1");
  return result;
}

void Server::begin_drain(const char *why) {
  if (draining_) return;
  draining_ = true;
  LOG_INFO("%s: draining (GOAWAY, up to %llu ms for requests in flight)", why,
           static_cast<unsigned long long>(opts_.drain_timeout_ms));
  sd_notify_state("STOPPING=1");
  uint64_t deadline = dataplane::monotonic_ns() + opts_.drain_timeout_ms * 1'000'000ull;
  for (auto &w : workers_) w->request_drain(deadline);
}

std::string Server::command(const std::vector<std::string> &args, bool json) {
  auto err = [json](const std::string &m) {
    return json ? "{\"error\":\"" + json_escape(m) + "\"}" : "error: " + m + "\n";
  };
  auto ok = [json](const std::string &m) {
    return json ? "{\"ok\":true,\"message\":\"" + json_escape(m) + "\"}" : m + "\n";
  };
  if (args.empty()) return err("empty command");
  const std::string &cmd = args[0];
  if (cmd == "status") return status_text(json);
  if (cmd == "stats") return stats_text(snapshots(false), json);
  if (cmd == "conns") return conns_text(snapshots(true), json);
  if (cmd == "reload") {
    std::string r = reload();
    return r.starts_with("error: ") ? err(r.substr(7)) : ok(r);
  }
  if (cmd == "drain") {
    begin_drain("xdpqctl drain");
    return ok("draining");
  }
  if (cmd == "capture" && args.size() >= 2 && args[1] == "start" && args.size() >= 3) {
    std::string filter = args.size() >= 4 ? args[3] : "";
    uint64_t count = args.size() >= 5 ? std::strtoull(args[4].c_str(), nullptr, 10) : 0;
    std::string why = capture_.start(args[2], filter, count);
    return why.empty() ? ok("capturing to " + args[2]) : err(why);
  }
  if (cmd == "capture" && args.size() == 2 && args[1] == "stop") {
    uint64_t n = capture_.stop();
    return ok("capture stopped, " + std::to_string(n) + " packets written");
  }
  if (cmd == "keylog" && args.size() == 3 && args[1] == "start") {
    std::string why = KeyLog::instance().start(args[2]);
    return why.empty() ? ok("logging TLS secrets to " + args[2]) : err(why);
  }
  if (cmd == "keylog" && args.size() == 2 && args[1] == "stop") {
    KeyLog::instance().stop();
    return ok("key logging stopped");
  }
  return err("unknown command '" + cmd +
             "' (status, stats, conns, reload, drain, capture start|stop, keylog start|stop)");
}

void Server::handle_control_client(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      (cred.uid != geteuid() && cred.uid != 0)) {
    write_all(fd, "error: permission denied (only the owner may use this socket)\n");
    LOG_WARN("control socket: refused uid %u", cred.uid);
    return;
  }
  std::string line;
  if (!read_line(fd, line, 2000)) {
    write_all(fd, "error: expected one line: FORMAT<TAB>COMMAND[<TAB>ARG...]\n");
    return;
  }
  std::vector<std::string> fields;
  size_t pos = 0;
  while (pos <= line.size()) {
    auto tab = line.find('\t', pos);
    if (tab == std::string::npos) tab = line.size();
    fields.push_back(line.substr(pos, tab - pos));
    pos = tab + 1;
  }
  if (fields.size() < 2 || (fields[0] != "json" && fields[0] != "text")) {
    write_all(fd, "error: expected FORMAT (json or text) TAB COMMAND\n");
    return;
  }
  bool json = fields[0] == "json";
  std::vector<std::string> args(fields.begin() + 1, fields.end());
  std::string out = command(args, json);
  if (json && (out.empty() || out.back() != '\n')) out += "\n";
  write_all(fd, out);
}

void Server::handle_metrics_client(int fd) {
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < 8192) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  std::string body, status = "200 OK";
  if (req.starts_with("GET /metrics ") || req.starts_with("GET / ")) {
    body = metrics_text(snapshots(false));
  } else {
    status = "404 Not Found";
    body = "try /metrics\n";
  }
  write_all(fd, "HTTP/1.1 " + status +
                    "\r\ncontent-type: text/plain; version=0.0.4\r\nconnection: close\r\n"
                    "content-length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
}

int Server::run() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  int sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  for (auto &w : workers_) w->start();
  sd_notify_state("READY=1");
  uint64_t wd_usec = sd_watchdog_usec();
  uint64_t wd_next = dataplane::monotonic_ns();
  std::vector<uint64_t> beats(workers_.size(), UINT64_MAX);
  bool hard_stop = false;
  for (;;) {
    bool all_stopped = true;
    for (auto &w : workers_) all_stopped &= w->stopped();
    if (all_stopped) break;
    pollfd fds[3] = {{sfd, POLLIN, 0}, {control_fd_, POLLIN, 0}, {metrics_fd_, POLLIN, 0}};
    int timeout = 200;
    poll(fds, 3, timeout);
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
          reload();
        } else if (si.ssi_signo == SIGTERM) {
          begin_drain("SIGTERM");
        } else if (!hard_stop) { // SIGINT: stop now
          hard_stop = true;
          LOG_INFO("SIGINT: closing connections and stopping");
          for (auto &w : workers_) w->request_stop();
        }
      }
    }
    if (fds[1].revents & POLLIN) {
      int c = accept4(control_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        handle_control_client(c);
        close(c);
      }
    }
    if (metrics_fd_ >= 0 && (fds[2].revents & POLLIN)) {
      int c = accept4(metrics_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        handle_metrics_client(c);
        close(c);
      }
    }
    // Watchdog: ping only while every worker's loop keeps turning.
    uint64_t now = dataplane::monotonic_ns();
    if (wd_usec && now >= wd_next) {
      bool alive = true;
      for (size_t i = 0; i < workers_.size(); ++i) {
        uint64_t b = workers_[i]->heartbeat();
        if (b == beats[i] && !workers_[i]->stopped()) alive = false;
        beats[i] = b;
      }
      if (alive) sd_notify_state("WATCHDOG=1");
      else LOG_ERROR("a worker stopped making progress; withholding the watchdog ping");
      wd_next = now + wd_usec * 1000 / 2;
    }
  }
  close(sfd);
  for (auto &w : workers_) w->join();
  for (auto &w : workers_) w->log_stats();
  std::vector<WorkerSnapshot> snaps;
  for (auto &w : workers_) snaps.push_back(w->final_snapshot());
  Counters all = sum(snaps);
#ifdef XDPQ_HAVE_AFXDP
  if (program_) {
    auto c = program_->counters();
    for (size_t i = 0; i < c.size(); ++i) all.emplace_back(dataplane::XDP_COUNTER_NAMES[i], c[i]);
  }
#endif
  LOG_INFO("stats %s", counters_json(all).c_str());
  return 0;
}

} // namespace xdpq::control
