#include "quic/secrets.h"

#include "base/hex.h"
#include "base/log.h"
#include "base/private_file.h"

#include <fcntl.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace xdpq::quic {

namespace {

template <size_t N> void random_fill(std::array<uint8_t, N> &a) {
  if (gnutls_rnd(GNUTLS_RND_KEY, a.data(), a.size()) != 0) {
    throw std::runtime_error("gnutls_rnd failed");
  }
}

// Writes s to a file of a name of its own, synced, then gives it path's
// name if no file has it: a failed write (a full disk) leaves no part of a
// file that every later start would refuse, and of two processes creating
// it at once, one's keys are the file. False if path was taken meanwhile.
bool publish(const std::string &path, const std::string &dir, const Secrets &s) {
  std::string tmp = path + ".new.XXXXXX";
  const int fd = mkostemp(tmp.data(), O_CLOEXEC); // mode 0600, a name no one else has
  if (fd < 0) {
    throw std::runtime_error("secrets file " + path + ": cannot create: " + std::strerror(errno));
  }
  std::string text = "# xdpq secrets: keep private, keep across restarts\n";
  text += "reset_key=" + to_hex(s.reset_key) + "\n";
  text += "token_key=" + to_hex(s.token_key) + "\n";
  text += "ticket_key=" + to_hex(s.ticket_key) + "\n";
  text += "# QUIC-LB (quic_lb.mode = \"encrypted\"): the same on every node and the balancer\n";
  text += "quic_lb_key=" + to_hex(*s.quic_lb_key) + "\n";
  errno = 0;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ok && fsync(fd) == 0;
  const int write_errno = errno;
  close(fd);
  if (!ok) {
    unlink(tmp.c_str());
    throw std::runtime_error("secrets file " + path + ": write failed" +
                             (write_errno ? std::string(": ") + std::strerror(write_errno) : ""));
  }
  int placed = link(tmp.c_str(), path.c_str());
  if (placed != 0 && (errno == EPERM || errno == EOPNOTSUPP)) // a filesystem without hard links
    placed = renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE);
  const int place_errno = errno;
  unlink(tmp.c_str()); // gone already if renamed
  if (placed != 0 && place_errno == EEXIST) return false;
  if (placed != 0) {
    throw std::runtime_error("secrets file " + path + ": cannot create: " +
                             std::strerror(place_errno));
  }
  if (int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    fsync(d); // the new name outlives a crash
    close(d);
  }
  return true;
}

} // namespace

Secrets Secrets::generate() {
  Secrets s;
  random_fill(s.reset_key);
  random_fill(s.token_key);
  random_fill(s.ticket_key);
  std::array<uint8_t, 16> lb{};
  random_fill(lb);
  s.quic_lb_key = lb;
  return s;
}

Secrets Secrets::load_or_create(const std::string &path, bool create) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    Secrets s = generate();
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1);
    if (!create) {
      if (access(dir.c_str(), W_OK | X_OK) != 0) {
        throw std::runtime_error("secrets file " + path + ": cannot create: " +
                                 std::strerror(errno));
      }
      return s;
    }
    if (publish(path, dir, s)) return s;
    // Another process made it first (its keys are the file's), or the
    // name is a symbolic link to nothing.
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      struct stat ls {};
      const bool dangling = errno == ENOENT && lstat(path.c_str(), &ls) == 0 && S_ISLNK(ls.st_mode);
      throw std::runtime_error("secrets file " + path + ": " +
                               (dangling ? std::string("a symbolic link to a file that does not exist")
                                         : std::strerror(errno)));
    }
  }
  if (fd < 0) {
    throw std::runtime_error("secrets file " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  std::string problem;
  if (fstat(fd, &st) != 0) {
    problem = std::strerror(errno);
  } else {
    // Whoever owns it could swap the keys (forge tokens, read tickets).
    // Root checking a service's configuration (--check-config before a
    // reload) reads the file the service's user made, and serves nothing
    // with it: any owner, as long as the file is private.
    problem = private_file_problem(st, true, !create && geteuid() == 0);
    if (problem.empty() && st.st_uid != geteuid() && st.st_uid != 0) {
      LOG_WARN("secrets file %s is owned by uid %u: only a daemon running as that user may use it",
               path.c_str(), static_cast<unsigned>(st.st_uid));
    }
    if (problem.empty() && st.st_size > 64 * 1024) problem = "larger than a secrets file can be";
  }
  if (!problem.empty()) {
    close(fd);
    throw std::runtime_error("secrets file " + path + ": " + problem);
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  ssize_t n = read(fd, text.data(), text.size());
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    throw std::runtime_error("secrets file " + path + ": short read");
  }
  Secrets s;
  bool have_reset = false, have_token = false, have_ticket = false;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    auto eq = line.find('=');
    std::string key = line.substr(0, eq);
    std::string_view val = eq == std::string::npos ? std::string_view{}
                                                   : std::string_view(line).substr(eq + 1);
    bool ok = false;
    if (key == "reset_key") ok = have_reset = parse_hex_into(val, s.reset_key);
    else if (key == "token_key") ok = have_token = parse_hex_into(val, s.token_key);
    else if (key == "ticket_key") ok = have_ticket = parse_hex_into(val, s.ticket_key);
    else if (key == "quic_lb_key") {
      std::array<uint8_t, 16> lb{};
      ok = parse_hex_into(val, lb);
      if (ok) s.quic_lb_key = lb;
    }
    if (!ok) {
      throw std::runtime_error("secrets file " + path + ":" + std::to_string(lineno) +
                               ": expected reset_key=<64 hex>, token_key=<64 hex>, "
                               "ticket_key=<128 hex> or quic_lb_key=<32 hex>");
    }
  }
  if (!have_reset || !have_token || !have_ticket) {
    throw std::runtime_error("secrets file " + path + ": missing a key");
  }
  return s;
}

} // namespace xdpq::quic
