// The control socket (xdpqctl) and the metrics port: their listeners,
// the commands and the status, counter and connection pages they answer.
//
// Control protocol (documented in README "Control socket"): the client
// sends one line, fields separated by TAB: FORMAT TAB COMMAND [TAB ARG...]
// where FORMAT is "json" or "text"; the server answers with one document in
// that format and closes. Errors: {"error": "..."} (json) or "error: ...".

#include "control/admin.h"
#include "control/config.h"
#include "control/counters.h"
#include "base/log.h"
#include "base/utf8.h"
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
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "xdpq_version.h"

namespace xdpq::control {

namespace {

// A JSON string's content; bytes that are not UTF-8 (JSON must be) are
// given as U+FFFD.
std::string json_escape(const std::string &s) {
  std::string o;
  append_utf8(o, s, [](std::string &out, char c) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        snprintf(b, sizeof(b), "\\u%04x", c);
        out += b;
      } else {
        out += c;
      }
    }
  });
  return o;
}

std::string default_control_path() {
  // Root, and the service user the unit gives /run/xdpq to (RuntimeDirectory=).
  if (geteuid() == 0 || access("/run/xdpq", W_OK) == 0)
    return "/run/xdpq/xdpqd.sock";
  const char *rt = getenv("XDG_RUNTIME_DIR");
  if (rt && *rt) return std::string(rt) + "/xdpqd.sock";
  return "/tmp/xdpqd-" + std::to_string(geteuid()) + ".sock";
}

} // namespace

std::string control_socket_path(const Options &o) {
  return o.control_socket.empty() ? default_control_path() : o.control_socket;
}

void check_control_path(const std::string &path) {
  const auto fail = [&](const std::string &why) {
    throw UsageError("--control-socket " + path + ": " + why);
  };
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    fail("path too long (at most " + std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
         " bytes)");
  }
  // Only a socket is ever replaced: a path set by mistake to a file must
  // not cost that file.
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
    fail("exists and is not a socket (left as it is)");
  }
  // Its directory (made if missing) must be one. Whether the daemon's user
  // may write there is not checked: who runs the check may be another.
  const auto slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) fail(dir + " is not a directory");
}

namespace {

// The control socket at path, created 0600; a stale one from a crashed run
// is replaced, a live one refused.
int bind_control_socket(const std::string &path) {
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    mkdir(path.substr(0, slash).c_str(), 0700); // may exist
  }
  check_control_path(path);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  // Not blocking: a listener whose backlog is full (a hung server that
  // clients kept calling) would hold a blocking connect for good.
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (connect(probe, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0 || errno == EAGAIN) {
    close(probe);
    throw UsageError("--control-socket " + path +
                     ": another xdpqd is listening there (use another path)");
  }
  close(probe);
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) unlink(path.c_str()); // a socket: a stale one
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  mode_t old = umask(0177); // the socket file is created 0600: owner only
  int rv = bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr));
  umask(old);
  if (rv != 0 || listen(fd, 16) != 0) {
    std::string why = strerror(errno);
    close(fd);
    throw UsageError("--control-socket " + path + ": " + why);
  }
  return fd;
}

// Where an inherited listening socket is bound.
std::string bound_path(int fd) {
  sockaddr_un a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0 || a.sun_family != AF_UNIX ||
      len <= offsetof(sockaddr_un, sun_path)) {
    return {};
  }
  return std::string(a.sun_path, strnlen(a.sun_path, len - offsetof(sockaddr_un, sun_path)));
}

dataplane::Address bound_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return {};
  return dataplane::Address::from(reinterpret_cast<sockaddr *>(&ss), len);
}

} // namespace

