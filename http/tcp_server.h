#pragma once
// The TCP side of one worker: SO_REUSEPORT listeners (TLS, and optionally
// cleartext h2c/HTTP/1.1 for benchmarks), non-blocking connections in the
// worker's event loop with TLS on OpenSSL, HTTP/2 or HTTP/1.1 chosen by
// ALPN, timeouts on the worker's timer wheel, and bounded output.

#include "dataplane/address.h"
#include "dataplane/event_loop.h"
#include "dataplane/source_limiter.h"
#include "http/tcp_session.h"
#include "http/tcp_tls.h"

#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace xdpq::http {

struct TcpConfig {
  std::vector<dataplane::Address> tls_listen;
  std::vector<dataplane::Address> cleartext_listen; // off unless given
  bool check_in_use = true;            // worker 0 refuses a taken port
  size_t max_connections = 10000;      // per worker
  size_t max_output = 256 * 1024;      // bytes buffered per connection
  uint64_t handshake_timeout = 10'000'000'000ull;
  uint64_t header_timeout = 10'000'000'000ull; // a request's headers
  uint64_t idle_timeout = 60'000'000'000ull;
  uint64_t write_timeout = 30'000'000'000ull;  // output pending, no progress
  dataplane::SourceLimits per_source{256, 200, 400};
  // Listening sockets a previous process of ours bound (binary upgrade),
  // taken over instead of binding new ones (all for configured addresses;
  // more than one per address are all accepted from).
  std::vector<std::pair<dataplane::Address, int>> inherited_tls;
  std::vector<std::pair<dataplane::Address, int>> inherited_clear;
};

class TcpError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class TcpConnection;

// One live TCP connection, for `xdpqctl conns`.
struct TcpConnInfo {
  std::string peer;
  std::string proto; // "h2", "http/1.1", "tls-handshake"
  uint64_t age_ms = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  size_t out_buffer = 0; // bytes the output buffer holds allocated
  bool busy = false;
};

class TcpServer final {
public:
  // Binds the listeners (throws TcpError naming the address and reason).
  TcpServer(const TcpConfig &cfg, const SessionEnv &env, std::shared_ptr<TcpTlsContext> tls,
            dataplane::EventLoop &loop);
  ~TcpServer();
  TcpServer(const TcpServer &) = delete;
  TcpServer &operator=(const TcpServer &) = delete;

  // Frees connections closed during this iteration (call at its end).
  void end_of_pass();
  // Stops accepting; asks every session to finish (GOAWAY / close).
  void shutdown();
  // Closes the listening sockets (a drain that hands them to nobody): new
  // clients are refused at once instead of waiting in the backlog for the
  // drain's end. Never after stop_accepting() for an upgrade.
  void close_listeners();
  // Stops accepting; the connections go on (a binary upgrade: the new
  // process accepts from the same listeners).
  void stop_accepting();
  // After stop_accepting() for an upgrade: closes the listeners the new
  // process did not take (its configuration dropped their addresses), so
  // that their clients are refused instead of waiting in a backlog nobody
  // accepts from.
  void close_listeners_except(const std::vector<int> &kept);
  // Accepts again after stop_accepting() (the new process died); the
  // listeners close_listeners_except() closed are bound again.
  void resume_accepting();
  size_t connection_count() const { return conns_.size(); }
  // Connections with requests in flight (drain waits for them).
  size_t busy_connections() const;
  void list_connections(std::vector<TcpConnInfo> &out) const;
  const TcpStats &stats() const { return stats_; }
  std::vector<dataplane::Address> bound_addresses() const;
  struct ListenerInfo {
    int fd;
    dataplane::Address bound;
    bool tls;
  };
  std::vector<ListenerInfo> listeners() const; // the open ones

  // Used by connections.
  void closed(TcpConnection *c, uint32_t source_slot);
  // c->resume() at the end of this pass (before closed connections are freed).
  void wake_later(TcpConnection *c) { woken_.push_back(c); }
  const TcpConfig &config() const { return cfg_; }
  SessionEnv &env() { return env_; }
  TcpStats &mutable_stats() { return stats_; }
  dataplane::EventLoop &loop() { return loop_; }
  TcpTlsContext &tls() { return *tls_; }
  std::vector<uint8_t> &scratch() { return scratch_; }

private:
  struct Listener;
  void accept_all(Listener &l);

  TcpConfig cfg_;
  SessionEnv env_;
  std::shared_ptr<TcpTlsContext> tls_;
  dataplane::EventLoop &loop_;
  TcpStats stats_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::unordered_map<TcpConnection *, std::unique_ptr<TcpConnection>> conns_;
  std::vector<std::unique_ptr<TcpConnection>> dead_; // finished this pass
  std::vector<TcpConnection *> woken_;               // to resume at the end of this pass
  std::vector<uint8_t> scratch_; // read buffer shared by this worker's connections
  dataplane::SourceLimiter sources_;
  bool shutting_down_ = false;
};

} // namespace xdpq::http
