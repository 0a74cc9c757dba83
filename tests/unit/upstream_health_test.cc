// Active health checks against fake upstreams on loopback: a failing
// status holds an upstream out of balancing until a probe passes, a
// silent or trickling upstream is cut off by the probe timeout, and what a
// hostile upstream sends to a probe is read only up to the head.

#include "http/proxy.h"
#include "http/upstream_health.h"
#include "epoll_refusal.h"
#include "loop_steps.h"

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace xdpq::http;
using xdpq::dataplane::EventLoop;
using xdpq::testing::Steps;

namespace {

// A listening socket on 127.0.0.1 with a thread that answers one
// connection at a time as mode says. Connections queue in the backlog
// while one is served.
class FakeUpstream {
public:
  enum class Mode { status, silent, trickle, endless_interim, endless_body };

  explicit FakeUpstream(Mode m, int status = 200) : mode_(m), status_(status) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (m != Mode::silent) thread_ = std::thread([this] { serve(); });
  }
  ~FakeUpstream() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set_status(int s) { status_ = s; }
  // The most bytes written on one connection before the prober closed it.
  uint64_t most_written() const { return most_written_; }

private:
  bool wait(int fd, short events, int ms) {
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, ms) > 0;
  }

  // Writes all of data unless the peer goes away or stop_; false then.
  bool write_all(int c, std::string_view data, uint64_t &written) {
    while (!data.empty()) {
      if (stop_ || !wait(c, POLLOUT, 50)) {
        if (stop_) return false;
        continue;
      }
      ssize_t w = ::send(c, data.data(), data.size(), MSG_NOSIGNAL);
      if (w <= 0) return false;
      written += static_cast<uint64_t>(w);
      data.remove_prefix(static_cast<size_t>(w));
    }
    return true;
  }

  void serve() {
    while (!stop_) {
      if (!wait(fd_, POLLIN, 50)) continue;
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string req;
      char buf[1024];
      while (req.find("\r\n\r\n") == std::string::npos && !stop_) {
        if (!wait(c, POLLIN, 50)) continue;
        ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      uint64_t written = 0;
      switch (mode_) {
      case Mode::status:
        write_all(c,
                  "HTTP/1.1 " + std::to_string(status_.load()) +
                      " X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                  written);
        break;
      case Mode::trickle: {
        // A byte of a valid head every 20 ms, for ever.
        const std::string head = "HTTP/1.1 200 OK\r\nx-slow: " + std::string(100000, 'a');
        for (char ch : head) {
          if (!write_all(c, std::string_view(&ch, 1), written)) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        break;
      }
      case Mode::endless_interim: {
        const std::string interim(std::string_view("HTTP/1.1 100 Continue\r\n\r\n"));
        while (written < (256u << 20) && write_all(c, interim, written)) {
        }
        break;
      }
      case Mode::endless_body: {
        write_all(c, "HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n", written);
        const std::string chunk(64 * 1024, 'x');
        while (written < 1'000'000'000 && write_all(c, chunk, written)) {
        }
        break;
      }
      case Mode::silent: break;
      }
      if (written > most_written_) most_written_ = written;
      ::close(c);
    }
  }

  Mode mode_;
  std::atomic<int> status_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> most_written_{0};
  std::thread thread_;
};

std::shared_ptr<ProxyConfig> config(const std::vector<std::string> &urls, uint64_t timeout_ms) {
  auto cfg = std::make_shared<ProxyConfig>();
  std::string spec = "/app=";
  for (size_t i = 0; i < urls.size(); ++i) spec += (i ? "," : "") + urls[i];
  cfg->add_route(spec);
  cfg->health_check_path = "/health";
  cfg->health_interval_ns = 50'000'000;
  cfg->health_timeout_ns = timeout_ms * 1'000'000;
  return cfg;
}

UpstreamStats stats_of(const Proxy &p, size_t i) {
  std::vector<UpstreamStats> v;
  p.upstream_stats(v);
  return v.at(i);
}

// The distinct upstreams pick() hands out over a few calls.
size_t distinct_picks(Proxy &p) {
  std::set<Upstream *> seen;
  for (int i = 0; i < 6; ++i) seen.insert(p.pick_route(0));
  seen.erase(nullptr);
  return seen.size();
}

} // namespace

TEST(HealthProbe, FailingUpstreamSkippedUntilAProbePasses) {
  FakeUpstream a(FakeUpstream::Mode::status, 503);
  FakeUpstream b(FakeUpstream::Mode::status, 200);
  EventLoop loop;
  // Probes answered late on a loaded machine are no failures here.
  Proxy proxy(config({a.url(), b.url()}, 10'000), loop);
  size_t picks_while_down = 0, picks_after = 0;
  UpstreamStats a_down, a_up;
  auto a_failed = [&] { return stats_of(proxy, 0).down == 1 && stats_of(proxy, 1).probes >= 1; };
  auto a_back = [&] { return stats_of(proxy, 0).down == 0; };
  Steps steps(loop, {{a_failed,
                      [&] {
                        a_down = stats_of(proxy, 0);
                        picks_while_down = distinct_picks(proxy);
                        a.set_status(204);
                      }},
                     {a_back, [&] {
                        a_up = stats_of(proxy, 0);
                        picks_after = distinct_picks(proxy);
                      }}});
  ASSERT_EQ(steps.run(), 2u);
  EXPECT_GE(a_down.probe_failures, 1u);
  EXPECT_EQ(a_down.probe_timeouts, 0u); // it answered, with the wrong status
  EXPECT_EQ(picks_while_down, 1u);      // only b
  EXPECT_EQ(a_up.down, 0u);
  EXPECT_GT(a_up.probes, a_down.probes);
  EXPECT_EQ(picks_after, 2u); // both again
  EXPECT_EQ(stats_of(proxy, 1).probe_failures, 0u);
  EXPECT_EQ(stats_of(proxy, 0).requests, 0u); // probes are not requests
}

// Regression: one failed probe took the upstream out for an interval at
// least, and with it the whole route when it was the route's only one:
// the blip (a full backlog, a lost SYN) that passive health lets pass
// became an outage. Two failures in a row take it out.
TEST(HealthProbe, OneFailedProbeIsABlipTwoInARowMarkDown) {
  FakeUpstream a(FakeUpstream::Mode::status, 503);
  EventLoop loop;
  Proxy proxy(config({a.url()}, 1000), loop);
  uint64_t down_after_one = 9;
  Upstream *picked_after_one = nullptr;
  Steps steps(loop, {{[&] { return stats_of(proxy, 0).probe_failures >= 1; },
                      [&] {
                        down_after_one = stats_of(proxy, 0).down;
                        picked_after_one = proxy.pick_route(0);
                      }},
                     {[&] { return stats_of(proxy, 0).probe_failures >= 2; }, nullptr}});
  ASSERT_EQ(steps.run(), 2u);
  EXPECT_EQ(down_after_one, 0u);
  EXPECT_NE(picked_after_one, nullptr);
  EXPECT_EQ(stats_of(proxy, 0).down, 1u);
  EXPECT_EQ(proxy.pick_route(0), nullptr);
}

TEST(HealthProbe, SilentAndTricklingUpstreamsEndAtTheTimeout) {
  FakeUpstream silent(FakeUpstream::Mode::silent);
  FakeUpstream trickle(FakeUpstream::Mode::trickle);
  EventLoop loop;
  Proxy proxy(config({silent.url(), trickle.url()}, 100), loop);
  // Each probe must end for the next to start: two timeouts each prove it.
  Steps steps(loop, {{[&] {
                        return stats_of(proxy, 0).probe_timeouts >= 2 &&
                               stats_of(proxy, 1).probe_timeouts >= 2;
                      },
                      nullptr}});
  ASSERT_EQ(steps.run(), 1u);
  for (size_t i = 0; i < 2; ++i) {
    auto s = stats_of(proxy, i);
    EXPECT_EQ(s.down, 1u) << i;
    EXPECT_EQ(s.probe_failures, s.probe_timeouts) << i;
    EXPECT_GE(s.probes, s.probe_failures) << i;
    EXPECT_LE(s.probes, s.probe_failures + 1) << i; // one in flight at most
  }
  EXPECT_EQ(proxy.pick_route(0), nullptr); // nothing left to send to
}

TEST(HealthProbe, HostileResponsesAreReadOnlyToTheHead) {
  FakeUpstream interim(FakeUpstream::Mode::endless_interim);
  FakeUpstream body(FakeUpstream::Mode::endless_body);
  EventLoop loop;
  Proxy proxy(config({interim.url(), body.url()}, 10'000), loop);
  Steps steps(loop, {{[&] {
                        return stats_of(proxy, 0).probe_failures >= 2 &&
                               stats_of(proxy, 1).probes >= 3;
                      },
                      nullptr}});
  ASSERT_EQ(steps.run(), 1u);
  // Endless interim responses: failed by the read limit, not the timeout.
  auto s = stats_of(proxy, 0);
  EXPECT_EQ(s.probe_timeouts, 0u);
  EXPECT_EQ(s.down, 1u);
  // A 200 with a gigabyte behind it: passed at the head, the rest unread.
  s = stats_of(proxy, 1);
  EXPECT_EQ(s.probe_failures, 0u);
  EXPECT_EQ(s.down, 0u);
  EXPECT_LT(body.most_written(), 1'000'000'000u);
}

TEST(HealthProbe, RefusedConnectFails) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  EventLoop loop;
  Proxy proxy(config({url}, 1000), loop); // bound, not listening: refused
  Steps steps(loop, {{[&] { return stats_of(proxy, 0).probe_failures >= 2; }, nullptr}});
  ASSERT_EQ(steps.run(), 1u);
  auto s = stats_of(proxy, 0);
  EXPECT_EQ(s.probe_timeouts, 0u);
  EXPECT_EQ(s.down, 1u);
  EXPECT_EQ(s.connect_failures, 0u); // the passive counters are the requests'
  ::close(fd);
}

// epoll refusing the probe's socket (no memory for the watch, or
// fs.epoll.max_user_watches reached) is this host's shortage: no probe, no
// verdict, the next at the next interval. Before, the exception stopped
// the worker.
TEST(HealthProbe, AProbeSocketEpollRefusesGivesNoVerdict) {
  FakeUpstream a(FakeUpstream::Mode::status, 200);
  EventLoop loop;
  xdpq::testing::RefuseSocketWatches refusal(1);
  Proxy proxy(config({a.url()}, 1000), loop);
  Steps steps(loop, {{[&] {
                        return refusal.left() == 0 &&
                               stats_of(proxy, 0).probes >= 2;
                      },
                      nullptr}});
  ASSERT_EQ(steps.run(), 1u);
  auto s = stats_of(proxy, 0);
  EXPECT_EQ(s.probe_failures, 0u);
  EXPECT_EQ(s.down, 0u);
  EXPECT_EQ(distinct_picks(proxy), 1u);
}

TEST(HealthProbe, NoChecksUnlessConfigured) {
  FakeUpstream a(FakeUpstream::Mode::status, 503);
  EventLoop loop;
  auto cfg = config({a.url()}, 1000);
  cfg->health_check_path.clear();
  Proxy proxy(cfg, loop);
  int passes = 0;
  Steps steps(loop, {{[&] { return ++passes >= 30; }, nullptr}}); // ~300 ms of ticks
  ASSERT_EQ(steps.run(), 1u);
  auto s = stats_of(proxy, 0);
  EXPECT_EQ(s.probes, 0u);
  EXPECT_EQ(s.down, 0u);
  EXPECT_NE(proxy.pick_route(0), nullptr);
}

// A reload keeps an upstream that stays (same route, same URL) out while
// its checks fail: the new configuration's first check does not start
// from "up".
TEST(HealthProbe, ReloadKeepsAFailingVerdict) {
  FakeUpstream a(FakeUpstream::Mode::status, 503);
  EventLoop loop;
  Proxy proxy(config({a.url()}, 1000), loop);
  uint64_t down_after_reload = 0, probes_at_reload = 0;
  Upstream *picked_after_reload = reinterpret_cast<Upstream *>(1);
  Steps steps(loop, {{[&] { return stats_of(proxy, 0).down == 1; },
                      [&] {
                        proxy.reconfigure(config({a.url()}, 500));
                        proxy.end_of_pass();
                        down_after_reload = stats_of(proxy, 0).down;
                        probes_at_reload = stats_of(proxy, 0).probes;
                        picked_after_reload = proxy.pick_route(0);
                      }},
                     {[&] { return stats_of(proxy, 0).probes > probes_at_reload; }, nullptr}});
  ASSERT_EQ(steps.run(), 2u);
  EXPECT_EQ(down_after_reload, 1u);
  EXPECT_EQ(picked_after_reload, nullptr);
  EXPECT_EQ(stats_of(proxy, 0).down, 1u); // the new checks fail too
  EXPECT_GE(probes_at_reload, 1u);        // counters carried over
}
