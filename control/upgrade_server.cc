// The server's side of a binary upgrade (control/upgrade.h): the running
// process starts the new one and hands over; the new one reports ready.
// Control thread only.

#include "base/log.h"
#include "control/server.h"
#include "control/systemd.h"
#include "control/worker.h"
#include "dataplane/handoff_ring.h"
#include "dataplane/udp_socket_port.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
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
  if (opts_.dataplane != "socket") {
    // No hand-over of AF_XDP sockets yet: a reload (systemctl reload runs
    // `xdpqctl upgrade`) still does what it did before.
    LOG_WARN("upgrade: --dataplane %s cannot hand over to a new process yet; reloading the "
             "certificate instead (restart for a new binary or configuration)",
             opts_.dataplane.c_str());
    std::string r = reload();
    return r.starts_with("error: ") ? r
                                    : "no binary upgrade on --dataplane " + opts_.dataplane +
                                          " yet (restart for a new binary or configuration); " +
                                          r;
  }
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
  for (size_t i = 0; i < workers_.size(); ++i) {
    const int w = static_cast<int>(i);
    const auto *port = dynamic_cast<const dataplane::UdpSocketPort *>(&workers_[i]->datagram_port());
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
  sigset_t none;
  sigemptyset(&none);

  // From the moment the new process reads our sockets until we stop: its
  // CIDs are dropped here, never answered with a stateless reset.
  for (auto &w : workers_) w->expect_next_generation(true, std::chrono::milliseconds(500));
  auto restore = [this] {
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
    fcntl(sv[1], F_SETFD, 0); // this end crosses exec
    sigprocmask(SIG_SETMASK, &none, nullptr);
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
  std::vector<std::vector<int>> stop(prev);
  bool control_taken = false;
  for (size_t k : ready.adopted) {
    if (k >= inh.sockets.size()) continue;
    const auto &s = inh.sockets[k];
    if (s.kind == Inheritance::Kind::udp) stop[static_cast<size_t>(s.worker)].push_back(s.fd);
    control_taken |= s.kind == Inheritance::Kind::control;
  }
  for (size_t j = 0; j < prev; ++j) {
    std::vector<dataplane::HandoffRing *> rings;
    for (size_t i = 0; i < next; ++i) rings.push_back(&upgrade_region_->ring(i * prev + j));
    workers_[j]->request_handover(std::move(rings), std::move(stop[j]));
  }
  handed_over_ = control_taken;
  upgrade_child_ = child;
  if (control_taken) stop_admin_listening();
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
