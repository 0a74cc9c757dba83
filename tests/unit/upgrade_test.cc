// The binary upgrade's channel (control/upgrade.h): what the running xdpqd
// hands the new one arrives whole, descriptors included; anything else is
// refused without leaking what came with it.
#include "control/upgrade.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace xdpq;
using namespace xdpq::control;

namespace {

struct Pair {
  int a = -1, b = -1;
  Pair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a = sv[0];
    b = sv[1];
  }
  ~Pair() {
    close(a);
    close(b);
  }
};

ino_t inode(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return st.st_ino;
}

} // namespace

TEST(Upgrade, InheritanceArrivesWhole) {
  Pair p;
  Inheritance out;
  out.generation = 1;
  out.workers = 3;
  out.cid_format = "quic-lb:cr=2:sid=0a0b:nonce=14:encrypted:1234";
  out.secrets = quic::Secrets::generate();
  std::vector<int> pipes;
  // More descriptors than one message carries.
  for (int i = 0; i < 150; ++i) {
    int fds[2];
    ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
    pipes.push_back(fds[0]);
    pipes.push_back(fds[1]);
    out.sockets.push_back({Inheritance::Kind::udp, i % 3,
                           *dataplane::parse_address("[::1]:" + std::to_string(1000 + i)),
                           fds[0]});
    out.sockets.push_back({i == 0 ? Inheritance::Kind::control : Inheritance::Kind::wake,
                           i == 0 ? -1 : i % 3, {}, fds[1]});
  }
  // AF_XDP: the sockets holding the ports and the XDP link.
  out.dataplane = "afxdp";
  out.interface = "eth7";
  for (int i = 0; i < 2; ++i) {
    int fds[2];
    ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
    pipes.push_back(fds[0]);
    pipes.push_back(fds[1]);
    out.sockets.push_back({Inheritance::Kind::reservation, -1,
                           *dataplane::parse_address("10.0.0.1:44" + std::to_string(i)), fds[0]});
    if (i == 0) out.sockets.push_back({Inheritance::Kind::xdp_link, -1, {}, fds[1]});
  }
  send_inheritance(p.a, out);
  Inheritance in = receive_inheritance(p.b, 1000);
  EXPECT_EQ(in.dataplane, "afxdp");
  EXPECT_EQ(in.interface, "eth7");
  EXPECT_EQ(in.of(Inheritance::Kind::reservation).size(), 2u);
  ASSERT_EQ(in.of(Inheritance::Kind::xdp_link).size(), 1u);
  EXPECT_EQ(in.generation, 1);
  EXPECT_EQ(in.workers, 3);
  EXPECT_EQ(in.cid_format, out.cid_format);
  EXPECT_EQ(in.secrets.reset_key, out.secrets.reset_key);
  EXPECT_EQ(in.secrets.ticket_key, out.secrets.ticket_key);
  EXPECT_EQ(in.secrets.quic_lb_key, out.secrets.quic_lb_key);
  ASSERT_EQ(in.sockets.size(), out.sockets.size());
  for (size_t i = 0; i < in.sockets.size(); ++i) {
    const auto &x = in.sockets[i], &y = out.sockets[i];
    EXPECT_EQ(x.kind, y.kind) << i;
    EXPECT_EQ(x.worker, y.worker) << i;
    if (x.kind == Inheritance::Kind::udp || x.kind == Inheritance::Kind::reservation) {
      EXPECT_EQ(x.addr, y.addr) << i;
    }
    EXPECT_NE(x.fd, y.fd) << i;                  // a new descriptor...
    EXPECT_EQ(inode(x.fd), inode(y.fd)) << i;    // ...of the same pipe
    EXPECT_EQ(fcntl(x.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC) << i;
  }
  EXPECT_EQ(in.of(Inheritance::Kind::udp, 1).size(), 50u);
  in.close_all();
  for (int fd : pipes) close(fd);
}

TEST(Upgrade, MalformedInheritanceIsRefusedAndClosed) {
  auto refused = [](const std::vector<std::string> &messages, std::vector<int> fds = {}) {
    Pair p;
    for (size_t i = 0; i < messages.size(); ++i) {
      EXPECT_TRUE(send_message(p.a, messages[i], i == 1 ? std::span<const int>(fds)
                                                        : std::span<const int>()));
    }
    shutdown(p.a, SHUT_WR);
    try {
      receive_inheritance(p.b, 1000).close_all();
    } catch (const std::runtime_error &e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string keys = std::string(64, '1') + " " + std::string(64, '2') + " " +
                           std::string(128, '3') + " -";
  const std::string head = "inherit 0 2\ncid unroutable\nsecrets " + keys + "\n";
  EXPECT_NE(refused({"hello\n"}), "");
  EXPECT_NE(refused({"inherit 2 2\ncid unroutable\nsecrets " + keys + "\n"}), "");
  EXPECT_NE(refused({"inherit 0 200\ncid unroutable\nsecrets " + keys + "\n"}), "");
  EXPECT_NE(refused({"inherit 0 2\ncid unroutable\nsecrets 11 22 33 -\n"}), "");
  // A dataplane line, when there is one, names a known dataplane and an
  // interface name that fits.
  EXPECT_NE(refused({head + "dataplane dpdk eth0\n", "end\n"}), "");
  EXPECT_NE(refused({head + "dataplane afxdp " + std::string(20, 'x') + "\n", "end\n"}), "");
  EXPECT_EQ(refused({head + "dataplane afxdp eth0\n", "end\n"}), "");
  // A worker descriptor without a worker (would index wake[-1]), a worker
  // out of range, more names than descriptors, an end that never comes.
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  EXPECT_NE(refused({head, "wake -1 -\n", "end\n"}, {fds[0]}), "");
  EXPECT_NE(refused({head, "udp 2 127.0.0.1:1\n", "end\n"}, {fds[0]}), "");
  EXPECT_NE(refused({head, "udp 0 127.0.0.1:1\nudp 1 127.0.0.1:2\n", "end\n"}, {fds[0]}), "");
  EXPECT_NE(refused({head, "udp 0 127.0.0.1:1\n"}, {fds[0]}), "");
  // An address where none belongs, none where one does.
  EXPECT_NE(refused({head, "xdp-link -1 127.0.0.1:1\n", "end\n"}, {fds[0]}), "");
  EXPECT_NE(refused({head, "reservation -1 -\n", "end\n"}, {fds[0]}), "");
  EXPECT_EQ(refused({head, "reservation -1 127.0.0.1:1\n", "end\n"}, {fds[0]}), "");
  // Each refusal closed the copies it received: only ours are left.
  int probe = dup(fds[0]);
  EXPECT_LT(probe, 64) << "descriptors leaked";
  close(probe);
  close(fds[0]);
  close(fds[1]);
  EXPECT_NE(refused({head, "udp 1 127.0.0.1:9\n", "end\n"}, {}), "") << "a name without its descriptor";
}

TEST(Upgrade, ReadyMessage) {
  UpgradeReady r;
  r.pid = 1234;
  r.workers = 4;
  r.capacity = 256;
  r.adopted = {0, 3, 7};
  UpgradeReady back;
  ASSERT_TRUE(parse_ready(ready_text(r), back));
  EXPECT_EQ(back.pid, 1234);
  EXPECT_EQ(back.workers, 4);
  EXPECT_EQ(back.capacity, 256u);
  EXPECT_EQ(back.adopted, r.adopted);
  UpgradeReady bad;
  EXPECT_FALSE(parse_ready("ready 1 0 256\n", bad));
  EXPECT_FALSE(parse_ready("ready 1 2 100000000\n", bad));
  EXPECT_FALSE(parse_ready("ready 1 2 256 x\n", bad));
  EXPECT_FALSE(parse_ready("error nope\n", bad));
}
