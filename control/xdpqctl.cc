// xdpqctl: the command-line client of xdpqd's control socket.

#include "control/options.h"
#include "control/server.h"
#include "xdpq_version.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

constexpr int CONNECT_WAIT_S = 10;

const char *USAGE = R"(Usage: xdpqctl [--socket PATH] [--json] COMMAND

Commands:
  status                      version, uptime, dataplane, XDP mode, workers
  stats                       counters, per worker and total
  conns                       live connections (peer, age, RTT, bytes, streams)
  reload                      reload the certificate, log level and proxy routes now
  drain                       graceful shutdown: GOAWAY, finish, stop
  upgrade                     start the binary at xdpqd's path with the current
                              configuration, hand it the sockets; the old
                              process finishes its connections (SIGUSR2 too)
  capture start FILE [--filter EXPR] [--count N]
                              pcap of what the user-space path receives/sends
  capture stop
  keylog start FILE           TLS secrets (NSS key log) for Wireshark
  keylog stop

--socket PATH   the control socket (default: the daemon's default path)
--json          machine-readable output
--version       print the version
Exit status: 0 ok, 1 the daemon reported an error, 2 usage or connection error.
)";

} // namespace

int main(int argc, char **argv) {
  std::string socket_path;
  bool json = false;
  std::vector<std::string> cmd;
  std::string filter, count;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else if (a == "--count" && i + 1 < argc) {
      count = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::fputs(USAGE, stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("xdpqctl %s\n", XDPQ_VERSION);
      return 0;
    } else if (a.starts_with("--")) {
      std::fprintf(stderr, "xdpqctl: unknown option %s\n%s", a.c_str(), USAGE);
      return 2;
    } else {
      cmd.push_back(a);
    }
  }
  if (cmd.empty()) {
    std::fputs(USAGE, stderr);
    return 2;
  }
  if (cmd[0] == "capture" && cmd.size() >= 2 && cmd[1] == "start") {
    if (cmd.size() != 3) {
      std::fprintf(stderr, "xdpqctl: capture start FILE [--filter EXPR] [--count N]\n");
      return 2;
    }
    cmd.push_back(filter);
    cmd.push_back(count.empty() ? "0" : count);
  }
  if ((cmd[0] == "capture" || cmd[0] == "keylog") && cmd.size() >= 3 && cmd[1] == "start" &&
      !cmd[2].empty() && cmd[2][0] != '/') {
    // The daemon's working directory is / (read-only under the unit): a
    // relative path means the caller's.
    std::error_code ec;
    auto cwd = std::filesystem::current_path(ec);
    if (!ec) cmd[2] = (cwd / cmd[2]).string();
  }
  if (socket_path.empty()) socket_path = xdpq::control::control_socket_path({});
  std::string line = json ? "json" : "text";
  for (const auto &c : cmd) {
    if (c.find_first_of("\t\n") != std::string::npos) {
      std::fprintf(stderr, "xdpqctl: arguments may not contain tabs or newlines\n");
      return 2;
    }
    line += "\t" + c;
  }
  line += "\n";
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    // Cut short, it would name another socket (xdpqd refuses such a path).
    std::fprintf(stderr, "xdpqctl: %s: path too long (at most %zu bytes)\n",
                 socket_path.c_str(), sizeof(addr.sun_path) - 1);
    return 2;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  // A daemon that stopped accepting (hung, or its backlog full) would make
  // connect() wait for good: the send timeout bounds that wait, and the
  // one for our request line.
  const timeval connect_wait{CONNECT_WAIT_S, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &connect_wait, sizeof(connect_wait));
  if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      std::fprintf(stderr, "xdpqctl: %s: xdpqd did not take the connection within %d s "
                   "(busy or hung)\n", socket_path.c_str(), CONNECT_WAIT_S);
    } else {
      std::fprintf(stderr, "xdpqctl: %s: %s (is xdpqd running? --socket PATH)\n",
                   socket_path.c_str(), std::strerror(errno));
    }
    return 2;
  }
  // A user's xdpqctl asks and believes only that user's xdpqd: in a
  // shared directory (the /tmp fallback) another user can put a socket (or
  // a link to some other service's) where ours is expected. (A root xdpqd
  // answers only root.) Root may ask any: a service user's.
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    std::fprintf(stderr, "xdpqctl: %s: %s\n", socket_path.c_str(), std::strerror(errno));
    return 2;
  }
  if (geteuid() != 0 && cred.uid != geteuid()) {
    std::fprintf(stderr, "xdpqctl: %s: served by uid %u, not by you; not talking to it\n",
                 socket_path.c_str(), cred.uid);
    return 2;
  }
  // MSG_NOSIGNAL: a daemon that answers early (a refusal) and closes must
  // not kill us with SIGPIPE before we read its answer.
  if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()) &&
      errno != EPIPE && errno != ECONNRESET) {
    std::fprintf(stderr, "xdpqctl: write: %s\n", std::strerror(errno));
    return 2;
  }
  std::string out;
  char buf[65536];
  // An upgrade waits up to 30 s for the new process, a reload as long for
  // its checks.
  const bool slow = line.find("\tupgrade") != std::string::npos ||
                    line.find("\treload") != std::string::npos;
  const int wait_ms = slow ? 40000 : 10000;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) <= 0) {
      std::fprintf(stderr, "xdpqctl: no answer from xdpqd within %d s\n", wait_ms / 1000);
      return 2;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (out.empty()) {
    // Every request is answered: a close without one means it was not
    // done (the daemon's deadline passed, or it is going away).
    std::fprintf(stderr, "xdpqctl: xdpqd closed the connection without an answer\n");
    return 2;
  }
  std::fputs(out.c_str(), stdout);
  bool error = out.starts_with("error:") || out.starts_with("{\"error\"");
  return error ? 1 : 0;
}
