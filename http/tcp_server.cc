#include "http/tcp_server.h"

#include "base/log.h"
#include "dataplane/accept_backoff.h"
#include "http/tcp_connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace xdpq::http {

namespace {
constexpr size_t READ_CHUNK = 16 * 1024; // the connections' shared read buffer

// A listening socket on a, in the port's SO_REUSEPORT group. check_in_use:
// refuse a port someone else listens on before joining a group.
int open_listener(const dataplane::Address &a, bool check_in_use) {
  int fd = socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw TcpError("tcp listen " + a.to_string() + ": " + strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (a.family() == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (check_in_use && a.port() != 0) {
    int probe = socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a.family() == AF_INET6) setsockopt(probe, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bool taken = bind(probe, &a.u.sa, a.len) != 0 && errno == EADDRINUSE;
    close(probe);
    if (taken) {
      close(fd);
      throw TcpError("tcp listen " + a.to_string() + ": bind: port in use");
    }
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  if (bind(fd, &a.u.sa, a.len) != 0 || listen(fd, 1024) != 0) {
    std::string e = strerror(errno);
    close(fd);
    throw TcpError("tcp listen " + a.to_string() + ": " + e);
  }
  return fd;
}
} // namespace

struct TcpServer::Listener final : public dataplane::FdHandler {
  TcpServer *srv = nullptr;
  int fd = -1;
  bool tls = true;
  dataplane::Address bound;
  bool dropped = false; // closed at a hand-over that kept it from the new process
  std::unique_ptr<dataplane::AcceptBackoff> backoff;
  void on_io(uint32_t) override { srv->accept_all(*this); }
};

TcpServer::TcpServer(const TcpConfig &cfg, const SessionEnv &env,
                     std::shared_ptr<TcpTlsContext> tls, dataplane::EventLoop &loop)
    : cfg_(cfg), env_(env), tls_(std::move(tls)), loop_(loop), sources_(cfg.per_source) {
  env_.stats = &stats_;
  scratch_.reserve(READ_CHUNK);
  auto inherited_tls = cfg_.inherited_tls, inherited_clear = cfg_.inherited_clear;
  auto adopt = [this](const dataplane::Address &a, int fd, bool tls_port) {
    auto l = std::make_unique<Listener>();
    l->srv = this;
    l->fd = fd;
    l->tls = tls_port;
    l->bound = a;
    loop_.watch(fd, l.get());
    l->backoff = std::make_unique<dataplane::AcceptBackoff>(loop_, fd, l.get());
    listeners_.push_back(std::move(l));
  };
  auto listen_on = [&](const dataplane::Address &a, bool tls_port) {
    auto &inherited = tls_port ? inherited_tls : inherited_clear;
    for (auto it = inherited.begin(); it != inherited.end(); ++it) {
      if (it->first == a) {
        adopt(a, it->second, tls_port);
        inherited.erase(it);
        return;
      }
    }
    const int fd = open_listener(a, cfg_.check_in_use);
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl);
    adopt(dataplane::Address::from(reinterpret_cast<sockaddr *>(&ss), sl), fd, tls_port);
  };
  try {
    for (const auto &a : cfg_.tls_listen) listen_on(a, true);
    for (const auto &a : cfg_.cleartext_listen) listen_on(a, false);
    // The rest (the previous process had more workers than this one):
    // their queued connections are served, not reset.
    for (const auto &[a, fd] : inherited_tls) adopt(a, fd, true);
    for (const auto &[a, fd] : inherited_clear) adopt(a, fd, false);
  } catch (...) {
    for (auto &l : listeners_) {
      loop_.unwatch(l->fd);
      close(l->fd);
    }
    throw;
  }
}

TcpServer::~TcpServer() {
  conns_.clear();
  dead_.clear();
  close_listeners();
}

void TcpServer::close_listeners() {
  for (auto &l : listeners_) {
    if (l->fd < 0) continue;
    l->backoff->stop();
    loop_.unwatch(l->fd);
    close(l->fd);
    l->fd = -1;
  }
}

std::vector<TcpServer::ListenerInfo> TcpServer::listeners() const {
  std::vector<ListenerInfo> v;
  for (const auto &l : listeners_) {
    if (l->fd >= 0) v.push_back(ListenerInfo{l->fd, l->bound, l->tls}); // open ones
  }
  return v;
}

std::vector<dataplane::Address> TcpServer::bound_addresses() const {
  std::vector<dataplane::Address> v;
  for (const auto &l : listeners_) v.push_back(l->bound);
  return v;
}

void TcpServer::accept_all(Listener &l) {
  for (int i = 0; i < 64 && !shutting_down_; ++i) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    int fd = accept4(l.fd, reinterpret_cast<sockaddr *>(&ss), &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (l.backoff->on_error(errno)) {
        stats_.accept_paused += 1;
        LOG_DEBUG("tcp accept: %s; pausing the listener", strerror(errno));
      }
      return;
    }
    l.backoff->on_success();
    if (conns_.size() >= cfg_.max_connections) {
      stats_.refused_conn_limit += 1;
      close(fd);
      continue;
    }
    uint32_t slot = dataplane::SourceLimiter::NONE;
    auto peer = dataplane::Address::from(reinterpret_cast<sockaddr *>(&ss), sl);
    // The TCP handshake has proven the address: the validated rate holds.
    switch (sources_.admit(peer, loop_.now(), &slot, dataplane::SourceLimiter::Proof::validated)) {
    case dataplane::SourceLimiter::Verdict::ok: break;
    case dataplane::SourceLimiter::Verdict::too_many_connections:
      stats_.refused_source_limit += 1;
      close(fd);
      continue;
    case dataplane::SourceLimiter::Verdict::too_fast:
      stats_.refused_source_rate += 1;
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // No memory for this client, or epoll refuses its socket: it alone is
    // refused; the worker and its other clients go on.
    bool built = false;
    try {
      auto c = make_tcp_connection(*this, fd, l.tls, slot, peer);
      built = true; // from here on, destroying it closes fd
      TcpConnection *raw = c.get();
      conns_.emplace(raw, std::move(c));
    } catch (const std::exception &e) {
      if (!built) close(fd);
      sources_.release(slot);
      stats_.refused_no_resources += 1;
      LOG_DEBUG("tcp accept: %s; connection refused", e.what());
      continue;
    }
    stats_.accepted += 1;
  }
}

void TcpServer::closed(TcpConnection *c, uint32_t source_slot) {
  auto it = conns_.find(c);
  if (it == conns_.end())
    return;
  sources_.release(source_slot);
  stats_.closed += 1;
  // A connection woken and then closed in the same round of end_of_pass()
  // would outlive its memory in woken_ (freed below, resumed next pass).
  std::erase(woken_, c);
  // Freed at the end of the pass: an event for it may still be pending.
  dead_.push_back(std::move(it->second));
  conns_.erase(it);
}

void TcpServer::end_of_pass() {
  // Resuming may wake others (rarely): a bounded number of rounds.
  std::vector<TcpConnection *> now;
  for (int round = 0; round < 4 && !woken_.empty(); ++round) {
    now.swap(woken_);
    for (auto *c : now) c->resume();
    now.clear();
  }
  dead_.clear();
}

size_t TcpServer::busy_connections() const {
  size_t n = 0;
  for (const auto &[c, owner] : conns_)
    n += c->busy();
  return n;
}

void TcpServer::list_connections(std::vector<TcpConnInfo> &out) const {
  for (const auto &[c, owner] : conns_)
    out.push_back(c->info());
}

void TcpServer::stop_accepting() {
  if (shutting_down_) return;
  shutting_down_ = true;
  for (auto &l : listeners_) {
    l->backoff->stop();
    loop_.unwatch(l->fd);
  }
}

void TcpServer::close_listeners_except(const std::vector<int> &kept) {
  for (auto &l : listeners_) {
    if (l->fd < 0 || std::find(kept.begin(), kept.end(), l->fd) != kept.end()) continue;
    l->backoff->stop();
    loop_.unwatch(l->fd);
    close(l->fd);
    l->fd = -1;
    l->dropped = true;
  }
}

void TcpServer::resume_accepting() {
  if (!shutting_down_) return;
  shutting_down_ = false;
  for (auto &l : listeners_) {
    if (l->dropped) {
      // The new process's configuration dropped it, and that process is
      // gone: ours still lists it, so it is bound again (if that fails, at
      // the next take-back again; meanwhile no upgrade hands it on).
      try {
        l->fd = open_listener(l->bound, false);
      } catch (const TcpError &e) {
        LOG_WARN("%s (taken back from a new process that had dropped it)", e.what());
        continue;
      }
      l->dropped = false;
      l->backoff = std::make_unique<dataplane::AcceptBackoff>(loop_, l->fd, l.get());
      l->backoff->restart(); // watches it, or backs off if epoll refuses
      continue;
    }
    if (l->fd < 0) continue;
    l->backoff->restart(); // watches it
  }
}

void TcpServer::shutdown() {
  stop_accepting();
  std::vector<TcpConnection *> all;
  for (const auto &[c, owner] : conns_)
    all.push_back(c);
  for (auto *c : all)
    c->shutdown(); // (a connection may finish, and move to dead_, here)
}

} // namespace xdpq::http
