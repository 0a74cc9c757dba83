// The server's side of a binary upgrade (control/upgrade.h): the running
// process starts the new one and hands over; the new one reports ready.
// Control thread only.

#include "base/log.h"
#include "control/server.h"
#include "control/systemd.h"
#include "control/worker.h"
#include "dataplane/handoff_ring.h"
#include "dataplane/udp_socket_port.h"
#include "dataplane/xdp_program.h"

#include <fcntl.h>
#include <signal.h>
#include <linux/close_range.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char **environ;

namespace xdpq::control {

namespace {
constexpr int READY_TIMEOUT_MS = 30000;

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}
} // namespace

std::string Server::upgrade() {
  auto fail = [](const std::string &why) {
    LOG_ERROR("upgrade failed, still serving: %s", why.c_str());
    return "error: upgrade failed, still serving: " + why;
  };
  if (draining_) return fail("this process is draining");
  if (handed_over_) return fail("an upgrade already happened; this process drains");
  if (inherited_ && upgrade_channel_ >= 0) {
    // Two generations at a time: a third would take the first's bit.
    return fail("the previous process is still finishing its connections; upgrade again once "
                "it has exited");
  }
  if (argv_.empty()) return fail("the command line of this process is unknown");
  const std::string exe = running_binary_path();
  if (exe.empty() || access(exe.c_str(), X_OK) != 0) {
    return fail("cannot run " + (exe.empty() ? std::string("this binary") : exe) + ": " +
                strerror(errno));
  }

  // What the new process takes over.
  Inheritance inh;
  inh.generation = generation_;
  inh.workers = static_cast<int>(workers_.size());
  inh.cid_format = cid_format_;
  inh.secrets = secrets_;
  inh.dataplane = opts_.dataplane;
  const bool afxdp = opts_.dataplane == "afxdp";
  if (afxdp) {
    // The new process loads its own XDP program and puts it on our link;
    // meanwhile these sockets serve.
    inh.interface = opts_.interface;
    for (size_t k = 0; k < reservations_.size(); ++k) {
      inh.sockets.push_back({Inheritance::Kind::reservation, -1, opts_.listen[k], reservations_[k]});
    }
    inh.sockets.push_back({Inheritance::Kind::xdp_link, -1, {}, xdp_link_fd()});
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    const int w = static_cast<int>(i);
    const auto *port = afxdp ? nullptr
                             : dynamic_cast<const dataplane::UdpSocketPort *>(
                                   &workers_[i]->datagram_port());
    if (port) {
      for (const auto &[fd, addr] : port->sockets()) {
        inh.sockets.push_back({Inheritance::Kind::udp, w, addr, fd});
      }
    }
    if (const auto *tcp = workers_[i]->tcp()) {
      for (const auto &l : tcp->listeners()) {
        inh.sockets.push_back({l.tls ? Inheritance::Kind::tcp_tls : Inheritance::Kind::tcp_clear,
                               w, l.bound, l.fd});
      }
    }
    inh.sockets.push_back({Inheritance::Kind::wake, w, {}, workers_[i]->wake_fd()});
  }
  if (control_fd_ >= 0) inh.sockets.push_back({Inheritance::Kind::control, -1, {}, control_fd_});
  if (metrics_fd_ >= 0) inh.sockets.push_back({Inheritance::Kind::metrics, -1, {}, metrics_fd_});

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return fail(std::string("socketpair: ") + strerror(errno));
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls until exec.
  std::vector<std::string> env_strings;
  for (char **e = environ; *e; ++e) {
    if (!std::string_view(*e).starts_with(std::string(UPGRADE_FD_ENV) + "=")) {
      env_strings.emplace_back(*e);
    }
  }
  env_strings.push_back(std::string(UPGRADE_FD_ENV) + "=" + std::to_string(sv[1]));
  std::vector<char *> envp, args;
  for (auto &e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv = argv_;
  for (auto &a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  // The new process starts with our signals still blocked, as it blocks
  // them first thing: one sent before then (logrotate's USR1, a reload's
  // HUP) waits for its signalfd instead of killing it (their default).
  const sigset_t handled = server_signals();

  // From the moment the new process reads our sockets until we stop: its
  // CIDs are dropped here, never answered with a stateless reset.
  for (auto &w : workers_) w->expect_next_generation(true, std::chrono::milliseconds(500));
  bool released = false; // AF_XDP: our workers left the queues to the new process
  auto restore = [this, &released] {
    if (released) restore_afxdp();
    for (auto &w : workers_) w->expect_next_generation(false, std::chrono::milliseconds(500));
  };

  pid_t child = fork();
  if (child < 0) {
    close(sv[0]);
    close(sv[1]);
    restore();
    return fail(std::string("fork: ") + strerror(errno));
  }
  if (child == 0) {
    // Nothing of ours but this end crosses exec, whatever a library
    // opened without O_CLOEXEC: an inherited AF_XDP socket would keep its
    // queue from the new process.
    syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
    fcntl(sv[1], F_SETFD, 0); // this end crosses exec
    sigprocmask(SIG_SETMASK, &handled, nullptr);
    execve(exe.c_str(), args.data(), envp.data());
    _exit(127);
  }
  close(sv[1]);
  LOG_INFO("upgrade: started %s (pid %d); handing over %zu sockets", exe.c_str(), child,
           inh.sockets.size());

  // Every failure: the new process is stopped (if it still runs) and
  // reaped, and our workers answer unknown CIDs again.
  auto abandon = [&](const std::string &why) {
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    close(sv[0]);
    restore();
    return fail(why);
  };
  try {
    send_inheritance(sv[0], inh);
  } catch (const std::exception &e) {
    return abandon(e.what());
  }

  // Wait for its verdict; the watchdog keeps being fed meanwhile.
  const uint64_t wd_usec = sd_watchdog_usec();
  std::string text;
  std::vector<int> fds;
  bool got = false;
  for (int waited = 0; waited < READY_TIMEOUT_MS && !got; waited += 500) {
    got = recv_message(sv[0], text, fds, 500);
    if (got && afxdp && !released && text == "prepared\n" && fds.empty()) {
      // Its program is loaded: our AF_XDP sockets go, the kernel's UDP
      // sockets serve until its program is on the link.
      released = true;
      std::string why = release_afxdp();
      if (!why.empty()) return abandon("cannot release the AF_XDP queues: " + why);
      if (!send_message(sv[0], "released\n", {})) {
        return abandon(std::string("send: ") + strerror(errno));
      }
      LOG_INFO("upgrade: AF_XDP sockets closed; serving through the kernel's UDP sockets until "
               "pid %d takes the queues",
               child);
      got = false;
      text.clear();
      continue;
    }
    if (!got && errno == ETIMEDOUT && stop_pending()) {
      // The stop is not kept waiting (systemd kills what has not stopped
      // within TimeoutStopSec, drain or not): the signal stays queued for
      // the loop, which drains as soon as this returns.
      return abandon("abandoned: the server was asked to stop while the new process was "
                     "starting");
    }
    if (!got && errno != ETIMEDOUT) {
      for (int fd : fds) close(fd);
      int status = 0;
      // Ended (the usual case), or a message we could not take: stop it.
      if (waitpid(child, &status, WNOHANG) != child) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
      }
      close(sv[0]);
      restore();
      return fail("the new process " + exit_text(status) + " before it was ready");
    }
    if (wd_usec) sd_notify_state("WATCHDOG=1");
  }
  UpgradeReady ready;
  if (!got) return abandon("the new process was not ready within 30 s");
  if (text.starts_with("error ")) {
    for (int fd : fds) close(fd);
    std::string why = text.substr(6);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return abandon("the new process refused to start: " + why);
  }
  if (!parse_ready(text, ready) || fds.size() != 1 || ready.pid != child) {
    for (int fd : fds) close(fd);
    return abandon("the new process answered '" + text.substr(0, 80) + "'");
  }
  const size_t prev = workers_.size();
  const size_t next = static_cast<size_t>(ready.workers);
  try {
    upgrade_region_ = std::make_unique<dataplane::HandoffRegion>(fds[0], next * prev,
                                                                 ready.capacity);
  } catch (const std::exception &e) {
    close(fds[0]);
    return abandon(e.what());
  }

  // The new process serves from now on: each of our workers stops reading
  // the sockets it took and takes its connections' datagrams from the
  // rings; then all drain.
  std::vector<std::vector<int>> stop(prev), tcp_kept(prev);
  bool control_taken = false, metrics_taken = false;
  for (size_t k : ready.adopted) {
    if (k >= inh.sockets.size()) continue;
    const auto &s = inh.sockets[k];
    if (s.kind == Inheritance::Kind::udp) stop[static_cast<size_t>(s.worker)].push_back(s.fd);
    if (s.kind == Inheritance::Kind::tcp_tls || s.kind == Inheritance::Kind::tcp_clear)
      tcp_kept[static_cast<size_t>(s.worker)].push_back(s.fd);
    control_taken |= s.kind == Inheritance::Kind::control;
    metrics_taken |= s.kind == Inheritance::Kind::metrics;
  }
  // AF_XDP: while the new process took the queues, our workers served on
  // duplicates of the reserved sockets (release_afxdp()), which the new
  // process reads now (its side door): stop reading them too.
  for (size_t j = 0; j < afxdp_released_ && j < prev; ++j) {
    for (int fd : workers_[j]->datagram_port().fds()) stop[j].push_back(fd);
  }
  for (size_t j = 0; j < prev; ++j) {
    std::vector<dataplane::HandoffRing *> rings;
    for (size_t i = 0; i < next; ++i) rings.push_back(&upgrade_region_->ring(i * prev + j));
    workers_[j]->request_handover(std::move(rings), std::move(stop[j]), std::move(tcp_kept[j]));
  }
  handed_over_ = control_taken;
  upgrade_child_ = child;
  // What the new process took is its alone: two processes accepting on
  // one metrics socket would answer scrapes in turn.
  if (control_taken && metrics_taken) stop_admin_listening(AdminServer::Which::both);
  else if (control_taken) stop_admin_listening(AdminServer::Which::control);
  else if (metrics_taken) stop_admin_listening(AdminServer::Which::metrics);
  upgrade_channel_ = sv[0];
  watch_upgrade_channel();
  // systemd follows the service to its new main process (sent by us, the
  // main process, as NotifyAccess=main wants).
  sd_notify_state(("MAINPID=" + std::to_string(child)).c_str());
  LOG_INFO("upgrade: pid %d (generation %d, %d workers) serves new connections; this process "
           "(pid %d) finishes its own",
           child, generation_ ^ 1, ready.workers, getpid());
  begin_drain("upgrade", false);
  return "upgraded: pid " + std::to_string(child) + " serves new connections; pid " +
         std::to_string(getpid()) + " finishes its own";
}

void Server::take_queues_from_previous() {
  if (!send_message(upgrade_channel_, "prepared\n", {})) {
    throw std::runtime_error(std::string("binary upgrade: send: ") + strerror(errno));
  }
  std::string text;
  std::vector<int> fds;
  const bool got = recv_message(upgrade_channel_, text, fds, 10000);
  const int err = errno;
  for (int fd : fds) close(fd);
  if (!got) {
    throw std::runtime_error(std::string("binary upgrade: the running xdpqd did not release its "
                                         "AF_XDP queues: ") +
                             strerror(err));
  }
  if (text != "released\n") {
    throw std::runtime_error("binary upgrade: the running xdpqd answered '" +
                             text.substr(0, 80) + "' instead of releasing its AF_XDP queues");
  }
}

std::string Server::release_afxdp() {
  // What the kernel queued on these sockets while AF_XDP served (packets
  // for queues without a socket, frames the XDP program passed) is old:
  // dropped, not served now.
  char junk[1];
  for (int fd : reservations_) {
    for (int i = 0; i < 100000 && recv(fd, junk, sizeof(junk), MSG_DONTWAIT | MSG_TRUNC) >= 0;
         ++i) {
    }
  }
  for (auto &w : workers_) {
    dataplane::UdpSocketOptions o;
    o.check_in_use = false;
    for (size_t k = 0; k < reservations_.size(); ++k) {
      int fd = fcntl(reservations_[k], F_DUPFD_CLOEXEC, 0);
      if (fd < 0) {
        for (auto &[a, f] : o.inherited) close(f);
        return std::string("dup: ") + strerror(errno);
      }
      o.inherited.emplace_back(opts_.listen[k], fd);
    }
    std::unique_ptr<dataplane::UdpSocketPort> port;
    try {
      port = std::make_unique<dataplane::UdpSocketPort>(opts_.listen, o);
    } catch (const std::exception &e) {
      for (auto &[a, f] : o.inherited) close(f);
      return e.what();
    }
    // Counted once handed over: a worker that does not answer in time
    // still moves when it gets to it.
    ++afxdp_released_;
    if (!w->replace_port(std::move(port), nullptr, std::chrono::seconds(2))) {
      return "a worker did not answer";
    }
  }
  return {};
}

bool Server::restore_afxdp() {
  std::string why = try_restore_afxdp();
  if (why.empty()) return true;
  LOG_ERROR("upgrade: cannot go back to AF_XDP (%s); serving through the kernel's UDP sockets",
            why.c_str());
  return false;
}

std::string Server::try_restore_afxdp() {
#ifdef XDPQ_HAVE_AFXDP
  // The new process is gone (killed and reaped): its sockets let go of the
  // queues a moment later (AfXdpOptions::busy_wait). Every port first,
  // then our program on the link, then the workers move: a failure on the
  // way destroys what was built and leaves every worker on the kernel
  // sockets, which the kernel feeds while no socket holds a queue.
  const bool watchdog = sd_watchdog_usec() != 0;
  std::vector<std::unique_ptr<dataplane::AfXdpPort>> ports;
  for (size_t i = 0; i < afxdp_released_ && i < workers_.size(); ++i) {
    try {
      ports.push_back(std::make_unique<dataplane::AfXdpPort>(afxdp_options(i, true), *program_));
    } catch (const std::exception &e) {
      return e.what();
    }
    if (watchdog) sd_notify_state("WATCHDOG=1"); // each may wait seconds for its queue
  }
  try {
    program_->update_link();
  } catch (const std::exception &e) {
    return e.what();
  }
  for (size_t i = 0; i < ports.size(); ++i) {
    auto *raw = ports[i].get();
    if (!workers_[i]->replace_port(std::move(ports[i]), raw, std::chrono::seconds(2))) {
      LOG_WARN("upgrade: worker %zu has not moved back to AF_XDP yet", i);
    }
  }
  afxdp_released_ = 0;
  LOG_INFO("upgrade: back on AF_XDP (prog id %u)", program_->prog_id());
  return {};
#else
  return "built without AF_XDP support";
#endif
}

int Server::xdp_link_fd() const {
#ifdef XDPQ_HAVE_AFXDP
  return program_ ? program_->link_fd() : -1;
#else
  return -1;
#endif
}

void Server::report_ready_to_previous() {
  if (!inherited_ || upgrade_channel_ < 0) return;
  UpgradeReady r;
  r.pid = getpid();
  r.workers = static_cast<int>(workers_.size());
  r.capacity = upgrade_capacity_;
  r.adopted = adopted_;
  int fd = upgrade_region_->fd();
  if (!send_message(upgrade_channel_, ready_text(r), {&fd, 1})) {
    LOG_ERROR("upgrade: cannot tell the previous process we are ready: %s", strerror(errno));
  }
  reported_ready_ = true;
  close_unadopted();
}

void Server::close_unadopted() {
  if (!inherited_) return;
  std::vector<bool> keep(inherited_->sockets.size(), false);
  for (size_t k : adopted_) {
    if (k < keep.size()) keep[k] = true;
  }
  for (size_t k = 0; k < keep.size(); ++k) {
    auto &s = inherited_->sockets[k];
    if (!keep[k] && s.fd >= 0) close(s.fd);
    s.fd = -1; // the adopted ones belong to their users now
  }
}

} // namespace xdpq::control