void Server::open_control() {
  started_at_ = dataplane::monotonic_ns();
  control_path_ = control_socket_path(opts_);
  if (inherited_) {
    // The previous process's listening sockets: xdpqctl and scrapers see
    // no gap. A changed path or metrics address is bound afresh, and the
    // previous process keeps its own until it exits.
    for (size_t k = 0; k < inherited_->sockets.size(); ++k) {
      const auto &s = inherited_->sockets[k];
      if (s.kind == Inheritance::Kind::control && control_fd_ < 0 &&
          bound_path(s.fd) == control_path_) {
        control_fd_ = s.fd;
        adopted_.push_back(k);
      } else if (s.kind == Inheritance::Kind::metrics && opts_.metrics && metrics_fd_ < 0 &&
                 bound_address(s.fd) == *opts_.metrics) {
        metrics_fd_ = s.fd;
        adopted_.push_back(k);
      }
    }
  }
  if (control_fd_ < 0) {
    try {
      control_fd_ = bind_control_socket(control_path_);
    } catch (const UsageError &e) {
      throw UsageError(opts_.at({"--control-socket"}) + e.what());
    }
  }
  if (opts_.metrics && metrics_fd_ < 0) {
    const auto &a = *opts_.metrics;
    metrics_fd_ = socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(metrics_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(metrics_fd_, &a.u.sa, a.len) != 0 || listen(metrics_fd_, 16) != 0) {
      std::string why = strerror(errno);
      close(metrics_fd_);
      metrics_fd_ = -1;
      throw UsageError(opts_.at({"--metrics"}) + "--metrics " + a.to_string() + ": " + why);
    }
  }
}

int Server::rebind_control() {
  // A new process that exits through its destructors after it became
  // ready removes the path of the control socket it shares with us: bound
  // afresh, xdpqctl (and systemctl reload) reach us again.
  struct stat st {};
  if (control_fd_ < 0 || lstat(control_path_.c_str(), &st) == 0 || errno != ENOENT) return -1;
  try {
    const int old = control_fd_;
    control_fd_ = bind_control_socket(control_path_);
    LOG_INFO("control socket %s bound afresh", control_path_.c_str());
    return old;
  } catch (const std::exception &e) {
    LOG_ERROR("control socket %s: %s", control_path_.c_str(), e.what());
    return -1;
  }
}

void Server::close_control() {
  if (control_fd_ >= 0) {
    close(control_fd_);
    // After a binary upgrade the path is the new process's socket; a new
    // process that never became ready leaves it to the old one.
    if (!handed_over_ && (!inherited_ || reported_ready_)) unlink(control_path_.c_str());
    control_fd_ = -1;
  }
  if (metrics_fd_ >= 0) {
    close(metrics_fd_);
    metrics_fd_ = -1;
  }
}

std::vector<WorkerSnapshot> Server::snapshots(bool with_conns, std::vector<int> &unanswered,
                                              bool last_known) {
  std::vector<WorkerSnapshot> v;
  unanswered.clear();
  // All asked at once, one deadline for all: a stuck worker costs the
  // control thread SNAPSHOT_WAIT, not that per worker.
  for (auto &w : workers_) w->request_snapshot(with_conns);
  const auto now = std::chrono::steady_clock::now();
  const auto deadline = now + SNAPSHOT_WAIT;
  last_snapshots_.resize(workers_.size());
  missed_at_beat_.resize(workers_.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerSnapshot s;
    auto &missed = missed_at_beat_[i];
    const bool stuck = missed && *missed == workers_[i]->heartbeat();
    if (workers_[i]->collect_snapshot(s, stuck ? now : deadline)) {
      missed.reset();
      if (!with_conns) last_snapshots_[i] = s;
      v.push_back(std::move(s));
      continue;
    }
    if (!stuck) missed = workers_[i]->heartbeat();
    unanswered.push_back(workers_[i]->id());
    if (last_known && last_snapshots_[i]) v.push_back(*last_snapshots_[i]);
  }
  // A batch of admin requests, each waiting for a slow worker, can keep
  // this thread from its tick for longer than the watchdog allows: the
  // ping (still only while every worker's loop turns) is due here too.
  feed_watchdog();
  return v;
}

