// The host's addresses followed from rtnetlink, in a network namespace of
// the test's own (a forked child: the namespace and the addresses it gets
// are gone with it).

#include "dataplane/local_addresses.h"

#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

using namespace xdpq::dataplane;

namespace {

// Runs body in a child in a fresh network namespace with a link "xq0"
// (one end of a veth pair, left down: no IPv6 link-local address to
// announce later); the child's exit status (0: passed; 100+: the setup
// failed).
int in_own_namespace(int (*body)()) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(100);
    if (std::system("ip link add xq0 type veth peer name xq1") != 0) {
      _exit(101);
    }
    _exit(body());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 102;
  return WEXITSTATUS(status);
}

} // namespace

// Regression: after the kernel dropped notifications for the socket
// (ENOBUFS), the addresses were listed afresh and then the notifications
// still queued, older than the dropped ones, were applied on top: an
// address added (queued) and then removed (its removal dropped) came back,
// and the XDP program went on serving it (and refusing sources with it).
TEST(LocalAddresses, AnOverflowIsNotUndoneByOlderQueuedNotifications) {
  if (geteuid() != 0 && std::getenv("CI") == nullptr) {
    GTEST_SKIP() << "needs root for a network namespace; CI runs it as root";
  }
  int rc = in_own_namespace([] {
    LocalAddresses la([](const Address &, bool) {});
    // The smallest receive buffer: a message or two, then overflow.
    int tiny = 0;
    if (setsockopt(la.fd(), SOL_SOCKET, SO_RCVBUFFORCE, &tiny, sizeof(tiny)) != 0) return 103;
    // Added (queued), a burst that overflows the buffer, removed (dropped).
    char batch[64];
    std::snprintf(batch, sizeof(batch), "/tmp/xdpq-la-batch-%d", static_cast<int>(getpid()));
    FILE *f = std::fopen(batch, "w");
    if (f == nullptr) return 104;
    std::fprintf(f, "addr add 10.77.0.1/32 dev xq0\n");
    for (int i = 0; i < 200; ++i) std::fprintf(f, "addr add 10.78.0.%d/32 dev xq0\n", i + 1);
    std::fprintf(f, "addr del 10.77.0.1/32 dev xq0\n");
    std::fclose(f);
    const std::string cmd = std::string("ip -batch ") + batch;
    const int batch_rc = std::system(cmd.c_str());
    std::remove(batch);
    if (batch_rc != 0) return 105;
    la.on_readable();
    if (la.resyncs() == 0) return 106; // no overflow: the test proves nothing
    if (!la.contains(*parse_address("10.78.0.200:0"))) return 107;
    return la.contains(*parse_address("10.77.0.1:0")) ? 1 : 0;
  });
  EXPECT_EQ(rc, 0) << "1: the removed address came back; 100+: setup step failed";
}

// Regression (review): the table knew which interfaces had an address,
// not which of their entries: with the same address twice on one link
// (two prefix lengths, as Linux allows), removing either entry took the
// address away while the other still held it, and the XDP program
// stopped serving it.
TEST(LocalAddresses, AnAddressHeldTwiceStaysUntilItsLastEntryGoes) {
  if (geteuid() != 0 && std::getenv("CI") == nullptr) {
    GTEST_SKIP() << "needs root for a network namespace; CI runs it as root";
  }
  int rc = in_own_namespace([] {
    LocalAddresses la([](const Address &, bool) {});
    const Address a = *parse_address("10.77.0.1:0");
    if (std::system("ip addr add 10.77.0.1/24 dev xq0 && ip addr add 10.77.0.1/32 dev xq0") != 0)
      return 103;
    la.on_readable();
    if (!la.contains(a)) return 104;
    if (std::system("ip addr del 10.77.0.1/32 dev xq0") != 0) return 105;
    la.on_readable();
    if (!la.contains(a)) return 1; // the /24 entry still holds it
    if (std::system("ip addr del 10.77.0.1/24 dev xq0") != 0) return 106;
    la.on_readable();
    if (la.contains(a)) return 2;
    // IPv6 has one entry per address and link, whose peer may change in
    // place: removed after that, it is gone.
    const Address b = *parse_address("[fd00::1]:0");
    if (std::system("ip -6 addr add fd00::1 peer fd00::2 dev xq0 nodad && "
                    "ip -6 addr change fd00::1 peer fd00::3 dev xq0 nodad") != 0)
      return 107;
    la.on_readable();
    if (!la.contains(b)) return 108;
    if (std::system("ip -6 addr del fd00::1 peer fd00::3 dev xq0") != 0) return 109;
    la.on_readable();
    return la.contains(b) ? 3 : 0;
  });
  EXPECT_EQ(rc, 0) << "1: gone with one of its two entries; 2: kept after both; "
                      "3: IPv6 kept after its peer changed and it went; 100+: setup";
}
