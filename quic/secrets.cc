#include "quic/secrets.h"

#include "base/hex.h"
#include "base/private_file.h"

#include <fcntl.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
    // Written whole under a temporary name, then linked into place: a
    // failed write (a full disk) leaves no part of a file that every later
    // start would refuse, and of two processes creating it at once, one's
    // keys are the file and the other reads them.
    const std::string tmp = path + ".new." + std::to_string(getpid());
    unlink(tmp.c_str()); // left by a process of ours that died writing it
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
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
    int linked = link(tmp.c_str(), path.c_str());
    if (linked != 0 && (errno == EPERM || errno == EOPNOTSUPP))
      linked = rename(tmp.c_str(), path.c_str()); // a filesystem without hard links
    const int link_errno = errno;
    unlink(tmp.c_str());
    if (linked != 0 && link_errno == EEXIST) return load_or_create(path, create); // theirs won
    if (linked != 0) {
      throw std::runtime_error("secrets file " + path + ": cannot create: " +
                               std::strerror(link_errno));
    }
    if (int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
      fsync(d); // the new name outlives a crash
      close(d);
    }
    return s;
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