namespace {

// "1 3" / "[1,3]": the workers that did not answer.
std::string id_list(const std::vector<int> &ids, bool json) {
  std::string out = json ? "[" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    out += (i ? (json ? "," : " ") : "") + std::to_string(ids[i]);
  }
  return json ? out + "]" : out;
}

// The line a text report starts with when some worker did not answer.
std::string unanswered_note(const std::vector<int> &ids) {
  if (ids.empty()) return {};
  return "warning: worker" + std::string(ids.size() > 1 ? "s " : " ") + id_list(ids, false) +
         " did not answer within " + std::to_string(Server::SNAPSHOT_WAIT.count()) +
         " ms; what follows leaves " + (ids.size() > 1 ? "them" : "it") + " out\n";
}

} // namespace

std::string Server::status_text(bool json) {
  uint64_t up = (dataplane::monotonic_ns() - started_at_) / 1'000'000'000ull;
  std::vector<int> unanswered;
  auto snaps = snapshots(false, unanswered);
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
        j += ",\"queue\":" + std::to_string(s.queues.empty() ? 0 : s.queues[0]) +
             ",\"queues\":[" + dataplane::queue_list(s.queues) +
             "],\"zerocopy\":" + (s.zerocopy ? "true" : "false");
      }
#endif
      j += ",\"quic_connections\":" + std::to_string(s.gauges.quic_connections) +
           ",\"tcp_connections\":" + std::to_string(s.gauges.tcp_connections) + "}";
    }
    return j + "],\"unanswered_workers\":" + id_list(unanswered, true) + upstreams_json(snaps) +
           "}";
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
    std::string queue = "-", zc = "-";
#ifdef XDPQ_HAVE_AFXDP
    if (s.has_afxdp) {
      queue = dataplane::queue_list(s.queues);
      zc = s.zerocopy ? "yes" : "no";
    }
#endif
    // Streamed, not into a fixed buffer: a worker's queue list has no
    // bound in length (32 queues of one worker cut a 128-byte row's
    // newline, and the next row ran on).
    t << std::setw(6) << s.id << "  " << std::setw(3) << s.cpu << "  " << std::setw(5) << queue
      << "  " << std::setw(9) << zc << "  " << std::setw(10)
      << static_cast<size_t>(s.gauges.quic_connections) << "  " << std::setw(9)
      << static_cast<size_t>(s.gauges.tcp_connections) << "\n";
  }
  for (int id : unanswered) {
    char line[128];
    snprintf(line, sizeof(line), "%6d  no answer within %lld ms\n", id,
             static_cast<long long>(SNAPSHOT_WAIT.count()));
    t << line;
  }
  auto names = http::Proxy::upstream_names(opts_.proxy);
  if (!names.empty()) {
    t << "upstream    state  requests  errors  idle  busy  route=url\n";
    for (size_t i = 0; i < names.size(); ++i) {
      const http::UpstreamStats u = upstream_total(snaps, i);
      char line[160];
      snprintf(line, sizeof(line), "upstream%-3zu %5s  %8llu  %6llu  %4llu  %4llu  ", i,
               u.down ? "down" : "up", static_cast<unsigned long long>(u.requests),
               static_cast<unsigned long long>(u.connect_failures + u.timeouts + u.resets +
                                               u.bad_responses),
               static_cast<unsigned long long>(u.idle_connections),
               static_cast<unsigned long long>(u.busy_connections));
      t << line << names[i] << "\n";
    }
    t << upstream_latency_table(snaps, names);
  }
  return t.str();
}

