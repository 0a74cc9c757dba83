#include "control/admin.h"

#include "base/clock.h"
#include "base/log.h"
#include "dataplane/accept_backoff.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace xdpq::control {

struct AdminServer::Listener final : public dataplane::FdHandler {
  AdminServer *srv = nullptr;
  int fd = -1;
  bool http = false;
  bool listening = true;
  std::unique_ptr<dataplane::AcceptBackoff> backoff;
  void on_io(uint32_t) override { srv->accept_all(*this); }
};

class AdminServer::Client final : public dataplane::FdHandler {
public:
  Client(AdminServer &srv, int fd, bool http) : srv_(srv), fd_(fd), http_(http), timer_(fired, this) {
    srv_.loop().watch(fd_, this);
    // From the clock, not the loop's time of this batch of events: a slow
    // handler earlier in the batch (a reload) must not leave a new client
    // a deadline already past.
    srv_.loop().timers().schedule(timer_, monotonic_ns() + DEADLINE_NS);
  }
  ~Client() {
    srv_.loop().timers().cancel(timer_);
    close(fd_);
  }
  Client(const Client &) = delete;
  Client &operator=(const Client &) = delete;

  // Answers the request, once complete, with this error instead (a
  // refusal decided at accept; reading the request first means the client
  // is not cut off in the middle of sending it).
  void refuse(std::string text) { refusal_ = std::move(text); }
  bool http() const { return http_; }

  void reply_and_close(std::string text) {
    out_ = std::move(text);
    replying_ = true;
    // The answer may have taken long to make (a reload, a large table): the
    // client gets the whole deadline to read it.
    srv_.loop().timers().schedule(timer_, monotonic_ns() + DEADLINE_NS);
    write_out();
    off_at_deadline_ = off_; // what the client takes from here is progress
  }

  void on_io(uint32_t events) override {
    if (done_) return;
    if (!replying_) read_in(events);
    if (!done_ && replying_) write_out();
  }

private:
  static void fired(dataplane::Timer &t) {
    auto *c = static_cast<Client *>(t.owner());
    if (!c->http_ && c->replying_ && c->off_ < c->out_.size()) {
      // Timers run after the batch of events: this thread may have been
      // busy (a reload, a slow worker's snapshot) while the client read.
      // A control client's answer is not cut while it keeps taking it
      // (xdpqctl could not tell a cut answer from a whole one); the
      // control socket is its owner's alone, and has 16 places. A metrics
      // client (whoever can reach the port) keeps the plain deadline.
      c->write_out();
      if (c->done_) return;
      if (c->off_ > c->off_at_deadline_) {
        c->off_at_deadline_ = c->off_;
        c->srv_.loop().timers().schedule(t, monotonic_ns() + DEADLINE_NS);
        return;
      }
    }
    c->srv_.mutable_stats().timeouts += 1;
    c->finish();
  }

