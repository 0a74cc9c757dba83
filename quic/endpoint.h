#pragma once
// The QUIC server endpoint of one worker: it is handed datagrams, routes
// them by connection ID, accepts new connections, and answers what has no
// connection (version negotiation, Retry, stateless reset). It does no I/O:
// every packet leaves through the TxSink it was given, and time comes from
// an injected Clock and the worker's TimerWheel.

#include "base/counters.h"
#include "base/token_bucket.h"
#include "dataplane/datagram_port.h"
#include "dataplane/histogram.h"
#include "dataplane/source_limiter.h"
#include "dataplane/timer_wheel.h"
#include "quic/application.h"
#include "quic/clock.h"
#include "quic/endpoint_types.h"
#include "quic/quic_lb.h"
#include "quic/secrets.h"
#include "quic/tls_context.h"

#include <ngtcp2/ngtcp2.h>

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace xdpq::quic {

class Connection;

enum class RetryMode { off, on, automatic };

// Where a datagram for another worker's connection ID goes: a copy into
// that worker's hand-off ring (control/worker.h), so a client whose new
// path lands on another NIC queue keeps its connection. quic/ only names
// the owner; it never touches another worker.
class Handoff {
public:
  // owner: the worker byte of its CIDs (generation << 7 | worker id); the
  // other generation's workers are those of the other process during a
  // binary upgrade. True when the owner took a copy of dg (valid only
  // during the call); false when it could not, and the endpoint drops and
  // counts it.
  virtual bool hand_off(uint8_t owner, const dataplane::RxDatagram &dg) = 0;

protected:
  ~Handoff() = default;
};

struct EndpointConfig {
  static constexpr uint8_t MAX_WORKERS = 127;
  // Every CID we issue carries a worker byte in the first byte of its
  // nonce (see Endpoint::make_cid): the process generation in its top bit
  // (a binary upgrade runs two, each routing the other's packets to it),
  // the worker id (0..126) in the rest.
  uint8_t worker_id = 0;
  uint8_t generation = 0; // 0 or 1
  // Workers sharing the CID space (ids 0..worker_count-1): a packet for
  // another worker's CID is that worker's: handed off to it (set_handoff),
  // never ours to reset.
  uint8_t worker_count = 1;
  // QUIC-LB: CIDs a balancer routes to this node. None: "unroutable" CIDs
  // (codepoint 0b111) of UNROUTABLE_CID_LEN bytes.
  std::shared_ptr<const QuicLbCodec> quic_lb;
  RetryMode retry = RetryMode::automatic;
  // automatic: require Retry while this many handshakes are in progress...
  size_t retry_threshold = 128;
  // ...or while new handshakes arrive faster than this per second (a flood
  // of junk Initials fails fast and is never "in progress").
  double retry_rate = 5000;
  // Per-source caps on connections and on new handshakes per second: over
  // the unvalidated rate a source gets a Retry, over the validated rate
  // (with a Retry token) CONNECTION_REFUSED.
  dataplane::SourceLimits per_source{256, 5000, 10000, 5000};
  // The longest draining period (three probe timeouts) in which a
  // connection its client closed after its handshake holds no place under
  // its source's connection cap. Those are bounded by the source's rates
  // (at the defaults 2,500 in 250 ms, and up to 20,000 more in a burst);
  // a longer period (the client's max_ack_delay counts in it, up to 16 s)
  // keeps the place.
  uint64_t source_free_draining = 250'000'000; // ns
  uint64_t idle_timeout = 30'000'000'000ull;
  uint64_t handshake_timeout = 10'000'000'000ull;
  uint64_t retry_token_lifetime = 10'000'000'000ull;
  uint64_t new_token_lifetime = 3600'000'000'000ull;
  uint64_t max_streams_bidi = 100; // concurrent request streams per connection
  uint64_t stream_window = 256 * 1024;
  uint64_t conn_window = 1024 * 1024;
  uint64_t max_stream_window = 6 * 1024 * 1024; // auto-tuning ceiling
  // The connection's receive window's auto-tuning ceiling: what proxied
  // uploads to a stalled upstream may hold beyond what had the connection's
  // credit early (http::BodyCredit), within the body budget.
  uint64_t max_conn_window = 8 * 1024 * 1024;
  size_t max_udp_payload = 1452;
  size_t max_connections = 65536;
  uint32_t stateless_resets_per_second = 1000;
  // A peer's RESET_STREAM on request streams, per connection: a burst,
  // then a rate per second (each can have set work going: a file read, an
  // upstream request). Past it the connection closes (HTTP/2's RST_STREAM
  // has the same limit).
  uint32_t stream_reset_burst = 100;
  uint32_t stream_reset_rate = 33;
  bool early_data = true;
  // What ngtcp2 may hold for all of the worker's connections (their
  // buffers: out-of-order data in the receive windows, packets in flight,
  // crypto state); past it the connections holding the most are closed
  // (H3_EXCESSIVE_LOAD). 0: no limit.
  size_t max_memory = 1ull << 30;
};

// Every datagram lands in exactly one of: datagrams_routed,
// datagrams_handed_off, handshakes_started, retries_sent, version_negotiations,
// stateless_resets_sent, refused_source_limit, refused_source_rate, or a
// drop_* counter. A datagram handed to another worker is counted in
// datagrams_in by both (handoff_received at the owner).
#define XDPQ_ENDPOINT_COUNTERS(X)                                                                  \
  X(datagrams_in, "datagrams handed to QUIC")                                                      \
  X(bytes_in, "bytes handed to QUIC")                                                              \
  X(datagrams_routed, "datagrams routed to an existing connection")                                \
  X(datagrams_handed_off, "datagrams handed to the worker that owns their connection ID")          \
  X(drop_reflection, "dropped: from a privileged or amplifier source port")                        \
  X(drop_unparsable, "dropped: not a QUIC header we can read")                                     \
  X(drop_small_initial, "dropped: Initial in a datagram under 1200 bytes")                         \
  X(drop_unknown_packet, "dropped: long header for no connection, not an Initial")                 \
  X(drop_bad_token, "dropped: Retry token failed validation")                                      \
  X(drop_conn_limit, "refused: too many connections")                                              \
  X(drop_amplification, "dropped: stateless reply over 3x the datagram")                           \
  X(drop_reset_rate, "dropped: stateless reset suppressed by its rate limit")                      \
  X(drop_closing, "datagrams for a connection in closing or draining (also routed)")               \
  X(drop_tx_full, "stateless replies not sent: no room to transmit")                               \
  X(drop_other_worker, "dropped: another worker's connection ID, and no room to hand it off")      \
  X(drop_source_limit, "dropped Initials: the source holds its connection cap")                    \
  X(memory_closes, "connections closed: the worker's QUIC memory was over its limit, theirs the most") \
  X(retries_source_limit, "Retries sent: an unvalidated source at its connection cap")             \
  X(refused_source_limit, "Initials refused: a validated source at its connection cap")            \
  X(drop_source_rate, "dropped Initials: the source opens connections too fast (Retry is off)")     \
  X(retries_source_rate, "Retries sent: an unvalidated source over its new-connection rate")        \
  X(refused_source_rate, "Initials refused: a validated source over its new-connection rate")       \
  X(version_negotiations, "Version Negotiation packets sent")                                      \
  X(retries_sent, "Retry packets sent")                                                            \
  X(stateless_resets_sent, "stateless resets sent")                                                \
  X(handshakes_started, "connections accepted (handshakes started)")                               \
  X(handshakes_completed, "handshakes completed")                                                  \
  X(handshakes_failed, "connections that ended before their handshake completed")                  \
  X(sessions_resumed, "handshakes that resumed a TLS session")                                     \
  X(early_data_accepted, "connections whose requests arrived in 0-RTT")                            \
  X(early_data_refused, "0-RTT hellos whose early data was refused as a replay (seen by this or "  \
                        "another worker), or with the anti-replay store full")                     \
  X(new_tokens_accepted, "Initials with a valid NEW_TOKEN token")                                  \
  X(acks_held, "ACKs held after a read for a proxied answer to carry")                            \
  X(acks_held_expired, "held ACKs sent alone: no answer within the hold")                           \
  X(conns_closed, "connections freed")                                                             \
  X(conns_idle_closed, "connections closed by the idle timeout")                                   \
  X(conn_errors, "connections closed by a protocol or TLS error")                                  \
  X(stream_reset_closes, "connections closed for resetting streams past the rate limit")           \
  X(key_updates, "key updates by peers")                                                           \
  X(path_validations_ok, "path validations that succeeded (migration, rebinding)")                 \
  X(path_validations_failed, "path validations that failed")                                       \
  X(packets_out, "QUIC packets sent")                                                              \
  X(pacer_wakeups_skipped, "writes that left nothing to send and armed no timer for the pacer")

struct EndpointStats {
  XDPQ_COUNTER_FIELDS(XDPQ_ENDPOINT_COUNTERS)
  dataplane::Histogram handshake_time; // first Initial to handshake completed
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_ENDPOINT_COUNTERS) }
};

