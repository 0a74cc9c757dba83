#pragma once
// The daemon's runtime: certificate and secrets, one worker thread per CPU
// (each with its own sockets, TLS context, QUIC endpoint and timer wheel),
// signal handling and shutdown.

#include "control/options.h"
#include "http/router.h"
#include "quic/endpoint.h"
#include "quic/secrets.h"
#include "quic/tls_context.h"

#include <memory>
#include <vector>

namespace xdpq::http {
class TcpTlsContext;
}
namespace xdpq::dataplane {
class UdpSocketPort;
class XdpProgram;
} // namespace xdpq::dataplane

namespace xdpq::control {

class Worker;

class Server {
public:
  // Prepares everything that can fail on bad input: files, addresses,
  // sockets. Throws UsageError for configuration problems (exit 2) and
  // std::runtime_error for others.
  explicit Server(const Options &opts);
  ~Server();
  Server(const Server &) = delete;
  Server &operator=(const Server &) = delete;

  // Runs the workers until SIGINT or SIGTERM; returns the exit status.
  int run();

private:
  void log_totals() const;
  // Reserves the ports, attaches the XDP program and creates one AF_XDP
  // worker per queue; returns a description for the ready line.
  std::string start_afxdp(const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
                          const std::shared_ptr<const http::Router> &router,
                          quic::EndpointConfig ecfg);

  // Adds HTTP/2 + HTTP/1.1 over TLS on the QUIC addresses to every worker.
  void start_tcp(const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
                 const std::shared_ptr<const http::Router> &router,
                 const std::vector<dataplane::Address> &quic_listen);

  Options opts_;
  std::shared_ptr<http::TcpTlsContext> tcp_tls_;
  std::vector<int> reservations_; // kernel sockets holding AF_XDP-served ports
  std::unique_ptr<dataplane::XdpProgram> program_; // outlives the workers
  std::vector<std::unique_ptr<Worker>> workers_;
  dataplane::UdpSocketPort *steering_port_ = nullptr;
};

// Blocks the signals the server handles in the calling thread (and in every
// thread it creates afterwards); call first thing in main.
void block_server_signals();

} // namespace xdpq::control
