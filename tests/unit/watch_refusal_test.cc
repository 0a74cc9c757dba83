// When epoll refuses one client's socket (the kernel has no memory for the
// watch, or fs.epoll.max_user_watches is reached), that client alone is
// refused: the loop goes on and the next client is served. Before, the
// exception left the loop and stopped the worker, and with it the daemon.

#include "control/admin.h"
#include "dataplane/address.h"
#include "epoll_refusal.h"
#include "http/tcp_server.h"
#include "loop_steps.h"
#include "unix_listener.h"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

using namespace xdpq;
using xdpq::testing::Steps;

namespace {

int connect_tcp(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
  return fd;
}

// The server closed this connection: end of file or a reset, within 5 s.
bool closed_by_server(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 5000) != 1) return false;
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

class NoAdmin final : public control::AdminHandler {
public:
  std::string control_request(const std::string &line) override { return "got " + line + "\n"; }
  bool metrics_page(std::string_view, std::string &) override { return false; }
};

} // namespace

TEST(WatchRefused, OnlyThatTcpClientIsRefused) {
  dataplane::EventLoop loop;
  http::TcpConfig cfg;
  cfg.cleartext_listen = {*dataplane::parse_address("127.0.0.1:0")};
  cfg.check_in_use = false;
  http::TcpServer srv(cfg, http::SessionEnv{}, nullptr, loop);
  const uint16_t port = srv.bound_addresses().at(0).port();

  xdpq::testing::RefuseSocketWatches refusal(1);
  int refused = connect_tcp(port), served = -1;
  Steps steps(loop, {{[&] { return srv.stats().refused_no_resources == 1; },
                      [&] { served = connect_tcp(port); }},
                     {[&] { return srv.connection_count() == 1; }, nullptr}});
  EXPECT_EQ(steps.run(), 2u);
  EXPECT_EQ(refusal.left(), 0);
  EXPECT_EQ(srv.stats().accepted, 1u);
  EXPECT_TRUE(closed_by_server(refused));
  srv.end_of_pass();
  ::close(refused);
  ::close(served);
}

TEST(WatchRefused, OnlyThatControlClientIsRefused) {
  const std::string path = "/tmp/xdpq-watch-refusal-" + std::to_string(getpid());
  sockaddr_un sun{};
  const int lfd = xdpq::testing::listen_unix(path, &sun);
  ASSERT_GE(lfd, 0);
  auto dial = [&] {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&sun), sizeof(sun)), 0);
    return fd;
  };

  dataplane::EventLoop loop;
  NoAdmin handler;
  {
    control::AdminServer admin(loop, handler, lfd, -1);
    xdpq::testing::RefuseSocketWatches refusal(1);
    int refused = dial(), served = -1;
    Steps steps(loop, {{[&] { return admin.stats().refused_no_resources == 1; },
                        [&] {
                          served = dial();
                          ASSERT_EQ(::send(served, "status\n", 7, MSG_NOSIGNAL), 7);
                        }},
                       {[&] {
                          admin.end_of_pass();
                          pollfd p{served, POLLIN, 0};
                          return ::poll(&p, 1, 0) == 1;
                        },
                        nullptr}});
    EXPECT_EQ(steps.run(), 2u);
    EXPECT_TRUE(closed_by_server(refused));
    char buf[64] = {};
    EXPECT_GT(::recv(served, buf, sizeof(buf) - 1, 0), 0);
    EXPECT_EQ(std::string(buf), "got status\n");
    EXPECT_EQ(admin.stats().clients, 1u);
    ::close(refused);
    ::close(served);
  }
  ::close(lfd);
  ::unlink(path.c_str());
}
