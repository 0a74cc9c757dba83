#include "control/upgrade.h"

#include "base/hex.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <array>
#include <sstream>
#include <stdexcept>

namespace xdpq::control {

namespace {

const char *kind_name(Inheritance::Kind k) {
  switch (k) {
  case Inheritance::Kind::udp: return "udp";
  case Inheritance::Kind::tcp_tls: return "tcp-tls";
  case Inheritance::Kind::tcp_clear: return "tcp-clear";
  case Inheritance::Kind::control: return "control";
  case Inheritance::Kind::metrics: return "metrics";
  case Inheritance::Kind::wake: return "wake";
  case Inheritance::Kind::reservation: return "reservation";
  case Inheritance::Kind::xdp_link: return "xdp-link";
  }
  return "?";
}

bool kind_of(const std::string &name, Inheritance::Kind &k) {
  for (auto c : {Inheritance::Kind::udp, Inheritance::Kind::tcp_tls, Inheritance::Kind::tcp_clear,
                 Inheritance::Kind::control, Inheritance::Kind::metrics,
                 Inheritance::Kind::wake, Inheritance::Kind::reservation,
                 Inheritance::Kind::xdp_link}) {
    if (name == kind_name(c)) {
      k = c;
      return true;
    }
  }
  return false;
}

bool has_address(Inheritance::Kind k) {
  return k == Inheritance::Kind::udp || k == Inheritance::Kind::tcp_tls ||
         k == Inheritance::Kind::tcp_clear || k == Inheritance::Kind::reservation;
}

} // namespace

std::vector<const Inheritance::Socket *> Inheritance::of(Kind k, int worker) const {
  std::vector<const Socket *> v;
  for (const auto &s : sockets) {
    if (s.kind == k && (worker < 0 || s.worker == worker)) v.push_back(&s);
  }
  return v;
}

void Inheritance::close_all() {
  for (auto &s : sockets) {
    if (s.fd >= 0) close(s.fd);
    s.fd = -1;
  }
}

bool send_message(int sock, std::string_view text, std::span<const int> fds) {
  if (fds.size() > MAX_FDS) {
    errno = EINVAL;
    return false;
  }
  iovec iov{const_cast<char *>(text.data()), text.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * MAX_FDS));
  if (!fds.empty()) {
    m.msg_control = control.data();
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &m, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(text.size());
}

bool recv_message(int sock, std::string &text, std::vector<int> &fds, int timeout_ms) {
  pollfd p{sock, POLLIN, 0};
  int rv;
  do {
    rv = poll(&p, 1, timeout_ms);
  } while (rv < 0 && errno == EINTR);
  if (rv <= 0) {
    if (rv == 0) errno = ETIMEDOUT;
    return false;
  }
  std::vector<char> buf(64 * 1024);
  iovec iov{buf.data(), buf.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * MAX_FDS));
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control.data();
  m.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(fd);
      }
    }
  }
  if (n <= 0 || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    if (n == 0) errno = ECONNRESET;
    if (n > 0) errno = EMSGSIZE;
    return false;
  }
  text.assign(buf.data(), static_cast<size_t>(n));
  return true;
}

void send_inheritance(int sock, const Inheritance &inh) {
  const auto &keys = inh.secrets;
  std::string head = "inherit " + std::to_string(inh.generation) + " " +
                     std::to_string(inh.workers) + "\ncid " + inh.cid_format + "\nsecrets " +
                     to_hex(keys.reset_key) + " " + to_hex(keys.token_key) + " " +
                     to_hex(keys.ticket_key) + " " +
                     (keys.quic_lb_key ? to_hex(*keys.quic_lb_key) : std::string("-")) +
                     "\ndataplane " + inh.dataplane + " " +
                     (inh.interface.empty() ? std::string("-") : inh.interface) + "\n";
  if (!send_message(sock, head, {})) {
    throw std::runtime_error(std::string("upgrade: send: ") + std::strerror(errno));
  }
  for (size_t i = 0; i < inh.sockets.size(); i += MAX_FDS) {
    std::string text;
    std::vector<int> fds;
    for (size_t k = i; k < inh.sockets.size() && k < i + MAX_FDS; ++k) {
      const auto &s = inh.sockets[k];
      text += std::string(kind_name(s.kind)) + " " + std::to_string(s.worker) + " " +
              (has_address(s.kind) ? s.addr.to_string()
                   : "-") +
              "\n";
      fds.push_back(s.fd);
    }
    if (!send_message(sock, text, fds)) {
      throw std::runtime_error(std::string("upgrade: send: ") + std::strerror(errno));
    }
  }
  if (!send_message(sock, "end\n", {})) {
    throw std::runtime_error(std::string("upgrade: send: ") + std::strerror(errno));
  }
}

