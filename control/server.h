#pragma once
// The daemon's runtime: certificate and secrets, one worker thread per CPU
// (each with its own sockets, TLS context, QUIC endpoint and timer wheel),
// signal handling and shutdown.

#include "control/options.h"

#include <memory>
#include <vector>

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

  Options opts_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// Blocks the signals the server handles in the calling thread (and in every
// thread it creates afterwards); call first thing in main.
void block_server_signals();

} // namespace xdpq::control