  void read_in(uint32_t events) {
    char buf[1024];
    size_t cap = http_ ? MAX_HTTP_REQUEST : MAX_CONTROL_REQUEST;
    for (;;) {
      ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        in_.append(buf, static_cast<size_t>(n));
        if (complete()) return answer();
        if (in_.size() > cap) {
          srv_.mutable_stats().bad_requests += 1;
          return reply_and_close(http_ ? "HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                         "connection: close\r\ncontent-length: 0\r\n\r\n"
                                       : "error: request too long\n");
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      // EOF or error before a complete request.
      if (!http_ && n == 0 && !in_.empty()) {
        srv_.mutable_stats().bad_requests += 1;
        return reply_and_close("error: expected one line: FORMAT<TAB>COMMAND[<TAB>ARG...]\n");
      }
      return finish();
    }
    if (events & (EPOLLHUP | EPOLLERR)) finish();
  }

  bool complete() const {
    return http_ ? in_.find("\r\n\r\n") != std::string::npos || in_.find("\n\n") != std::string::npos
                 : in_.find('\n') != std::string::npos;
  }

  void answer() {
    if (!refusal_.empty()) return reply_and_close(std::move(refusal_));
    if (http_) {
      std::string_view req = in_;
      std::string body, status = "200 OK";
      std::string_view path;
      if (req.starts_with("GET ")) {
        auto sp = req.find(' ', 4);
        if (sp != std::string_view::npos) path = req.substr(4, sp - 4);
      }
      if (path.empty() || !srv_.handler().metrics_page(path, body)) {
        status = "404 Not Found";
        body = "try /metrics\n";
      }
      return reply_and_close("HTTP/1.1 " + status +
                             "\r\ncontent-type: text/plain; version=0.0.4\r\nconnection: close\r\n"
                             "content-length: " +
                             std::to_string(body.size()) + "\r\n\r\n" + body);
    }
    std::string line = in_.substr(0, in_.find('\n'));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    reply_and_close(srv_.handler().control_request(line));
  }

  void write_out() {
    while (off_ < out_.size()) {
      ssize_t n = send(fd_, out_.data() + off_, out_.size() - off_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        srv_.loop().set_interest(fd_, this, false, true);
        return; // the rest when the client reads, or the deadline
      }
      return finish();
    }
    shutdown(fd_, SHUT_WR);
    finish();
  }

  void finish() {
    if (done_) return;
    done_ = true;
    srv_.loop().timers().cancel(timer_);
    srv_.loop().unwatch(fd_);
    srv_.finished(this);
  }

  AdminServer &srv_;
  int fd_;
  bool http_;
  dataplane::Timer timer_;
  std::string in_;
  std::string out_;
  std::string refusal_;
  size_t off_ = 0;
  size_t off_at_deadline_ = 0; // off_ when the last deadline passed
  bool replying_ = false;
  bool done_ = false;
};

AdminServer::AdminServer(dataplane::EventLoop &loop, AdminHandler &handler, int control_fd,
                         int metrics_fd)
    : loop_(loop), handler_(handler) {
  for (auto [fd, http] : {std::pair{control_fd, false}, std::pair{metrics_fd, true}}) {
    if (fd < 0) continue;
    auto l = std::make_unique<Listener>();
    l->srv = this;
    l->fd = fd;
    l->http = http;
    loop_.watch(fd, l.get());
    l->backoff = std::make_unique<dataplane::AcceptBackoff>(loop_, fd, l.get());
    listeners_.push_back(std::move(l));
  }
}

AdminServer::~AdminServer() {
  clients_.clear();
  dead_.clear();
  stop_listening();
}

void AdminServer::stop_listening(Which which) {
  // The listeners stay allocated until we are destroyed: this may run from
  // a callback of the same event batch in which a listener is still due.
  for (auto &l : listeners_) {
    if (!l->listening || (which == Which::control && l->http) ||
        (which == Which::metrics && !l->http)) {
      continue;
    }
    l->listening = false;
    l->backoff->stop();
    loop_.unwatch(l->fd);
  }
}

bool AdminServer::control_listening() const {
  for (const auto &l : listeners_) {
    if (!l->http) return l->listening;
  }
  return false;
}

void AdminServer::replace_control_fd(int fd) {
  for (auto &l : listeners_) {
    if (l->http || l->listening) continue;
    l->fd = fd;
    l->backoff = std::make_unique<dataplane::AcceptBackoff>(loop_, fd, l.get());
  }
}

void AdminServer::resume_listening() {
  for (auto &l : listeners_) {
    if (l->listening) continue;
    l->listening = true;
    l->backoff->restart(); // watches it
  }
}

void AdminServer::accept_all(Listener &l) {
  if (!l.listening) return; // an event of the batch that handed it over
  for (int i = 0; i < 64; ++i) {
    int fd = accept4(l.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (l.backoff->on_error(errno)) stats_.accept_paused += 1;
      return;
    }
    l.backoff->on_success();
    const size_t same_kind = l.http ? http_clients_ : clients_.size() - http_clients_;
    if (same_kind >= (l.http ? MAX_METRICS_CLIENTS : MAX_CONTROL_CLIENTS)) {
      stats_.refused_busy += 1;
      // A scraper speaks HTTP: it gets an HTTP answer it can report.
      static constexpr std::string_view BUSY = "error: too many admin clients, try again\n";
      static constexpr std::string_view HTTP_BUSY =
          "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
          "connection: close\r\nretry-after: 1\r\ncontent-length: 36\r\n\r\n"
          "too many metrics clients, try again\n";
      const std::string_view busy = l.http ? HTTP_BUSY : BUSY;
      [[maybe_unused]] auto n = send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      continue;
    }
    // No memory for this client, or epoll refuses its socket: it alone is
    // refused.
    Client *c = nullptr;
    bool built = false;
    try {
      auto owned = std::make_unique<Client>(*this, fd, l.http);
      built = true; // from here on, destroying it closes fd
      c = owned.get();
      clients_.emplace(c, std::move(owned));
    } catch (const std::exception &e) {
      if (!built) close(fd);
      stats_.refused_no_resources += 1;
      // The control socket's clients are few and local: worth a line each.
      if (l.http) LOG_DEBUG("metrics port: client refused: %s", e.what());
      else LOG_WARN("control socket: client refused: %s", e.what());
      continue;
    }
    stats_.clients += 1;
    http_clients_ += l.http;
    if (!l.http) {
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
          (cred.uid != geteuid() && cred.uid != 0)) {
        stats_.refused_uid += 1;
        LOG_WARN("control socket: refused uid %u", cred.uid);
        c->refuse("error: permission denied (only the owner may use this socket)\n");
      }
    }
  }
}

void AdminServer::finished(Client *c) {
  auto it = clients_.find(c);
  if (it == clients_.end())
    return;
  http_clients_ -= c->http();
  dead_.push_back(std::move(it->second)); // freed at the end of the pass
  clients_.erase(it);
}

void AdminServer::end_of_pass() {
  dead_.clear();
}

} // namespace xdpq::control