Inheritance receive_inheritance(int sock, int timeout_ms) {
  Inheritance inh;
  auto fail = [&](const std::string &why) {
    inh.close_all();
    return std::runtime_error("upgrade: from the running xdpqd: " + why);
  };
  std::string text;
  std::vector<int> fds;
  if (!recv_message(sock, text, fds, timeout_ms)) throw fail(std::strerror(errno));
  int gen = -1, workers = -1;
  {
    std::istringstream in(text);
    std::string word, cid, secrets, reset, token, ticket, lb, dp_word, dp, ifname;
    in >> word >> gen >> workers >> cid >> inh.cid_format >> secrets >> reset >> token >> ticket >>
        lb;
    // Older senders stop here: they ran the socket dataplane.
    if (in >> dp_word >> dp >> ifname) {
      if (dp_word != "dataplane" || (dp != "socket" && dp != "afxdp") || ifname.empty() ||
          ifname.size() >= 16) {
        for (int fd : fds) close(fd);
        throw fail("expected 'dataplane socket|afxdp INTERFACE'");
      }
      inh.dataplane = dp;
      if (ifname != "-") inh.interface = ifname;
    }
    std::array<uint8_t, 16> lb_key{};
    bool ok = word == "inherit" && (gen == 0 || gen == 1) && workers >= 1 && workers <= 127 &&
              cid == "cid" && secrets == "secrets" &&
              parse_hex_into(reset, inh.secrets.reset_key) &&
              parse_hex_into(token, inh.secrets.token_key) &&
              parse_hex_into(ticket, inh.secrets.ticket_key) &&
              (lb == "-" || parse_hex_into(lb, lb_key)) && fds.empty();
    if (!ok) {
      for (int fd : fds) close(fd);
      throw fail("expected 'inherit GENERATION WORKERS', the CID format and the secrets");
    }
    if (lb != "-") inh.secrets.quic_lb_key = lb_key;
  }
  inh.generation = static_cast<uint8_t>(gen);
  inh.workers = workers;
  for (;;) {
    text.clear();
    fds.clear();
    if (!recv_message(sock, text, fds, timeout_ms)) {
      for (int fd : fds) close(fd);
      throw fail(std::strerror(errno));
    }
    if (text == "end\n" && fds.empty()) return inh;
    std::istringstream in(text);
    std::string line;
    size_t used = 0;
    bool bad = false;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      std::string kind, addr;
      int worker = -2;
      Inheritance::Socket s;
      l >> kind >> worker >> addr;
      bad = bad || used >= fds.size() || !kind_of(kind, s.kind) || worker < -1 ||
            worker >= workers;
      // Worker sockets name their worker; the control and metrics ones none.
      const bool per_worker = s.kind != Inheritance::Kind::control &&
                              s.kind != Inheritance::Kind::metrics &&
                              s.kind != Inheritance::Kind::reservation &&
                              s.kind != Inheritance::Kind::xdp_link;
      bad = bad || (per_worker && worker < 0);
      bad = bad || has_address(s.kind) != (addr != "-");
      if (!bad && addr != "-") {
        auto a = dataplane::parse_address(addr);
        bad = !a;
        if (a) s.addr = *a;
      }
      if (bad) break;
      s.worker = worker;
      s.fd = fds[used++];
      inh.sockets.push_back(s);
    }
    if (bad || used != fds.size()) {
      for (size_t k = used; k < fds.size(); ++k) close(fds[k]);
      throw fail("malformed descriptor list");
    }
  }
}

std::string ready_text(const UpgradeReady &r) {
  std::string t = "ready " + std::to_string(r.pid) + " " + std::to_string(r.workers) + " " +
                  std::to_string(r.capacity);
  for (size_t i : r.adopted) t += " " + std::to_string(i);
  return t + "\n";
}

bool parse_ready(const std::string &text, UpgradeReady &r) {
  std::istringstream in(text);
  std::string word;
  in >> word >> r.pid >> r.workers >> r.capacity;
  if (word != "ready" || !in || r.pid <= 0 || r.workers < 1 || r.workers > 127 ||
      r.capacity < 2 || r.capacity > (1u << 16)) {
    return false;
  }
  size_t i;
  while (in >> i) r.adopted.push_back(i);
  return in.eof();
}

std::string running_binary_path() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  std::string p(buf, static_cast<size_t>(n));
  // Replaced by a package upgrade: the new file is at the same path.
  constexpr std::string_view deleted = " (deleted)";
  if (p.ends_with(deleted)) p.resize(p.size() - deleted.size());
  return p;
}

} // namespace xdpq::control