std::string Server::upstreams_json(const std::vector<WorkerSnapshot> &snaps) const {
  const auto labels = upstream_labels(opts_.proxy);
  if (labels.empty()) return {};
  std::string j = ",\"upstreams\":[";
  for (size_t i = 0; i < labels.size(); ++i) {
    const http::UpstreamStats u = upstream_total(snaps, i);
    j += (i ? ",{" : "{") + std::string("\"id\":") + std::to_string(i) + ",\"route\":\"" +
         json_escape(labels[i].route) + "\",\"url\":\"" + json_escape(labels[i].url) +
         "\",\"state\":\"" + (u.down ? "down" : "up") +
         "\",\"down_in_workers\":" + std::to_string(u.down) +
         ",\"requests\":" + std::to_string(u.requests) +
         ",\"errors\":" +
         std::to_string(u.connect_failures + u.timeouts + u.resets + u.bad_responses) +
         ",\"probes\":" + std::to_string(u.probes) +
         ",\"probe_failures\":" + std::to_string(u.probe_failures) +
         ",\"idle_connections\":" + std::to_string(u.idle_connections) +
         ",\"busy_connections\":" + std::to_string(u.busy_connections) + "," +
         upstream_latency_json(u) + "}";
  }
  return j + "]";
}

std::string Server::stats_text(bool json) {
  std::vector<int> unanswered;
  const auto snaps = snapshots(false, unanswered);
  Counters xdp = xdp_counters(program_.get());
  if (!json) {
    return unanswered_note(unanswered) + counters_table(snaps, xdp) +
           upstream_latency_table(snaps, http::Proxy::upstream_names(opts_.proxy));
  }
  Counters all = sum(snaps);
  all.insert(all.end(), xdp.begin(), xdp.end());
  std::string j = "{\"total\":" + counters_json(all) + ",\"workers\":[";
  for (size_t i = 0; i < snaps.size(); ++i) {
    j += (i ? "," : "") + std::string("{\"id\":") + std::to_string(snaps[i].id) +
         ",\"counters\":" + counters_json(counters_of(snaps[i])) + "}";
  }
  return j + "],\"unanswered_workers\":" + id_list(unanswered, true) + upstreams_json(snaps) +
         "}";
}

