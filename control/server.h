#pragma once
// The daemon's runtime: certificate and secrets, one worker thread per CPU
// (each with its own sockets, TLS context, QUIC endpoint and timer wheel),
// signal handling and shutdown.

#include "control/admin.h"
#include "control/capture.h"
#include "control/options.h"
#include "control/upgrade.h"
#include "http/h3_session.h"
#include "http/router.h"
#include "quic/endpoint.h"
#include "quic/secrets.h"
#include "quic/tls_context.h"
#ifdef XDPQ_HAVE_AFXDP
#include "dataplane/afxdp_port.h"
#endif

#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

namespace xdpq::http {
class TcpTlsContext;
}
namespace xdpq::dataplane {
class HandoffRegion;
class LocalAddresses;
class UdpSocketPort;
class XdpProgram;
} // namespace xdpq::dataplane

namespace xdpq::control {

class Worker;
struct WorkerSnapshot;

// SIGTERM or SIGINT waits to be read: the server signals are blocked in
// every thread and read from the control loop's signalfd. Work that keeps
// the control thread (a reload's check, an upgrade's wait) gives up for it.
bool stop_pending();

class Server final : public AdminHandler {
public:
  // Prepares everything that can fail on bad input: files, addresses,
  // sockets. Throws UsageError for configuration problems (exit 2) and
  // std::runtime_error for others. argv: how this process was started (a
  // binary upgrade starts the new one alike); upgrade_fd: this process's
  // end of the channel to the running xdpqd that started it (-1: none).
  Server(const Options &opts, std::vector<std::string> argv = {}, int upgrade_fd = -1);
  ~Server();
  Server(const Server &) = delete;
  Server &operator=(const Server &) = delete;

  // Runs the workers and the control plane (signals, control socket,
  // metrics, watchdog) until stopped; returns the exit status.
  int run();

  // The control thread's signal handler (SIGHUP reload, SIGTERM drain,
  // SIGINT stop now, SIGUSR1 reopen the access log, SIGUSR2 binary upgrade).
  void on_signal(int signo);
  // The control thread: the binary-upgrade channel became readable (the
  // other process exited).
  void upgrade_channel_closed();

  // AdminHandler: requests from the control socket and the metrics port.
  std::string control_request(const std::string &line) override;
  bool metrics_page(std::string_view path, std::string &body) override;
  // The control thread's admin clients' counters (null outside run()).
  const AdminStats *admin_stats() const;

  // How long a status, stats, conns or metrics request waits for each
  // worker's snapshot.
  static constexpr std::chrono::milliseconds SNAPSHOT_WAIT{500};

private:
  struct ControlLoop;
  // control_socket.cc
  void open_control();
  void close_control();
  // After a take-back: if the control socket's path went away, binds it
  // afresh and returns the old descriptor (to close once unused), else -1.
  int rebind_control();
  std::string command(const std::vector<std::string> &args, bool json);
  // Every worker's snapshot, all asked for at once with one deadline
  // (SNAPSHOT_WAIT); the ids of workers that did not answer in time (stuck,
  // or busy past it) go to unanswered, so that no output leaves them out
  // without saying so. With last_known, such a worker's last snapshot
  // stands in for it (if it ever answered). A worker that missed a round
  // and has not turned its loop since is not waited for again: a stuck
  // worker costs the control thread (its signals, other admin clients)
  // one wait, not one per request.
  std::vector<WorkerSnapshot> snapshots(bool with_conns, std::vector<int> &unanswered,
                                        bool last_known = false);
  std::vector<std::optional<WorkerSnapshot>> last_snapshots_; // by worker index
  std::vector<std::optional<uint64_t>> missed_at_beat_;      // by worker index: its heartbeat then
  // A reload's check thread runs (it may outlive the reload that gave up
  // on it): the next reload waits for it to end.
  std::shared_ptr<std::atomic<bool>> reload_check_running_ =
      std::make_shared<std::atomic<bool>>(false);
  std::string status_text(bool json);
  std::string stats_text(bool json);
  // ,"upstreams":[...] per upstream summed over workers; empty without any.
  std::string upstreams_json(const std::vector<WorkerSnapshot> &snaps) const;
  std::string conns_text(bool json);
  // control_plane.cc
  std::string reload();
  std::string reopen_access_log(const char *why);
  void feed_watchdog(); // from the control thread, while it waits on something
  void begin_drain(const char *why, bool notify_systemd = true);
  // Binary upgrade (control thread): starts the new process, hands it the
  // sockets, and drains once it is ready; "error: ..." if it failed (this
  // process keeps serving).
  std::string upgrade();
  // The new process: tells the previous one it is ready.
  void report_ready_to_previous();
  // Closes inherited descriptors this process did not take.
  void close_unadopted();
  // control_plane.cc: the admin listeners went to the new process; the
  // channel to the other process is watched for its end.
  void stop_admin_listening(AdminServer::Which which);
  void watch_upgrade_channel();
  // Reserves the ports, attaches the XDP program and creates the AF_XDP
  // workers (afxdp_workers(), each on its share of the queues); returns a
  // description for the ready line.
  std::string start_afxdp(const quic::TlsConfig &tls_cfg, const quic::Secrets &secrets,
                          const std::shared_ptr<const http::Router> &router,
                          quic::EndpointConfig ecfg);

