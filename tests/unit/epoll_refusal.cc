#include "epoll_refusal.h"

#include <dlfcn.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>

namespace {

std::atomic<int> refusals{0};

// A stream socket that is not listening: an accepted client or an
// outgoing connection.
bool stream_connection(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int type = 0, listening = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  len = sizeof(listening);
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && !listening;
}

} // namespace

namespace xdpq::testing {

RefuseSocketWatches::RefuseSocketWatches(int n) { refusals.store(n); }
RefuseSocketWatches::~RefuseSocketWatches() { refusals.store(0); }
int RefuseSocketWatches::left() const { return refusals.load(); }

} // namespace xdpq::testing

extern "C" int epoll_ctl(int epfd, int op, int fd, epoll_event *ev) {
  using Real = int (*)(int, int, int, epoll_event *);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "epoll_ctl"));
  if (op == EPOLL_CTL_ADD && refusals.load() > 0 && stream_connection(fd)) {
    int n = refusals.load();
    while (n > 0 && !refusals.compare_exchange_weak(n, n - 1)) {
    }
    if (n > 0) {
      errno = ENOSPC;
      return -1;
    }
  }
  return real(epfd, op, fd, ev);
}