std::string Server::conns_text(bool json) {
  std::vector<int> unanswered;
  const auto snaps = snapshots(true, unanswered);
  std::ostringstream t;
  if (json) {
    t << "{\"connections\":[";
    bool first = true;
    for (const auto &s : snaps) {
      for (const auto &c : s.quic_conns) {
        t << (first ? "" : ",") << "{\"worker\":" << s.id << ",\"proto\":\"h3\",\"peer\":\""
          << c.peer << "\",\"state\":\"" << c.state << "\",\"age_ms\":" << c.age_ms
          << ",\"rtt_us\":" << c.rtt_us << ",\"bytes_in\":" << c.bytes_in
          << ",\"bytes_out\":" << c.bytes_out << ",\"streams\":" << c.streams
          << ",\"out_buffer\":null}";
        first = false;
      }
      for (const auto &c : s.tcp_conns) {
        t << (first ? "" : ",") << "{\"worker\":" << s.id << ",\"proto\":\"" << c.proto
          << "\",\"peer\":\"" << c.peer << "\",\"state\":\"" << (c.busy ? "busy" : "idle")
          << "\",\"age_ms\":" << c.age_ms << ",\"rtt_us\":null,\"bytes_in\":" << c.bytes_in
          << ",\"bytes_out\":" << c.bytes_out << ",\"streams\":null,\"out_buffer\":" << c.out_buffer
          << "}";
        first = false;
      }
    }
    t << "],\"unanswered_workers\":" << id_list(unanswered, true) << "}";
    return t.str();
  }
  t << unanswered_note(unanswered);
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

bool Server::metrics_page(std::string_view path, std::string &body) {
  if (path != "/metrics" && path != "/") return false;
  std::vector<int> unanswered;
  // A worker that misses this scrape counts with its last figures: the
  // sums over workers (the histograms) must not go down, which would read
  // as a counter reset.
  const auto snaps = snapshots(false, unanswered, true);
  body = prometheus_text(snaps, xdp_counters(program_.get()), opts_.proxy);
  body += "# HELP xdpq_workers_unanswered Workers that did not answer this scrape in time "
          "(their figures are those of the last scrape they answered).\n# TYPE xdpq_workers_unanswered gauge\n"
          "xdpq_workers_unanswered " +
          std::to_string(unanswered.size()) + "\n";
  // The control socket's and metrics port's own clients (read on the
  // control thread, which counts them).
  if (const AdminStats *a = admin_stats()) {
    a->visit([&](const char *name, const char *help, uint64_t v) {
      const std::string metric = std::string("xdpq_admin_") + name + "_total";
      body += "# HELP " + metric + " " + help + ".\n# TYPE " + metric + " counter\n" + metric +
              " " + std::to_string(v) + "\n";
    });
  }
  // Which process answered: after a binary upgrade, the new one.
  body += "# HELP xdpq_process_id The process ID of the xdpqd that answered this scrape.\n"
          "# TYPE xdpq_process_id gauge\nxdpq_process_id " +
          std::to_string(getpid()) + "\n";
  return true;
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
  if (cmd == "stats") return stats_text(json);
  if (cmd == "conns") return conns_text(json);
  if (cmd == "reload") {
    std::string r = reload();
    return r.starts_with("error: ") ? err(r.substr(7)) : ok(r);
  }
  if (cmd == "drain") {
    begin_drain("xdpqctl drain");
    return ok("draining");
  }
  if (cmd == "upgrade") {
    std::string r = upgrade();
    return r.starts_with("error: ") ? err(r.substr(7)) : ok(r);
  }
  if (cmd == "capture" && args.size() >= 2 && args[1] == "start" && args.size() >= 3) {
    std::string filter = args.size() >= 4 ? args[3] : "";
    uint64_t count = 0; // 0: until stopped
    if (args.size() >= 5) {
      const std::string &c = args[4];
      auto [end, ec] = std::from_chars(c.data(), c.data() + c.size(), count);
      if (c.empty() || ec != std::errc() || end != c.data() + c.size()) {
        return err("capture start: --count expects a number of packets, got '" + c + "'");
      }
    }
    std::string why = capture_.start(args[2], filter, count);
    return why.empty() ? ok("capturing to " + args[2]) : err(why);
  }
  if (cmd == "capture" && args.size() == 2 && args[1] == "stop") {
    std::string ended;
    uint64_t n = capture_.stop(&ended);
    if (!ended.empty()) {
      return ok("capture had stopped by itself (" + ended + "), " + std::to_string(n) +
                " packets written");
    }
    return ok("capture stopped, " + std::to_string(n) + " packets written");
  }
  if (cmd == "keylog" && args.size() == 3 && args[1] == "start") {
    std::string why = KeyLog::instance().start(args[2]);
    return why.empty() ? ok("logging TLS secrets to " + args[2]) : err(why);
  }
  if (cmd == "keylog" && args.size() == 2 && args[1] == "stop") {
    std::string ended;
    if (!KeyLog::instance().stop(&ended)) return ok("key logging was not running");
    if (!ended.empty()) return ok("key logging had stopped by itself (" + ended + ")");
    return ok("key logging stopped");
  }
  return err("unknown command '" + cmd +
             "' (status, stats, conns, reload, drain, upgrade, capture start|stop, keylog "
             "start|stop)");
}

std::string Server::control_request(const std::string &line) {
  std::vector<std::string> fields;
  size_t pos = 0;
  while (pos <= line.size()) {
    auto tab = line.find('\t', pos);
    if (tab == std::string::npos) tab = line.size();
    fields.push_back(line.substr(pos, tab - pos));
    pos = tab + 1;
  }
  if (fields.size() < 2 || (fields[0] != "json" && fields[0] != "text")) {
    return "error: expected FORMAT (json or text) TAB COMMAND\n";
  }
  bool json = fields[0] == "json";
  std::vector<std::string> args(fields.begin() + 1, fields.end());
  std::string out = command(args, json);
  if (json && (out.empty() || out.back() != '\n')) out += "\n";
  return out;
}

} // namespace xdpq::control
