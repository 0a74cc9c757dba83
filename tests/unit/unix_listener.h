#pragma once
// A listening unix stream socket for tests that play an upstream or a
// control client.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace xdpq::testing {

// Listens at path (replacing a stale socket there); its address in *sun
// when given. Returns the socket (non-blocking), or -1.
inline int listen_unix(const std::string &path, sockaddr_un *sun = nullptr) {
  sockaddr_un a{};
  if (path.size() >= sizeof(a.sun_path)) return -1;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ::unlink(path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
      ::listen(fd, 8) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  if (sun) *sun = a;
  return fd;
}

} // namespace xdpq::testing