class Endpoint {
public:
  static constexpr size_t UNROUTABLE_CID_LEN = 18;
  // Where the worker byte sits in our CIDs when a balancer can read it
  // (plaintext); nullopt when it is encrypted.
  static std::optional<size_t> visible_worker_offset(const QuicLbCodec *lb);

  Endpoint(const EndpointConfig &cfg, TlsContext &tls, const Secrets &secrets,
           ApplicationFactory &app, dataplane::TimerWheel &timers, const Clock &clock,
           dataplane::TxSink &tx);
  ~Endpoint();
  Endpoint(const Endpoint &) = delete;
  Endpoint &operator=(const Endpoint &) = delete;

  // Processes one datagram. Never throws, never blocks.
  void on_datagram(const dataplane::RxDatagram &dg);
  // End of a pass: connections that have something to send write it (in
  // one batch per connection), and finished connections are freed.
  void end_of_pass();
  // The sink had no room: end_of_pass() left writers pending; call again
  // when it drains.
  bool write_blocked() const { return write_blocked_; }
  bool has_pending_writes() const { return !pending_writes_.empty(); }

  // Closes every connection without an error (the application's "no
  // error" code; CONNECTION_CLOSE sent now).
  void close_all();
  // Graceful drain: the application's GOAWAY on every connection, new connections are
  // refused. close_all() ends it.
  void start_drain();
  // New connections are welcome again (a binary upgrade whose new process
  // died); connections already told GOAWAY finish as they were.
  void stop_drain() { draining_ = false; }
  bool draining() const { return draining_; }
  // Request streams still open across all connections, and connections
  // whose final GOAWAY has not gone yet: what a drain waits for.
  size_t active_requests() const;
  void list_connections(std::vector<ConnInfo> &out) const;
  // A new TLS context for new connections (certificate reload); existing
  // connections keep the one they started with, which must stay alive.
  void set_tls(TlsContext &tls) { tls_ = &tls; }
  // Where other workers' datagrams go; without one they are dropped.
  void set_handoff(Handoff *h) { handoff_ = h; }
  // The other generation's worker count while another process of ours
  // serves its connections (binary upgrade), 0 when there is none: its
  // CIDs are then unknown ones (reset).
  void set_other_generation(uint8_t workers) { other_generation_workers_ = workers; }
  // This endpoint's worker byte.
  uint8_t worker_byte() const {
    return static_cast<uint8_t>(cfg_.generation << 7 | cfg_.worker_id);
  }

