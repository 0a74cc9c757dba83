#include "http/upstream_health.h"

#include "base/log.h"
#include "dataplane/accept_backoff.h"
#include "http/proxy.h"

#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace xdpq::http {

int start_connect(const UpstreamAddress &a, bool &connected) {
  const bool unix_socket = !a.unix_path.empty();
  int fd = ::socket(unix_socket ? AF_UNIX : a.inet.family(),
                    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int rv;
  if (unix_socket) {
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    std::memcpy(sun.sun_path, a.unix_path.data(), a.unix_path.size());
    rv = ::connect(fd, reinterpret_cast<sockaddr *>(&sun), sizeof(sun));
  } else {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    rv = ::connect(fd, &a.inet.u.sa, a.inet.len);
  }
  if (rv != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  connected = rv == 0;
  return fd;
}

bool local_connect_error(int err) {
  // What stops an accept() here stops a socket() too; a connect() may find
  // no local port left, and epoll may refuse the socket (ENOSPC: past
  // fs.epoll.max_user_watches).
  return dataplane::AcceptBackoff::is_resource_error(err) || err == EADDRNOTAVAIL ||
         err == ENOSPC;
}

HealthProbe::HealthProbe(dataplane::EventLoop &loop, const UpstreamAddress &addr,
                         std::string_view path, uint64_t interval_ns, uint64_t timeout_ns,
                         UpstreamStats &stats, HealthListener &listener)
    : loop_(loop), addr_(addr), interval_ns_(interval_ns), timeout_ns_(timeout_ns),
      stats_(stats), listener_(listener), timer_(timer_fired, this),
      parser_(UpstreamResponseLimits{MAX_HEAD, 100}) {
  request_.append("GET ").append(path).append(" HTTP/1.1\r\nhost: ").append(addr.host_header);
  request_.append("\r\nuser-agent: xdpq-health-check\r\nconnection: close\r\n\r\n");
  loop_.timers().schedule(timer_, loop_.now());
}

HealthProbe::~HealthProbe() { stop(); }

void HealthProbe::stop() {
  loop_.timers().cancel(timer_);
  if (fd_ >= 0) {
    if (state_ != State::waiting) loop_.unwatch(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  state_ = State::waiting;
}

void HealthProbe::timer_fired(dataplane::Timer &t) {
  auto *p = static_cast<HealthProbe *>(t.owner());
  if (p->state_ == State::waiting) return p->start();
  p->stats_.probe_timeouts += 1;
  p->finish(false, "no response head within the health check timeout");
}

void HealthProbe::start() {
  started_ = loop_.now();
  sent_ = read_ = 0;
  status_ = 0;
  parser_.reset(this, false);
  bool connected = false;
  fd_ = start_connect(addr_, connected);
  if (fd_ >= 0 && !loop_.try_watch(fd_, this, true)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    errno = err;
  }
  if (fd_ < 0 && local_connect_error(errno)) {
    // Our shortage says nothing of the upstream: no probe, no verdict this
    // time; the next at the next interval.
    loop_.timers().schedule(timer_, started_ + interval_ns_);
    return;
  }
  stats_.probes += 1;
  if (fd_ < 0) return finish(false, "connect failed");
  loop_.timers().schedule(timer_, started_ + timeout_ns_);
  state_ = State::connecting;
  if (connected) {
    state_ = State::sending;
    send_request();
  }
}

void HealthProbe::on_io(uint32_t events) {
  switch (state_) {
  case State::waiting: return; // an event from before the last probe ended
  case State::connecting: {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) return finish(false, "connect failed");
    if (!(events & EPOLLOUT)) return;
    state_ = State::sending;
    return send_request();
  }
  case State::sending:
    if (events & EPOLLOUT) send_request();
    if (state_ == State::reading && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_response();
    return;
  case State::reading: return read_response();
  }
}

void HealthProbe::send_request() {
  while (sent_ < request_.size()) {
    ssize_t w = ::send(fd_, request_.data() + sent_, request_.size() - sent_, MSG_NOSIGNAL);
    if (w >= 0) {
      sent_ += static_cast<size_t>(w);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return loop_.set_interest(fd_, this, true, true);
    // Closed on us: whatever it answered first is still readable.
    break;
  }
  state_ = State::reading;
  loop_.set_interest(fd_, this, true, false);
}

void HealthProbe::read_response() {
  uint8_t buf[2048];
  for (;;) {
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      read_ += static_cast<size_t>(n);
      const bool ok =
          parser_.feed(buf, static_cast<size_t>(n)) == UpstreamResponseParser::Result::ok;
      // The verdict is in the head: the body, if any, is never read.
      if (status_ != 0) return finish(status_ >= 200 && status_ < 400, "status not 2xx or 3xx");
      if (!ok) return finish(false, "malformed or oversized response head");
      // Endless interim responses pass the per-head limit; this stops them.
      if (read_ >= MAX_READ) return finish(false, "no final response head in 16 KiB");
      continue;
    }
    if (n == 0) return finish(false, "closed before a response head");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == EINTR) continue;
    return finish(false, "connection reset");
  }
}

void HealthProbe::on_head(const UpstreamResponseParser &p) { status_ = p.status(); }

void HealthProbe::finish(bool passed, const char *why) {
  if (fd_ >= 0) {
    if (state_ != State::waiting) loop_.unwatch(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  state_ = State::waiting;
  if (!passed) stats_.probe_failures += 1;
  // One failed probe is a blip (a full backlog, a lost SYN): only FALL in
  // a row take the upstream out; one that passes brings it back.
  failed_in_a_row_ = passed ? 0 : failed_in_a_row_ + 1;
  const bool failing = !passed && (failing_ || failed_in_a_row_ >= FALL);
  if (failing != failing_) {
    // A change of state: worth a line in the log (a steady state is not).
    if (passed) {
      LOG_INFO("upstream %s passes its health check again", addr_.text.c_str());
    } else if (status_ != 0) {
      LOG_WARN("upstream %s failed its health check: status %d", addr_.text.c_str(), status_);
    } else {
      LOG_WARN("upstream %s failed its health check: %s", addr_.text.c_str(), why);
    }
  }
  failing_ = failing;
  // Every interval from the last start; at once if the probe took longer.
  const uint64_t next = started_ + interval_ns_;
  loop_.timers().schedule(timer_, next > loop_.now() ? next : loop_.now());
  listener_.probe_done(passed);
}

} // namespace xdpq::http
