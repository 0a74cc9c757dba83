#include "control/server.h"

#include "base/hex.h"

#include "base/log.h"
#include "control/self_signed.h"
#include "control/worker.h"
#include "dataplane/cpu.h"
#include "dataplane/event_loop.h"
#include "dataplane/handoff_ring.h"
#include "dataplane/local_addresses.h"
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

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "xdpq_version.h"

namespace xdpq::control {

namespace {

// The least spin of a busy-polling worker (--busy-poll), in microseconds.
constexpr uint64_t BUSY_POLL_SPIN_US = 50;

// A file a flag names (an error says where a configuration file set it).
std::string read_file(const Options &o, const char *flag, const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError(o.at({flag}) + flag + " " + path + ": cannot read: " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

sigset_t server_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

void block_server_signals() {
  const sigset_t set = server_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // A write past a file size limit (systemd's LimitFSIZE) fails with
  // EFBIG, which the access log and capture handle, instead of killing us.
  signal(SIGXFSZ, SIG_IGN);
}

void raise_descriptor_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
      LOG_INFO("descriptor limit raised from %llu to %llu", static_cast<unsigned long long>(was),
               static_cast<unsigned long long>(rl.rlim_max));
    }
  }
  if (rl.rlim_cur < 4096) {
    LOG_WARN("descriptor limit is %llu: TCP connections and open files beyond it are refused "
             "(raise LimitNOFILE / ulimit -n)",
             static_cast<unsigned long long>(rl.rlim_cur));
  }
}

namespace {

// Whether an inherited socket of the previous process's worker goes to our
// worker i of n: its own id, or (it had more workers) spread over ours.
bool inherited_by(int old_worker, int i, int n) {
  return old_worker == i || (old_worker >= n && old_worker % n == i);
}

bool listed(const std::vector<dataplane::Address> &v, const dataplane::Address &a) {
  return std::find(v.begin(), v.end(), a) != v.end();
}

} // namespace

int take_upgrade_fd() {
  const char *e = getenv(UPGRADE_FD_ENV);
  if (e == nullptr) return -1;
  int fd = static_cast<int>(std::strtol(e, nullptr, 10));
  unsetenv(UPGRADE_FD_ENV);
  if (fd < 3 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return -1;
  return fd;
}

void report_upgrade_failure(int upgrade_fd, const std::string &why) {
  if (upgrade_fd < 0) return;
  // Read what the running xdpqd sent first: closing a socket with unread
  // messages would reset the connection before our answer is read.
  for (;;) {
    std::string text;
    std::vector<int> fds;
    bool got = recv_message(upgrade_fd, text, fds, 0);
    for (int fd : fds) close(fd);
    if (!got) break;
  }
  send_message(upgrade_fd, "error " + why + "\n", {});
}

Server::Server(const Options &opts, std::vector<std::string> argv, int upgrade_fd)
    : opts_(opts), argv_(std::move(argv)), upgrade_channel_(upgrade_fd) {
  log::set_level(*log::parse_level(opts_.log_level));
  if (upgrade_channel_ >= 0) {
    // Started by a running xdpqd (binary upgrade): take what it hands over.
    inherited_ = receive_inheritance(upgrade_channel_, 10000);
    generation_ = static_cast<uint8_t>(inherited_->generation ^ 1);
    if (opts_.dataplane != inherited_->dataplane) {
      throw UsageError("binary upgrade: the running xdpqd serves --dataplane " +
                       inherited_->dataplane + ", this configuration --dataplane " +
                       opts_.dataplane + "; a change of dataplane needs a restart");
    }
    // Once systemd makes us its main process, the watchdog is ours.
    if (getenv("WATCHDOG_USEC")) setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
    LOG_INFO("binary upgrade: took over %zu sockets of the running xdpqd (generation %d, %d "
             "workers); this process is generation %d",
             inherited_->sockets.size(), inherited_->generation, inherited_->workers, generation_);
  }
  // TLS secrets reach the key log only while `xdpqctl keylog start` runs.
  auto sink = [](const std::string &line) {
    if (KeyLog::instance().active()) KeyLog::instance().write_line(line);
  };
  quic::set_keylog_sink(sink, [] { return KeyLog::instance().active(); });
  http::set_tcp_keylog_sink(sink);

  quic::TlsConfig &tls_cfg = tls_cfg_;
  tls_cfg.early_data = opts_.early_data;
  if (!opts_.cert_file.empty()) {
    tls_cfg.cert_pem = read_file(opts_, "--cert", opts_.cert_file);
    tls_cfg.key_pem = read_file(opts_, "--key", opts_.key_file);
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
      secrets = quic::Secrets::load_or_create(opts_.secrets_file, !opts_.check_config);
    } catch (const std::exception &e) {
      throw UsageError(opts_.at({"--secrets"}) + "--secrets: " + e.what());
    }
  } else if (inherited_) {
    secrets = inherited_->secrets; // the running server's keys live on in us
  } else {
    secrets = quic::Secrets::generate();
    LOG_INFO("no --secrets file: stateless reset, token and ticket keys last for this run only");
  }

  if (!opts_.access_log.empty()) {
    if (opts_.check_config) {
      // Checked, not created.
      const auto slash = opts_.access_log.rfind('/');
      const std::string dir =
          slash == std::string::npos ? "." : opts_.access_log.substr(0, slash + 1);
      struct stat st {};
      const bool exists = stat(opts_.access_log.c_str(), &st) == 0;
      if (exists && !S_ISREG(st.st_mode)) {
        throw UsageError(opts_.at({"--access-log"}) + "--access-log " + opts_.access_log +
                         ": not a regular file");
      }
      if (access(exists ? opts_.access_log.c_str() : dir.c_str(), W_OK) != 0) {
        throw UsageError(opts_.at({"--access-log"}) + "--access-log " + opts_.access_log +
                         ": cannot be written (" + strerror(errno) + ")");
      }
    } else {
      try {
        access_log_ = std::make_shared<http::AccessLog>(opts_.access_log);
      } catch (const std::exception &e) {
        throw UsageError(opts_.at({"--access-log"}) + "--access-log " + e.what());
      }
    }
  }

  std::shared_ptr<const http::Router> router;
  try {
    http::RouterConfig rc;
    rc.docroot = opts_.docroot;
    rc.files.max_entries = opts_.file_cache_entries;
    rc.files.max_bytes = opts_.file_cache_bytes;
    rc.files.max_file_in_memory = opts_.file_cache_max_file;
    rc.files.revalidate_ns = opts_.file_cache_revalidate_ms * 1'000'000ull;
    rc.files.allow_dotfiles = opts_.serve_dotfiles;
    rc.test_routes = opts_.test_routes;
    router = http::make_default_router(rc);
  } catch (const std::exception &e) {
    throw UsageError(opts_.at({"--docroot"}) + "--docroot: " + e.what());
  }

  // Validate the certificate once up front, for a clear error.
  try {
    quic::TlsContext probe(tls_cfg, secrets);
  } catch (const std::exception &e) {
    throw UsageError(opts_.at({"--cert", "--key"}) + "--cert/--key: " + e.what());
  }
  if (!opts_.echo && (opts_.tcp || !opts_.h2c_listen.empty())) {
    // OpenSSL holds the certificate to its security level, which GnuTLS
    // does not (a 1024-bit RSA key passes the check above): built here,
    // --check-config refuses what the start would.
    try {
      tcp_tls_ = std::make_shared<http::TcpTlsContext>(tls_cfg.cert_pem, tls_cfg.key_pem,
                                                       secrets.ticket_key);
    } catch (const std::exception &e) {
      throw UsageError(opts_.at({"--cert", "--key"}) + "--cert/--key (TCP TLS): " + e.what());
    }
  }
  secrets_ = secrets;

  std::shared_ptr<const quic::QuicLbCodec> quic_lb;
  if (!opts_.quic_lb_server_id.empty()) {
    quic::QuicLbConfig lb;
    lb.config_id = static_cast<uint8_t>(opts_.quic_lb_config_id);
    lb.server_id = opts_.quic_lb_server_id;
    lb.nonce_len = opts_.quic_lb_nonce_length;
    if (opts_.quic_lb_mode == "encrypted") {
      if (!secrets.quic_lb_key) {
        throw UsageError(opts_.at({"--quic-lb-mode"}) + "--quic-lb-mode encrypted: secrets file " +
                         opts_.secrets_file +
                         " has no quic_lb_key line; add quic_lb_key=<32 hex digits> (the key "
                         "the balancer and every node share), or use --quic-lb-mode plaintext");
      }
      lb.key = secrets.quic_lb_key;
    }
    try {
      quic_lb = std::make_shared<const quic::QuicLbCodec>(lb);
    } catch (const std::invalid_argument &e) {
      throw UsageError(opts_.at({"--quic-lb-server-id"}) + "--quic-lb-server-id: " + e.what());
    }
    LOG_INFO("QUIC-LB: config %d, server ID %s, nonce %zu bytes, %s, connection IDs of %zu bytes",
             opts_.quic_lb_config_id, to_hex(lb.server_id).c_str(), lb.nonce_len,
             opts_.quic_lb_mode.c_str(), quic_lb->cid_len());
    // A fingerprint of the key, not the key: the format, for the upgrade check.
    uint64_t fp = 1469598103934665603ull;
    for (uint8_t b : lb.key.value_or(std::array<uint8_t, 16>{})) fp = (fp ^ b) * 1099511628211ull;
    cid_format_ = "quic-lb:cr=" + std::to_string(opts_.quic_lb_config_id) +
                  ":sid=" + to_hex(lb.server_id) + ":nonce=" + std::to_string(lb.nonce_len) +
                  ":" + opts_.quic_lb_mode + ":" + std::to_string(fp & 0xffff);
  }
  if (inherited_ && inherited_->cid_format != cid_format_) {
    // Our workers could not tell the running connections' CIDs apart from
    // unknown ones: they would reset them.
    throw UsageError("binary upgrade: the connection-ID format would change (" +
                     inherited_->cid_format + " -> " + cid_format_ +
                     "): the running connections could not be routed; change [quic_lb] with a "
                     "restart (drain, then start), not an upgrade");
  }
  if (opts_.check_config) {
    try {
      check_control_path(control_socket_path(opts_));
    } catch (const UsageError &e) {
      throw UsageError(opts_.at({"--control-socket"}) + e.what());
    }
    if (opts_.dataplane == "afxdp") {
      bool queue = false;
      const std::string why = dataplane::check_interface(opts_.interface, opts_.queues, queue);
      if (!why.empty()) throw UsageError(opts_.at({queue ? "--queues" : "--interface"}) + why);
    }
    return;
  }

  int nworkers = opts_.workers;
  if (nworkers == 0) {
    nworkers = opts_.cpus.empty() ? dataplane::available_cpus() : static_cast<int>(opts_.cpus.size());
  }
  if (nworkers > quic::EndpointConfig::MAX_WORKERS) {
    LOG_WARN("%d CPUs, but at most %d workers: starting %d (--workers N to choose)", nworkers,
             quic::EndpointConfig::MAX_WORKERS, quic::EndpointConfig::MAX_WORKERS);
    nworkers = quic::EndpointConfig::MAX_WORKERS;
  }

  quic::EndpointConfig ecfg;
  ecfg.retry = opts_.retry;
  ecfg.retry_threshold = opts_.retry_threshold;
  ecfg.retry_rate = opts_.retry_rate ? static_cast<double>(opts_.retry_rate) : 1e300;
  ecfg.per_source = dataplane::SourceLimits{static_cast<uint32_t>(opts_.per_source_connections),
                                            static_cast<double>(opts_.per_source_rate), 0,
                                            static_cast<double>(opts_.per_source_validated_rate)};
  ecfg.worker_count = static_cast<uint8_t>(opts_.dataplane == "afxdp" ? afxdp_workers()
                                                                       : nworkers);
  ecfg.idle_timeout = opts_.idle_timeout_ms * 1'000'000ull;
  ecfg.handshake_timeout = opts_.handshake_timeout_ms * 1'000'000ull;
  ecfg.max_streams_bidi = opts_.max_streams;
  ecfg.max_connections = opts_.max_connections;
  ecfg.max_memory = opts_.quic_memory_per_worker;
  ecfg.early_data = opts_.early_data;
  ecfg.quic_lb = quic_lb;
  ecfg.generation = generation_;
  h3_limits_.max_field_section_size = opts_.max_header_size;
  h3_limits_.qpack_table_capacity = opts_.qpack_table_capacity;
  h3_limits_.max_header_fields = opts_.max_header_fields;
  h3_limits_.max_request_body = opts_.max_request_body;
  h3_limits_.max_body_per_connection = opts_.max_body_per_connection;
  h3_limits_.max_conn_window = ecfg.max_conn_window;
  h3_limits_.header_timeout = opts_.header_timeout_ms * 1'000'000ull;
  h3_limits_.response_headers = &opts_.response_headers;

  // As many live early-data hellos as each worker used to keep alone.
  replays_ = std::make_shared<quic::ReplayStore>(65536 * size_t{ecfg.worker_count});

  std::vector<dataplane::Address> listen = opts_.listen;
  std::string dataplane_info;
  if (opts_.dataplane == "afxdp") {
    dataplane_info = start_afxdp(tls_cfg, secrets, router, ecfg);
  } else {
    for (int i = 0; i < nworkers; ++i) {
      dataplane::UdpSocketOptions popts;
      popts.check_in_use = i == 0 && !inherited_;
      if (inherited_) {
        for (size_t k = 0; k < inherited_->sockets.size(); ++k) {
          const auto &s = inherited_->sockets[k];
          if (s.kind == Inheritance::Kind::udp && inherited_by(s.worker, i, nworkers) &&
              listed(listen, s.addr)) {
            popts.inherited.emplace_back(s.addr, s.fd);
            adopted_.push_back(k);
          }
        }
      }
      std::unique_ptr<dataplane::UdpSocketPort> port;
      try {
        port = std::make_unique<dataplane::UdpSocketPort>(listen, popts);
      } catch (const dataplane::PortError &e) {
        throw UsageError(opts_.at({"--listen"}) + e.what());
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
      workers_.push_back(std::make_unique<Worker>(i, cpu, std::move(port), tls_cfg, secrets,
                                                  replays_, router, ecfg, h3_limits_, capture_,
                                                  opts_.max_body_per_worker));
      if (i == 0) steering_port_ = raw;
    }
    const auto worker_at = quic::Endpoint::visible_worker_offset(quic_lb.get());
    if (nworkers > 1 && !worker_at) {
      LOG_INFO("encrypted QUIC-LB connection IDs: the kernel spreads packets by address; a "
               "migrated client's packets reach their worker by hand-off");
    } else if (nworkers > 1 && !steering_port_->steer_by_connection_id(*worker_at)) {
      LOG_WARN("cannot attach the connection-ID steering filter (%s): a migrated client's "
               "packets reach their worker by hand-off", strerror(errno));
    }
  }
  // Cross-queue routing: a datagram for another worker's connection ID
  // reaches that worker through its hand-off ring.
  std::vector<Worker *> all;
  for (auto &w : workers_) all.push_back(w.get());
  // Busy polling brings packets in only while the worker polls: it spins
  // at least BUSY_POLL_SPIN_US after its last work.
  uint64_t spin_us = opts_.spin_us;
  if (opts_.busy_poll && opts_.dataplane == "afxdp" && spin_us < BUSY_POLL_SPIN_US) {
    spin_us = BUSY_POLL_SPIN_US;
  }
  // Every worker has a proxy, with or without routes, so that a reload
  // can add some.
  auto proxy = std::make_shared<const http::ProxyConfig>(opts_.proxy);
  for (auto &w : workers_) {
    w->connect_peers(all);
    w->set_spin(spin_us * 1000);
    w->set_proxy(proxy);
    w->set_access_log(access_log_);
  }
  if (inherited_) {
    // The previous process's connections: one ring from each of our
    // workers to each of its workers, in shared memory, and its workers'
    // wake eventfds.
    const size_t prev = static_cast<size_t>(inherited_->workers);
    std::vector<int> wake(prev, -1);
    for (const auto *s : inherited_->of(Inheritance::Kind::wake)) {
      wake[static_cast<size_t>(s->worker)] = s->fd;
      previous_wake_fds_.push_back(s->fd);
    }
    if (std::find(wake.begin(), wake.end(), -1) != wake.end()) {
      throw std::runtime_error("binary upgrade: the running xdpqd sent no wake descriptor for "
                               "some of its workers");
    }
    upgrade_region_ =
        std::make_unique<dataplane::HandoffRegion>(workers_.size() * prev, upgrade_capacity_);
    for (size_t i = 0; i < workers_.size(); ++i) {
      std::vector<dataplane::HandoffRing *> rings;
      for (size_t j = 0; j < prev; ++j) rings.push_back(&upgrade_region_->ring(i * prev + j));
      workers_[i]->set_previous_generation(rings, wake);
    }
    for (size_t k = 0; k < inherited_->sockets.size(); ++k) {
      if (inherited_->sockets[k].kind == Inheritance::Kind::wake) adopted_.push_back(k);
    }
  }
  if (opts_.echo) {
    for (auto &w : workers_) w->set_echo(true);
    dataplane_info += ", UDP echo mode (no QUIC, no TCP)";
  } else if (opts_.tcp || !opts_.h2c_listen.empty()) {
    start_tcp(router, listen);
  }

  std::string where;
  for (const auto &a : listen) where += " " + a.to_string();
  if (opts_.tcp && !opts_.echo) where += " (and TCP: HTTP/2, HTTP/1.1 over TLS)";
  for (const auto &a : opts_.h2c_listen) where += ", cleartext TCP " + a.to_string();
  int n = static_cast<int>(workers_.size());
  dataplane_info_ = dataplane_info;
  listen_ = listen;
  open_control();
  // Started: an XDP program this start replaced is gone for good.
  if (program_) program_->keep_replacement();
  LOG_INFO("xdpqd %s ready: HTTP/3 on%s, %d worker%s, %s", XDPQ_VERSION, where.c_str(), n,
           n == 1 ? "" : "s", dataplane_info.c_str());
}

void Server::start_tcp(const std::shared_ptr<const http::Router> &router,
                       const std::vector<dataplane::Address> &quic_listen) {
  std::shared_ptr<http::TcpTlsContext> tls = tcp_tls_; // checked up front
  // Alt-Svc advertises every UDP port QUIC actually serves.
  std::vector<uint16_t> ports;
  for (const auto &a : quic_listen) {
    if (std::find(ports.begin(), ports.end(), a.port()) == ports.end()) ports.push_back(a.port());
  }
  http::SessionEnv env;
  env.router = router;
  env.response_headers = &opts_.response_headers;
  env.limits.max_header_size = opts_.max_header_size;
  env.limits.max_header_fields = opts_.max_header_fields;
  env.limits.max_concurrent_streams = static_cast<uint32_t>(opts_.max_streams);
  env.limits.max_request_body = opts_.max_request_body;
  env.limits.max_body_per_connection = opts_.max_body_per_connection;
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
  // A TCP peer has proven its address: only the validated rate applies.
  cfg.per_source = dataplane::SourceLimits{static_cast<uint32_t>(opts_.per_source_connections),
                                           0, 0,
                                           static_cast<double>(opts_.per_source_validated_rate)};
  for (size_t i = 0; i < workers_.size(); ++i) {
    cfg.check_in_use = i == 0 && !inherited_;
    cfg.inherited_tls.clear();
    cfg.inherited_clear.clear();
    if (inherited_) {
      for (size_t k = 0; k < inherited_->sockets.size(); ++k) {
        const auto &s = inherited_->sockets[k];
        if (!inherited_by(s.worker, static_cast<int>(i), static_cast<int>(workers_.size()))) {
          continue;
        }
        if (s.kind == Inheritance::Kind::tcp_tls && listed(cfg.tls_listen, s.addr)) {
          cfg.inherited_tls.emplace_back(s.addr, s.fd);
        } else if (s.kind == Inheritance::Kind::tcp_clear && listed(cfg.cleartext_listen, s.addr)) {
          cfg.inherited_clear.emplace_back(s.addr, s.fd);
        } else {
          continue;
        }
        adopted_.push_back(k);
      }
    }
    try {
      workers_[i]->add_tcp(cfg, env, tls);
    } catch (const http::TcpError &e) {
      throw UsageError(e.what());
    }
  }
}

#ifdef XDPQ_HAVE_AFXDP
// The host's addresses, in the XDP program's tables: a wildcard listen
// serves these only, and a datagram from the wire whose source is one of
// them is forged (dropped, as the kernel drops such a martian on the
// socket dataplane).
void Server::follow_local_addresses() {
  const bool wildcard = std::any_of(opts_.listen.begin(), opts_.listen.end(),
                                    [](const dataplane::Address &a) { return a.is_unspecified(); });
  auto *program = program_.get();
  bool *full_logged = &local_full_logged_;
  try {
    local_addresses_ = std::make_unique<dataplane::LocalAddresses>(
        [program, full_logged, wildcard](const dataplane::Address &a, bool present) {
          try {
            program->set_local(a, present);
            LOG_DEBUG("local address %s %s", a.to_string().c_str(), present ? "known" : "gone");
          } catch (const dataplane::XdpError &e) {
            // Traffic to it stays the kernel's (the reserved port holds it),
            // and forgeries from it are not refused in XDP.
            if (!*full_logged) {
              LOG_WARN("%s; %s", e.what(),
                       wildcard ? "it is not served over AF_XDP"
                                : "datagrams forged with it as source are not refused");
            }
            *full_logged = true;
          }
        });
  } catch (const std::runtime_error &e) {
    throw UsageError(std::string("following the host's addresses: ") + e.what());
  }
  if (wildcard) {
    LOG_INFO("serving the wildcard listen on AF_XDP for the host's %zu addresses (followed)",
             local_addresses_->size());
  }
}
#else
void Server::follow_local_addresses() {}
#endif

Server::~Server() {
  workers_.clear(); // ports leave the XSKMAP before the program detaches
  local_addresses_.reset();
#ifdef XDPQ_HAVE_AFXDP
  program_.reset();
#endif
  for (int fd : reservations_) close(fd);
  close_control();
}

#ifdef XDPQ_HAVE_AFXDP
dataplane::AfXdpOptions Server::afxdp_options(size_t i, bool after_other) const {
  dataplane::AfXdpOptions xo;
  xo.ifname = opts_.interface;
  // Worker i of N serves queues i, i+N, i+2N... of the list.
  xo.queues.clear();
  for (size_t k = i; k < opts_.queues.size(); k += afxdp_workers()) {
    xo.queues.push_back(static_cast<uint32_t>(opts_.queues[k]));
  }
  xo.busy_poll = opts_.busy_poll;
  xo.kernel_train = opts_.kernel_trains;
  for (size_t k = 0; k < opts_.listen.size(); ++k) {
    xo.kernel_sockets.emplace_back(opts_.listen[k], reservations_[k]);
  }
  xo.zerocopy = opts_.zerocopy == "on"    ? dataplane::ZeroCopy::on
                : opts_.zerocopy == "off" ? dataplane::ZeroCopy::off
                                          : dataplane::ZeroCopy::automatic;
  // In an upgrade the other process just closed its socket on the queue.
  if (after_other) xo.busy_wait = std::chrono::seconds(3);
  return xo;
}
#endif

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
  // the XDP program. It also sends hybrid TX trains, and in a binary
  // upgrade it serves while the queues change hands.
  const bool upgrade = inherited_.has_value();
  if (upgrade) {
    if (inherited_->interface != opts_.interface) {
      throw UsageError("binary upgrade: the running xdpqd serves AF_XDP on " +
                       inherited_->interface + ", this configuration on " + opts_.interface +
                       "; a change of interface needs a restart");
    }
  }
  // The frames xdpq writes carry IPv6 flow label 0; so must the trains a
  // reservation sends through the kernel (hybrid TX), or one connection's
  // packets would be two flows to whatever hashes the label.
  auto unlabelled = [](int fd, const dataplane::Address &a) {
    if (a.family() != AF_INET6) return;
    int off = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, &off, sizeof(off));
  };
  for (const auto &a : opts_.listen) {
    if (upgrade) {
      const auto &socks = inherited_->sockets;
      auto it = std::find_if(socks.begin(), socks.end(), [&](const Inheritance::Socket &s) {
        return s.kind == Inheritance::Kind::reservation && s.addr == a;
      });
      if (it != socks.end()) {
        unlabelled(it->fd, a); // a previous version may not have
        reservations_.push_back(it->fd);
        adopted_.push_back(static_cast<size_t>(it - socks.begin()));
        continue;
      }
    }
    int fd = socket(a.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket: " + std::string(strerror(errno)));
    bool gro = true, gso = true;
    dataplane::UdpSocketPort::configure(fd, a.family(), {}, gro, gso);
    unlabelled(fd, a);
    if (bind(fd, &a.u.sa, a.len) != 0) {
      int err = errno;
      close(fd);
      throw UsageError(opts_.at({"--listen"}) + "listen " + a.to_string() + ": cannot reserve the port: " +
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
    follow_local_addresses();
    if (!upgrade) {
      program_->attach(opts_.interface, mode, opts_.xdp_replace);
    } else {
      // The running xdpqd's link: our program takes its place once our
      // sockets are bound (report_ready_to_previous).
      const auto links = inherited_->of(Inheritance::Kind::xdp_link);
      if (links.size() != 1) {
        throw dataplane::XdpError("binary upgrade: the running xdpqd sent no XDP link");
      }
      int link = fcntl(links[0]->fd, F_DUPFD_CLOEXEC, 0);
      if (link < 0) throw std::runtime_error("dup: " + std::string(strerror(errno)));
      program_->adopt_link(link, opts_.interface);
      take_queues_from_previous();
    }
  } catch (const dataplane::XdpError &e) {
    throw UsageError(e.what());
  }
  if (!program_->fallback_reason().empty()) {
    LOG_WARN("%s: XDP in generic mode (%s)", opts_.interface.c_str(),
             program_->fallback_reason().c_str());
  }
  std::string zc;
  for (size_t i = 0; i < afxdp_workers(); ++i) {
    auto xo = afxdp_options(i, upgrade);
    std::unique_ptr<dataplane::AfXdpPort> port;
    try {
      port = std::make_unique<dataplane::AfXdpPort>(xo, *program_);
    } catch (const dataplane::XdpError &e) {
      throw UsageError(e.what());
    }
    zc += (zc.empty() ? "" : ", ") + std::string(xo.queues.size() > 1 ? "queues " : "queue ") +
          dataplane::queue_list(xo.queues) + " " + (xo.queues.size() > 1 ? "shared UMEM " : "") +
          (port->zerocopy() ? "zero-copy" : "copy") + (port->hugepages() ? " hugepages" : "") +
          (port->kernel_train() ? ", trains of " + std::to_string(port->kernel_train()) +
                                      "+ via kernel UDP GSO"
                                : "");
    int cpu = opts_.cpus.empty() ? -1 : opts_.cpus[i % opts_.cpus.size()];
    ecfg.worker_id = static_cast<uint8_t>(i);
    auto *raw = port.get();
    workers_.push_back(std::make_unique<Worker>(static_cast<int>(i), cpu, std::move(port), tls_cfg,
                                                secrets, replays_, router, ecfg, h3_limits_,
                                                capture_,
                                                opts_.max_body_per_worker));
    workers_.back()->set_afxdp(raw);
    if (i == 0) {
      std::vector<std::pair<dataplane::Address, int>> held;
      for (size_t k = 0; k < opts_.listen.size(); ++k) {
        held.emplace_back(opts_.listen[k], reservations_[k]);
      }
      try {
        workers_.back()->set_side_door(held);
      } catch (const std::exception &e) {
        throw UsageError(std::string("the reserved sockets: ") + e.what());
      }
    }
  }
  return std::string(upgrade ? "took over " : "") + "dataplane afxdp on " + opts_.interface + " (XDP " + program_->mode() + " mode, prog id " +
         std::to_string(program_->prog_id()) + "; " + zc + ")";
#endif
}

} // namespace xdpq::control