  size_t connection_count() const { return conns_.size(); }
  // Entries in the CID routing table (every one names a live connection).
  size_t route_count() const { return cids_.size(); }
  size_t handshakes_in_progress() const { return handshakes_in_progress_; }
  // Connections the source limiter counts for this address's source.
  uint32_t source_connections(const dataplane::Address &a) const {
    return sources_.connections(a);
  }
  const EndpointStats &stats() const { return stats_; }

  // Used by Connection.
  const EndpointConfig &config() const { return cfg_; }
  const Secrets &secrets() const { return secrets_; }
  TlsContext &tls() { return *tls_; }
  const Clock &clock() const { return clock_; }
  dataplane::TimerWheel &timers() { return timers_; }
  dataplane::TxSink &tx() { return tx_; }
  EndpointStats &mutable_stats() { return stats_; }
  ApplicationFactory &app_factory() { return app_; }
  // A new CID of ours: the worker byte, then random bytes, in this node's
  // CID format.
  void make_cid(ngtcp2_cid &cid);
  size_t cid_len() const { return cid_len_; }
  // The worker byte of the worker that issued dcid if it is one of this
  // node's CIDs of a live generation (it may be ours), otherwise -1.
  int owner_of(const uint8_t *dcid, size_t len) const;
  // Routes cid to c. The route is c's: it is removed by remove_cid or,
  // whatever ngtcp2 recorded, when c is freed, so no entry ever outlives
  // its connection. long_only: see Route.
  void add_cid(const ngtcp2_cid &cid, Connection *c, bool long_only = false);
  void remove_cid(const ngtcp2_cid &cid, Connection *c);
  void want_write(Connection *c);
  void retire(Connection *c);
  // c stopped being active (closing, draining): its application is freed
  // at the end of this pass, not at the end of that period.
  void app_finished(Connection *c);
  void handshake_done(Connection *c);
  // c's handshake completed: its address is proven (per-source caps).
  void source_proven(Connection *c);
  // c's client closed it after its handshake: its draining period holds no
  // place under its source's connection cap.
  void source_left(Connection *c);

private:
  void drop_routes(Connection *c);
  void accept(const dataplane::RxDatagram &dg, const ngtcp2_version_cid &vc);
  void send_version_negotiation(const dataplane::RxDatagram &dg, const ngtcp2_version_cid &vc);
  void send_retry(const dataplane::RxDatagram &dg, const ngtcp2_pkt_hd &hd);
  void send_close_without_state(const dataplane::RxDatagram &dg, const ngtcp2_pkt_hd &hd,
                                uint64_t error_code);
  void send_stateless_reset(const dataplane::RxDatagram &dg, const ngtcp2_version_cid &vc);
  // Stateless replies obey the same 3x amplification budget as connections.
  bool send_stateless(const dataplane::RxDatagram &dg, const uint8_t *data, size_t len);

