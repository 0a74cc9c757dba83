#pragma once
// The admin endpoints (the control socket for xdpqctl and the Prometheus
// metrics listener), served from the control thread's event loop with
// non-blocking sockets: each client has one deadline for its whole
// exchange, the number of clients is capped, and a request is answered
// only once it is complete, so no client can hold the loop that also
// handles signals and the watchdog.

#include "base/counters.h"
#include "dataplane/event_loop.h"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace xdpq::control {

class AdminHandler {
public:
  // One control request line (without its newline): the reply document.
  virtual std::string control_request(const std::string &line) = 0;
  // The metrics page for an HTTP request path ("/metrics"); false for 404.
  virtual bool metrics_page(std::string_view path, std::string &body) = 0;

protected:
  ~AdminHandler() = default;
};

#define XDPQ_ADMIN_COUNTERS(X)                                                                  \
  X(clients, "control-socket and metrics-port clients accepted")                                \
  X(refused_busy, "control-socket and metrics-port clients refused: over the client cap")       \
  X(refused_uid, "control-socket clients refused: another user")                                \
  X(refused_no_resources, "control-socket and metrics-port clients refused: no memory or epoll space") \
  X(timeouts, "control-socket and metrics-port clients cut off at their 2 s deadline")          \
  X(bad_requests, "control-socket and metrics-port requests too long or malformed")             \
  X(accept_paused, "control-socket and metrics-port accept() paused: out of descriptors")

struct AdminStats {
  XDPQ_COUNTER_FIELDS(XDPQ_ADMIN_COUNTERS)
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_ADMIN_COUNTERS) }
};

class AdminServer {
public:
  // Each listener has its own cap: clients of the metrics port (whoever
  // can reach it) never take the control socket's places.
  static constexpr size_t MAX_CONTROL_CLIENTS = 16;
  static constexpr size_t MAX_METRICS_CLIENTS = 32;
  static constexpr uint64_t DEADLINE_NS = 2'000'000'000;
  static constexpr size_t MAX_CONTROL_REQUEST = 4096;
  static constexpr size_t MAX_HTTP_REQUEST = 8192;

  // control_fd and metrics_fd are listening, non-blocking sockets (-1: none);
  // the caller keeps owning them.
  AdminServer(dataplane::EventLoop &loop, AdminHandler &handler, int control_fd, int metrics_fd);
  ~AdminServer();
  AdminServer(const AdminServer &) = delete;
  AdminServer &operator=(const AdminServer &) = delete;

  // Frees clients finished during this iteration (call at its end).
  void end_of_pass();
  // Stops accepting (binary upgrade: the new process owns the listening
  // sockets now), on both listeners or on the one the new process took
  // (a changed control socket path or metrics address is bound afresh, and
  // the old one stays ours); clients being served finish.
  enum class Which { both, control, metrics };
  void stop_listening(Which which = Which::both);
  void resume_listening();
  // Whether the control listener accepts (not while a new process of a
  // binary upgrade holds it).
  bool control_listening() const;
  // The control socket bound afresh (the path of the one in use was
  // removed); call while not listening. The old descriptor is the caller's.
  void replace_control_fd(int fd);
  size_t client_count() const { return clients_.size(); }
  const AdminStats &stats() const { return stats_; }

  class Client;
  // Used by clients.
  void finished(Client *c);
  AdminHandler &handler() { return handler_; }
  dataplane::EventLoop &loop() { return loop_; }
  AdminStats &mutable_stats() { return stats_; }

private:
  struct Listener;
  void accept_all(Listener &l);

  dataplane::EventLoop &loop_;
  AdminHandler &handler_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::unordered_map<Client *, std::unique_ptr<Client>> clients_;
  size_t http_clients_ = 0; // of clients_, those of the metrics listener
  std::vector<std::unique_ptr<Client>> dead_;
  AdminStats stats_;
};

} // namespace xdpq::control
