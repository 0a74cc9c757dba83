#include "control/server.h"

#include "control/log.h"
#include "control/self_signed.h"
#include "dataplane/cpu.h"
#include "dataplane/event_loop.h"
#include "dataplane/udp_socket_port.h"
#include "dataplane/xdp_program.h"
#ifdef XDPQ_HAVE_AFXDP
#include "dataplane/afxdp_port.h"
#endif
#include "http/router.h"
#include "http/tcp_server.h"
#include "http/tcp_tls.h"
#include "quic/endpoint.h"
#include "quic/secrets.h"
#include "quic/tls_context.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "xdpq_version.h"

namespace xdpq::control {

namespace {

std::string read_file(const std::string &flag, const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError(flag + " " + path + ": cannot read: " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

// One shard: its sockets, TLS context, QUIC endpoint and timer wheel, all
// used by one pinned thread only.
class Worker final : public dataplane::LoopHandler, public dataplane::FdHandler {
public:
  Worker(int id, int cpu, std::unique_ptr<dataplane::DatagramPort> port,
         const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
         std::shared_ptr<const http::Router> router, const quic::EndpointConfig &ecfg)
      : id_(id), cpu_(cpu), port_(std::move(port)), tls_(tls_cfg, secrets),
        endpoint_(ecfg, tls_, secrets, router, loop_.timers(), clock_, *port_) {
    for (int fd : port_->fds()) loop_.watch(fd, this);
  }

  // Adds the TCP side to this worker's loop (throws http::TcpError).
  void add_tcp(const http::TcpConfig &cfg, const http::SessionEnv &env,
               std::shared_ptr<http::TcpTlsContext> tls) {
    tcp_ = std::make_unique<http::TcpServer>(cfg, env, std::move(tls), loop_);
  }
  const http::TcpServer *tcp() const { return tcp_.get(); }

  void start() {
    thread_ = std::thread([this] {
      if (cpu_ >= 0) {
        int rv = dataplane::pin_current_thread(cpu_);
        if (rv != 0) LOG_WARN("worker %d: cannot pin to CPU %d: %s", id_, cpu_, strerror(rv));
      }
      loop_.run(*this);
    });
  }

  void request_stop() {
    stop_requested_.store(true, std::memory_order_release);
    loop_.wake();
  }

  void join() {
    if (thread_.joinable()) thread_.join();
  }

  dataplane::DatagramPort &port() { return *port_; }
  const dataplane::DatagramPort &port() const { return *port_; }
  const quic::EndpointStats &endpoint_stats() const { return endpoint_.stats(); }
#ifdef XDPQ_HAVE_AFXDP
  void set_afxdp(dataplane::AfXdpPort *p) { afxdp_ = p; }
  dataplane::AfXdpPort *afxdp() const { return afxdp_; }
#endif
  const http::H3Stats &h3_stats() const { return endpoint_.h3_stats(); }

  void log_stats() const {
    const auto &p = port_->stats();
    const auto &e = endpoint_.stats();
    const auto &h = endpoint_.h3_stats();
    LOG_INFO("worker %d: rx %llu datagrams %llu bytes, tx %llu datagrams %llu bytes in %llu sends "
             "(%llu GSO), tx dropped %llu, rx truncated %llu",
             id_, ull(p.rx_datagrams), ull(p.rx_bytes), ull(p.tx_datagrams), ull(p.tx_bytes),
             ull(p.tx_sends), ull(p.tx_gso_batches), ull(p.tx_dropped), ull(p.rx_truncated));
    LOG_INFO("worker %d: handshakes %llu started %llu completed %llu failed, %llu resumed, "
             "%llu with 0-RTT, %llu retries, %llu version negotiations, %llu stateless resets, "
             "%llu closed (%llu idle, %llu errors), %llu key updates, %llu path validations "
             "(%llu failed)",
             id_, ull(e.handshakes_started), ull(e.handshakes_completed),
             ull(e.handshakes_failed), ull(e.sessions_resumed), ull(e.early_data_accepted),
             ull(e.retries_sent), ull(e.version_negotiations), ull(e.stateless_resets_sent),
             ull(e.conns_closed), ull(e.conns_idle_closed), ull(e.conn_errors),
             ull(e.key_updates), ull(e.path_validations_ok), ull(e.path_validations_failed));
    LOG_INFO("worker %d: dropped: unparsable %llu, small initial %llu, unknown packet %llu, "
             "bad token %llu, connection limit %llu, amplification %llu, reset rate %llu, "
             "closing %llu",
             id_, ull(e.drop_unparsable), ull(e.drop_small_initial), ull(e.drop_unknown_packet),
             ull(e.drop_bad_token), ull(e.drop_conn_limit), ull(e.drop_amplification),
             ull(e.drop_reset_rate), ull(e.drop_closing));
    LOG_INFO("worker %d: requests %llu (2xx %llu, 3xx %llu, 4xx %llu, 5xx %llu), header limit "
             "%llu, body limit %llu",
             id_, ull(h.requests), ull(h.responses_by_class[2]), ull(h.responses_by_class[3]),
             ull(h.responses_by_class[4]), ull(h.responses_by_class[5]),
             ull(h.header_limit_rejects), ull(h.body_limit_rejects));
  }

  // dataplane::FdHandler: the port's descriptors.
  void on_io(uint32_t) override {
    // Bounded work per wakeup so timers and writes get their turn.
    for (int round = 0; round < 16; ++round) {
      size_t n = port_->receive(batch_);
      if (n == 0) break;
      for (size_t i = 0; i < n; ++i) endpoint_.on_datagram(batch_[i]);
    }
  }

  void on_iteration_end() override {
    if (tcp_) tcp_->end_of_pass();
    bool drained = true;
    for (int round = 0; round < 8; ++round) {
      endpoint_.end_of_pass();
      drained = port_->flush();
      if (!drained || !endpoint_.write_blocked()) break;
    }
    if (drained == want_write_) {
      want_write_ = !drained;
      for (int fd : port_->fds()) loop_.set_want_write(fd, this, want_write_);
    }
  }

  void on_wake() override {
    if (stop_requested_.load(std::memory_order_acquire)) {
      endpoint_.close_all();
      if (tcp_) tcp_->shutdown(); // GOAWAY / close on every TCP connection
      loop_.stop(); // after this iteration, which flushes the closes
    }
  }

private:
  static unsigned long long ull(uint64_t v) { return v; }

  int id_;
  int cpu_;
  quic::SystemClock clock_;
  dataplane::EventLoop loop_;
  std::unique_ptr<dataplane::DatagramPort> port_;
  quic::TlsContext tls_;
  quic::Endpoint endpoint_;
  std::unique_ptr<http::TcpServer> tcp_;
  std::array<dataplane::RxDatagram, 64> batch_{};
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
#ifdef XDPQ_HAVE_AFXDP
  dataplane::AfXdpPort *afxdp_ = nullptr; // port_, when it is an AF_XDP port
#endif
  bool want_write_ = false;
};

void block_server_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

Server::Server(const Options &opts) : opts_(opts) {
  log::set_level(*log::parse_level(opts_.log_level));

  quic::TlsConfig tls_cfg;
  tls_cfg.early_data = opts_.early_data;
  if (!opts_.cert_file.empty()) {
    tls_cfg.cert_pem = read_file("--cert", opts_.cert_file);
    tls_cfg.key_pem = read_file("--key", opts_.key_file);
    LOG_INFO("certificate %s, SHA-256 fingerprint %s", opts_.cert_file.c_str(),
             certificate_fingerprint(tls_cfg.cert_pem).c_str());
  } else {
    auto pair = make_self_signed();
    tls_cfg.cert_pem = pair.cert_pem;
    tls_cfg.key_pem = pair.key_pem;
    LOG_INFO("no --cert/--key: generated a self-signed certificate, SHA-256 fingerprint %s",
             pair.sha256_fingerprint.c_str());
  }

  quic::Secrets secrets;
  if (!opts_.secrets_file.empty()) {
    try {
      secrets = quic::Secrets::load_or_create(opts_.secrets_file);
    } catch (const std::exception &e) {
      throw UsageError(std::string("--secrets: ") + e.what());
    }
  } else {
    secrets = quic::Secrets::generate();
    LOG_INFO("no --secrets file: stateless reset, token and ticket keys last for this run only");
  }

  std::shared_ptr<const http::Router> router;
  try {
    router = http::make_default_router(http::RouterConfig{opts_.docroot});
  } catch (const std::exception &e) {
    throw UsageError(std::string("--docroot: ") + e.what());
  }

  // Validate the certificate once up front, for a clear error.
  try {
    quic::TlsContext probe(tls_cfg, secrets);
  } catch (const std::exception &e) {
    throw UsageError(std::string("--cert/--key: ") + e.what());
  }
  if (opts_.check_config) return;

  int nworkers = opts_.workers;
  if (nworkers == 0) {
    nworkers = opts_.cpus.empty() ? dataplane::available_cpus() : static_cast<int>(opts_.cpus.size());
  }
  if (nworkers > 255) nworkers = 255;

  quic::EndpointConfig ecfg;
  ecfg.retry = opts_.retry;
  ecfg.retry_threshold = opts_.retry_threshold;
  ecfg.idle_timeout = opts_.idle_timeout_ms * 1'000'000ull;
  ecfg.max_streams_bidi = opts_.max_streams;
  ecfg.max_connections = opts_.max_connections;
  ecfg.early_data = opts_.early_data;
  ecfg.h3.max_field_section_size = opts_.max_header_size;
  ecfg.h3.max_header_fields = opts_.max_header_fields;

  std::vector<dataplane::Address> listen = opts_.listen;
  std::string dataplane_info;
  if (opts_.dataplane == "afxdp") {
    dataplane_info = start_afxdp(tls_cfg, secrets, router, ecfg);
  } else {
    for (int i = 0; i < nworkers; ++i) {
      dataplane::UdpSocketOptions popts;
      popts.check_in_use = i == 0;
      std::unique_ptr<dataplane::UdpSocketPort> port;
      try {
        port = std::make_unique<dataplane::UdpSocketPort>(listen, popts);
      } catch (const dataplane::PortError &e) {
        throw UsageError(e.what());
      }
      if (i == 0) {
        listen = port->bound_addresses(); // resolve port 0 once
        dataplane_info = std::string("dataplane socket (GSO ") +
                         (port->gso_enabled() ? "on" : "off") + ", GRO " +
                         (port->gro_enabled() ? "on" : "off") + ")";
      }
      int cpu = opts_.cpus.empty() ? -1 : opts_.cpus[static_cast<size_t>(i) % opts_.cpus.size()];
      ecfg.worker_id = static_cast<uint8_t>(i);
      auto *raw = port.get();
      workers_.push_back(
          std::make_unique<Worker>(i, cpu, std::move(port), tls_cfg, secrets, router, ecfg));
      if (i == 0) steering_port_ = raw;
    }
    if (nworkers > 1 && !steering_port_->steer_by_connection_id()) {
      LOG_WARN("cannot attach the connection-ID steering filter (%s): migrating clients may "
               "reach the wrong worker and be reset", strerror(errno));
    }
  }
  if (opts_.tcp || !opts_.h2c_listen.empty()) start_tcp(tls_cfg, secrets, router, listen);

  std::string where;
  for (const auto &a : listen) where += " " + a.to_string();
  if (opts_.tcp) where += " (and TCP: HTTP/2, HTTP/1.1 over TLS)";
  for (const auto &a : opts_.h2c_listen) where += ", cleartext TCP " + a.to_string();
  int n = static_cast<int>(workers_.size());
  LOG_INFO("xdpqd %s ready: HTTP/3 on%s, %d worker%s, %s", XDPQ_VERSION, where.c_str(), n,
           n == 1 ? "" : "s", dataplane_info.c_str());
}

void Server::start_tcp(const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
                       const std::shared_ptr<const http::Router> &router,
                       const std::vector<dataplane::Address> &quic_listen) {
  std::shared_ptr<http::TcpTlsContext> tls;
  try {
    tls = std::make_shared<http::TcpTlsContext>(tls_cfg.cert_pem, tls_cfg.key_pem,
                                                secrets.ticket_key);
  } catch (const std::exception &e) {
    throw UsageError(std::string("--cert/--key (TCP TLS): ") + e.what());
  }
  // Alt-Svc advertises every UDP port QUIC actually serves.
  std::vector<uint16_t> ports;
  for (const auto &a : quic_listen) {
    if (std::find(ports.begin(), ports.end(), a.port()) == ports.end()) ports.push_back(a.port());
  }
  http::SessionEnv env;
  env.router = router;
  env.limits.max_header_size = opts_.max_header_size;
  env.limits.max_header_fields = opts_.max_header_fields;
  env.limits.max_concurrent_streams = static_cast<uint32_t>(opts_.max_streams);
  for (uint16_t p : ports) {
    if (!env.alt_svc.empty()) env.alt_svc += ", ";
    env.alt_svc += "h3=\":" + std::to_string(p) + "\"; ma=86400";
  }
  http::TcpConfig cfg;
  if (opts_.tcp) cfg.tls_listen = quic_listen;
  cfg.cleartext_listen = opts_.h2c_listen;
  cfg.max_connections = opts_.tcp_max_connections;
  cfg.handshake_timeout = opts_.tcp_handshake_timeout_ms * 1'000'000ull;
  cfg.header_timeout = opts_.tcp_header_timeout_ms * 1'000'000ull;
  cfg.idle_timeout = opts_.tcp_idle_timeout_ms * 1'000'000ull;
  cfg.write_timeout = opts_.tcp_write_timeout_ms * 1'000'000ull;
  for (size_t i = 0; i < workers_.size(); ++i) {
    cfg.check_in_use = i == 0;
    try {
      workers_[i]->add_tcp(cfg, env, tls);
    } catch (const http::TcpError &e) {
      throw UsageError(e.what());
    }
  }
  tcp_tls_ = tls;
}

Server::~Server() {
  workers_.clear(); // ports leave the XSKMAP before the program detaches
#ifdef XDPQ_HAVE_AFXDP
  program_.reset();
#endif
  for (int fd : reservations_) close(fd);
}

std::string Server::start_afxdp(const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
                                const std::shared_ptr<const http::Router> &router,
                                quic::EndpointConfig ecfg) {
#ifndef XDPQ_HAVE_AFXDP
  (void)tls_cfg;
  (void)secrets;
  (void)router;
  (void)ecfg;
  throw UsageError("--dataplane afxdp: built without AF_XDP support");
#else
  // A kernel socket holds each served port: no other process can take it,
  // and a second xdpqd fails here with "in use" instead of fighting over
  // the XDP program.
  for (const auto &a : opts_.listen) {
    int fd = socket(a.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket: " + std::string(strerror(errno)));
    if (a.family() == AF_INET6) {
      int one = 1;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    if (bind(fd, &a.u.sa, a.len) != 0) {
      int err = errno;
      close(fd);
      throw UsageError("listen " + a.to_string() + ": cannot reserve the port: " +
                       strerror(err) + (err == EADDRINUSE ? " (port in use)" : ""));
    }
    if (a.port() == 0) {
      close(fd);
      throw UsageError("listen " + a.to_string() + ": --dataplane afxdp needs an explicit port");
    }
    reservations_.push_back(fd);
  }
  dataplane::XdpMode mode = opts_.xdp_mode == "native"    ? dataplane::XdpMode::native
                            : opts_.xdp_mode == "generic" ? dataplane::XdpMode::generic
                                                          : dataplane::XdpMode::automatic;
  try {
    program_ = std::make_unique<dataplane::XdpProgram>();
    for (const auto &a : opts_.listen) program_->add_served(a);
    program_->attach(opts_.interface, mode, opts_.xdp_replace);
  } catch (const dataplane::XdpError &e) {
    throw UsageError(e.what());
  }
  if (!program_->fallback_reason().empty()) {
    LOG_WARN("%s: XDP in generic mode (%s)", opts_.interface.c_str(),
             program_->fallback_reason().c_str());
  }
  std::string zc;
  for (size_t i = 0; i < opts_.queues.size(); ++i) {
    dataplane::AfXdpOptions xo;
    xo.ifname = opts_.interface;
    xo.queue = static_cast<uint32_t>(opts_.queues[i]);
    xo.busy_poll = opts_.busy_poll;
    xo.zerocopy = opts_.zerocopy == "on"    ? dataplane::ZeroCopy::on
                  : opts_.zerocopy == "off" ? dataplane::ZeroCopy::off
                                            : dataplane::ZeroCopy::automatic;
    std::unique_ptr<dataplane::AfXdpPort> port;
    try {
      port = std::make_unique<dataplane::AfXdpPort>(xo, *program_);
    } catch (const dataplane::XdpError &e) {
      throw UsageError(e.what());
    }
    zc += (zc.empty() ? "" : ", ") + std::string("queue ") + std::to_string(xo.queue) + " " +
          (port->zerocopy() ? "zero-copy" : "copy") + (port->hugepages() ? " hugepages" : "");
    int cpu = opts_.cpus.empty() ? -1 : opts_.cpus[i % opts_.cpus.size()];
    ecfg.worker_id = static_cast<uint8_t>(i);
    auto *raw = port.get();
    workers_.push_back(std::make_unique<Worker>(static_cast<int>(i), cpu, std::move(port), tls_cfg,
                                                secrets, router, ecfg));
    workers_.back()->set_afxdp(raw);
  }
  return "dataplane afxdp on " + opts_.interface + " (XDP " + program_->mode() + " mode, prog id " +
         std::to_string(program_->prog_id()) + "; " + zc + ")";
#endif
}

void Server::log_totals() const {
  // One JSON object of every counter summed over workers: for scripts and
  // tests until the control socket exports them live.
  std::string json = "{";
  auto add = [&json](const char *name, uint64_t v) {
    if (json.size() > 1) json += ",";
    json += "\"";
    json += name;
    json += "\":" + std::to_string(v);
  };
  auto sum = [this](auto field) {
    uint64_t t = 0;
    for (const auto &w : workers_) t += field(*w);
    return t;
  };
#define XDPQ_PORT(f) add(#f, sum([](const Worker &w) { return w.port().stats().f; }))
#define XDPQ_EP(f) add(#f, sum([](const Worker &w) { return w.endpoint_stats().f; }))
#define XDPQ_H3(f) add(#f, sum([](const Worker &w) { return w.h3_stats().f; }))
  XDPQ_PORT(rx_datagrams); XDPQ_PORT(rx_bytes); XDPQ_PORT(tx_datagrams); XDPQ_PORT(tx_bytes);
  XDPQ_PORT(tx_sends); XDPQ_PORT(tx_gso_batches); XDPQ_PORT(tx_dropped);
  XDPQ_PORT(rx_truncated); XDPQ_PORT(rx_errors);
  XDPQ_EP(datagrams_in); XDPQ_EP(datagrams_routed); XDPQ_EP(drop_tx_full);
  XDPQ_EP(drop_unparsable); XDPQ_EP(drop_small_initial);
  XDPQ_EP(drop_unknown_packet); XDPQ_EP(drop_bad_token); XDPQ_EP(drop_conn_limit);
  XDPQ_EP(drop_amplification); XDPQ_EP(drop_reset_rate); XDPQ_EP(drop_closing);
  XDPQ_EP(version_negotiations); XDPQ_EP(retries_sent); XDPQ_EP(stateless_resets_sent);
  XDPQ_EP(handshakes_started); XDPQ_EP(handshakes_completed); XDPQ_EP(handshakes_failed);
  XDPQ_EP(sessions_resumed); XDPQ_EP(early_data_accepted); XDPQ_EP(new_tokens_accepted);
  XDPQ_EP(conns_closed); XDPQ_EP(conns_idle_closed); XDPQ_EP(conn_errors);
  XDPQ_EP(key_updates); XDPQ_EP(path_validations_ok); XDPQ_EP(path_validations_failed);
  XDPQ_EP(packets_out);
  XDPQ_H3(requests); XDPQ_H3(header_limit_rejects); XDPQ_H3(body_limit_rejects);
  XDPQ_H3(stream_errors);
  add("responses_2xx", sum([](const Worker &w) { return w.h3_stats().responses_by_class[2]; }));
  add("responses_3xx", sum([](const Worker &w) { return w.h3_stats().responses_by_class[3]; }));
  add("responses_4xx", sum([](const Worker &w) { return w.h3_stats().responses_by_class[4]; }));
  add("responses_5xx", sum([](const Worker &w) { return w.h3_stats().responses_by_class[5]; }));
#undef XDPQ_PORT
#undef XDPQ_EP
#undef XDPQ_H3
  auto tcp_sum = [this](auto field) {
    uint64_t t = 0;
    for (const auto &w : workers_) {
      if (w->tcp()) t += field(w->tcp()->stats());
    }
    return t;
  };
#define XDPQ_TCP(f) add("tcp_" #f, tcp_sum([](const http::TcpStats &x) { return x.f; }))
  XDPQ_TCP(accepted); XDPQ_TCP(refused_conn_limit); XDPQ_TCP(tls_handshake_failed);
  XDPQ_TCP(plaintext_on_tls); XDPQ_TCP(h2_connections); XDPQ_TCP(h1_connections);
  XDPQ_TCP(requests); XDPQ_TCP(header_limit_rejects); XDPQ_TCP(body_limit_rejects);
  XDPQ_TCP(bad_requests); XDPQ_TCP(goaways_sent); XDPQ_TCP(protocol_error_closes);
  XDPQ_TCP(timeouts_handshake); XDPQ_TCP(timeouts_headers); XDPQ_TCP(timeouts_idle);
  XDPQ_TCP(timeouts_write); XDPQ_TCP(closed); XDPQ_TCP(tls_writes); XDPQ_TCP(bytes_in);
  XDPQ_TCP(bytes_out);
#undef XDPQ_TCP
  for (int cls = 2; cls <= 5; ++cls) {
    std::string name = "tcp_responses_" + std::to_string(cls) + "xx";
    add(name.c_str(), tcp_sum([cls](const http::TcpStats &x) { return x.responses_by_class[cls]; }));
  }
#ifdef XDPQ_HAVE_AFXDP
  if (program_) {
    auto c = program_->counters();
    for (size_t i = 0; i < c.size(); ++i) add(dataplane::XDP_COUNTER_NAMES[i], c[i]);
    auto afx = [this](auto field) {
      uint64_t t = 0;
      for (const auto &w : workers_) {
        if (w->afxdp()) t += field(w->afxdp()->xdp_stats());
      }
      return t;
    };
    for (size_t i = 1; i < static_cast<size_t>(dataplane::ParseStatus::count_); ++i) {
      std::string name = std::string("rx_invalid_") +
                         dataplane::parse_status_name(static_cast<dataplane::ParseStatus>(i));
      add(name.c_str(), afx([i](const dataplane::AfXdpStats &x) { return x.rx_invalid[i]; }));
    }
#define XDPQ_AFX(f) add("afxdp_" #f, afx([](const dataplane::AfXdpStats &x) { return x.f; }))
    XDPQ_AFX(tx_no_neighbor); XDPQ_AFX(tx_ring_full); XDPQ_AFX(tx_kicks);
    XDPQ_AFX(fill_starved); XDPQ_AFX(xdp_rx_dropped); XDPQ_AFX(xdp_rx_invalid_descs);
    XDPQ_AFX(xdp_tx_invalid_descs); XDPQ_AFX(xdp_rx_ring_full);
    XDPQ_AFX(xdp_rx_fill_ring_empty); XDPQ_AFX(xdp_tx_ring_empty);
#undef XDPQ_AFX
  }
#endif
  json += "}";
  LOG_INFO("stats %s", json.c_str());
}

int Server::run() {
  for (auto &w : workers_) w->start();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGHUP) {
      LOG_WARN("SIGHUP: configuration reload is not implemented yet; ignoring");
      continue;
    }
    LOG_INFO("%s: closing connections and stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    break;
  }
  for (auto &w : workers_) w->request_stop();
  for (auto &w : workers_) w->join();
  for (auto &w : workers_) w->log_stats();
  log_totals();
  return 0;
}

} // namespace xdpq::control