  EndpointConfig cfg_;
  size_t cid_len_;
  TlsContext *tls_;
  Secrets secrets_;
  ApplicationFactory &app_;
  dataplane::TimerWheel &timers_;
  const Clock &clock_;
  dataplane::TxSink &tx_;
  Handoff *handoff_ = nullptr;
  uint8_t other_generation_workers_ = 0;
  EndpointStats stats_;

  // A CID's connection. long_only: the DCID a client chose for its first
  // Initial, which routes its Initial and 0-RTT packets only. Its
  // Handshake and 1-RTT packets carry our CIDs; one with this DCID is
  // another connection's on another worker (the DCID is anyone's to pick,
  // and an observer can pick a live CID of another worker's: such a packet
  // must be handed to its owner, not swallowed here).
  struct Route {
    Connection *conn;
    bool long_only;
  };
  std::unordered_map<CidKey, Route, CidKeyHash> cids_;
  std::unordered_map<Connection *, std::unique_ptr<Connection>> conns_;
  std::vector<Connection *> pending_writes_;
  std::vector<Connection *> retired_;
  std::vector<Connection *> apps_finished_;
  size_t handshakes_in_progress_ = 0;
  int64_t memory_ = 0; // what ngtcp2 and nghttp3 hold for all our connections (charge_memory)
  void reap_memory();
  // Frees what closed in this pass (apps first); false if nothing had.
  bool free_retired();
  std::vector<std::pair<size_t, Connection *>> reap_scratch_; // reap_memory()'s picks
  void write_pending(); // the connections that asked to write, in order

public:
  // ngtcp2's allocations and frees for one of our connections.
  void charge_memory(int64_t bytes) { memory_ += bytes; }
  uint64_t memory() const { return memory_ > 0 ? static_cast<uint64_t>(memory_) : 0; }
  void set_max_memory(size_t bytes) { cfg_.max_memory = bytes; }

private:
  dataplane::SourceLimiter sources_;
  // New handshakes per second, decayed with a 1 s time constant.
  double recent_handshakes_ = 0;
  uint64_t recent_at_ = 0;
  bool write_blocked_ = false;
  bool draining_ = false;
  // Stateless resets: a second's worth, then the rate.
  TokenBucket resets_;
  std::vector<uint8_t> scratch_; // one datagram for stateless replies
};

} // namespace xdpq::quic