  // AF_XDP: --workers, or one per queue.
  size_t afxdp_workers() const {
    return opts_.workers > 0 ? static_cast<size_t>(opts_.workers) : opts_.queues.size();
  }
#ifdef XDPQ_HAVE_AFXDP
  // after_other: another process just closed its socket on the queue.
  dataplane::AfXdpOptions afxdp_options(size_t worker, bool after_other) const;
#endif
  // Binary upgrade on AF_XDP (upgrade_server.cc). The new process: tells
  // the running xdpqd its program is loaded and waits until that one has
  // closed its AF_XDP sockets. The old process: moves its workers to the
  // kernel UDP sockets that hold the ports (release) or back to AF_XDP
  // sockets with its program on the link (restore: false, and logged
  // why, if it stays on the kernel sockets); release: "" or why not.
  void take_queues_from_previous();
  // A wildcard listen on AF_XDP: the XDP program learns the host's
  // addresses (and their changes, on the control thread).
  void follow_local_addresses();
  std::string release_afxdp();
  bool restore_afxdp();
  std::string try_restore_afxdp();
  int xdp_link_fd() const;

  // Adds HTTP/2 + HTTP/1.1 over TLS on the QUIC addresses to every worker.
  // The TCP side on every worker, with tcp_tls_ (built and checked in
  // the constructor).
  void start_tcp(const std::shared_ptr<const http::Router> &router,
                 const std::vector<dataplane::Address> &quic_listen);

  Options opts_;
  quic::TlsConfig tls_cfg_;
  http::H3Limits h3_limits_;
  quic::Secrets secrets_;
  // The 0-RTT anti-replay store every worker's TLS contexts share.
  std::shared_ptr<quic::ReplayStore> replays_;
  std::shared_ptr<http::AccessLog> access_log_; // --access-log; null: none
  std::string dataplane_info_;
  std::vector<dataplane::Address> listen_;
  Capture capture_;
  int control_fd_ = -1;
  std::string control_path_;
  int metrics_fd_ = -1;
  uint64_t started_at_ = 0;
  bool draining_ = false;
  bool hard_stop_ = false;
  bool stop_asked_ = false; // SIGTERM came (the service is stopping)
  bool failed_ = false; // a worker failed: exit status 1
  std::shared_ptr<http::TcpTlsContext> tcp_tls_;
  std::vector<int> reservations_; // kernel sockets holding AF_XDP-served ports
  std::unique_ptr<dataplane::XdpProgram> program_; // outlives the workers
  // AF_XDP with a wildcard listen: the host's addresses, kept in program_.
  std::unique_ptr<dataplane::LocalAddresses> local_addresses_;
  bool local_full_logged_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  dataplane::UdpSocketPort *steering_port_ = nullptr;

  // Binary upgrade.
  std::vector<std::string> argv_;
  uint8_t generation_ = 0;
  std::string cid_format_ = "unroutable"; // what our CIDs look like (upgrade check)
  std::optional<Inheritance> inherited_; // the new process: what it was handed
  std::vector<size_t> adopted_;          // ... and which of those it serves
  size_t upgrade_capacity_ = 256;        // slots per hand-off ring between the two
  int upgrade_channel_ = -1;             // to the other process: its end means it exited
  bool handed_over_ = false;             // the old process: the new one owns our sockets
  pid_t upgrade_child_ = -1;             // the old process: the new one, once it took over
  std::unique_ptr<dataplane::HandoffRegion> upgrade_region_;
  std::vector<int> previous_wake_fds_; // the new process: the old workers' eventfds
  bool reported_ready_ = false;        // the new process: told the old one it serves
  size_t afxdp_released_ = 0; // the old process: workers moved off their AF_XDP queues
  ControlLoop *control_ = nullptr; // while run() runs
};

// A new process of a binary upgrade: its end of the channel from the
// environment (removed from it), or -1.
int take_upgrade_fd();
// Tells the running xdpqd that started this process why it cannot start.
void report_upgrade_failure(int upgrade_fd, const std::string &why);

// The control socket path for these options (the default when unset).
std::string control_socket_path(const Options &o);
// Throws UsageError when the control socket could not be made at path
// (too long, a file other than a socket there, a directory not writable).
void check_control_path(const std::string &path);

// The signals the server handles (INT, TERM, HUP, USR1, USR2): blocked in
// every thread, read from the control loop's signalfd.
sigset_t server_signals();

// Blocks the signals the server handles in the calling thread (and in every
// thread it creates afterwards); call first thing in main.
void block_server_signals();

// Raises the soft RLIMIT_NOFILE to the hard limit (every connection and
// file in flight holds a descriptor); logs what it got.
void raise_descriptor_limit();

} // namespace xdpq::control
