// The control thread: signals, the systemd watchdog, reload and drain,
// the binary-upgrade channel. It never touches a worker's state: it asks
// through the worker's mailboxes. (The control socket: control_socket.cc.)

#include "control/admin.h"
#include "control/config.h"
#include "control/counters.h"
#include "base/log.h"
#include "control/self_signed.h"
#include "control/server.h"
#include "control/systemd.h"
#include "control/worker.h"
#include "dataplane/local_addresses.h"
#include "dataplane/xdp_program.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "xdpq_version.h"

namespace xdpq::control {

namespace {
// How long a reload may take to check the new configuration.
constexpr std::chrono::seconds RELOAD_CHECK_LIMIT{30};
} // namespace

bool stop_pending() {
  sigset_t set;
  if (sigpending(&set) != 0) return false;
  return sigismember(&set, SIGTERM) == 1 || sigismember(&set, SIGINT) == 1;
}

// A fresh access log file at the configured path (logrotate moved the old
// one). "" or "; access log not reopened, ...: why".
std::string Server::reopen_access_log(const char *why) {
  if (!access_log_) return {};
  try {
    access_log_->reopen();
    return {};
  } catch (const std::exception &e) {
    LOG_ERROR("%s: access log %s", why, e.what());
    return std::string("; access log not reopened, still writing the old file: ") + e.what();
  }
}

std::string Server::reload() {
  // With the time it began (systemd 253 and later match reload cycles by
  // it; Type=notify-reload requires it).
  sd_notify_state(("RELOADING=1\nMONOTONIC_USEC=" +
                   std::to_string(dataplane::monotonic_ns() / 1000))
                      .c_str());
  // The access log first, whatever else happens.
  std::string log_note = reopen_access_log("reload");
  // Staged: nothing is applied until every part has been checked.
  struct Staged {
    std::shared_ptr<const http::ProxyConfig> new_proxy; // changed routes
    std::string log_level, cert_file, key_file;
    std::shared_ptr<quic::TlsConfig> cfg;
    std::string result;
    std::string kept; // "; kept the running value of ..." or empty
  };
  // Everything the check reads is copied in: if it outlives the reload (a
  // resolver that never answers), it touches nothing of ours.
  auto stage = [opts_ = opts_, argv_ = argv_, tls_cfg_ = tls_cfg_, secrets_ = secrets_] {
    Staged st{nullptr, opts_.log_level, opts_.cert_file, opts_.key_file, nullptr, {}, {}};
    // Re-read the configuration file for what can change without a
    // restart; the command line's flags still override it.
    if (!opts_.config_file.empty()) {
      std::vector<std::string> argv = argv_;
      if (argv.empty()) argv = {"xdpqd", "--config", opts_.config_file};
      std::vector<const char *> cargv;
      for (auto &a : argv) cargv.push_back(a.c_str());
      Options fresh = parse_options(static_cast<int>(cargv.size()), cargv.data());
      if (fresh.proxy.describe() != opts_.proxy.describe()) {
        st.new_proxy = std::make_shared<const http::ProxyConfig>(fresh.proxy);
      }
      st.log_level = fresh.log_level;
      if (!fresh.cert_file.empty()) {
        st.cert_file = fresh.cert_file;
        st.key_file = fresh.key_file;
      }
      // What else the file changed keeps its running value: named, so
      // that nobody takes it for applied.
      // What the command line gives it overrides, here as at a start or an
      // upgrade (which keeps the command line): named too.
      std::vector<std::string> overridden;
      auto kept = changed_config_keys(
          opts_.file_flags, fresh.file_flags,
          {"server.log_level", "tls.cert", "tls.key", "proxy_defaults.*", "[[proxy]]"}, argv,
          &overridden);
      if (fresh.cert_file.empty() && !opts_.cert_file.empty()) {
        // Removed: the running pair is reloaded from its files; only a
        // restart turns to a self-signed certificate.
        kept.insert(kept.begin(), {"tls.cert", "tls.key"});
      }
      if (!kept.empty()) {
        std::string names;
        for (const auto &k : kept) names += (names.empty() ? "" : ", ") + k;
        st.kept = "; kept the running value of " + names +
                  " (xdpqctl upgrade, or a restart, applies " +
                  (kept.size() > 1 ? "them)" : "it)");
        LOG_WARN("reload: changed in the file but not applied: %s (xdpqctl upgrade, or a "
                 "restart, applies %s)",
                 names.c_str(), kept.size() > 1 ? "them" : "it");
      }
      if (!overridden.empty()) {
        std::string names;
        for (const auto &k : overridden) names += (names.empty() ? "" : ", ") + k;
        st.kept += "; not applied: " + names + " (the command line's flag" +
                   (overridden.size() > 1 ? "s override" : " overrides") + " the file)";
        LOG_WARN("reload: changed in the file but overridden by the command line: %s",
                 names.c_str());
      }
    }
    if (st.cert_file.empty()) {
      st.result = "no --cert/--key: no certificate to reload (self-signed)";
    } else {
      auto read = [](const std::string &p) {
        std::ifstream in(p, std::ios::binary);
        if (!in) throw std::runtime_error(p + ": cannot read");
        std::ostringstream ss;
        ss << in.rdbuf();
        return ss.str();
      };
      st.cfg = std::make_shared<quic::TlsConfig>(tls_cfg_);
      st.cfg->cert_pem = read(st.cert_file);
      st.cfg->key_pem = read(st.key_file);
      quic::TlsContext probe(*st.cfg, secrets_); // throws on a bad pair: keep the old one
      st.result = "certificate reloaded, SHA-256 fingerprint " +
                  certificate_fingerprint(st.cfg->cert_pem);
    }
    return st;
  };
  std::string result;
  try {
    // One check at a time: a check given up on (below) may still wait on
    // its resolver, and each reload meanwhile would leave one more thread.
    if (reload_check_running_->load()) {
      throw std::runtime_error("the previous reload's check of the configuration is still "
                               "running (a name whose resolver does not answer); try again "
                               "once it has ended");
    }
    // Checked on a thread of its own: resolving upstream names can wait on
    // a resolver that does not answer for longer than systemd's watchdog
    // allows, and this thread feeds the watchdog meanwhile, for at most
    // RELOAD_CHECK_LIMIT: then the reload fails and the check, left to
    // finish alone, is dropped.
    struct Pending {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::optional<Staged> st;
      std::exception_ptr error;
    };
    auto pending = std::make_shared<Pending>();
    reload_check_running_->store(true);
    // (A thread that cannot be made throws: then no check runs.)
    struct NotStarted {
      std::atomic<bool> *flag;
      ~NotStarted() {
        if (flag) flag->store(false);
      }
    } not_started{reload_check_running_.get()};
    std::thread([pending, stage = std::move(stage), running = reload_check_running_] {
      std::optional<Staged> st;
      std::exception_ptr error;
      try {
        st = stage();
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(pending->mu);
      pending->st = std::move(st);
      pending->error = error;
      pending->done = true;
      pending->cv.notify_all();
      running->store(false);
    }).detach();
    not_started.flag = nullptr;
    const auto give_up = std::chrono::steady_clock::now() + RELOAD_CHECK_LIMIT;
    std::unique_lock lock(pending->mu);
    while (!pending->done) {
      if (stop_pending()) {
        // The stop is not kept waiting (systemd kills what has not
        // stopped within TimeoutStopSec, drain or not): the signal stays
        // queued for the loop, which drains as soon as this returns.
        throw std::runtime_error("abandoned: the server was asked to stop while the new "
                                 "configuration was being checked");
      }
      if (std::chrono::steady_clock::now() >= give_up) {
        throw std::runtime_error("checking the new configuration took longer than " +
                                 std::to_string(RELOAD_CHECK_LIMIT.count()) +
                                 " s (a name whose resolver does not answer, a file that does "
                                 "not open)");
      }
      lock.unlock();
      feed_watchdog();
      lock.lock();
      pending->cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    if (pending->error) std::rethrow_exception(pending->error);
    Staged st = std::move(*pending->st);
    lock.unlock();
    result = st.result;
    // Last: nothing above changed anything, and below only the first step
    // can fail (before it changes anything): a failed reload changes nothing.
    if (st.cfg && tcp_tls_) tcp_tls_->reload(st.cfg->cert_pem, st.cfg->key_pem);
    if (st.log_level != opts_.log_level) {
      log::set_level(*log::parse_level(st.log_level));
      opts_.log_level = st.log_level;
    }
    opts_.cert_file = st.cert_file;
    opts_.key_file = st.key_file;
    if (st.cfg) {
      for (auto &w : workers_) w->request_reload(st.cfg);
      tls_cfg_ = *st.cfg;
    }
    if (st.new_proxy) {
      for (auto &w : workers_) w->request_proxy_reload(st.new_proxy);
      // A worker's last figures stand in for it when it misses a scrape:
      // its upstreams' move to their places in the new routes, as the
      // workers carry an upstream's counters over (same route, same URL);
      // the others start from nothing.
      const auto before = upstream_labels(opts_.proxy);
      const auto after = upstream_labels(*st.new_proxy);
      for (auto &s : last_snapshots_) {
        if (!s) continue;
        std::vector<http::UpstreamStats> moved(after.size());
        for (size_t i = 0; i < after.size(); ++i) {
          for (size_t j = 0; j < before.size() && j < s->upstreams.size(); ++j) {
            if (before[j].route == after[i].route && before[j].url == after[i].url) {
              moved[i] = s->upstreams[j];
              break;
            }
          }
        }
        s->upstreams = std::move(moved);
      }
      opts_.proxy = *st.new_proxy;
      result = "proxy routes replaced (" + std::to_string(st.new_proxy->routes.size()) +
               " routes); " + result;
    }
    LOG_INFO("reload: %s", result.c_str());
    result += st.kept;
  } catch (const std::exception &e) {
    result = std::string("error: ") + e.what();
    LOG_ERROR("reload failed, nothing changed: %s", e.what());
  }
  sd_notify_state("READY=1");
  return result + log_note;
}

void Server::begin_drain(const char *why, bool notify_systemd) {
  if (draining_) return;
  draining_ = true;
  LOG_INFO("%s: draining (GOAWAY, up to %llu ms for requests in flight)", why,
           static_cast<unsigned long long>(opts_.drain_timeout_ms));
  // After a binary upgrade the service goes on in the new process.
  if (notify_systemd) sd_notify_state("STOPPING=1");
  uint64_t deadline = dataplane::monotonic_ns() + opts_.drain_timeout_ms * 1'000'000ull;
  for (auto &w : workers_) w->request_drain(deadline);
}

namespace {

// The control thread's signals, read from a signalfd in its event loop.
class SignalReader final : public dataplane::FdHandler {
public:
  explicit SignalReader(Server &srv) : srv_(srv) {
    const sigset_t set = server_signals();
    fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error(std::string("signalfd: ") + strerror(errno));
  }
  ~SignalReader() { close(fd_); }
  int fd() const { return fd_; }
  void on_io(uint32_t) override {
    signalfd_siginfo si;
    while (read(fd_, &si, sizeof(si)) == sizeof(si)) srv_.on_signal(static_cast<int>(si.ssi_signo));
  }

private:
  Server &srv_;
  int fd_ = -1;
};

} // namespace

void Server::on_signal(int signo) {
  if (signo == SIGHUP) {
    reload();
  } else if (signo == SIGUSR1) {
    // logrotate's signal: the access log only. A reload would also apply
    // whatever the configuration file says by then.
    if (reopen_access_log("SIGUSR1").empty() && access_log_) LOG_INFO("SIGUSR1: access log reopened");
  } else if (signo == SIGUSR2) {
    upgrade(); // logs its result
  } else if (signo == SIGTERM) {
    // Remembered even while draining after an upgrade: the new process
    // ending then is the service stopping, not a crash to recover from.
    stop_asked_ = true;
    begin_drain("SIGTERM");
  } else if (!hard_stop_) { // SIGINT: stop now
    hard_stop_ = true;
    LOG_INFO("SIGINT: closing connections and stopping");
    for (auto &w : workers_) w->request_stop();
  }
}

// The end of the binary-upgrade channel: the other process exited.
class ChannelWatch final : public dataplane::FdHandler {
public:
  explicit ChannelWatch(Server &srv) : srv_(srv) {}
  void on_io(uint32_t) override { srv_.upgrade_channel_closed(); }

private:
  Server &srv_;
};

// The host's address changes (AF_XDP serving a wildcard listen).
class AddressWatch final : public dataplane::FdHandler {
public:
  explicit AddressWatch(dataplane::LocalAddresses &a) : a_(a) {}
  void on_io(uint32_t) override { a_.on_readable(); }

private:
  dataplane::LocalAddresses &a_;
};

// The control thread's loop: signals, admin clients and the watchdog, all
// non-blocking; a tick checks the workers.
struct Server::ControlLoop final : public dataplane::LoopHandler {
  static constexpr uint64_t TICK_NS = 100'000'000;
  Server &srv;
  dataplane::EventLoop loop;
  SignalReader signals;
  AdminServer admin;
  ChannelWatch channel{srv};
  std::unique_ptr<AddressWatch> addresses;
  dataplane::Timer tick;
  uint64_t wd_usec;
  uint64_t wd_next;
  std::vector<uint64_t> beats;

  explicit ControlLoop(Server &s)
      : srv(s), signals(s), admin(loop, s, s.control_fd_, s.metrics_fd_), tick(on_tick, this),
        wd_usec(sd_watchdog_usec()), wd_next(dataplane::monotonic_ns()),
        beats(s.workers_.size(), UINT64_MAX) {
    loop.watch(signals.fd(), &signals);
    if (s.local_addresses_) {
      addresses = std::make_unique<AddressWatch>(*s.local_addresses_);
      loop.watch(s.local_addresses_->fd(), addresses.get());
    }
    loop.timers().schedule(tick, loop.now());
  }
  ~ControlLoop() {
    loop.unwatch(signals.fd());
    if (addresses) loop.unwatch(srv.local_addresses_->fd());
  }

  static void on_tick(dataplane::Timer &t) {
    auto *self = static_cast<ControlLoop *>(t.owner());
    self->check();
    self->loop.timers().schedule(t, self->loop.now() + TICK_NS);
  }

  void check() {
    bool all_stopped = true;
    for (auto &w : srv.workers_) {
      all_stopped &= w->stopped();
      if (w->failed() && !srv.failed_) {
        srv.failed_ = true;
        srv.hard_stop_ = true;
        for (auto &o : srv.workers_) o->request_stop();
      }
    }
    if (all_stopped) {
      loop.stop();
      return;
    }
    // After a hand-over the workers wait for each other: once every one of
    // them is idle, the old process is done.
    if (srv.upgrade_child_ > 0 && !srv.hard_stop_) {
      bool all_idle = true;
      for (auto &w : srv.workers_) all_idle &= w->stopped() || w->idle_after_handover();
      if (all_idle) {
        srv.hard_stop_ = true;
        for (auto &w : srv.workers_) w->request_stop();
      }
    }
    feed_watchdog();
  }

  // Watchdog: ping only while every worker's loop keeps turning, and only
  // while we are the main process (after an upgrade handed that to the new
  // process, systemd takes pings from it alone). The clock is read afresh:
  // a reload calls this while the loop waits.
  void feed_watchdog() {
    uint64_t now = dataplane::monotonic_ns();
    if (wd_usec && now >= wd_next && srv.upgrade_child_ <= 0) {
      bool alive = true;
      for (size_t i = 0; i < srv.workers_.size(); ++i) {
        uint64_t b = srv.workers_[i]->heartbeat();
        if ((b == beats[i] && !srv.workers_[i]->stopped()) || srv.workers_[i]->failed()) {
          alive = false;
        }
        beats[i] = b;
      }
      if (alive) sd_notify_state("WATCHDOG=1");
      else LOG_ERROR("a worker stopped making progress; withholding the watchdog ping");
      wd_next = now + wd_usec * 1000 / 2;
    }
  }

  void on_iteration_end() override { admin.end_of_pass(); }
  void on_wake() override {}
};

void Server::feed_watchdog() {
  if (control_) control_->feed_watchdog();
}

const AdminStats *Server::admin_stats() const {
  return control_ ? &control_->admin.stats() : nullptr;
}

void Server::stop_admin_listening(AdminServer::Which which) {
  if (control_) control_->admin.stop_listening(which);
}

void Server::watch_upgrade_channel() {
  if (control_ && upgrade_channel_ >= 0) control_->loop.watch(upgrade_channel_, &control_->channel);
}

void Server::upgrade_channel_closed() {
  // Nothing more is ever sent on it: readable means the other side ended.
  char b[64];
  if (recv(upgrade_channel_, b, sizeof(b), MSG_DONTWAIT) < 0 && errno == EAGAIN) return;
  control_->loop.unwatch(upgrade_channel_);
  close(upgrade_channel_);
  upgrade_channel_ = -1;
  // Our own successor first: a process that was itself started by an
  // upgrade (inherited_) and has since upgraded again is the old process
  // of the second upgrade (its predecessor is long gone: a process with a
  // live predecessor refuses to upgrade).
  if (upgrade_child_ > 0) {
    // Its descriptors close before it becomes a zombie: wait a moment
    // for its status.
    int status = 0;
    pid_t reaped = 0;
    for (int i = 0; i < 100 && reaped == 0; ++i) {
      reaped = waitpid(upgrade_child_, &status, WNOHANG);
      if (reaped == 0) usleep(10'000);
    }
    const bool clean = reaped == upgrade_child_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (stop_asked_ || clean) {
      // Stopped on purpose (systemd stops the whole service with SIGTERM,
      // or someone stopped the new process): we finish our drain and
      // exit, as the upgrade left us to.
      LOG_INFO("upgrade: the new process (pid %d) stopped; this process finishes its drain",
               upgrade_child_);
      return;
    }
    // The new process died after it took over: without us nobody would
    // read the sockets (outside systemd, nobody would restart it either).
    LOG_ERROR("upgrade: the new process (pid %d) exited after taking over (%s %d); taking the "
              "sockets back and serving on",
              upgrade_child_, reaped != upgrade_child_ ? "status unknown" :
                              WIFSIGNALED(status) ? "signal" : "status",
              reaped != upgrade_child_ ? 0 : WIFSIGNALED(status) ? WTERMSIG(status)
                                                                  : WEXITSTATUS(status));
    upgrade_child_ = -1;
    // systemd first: the dead main process must not make it stop us.
    sd_notify_state(("MAINPID=" + std::to_string(getpid()) + "\nREADY=1").c_str());
    if (afxdp_released_) restore_afxdp();
    for (auto &w : workers_) w->request_take_back();
    draining_ = false;
    handed_over_ = false;
    // Only the socket the new process took (it may have bound another
    // path, and ours was never stopped).
    if (const int old = control_->admin.control_listening() ? -1 : rebind_control(); old >= 0) {
      control_->admin.replace_control_fd(control_fd_);
      close(old);
    }
    control_->admin.resume_listening();
  } else if (inherited_) {
    LOG_INFO("upgrade: the previous process exited; its connection IDs are unknown from now on");
    for (auto &w : workers_) w->request_previous_gone();
    // Its workers' wake descriptors and the rings to them are ours to
    // free once no worker of ours can touch them (else kept: a few
    // descriptors leaked beat a write into a reused one).
    bool all = true;
    for (auto &w : workers_) all &= w->wait_previous_gone(std::chrono::milliseconds(500));
    if (all) {
      for (int fd : previous_wake_fds_) close(fd);
      previous_wake_fds_.clear();
      upgrade_region_.reset();
    }
  }
}

int Server::run() {
  ControlLoop control(*this);
  control_ = &control;
#ifdef XDPQ_HAVE_AFXDP
  // Binary upgrade: from here on the queues' packets reach our sockets.
  if (inherited_ && program_) program_->update_link();
#endif
  for (auto &w : workers_) w->start();
  sd_notify_state("READY=1");
  report_ready_to_previous();
  watch_upgrade_channel();
  control.loop.run(control);
  if (upgrade_channel_ >= 0) control.loop.unwatch(upgrade_channel_);
  control_ = nullptr;
  for (auto &w : workers_) w->join();
  std::vector<WorkerSnapshot> snaps;
  for (auto &w : workers_) {
    snaps.push_back(w->final_snapshot());
    LOG_INFO("worker %d: %s", snaps.back().id, counters_line(counters_of(snaps.back())).c_str());
  }
  Counters all = sum(snaps);
  Counters xdp = xdp_counters(program_.get());
  all.insert(all.end(), xdp.begin(), xdp.end());
  LOG_INFO("stats %s", counters_json(all).c_str());
  if (failed_) {
    LOG_ERROR("exiting with status 1: a worker failed (see above)");
    return 1;
  }
  return 0;
}

} // namespace xdpq::control
