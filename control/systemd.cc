#include "control/systemd.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

namespace xdpq::control {

void sd_notify_state(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (len >= sizeof(addr.sun_path)) return;
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0'; // abstract namespace
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  [[maybe_unused]] auto r =
      sendto(fd, state, strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr *>(&addr),
             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
  close(fd);
}

uint64_t sd_watchdog_usec() {
  const char *usec = getenv("WATCHDOG_USEC");
  if (!usec) return 0;
  const char *pid = getenv("WATCHDOG_PID");
  if (pid && std::strtoll(pid, nullptr, 10) != getpid()) return 0;
  return std::strtoull(usec, nullptr, 10);
}

} // namespace xdpq::control
