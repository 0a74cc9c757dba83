#pragma once
// Active health checks of one upstream in one worker: every interval, a
// connection of its own (never a pooled one) carries
// `GET PATH HTTP/1.1` with `connection: close`; a 2xx or 3xx head within
// the timeout passes, anything else (another status, a refused or failed
// connect, a close or malformed head, the timeout) fails. One probe is in
// flight at a time, and what a probe reads is bounded: it stops at the
// final response head (at most 8 KiB, at most 16 KiB read in all,
// interim responses included) and closes; the rest of the response is
// never read, and an upstream that trickles is cut off by the timeout.

#include "dataplane/event_loop.h"
#include "http/proxy_config.h"
#include "http/upstream_response.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace xdpq::http {

struct UpstreamStats;

// Starts a non-blocking connect to a (TCP with TCP_NODELAY, or a unix
// socket), for requests and probes alike. Returns the socket, or -1 when
// the connect failed at once (a unix socket's full backlog too: EAGAIN is
// a failure there, as nginx counts it, not a connect in progress);
// connected is set when it completed at once.
int start_connect(const UpstreamAddress &a, bool &connected);
// Whether a failed start_connect()'s errno is this host's shortage
// (descriptors, memory, buffers, local ports, epoll space), not the
// upstream's doing.
bool local_connect_error(int err);

// Told after every probe, from the worker's loop.
class HealthListener {
public:
  virtual void probe_done(bool passed) = 0;

protected:
  ~HealthListener() = default;
};

class HealthProbe final : public dataplane::FdHandler, private UpstreamResponseParser::Handler {
public:
  static constexpr size_t MAX_HEAD = 8 * 1024;
  static constexpr size_t MAX_READ = 16 * 1024;

  // Probes addr for path every interval_ns, each probe cut off after
  // timeout_ns; the first one starts at the loop's next pass. Counts into
  // stats (probes, probe_failures, probe_timeouts).
  HealthProbe(dataplane::EventLoop &loop, const UpstreamAddress &addr, std::string_view path,
              uint64_t interval_ns, uint64_t timeout_ns, UpstreamStats &stats,
              HealthListener &listener);
  ~HealthProbe();
  HealthProbe(const HealthProbe &) = delete;
  HealthProbe &operator=(const HealthProbe &) = delete;

  // The last FALL probes failed (false before they end), or the last one
  // after the upstream was already failing.
  bool failing() const { return failing_; }
  static constexpr unsigned FALL = 2;
  // Counts as failing until a probe passes (a reload's new probe of an
  // upstream that was failing).
  void assume_failing() { failing_ = true; }
  // No more probes (its upstream was replaced); the verdict stays.
  void stop();
  bool in_flight() const { return state_ != State::waiting; }

  void on_io(uint32_t events) override;

private:
  enum class State { waiting, connecting, sending, reading };

  static void timer_fired(dataplane::Timer &t);
  void start();
  void send_request();
  void read_response();
  void finish(bool passed, const char *why);

  void on_head(const UpstreamResponseParser &p) override;
  void on_body(const uint8_t *, size_t) override {}
  void on_complete() override {}

  dataplane::EventLoop &loop_;
  const UpstreamAddress &addr_;
  std::string request_;
  uint64_t interval_ns_;
  uint64_t timeout_ns_;
  UpstreamStats &stats_;
  HealthListener &listener_;
  dataplane::Timer timer_;
  UpstreamResponseParser parser_;
  State state_ = State::waiting;
  int fd_ = -1;
  uint64_t started_ = 0;
  size_t sent_ = 0;
  size_t read_ = 0;
  int status_ = 0; // the final head's, once parsed
  bool failing_ = false;
  unsigned failed_in_a_row_ = 0;
};

} // namespace xdpq::http
