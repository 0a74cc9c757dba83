#pragma once
// One QUIC connection: ngtcp2 state, its GnuTLS session and its
// application (HTTP/3, through quic/application.h). It reads datagrams the endpoint routes to it
// and writes packets into the endpoint's TxSink, at most a send quantum per pass; its timer lives
// in the worker's wheel.

#include "base/token_bucket.h"
#include "dataplane/datagram_port.h"
#include "dataplane/timer_wheel.h"
#include "quic/application.h"
#include "quic/endpoint_types.h"

#include <gnutls/gnutls.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <memory>
#include <vector>

namespace xdpq::quic {

class Endpoint;
class TlsContext;

class Connection final : public AppTransport {
public:
  explicit Connection(Endpoint &ep);
  ~Connection();
  Connection(const Connection &) = delete;
  Connection &operator=(const Connection &) = delete;

  // Sets up ngtcp2 for a client's first Initial. odcid is set when the
  // client came back with a valid Retry token; token is a validated
  // NEW_TOKEN or Retry token (empty otherwise). Returns 0 or -1.
  int init(const ngtcp2_pkt_hd &hd, const dataplane::Path &path, const ngtcp2_cid *odcid,
           const ngtcp2_vec &token);

  // Feeds one datagram. A connection that finishes retires itself.
  void on_datagram(const dataplane::RxDatagram &dg);

  // Writes pending packets. Returns false if the sink ran out of room.
  bool write();

  // Sends CONNECTION_CLOSE with this application error and enters the
  // closing period.
  void close(uint64_t app_error);

  // Graceful shutdown of HTTP/3: the first GOAWAY now, the final one a
  // probe timeout later; the streams in flight finish.
  void shutdown_notice();
  // The final GOAWAY is still to go (drain waits for it).
  bool goaway_pending() const { return goaway_at_ != UINT64_MAX; }
  size_t active_streams() const { return app_ ? app_->active_streams() : 0; }
  ConnInfo info() const;

  bool pending_write = false; // queued in the endpoint's write list
  bool retired = false;
  // ngtcp2 asked for a Retry instead (its first datagram): retired.
  bool wants_retry() const { return wants_retry_; }
  // Every key the endpoint's CID table routes to this connection (kept by
  // the endpoint; removed with the connection).
  std::vector<CidKey> routes;
  // Its place in the endpoint's per-source limiter (given back when freed).
  uint32_t source_slot = UINT32_MAX;
  bool source_unproven = false; // admitted without a token, handshake not completed yet

  ngtcp2_conn *conn() const { return conn_; }
  bool handshake_done() const { return handshake_done_; }

  // ngtcp2 callbacks (called from the C trampolines).
  int on_recv_stream_data(uint32_t flags, int64_t stream_id, const uint8_t *data, size_t len);
  int on_acked_stream_data(int64_t stream_id, uint64_t len);
  int on_stream_close(uint32_t flags, int64_t stream_id, uint64_t app_error);
  int on_stream_reset(int64_t stream_id);        // the peer's RESET_STREAM
  int on_stream_stop_sending(int64_t stream_id); // our STOP_SENDING
  int on_stream_read_shut(int64_t stream_id);    // either: reading ends
  int on_extend_max_stream_data(int64_t stream_id);
  int on_extend_max_remote_streams_bidi(uint64_t max_streams);
  int on_stream_open(int64_t stream_id);
  int on_handshake_completed();
  int on_new_cid(ngtcp2_cid *cid, uint8_t *token, size_t cidlen);
  int on_remove_cid(const ngtcp2_cid *cid);
  int on_recv_tx_key(ngtcp2_encryption_level level);
  // The peer switched to the next key generation (counted once each).
  void on_key_update();
  // The next generation's receive key, derived ahead of the update that
  // will use it (ngtcp2 derives it lazily); nullptr until then.
  void *next_rx_key = nullptr;
  // Something in the datagram being read decrypted (set by the callback).
  bool decrypted = false;
  // ...and it held a 1-RTT packet numbered above every earlier one.
  bool newest_1rtt = false;
  void on_path_validation(bool ok, const ngtcp2_path *path, bool new_token);
  void submit_address_token(const ngtcp2_path &path);
  // A 1-RTT packet decrypted; header: its unprotected header (the AAD).
  void saw_1rtt_packet(const uint8_t *header, size_t len);

  // AppTransport
  void app_consume_stream(int64_t stream_id, uint64_t n) override;
  void app_consume_conn(uint64_t n) override;
  void app_stop_reading(int64_t stream_id, uint64_t app_error) override;
  void app_reset_writing(int64_t stream_id, uint64_t app_error) override;
  bool app_charge_cancel() override;
  int64_t app_open_uni_stream() override;
  void app_want_write() override;
  const dataplane::Address *app_peer() const override;
  bool app_peer_proven() const override { return validated_remote_.len != 0; }
  uint64_t app_stream_credit(int64_t stream_id) const override;
  uint64_t app_conn_credit() const override;
  uint64_t app_now() const override;
  void app_charge_memory(int64_t bytes) override;
  bool app_awaits_acks() const override;
  void app_wake_at(uint64_t at_ns) override;

private:
  enum class State { active, closing, draining, dead };

  static void timer_fired(dataplane::Timer &t);
  void on_timer();
  void update_timer() { update_timer(ngtcp2_conn_get_expiry(conn_)); }
  void update_timer(uint64_t expiry); // expiry: ngtcp2's next deadline
  int settle_pacer(uint64_t now);
  int setup_app();
  // Enters the closing period with last_error_ (or retires silently for an
  // idle close). Returns false: the caller's "connection finished" value.
  bool fail();
  void enter_draining();
  void send_close_packet();
  void retire();
  // Grants the client the request streams that finished since the last
  // grant (one MAX_STREAMS frame).
  void release_stream_credit();
  // Holds the write after a read that left only an ACK to send while the
  // application awaits an answer; true if held.
  bool hold_ack(uint64_t read_ts);

  Endpoint &ep_;
  ngtcp2_conn *conn_ = nullptr;
  gnutls_session_t tls_ = nullptr;
  const TlsContext *tls_ctx_ = nullptr; // the one tls_ came from (a reload may retire it)
  ngtcp2_crypto_conn_ref conn_ref_{};
  std::unique_ptr<Application> app_;
  dataplane::Timer timer_;
  State state_ = State::active;
  bool handshake_done_ = false;
  bool wants_retry_ = false;
  bool early_counted_ = false;
  ngtcp2_ccerr last_error_{};
  mutable dataplane::Address peer_; // app_peer()'s answer
  std::vector<uint8_t> close_packet_;
  dataplane::Path close_path_;
  uint64_t close_received_ = 0; // datagrams received while closing
  uint64_t started_at_ = 0;
  uint64_t bytes_in_ = 0;
  // What the dataplane was last told about the peer's link (peer_verified).
  uint64_t verified_link_ = 0;
  dataplane::Address verified_remote_{};
  bool verified_strong_ = false;
  // The peer address the handshake or the last path validation proved.
  dataplane::Address validated_remote_{};
  int64_t largest_1rtt_pn_ = -1; // of the 1-RTT packets decrypted
  uint64_t bytes_out_ = 0;
  // Request streams finished but not yet granted back. A grant alone is an
  // ack-eliciting packet (and the client's ACK of it): most streams finish
  // on the client's ACK of their response, a moment before the next
  // request, whose response can carry the grant. So it waits for a packet
  // with stream data, for half the stream limit, or for the deadline, but
  // not while the client has used every stream it was granted.
  uint64_t stream_credit_ = 0;
  uint64_t client_streams_opened_ = 0;  // request streams the client opened
  uint64_t client_streams_granted_ = 0; // the limit it was last sent
  uint64_t credit_deadline_ = UINT64_MAX;
  uint64_t goaway_at_ = UINT64_MAX; // when the final GOAWAY goes (after shutdown_notice)
  bool drain_told_ = false;         // shutdown_notice() has run
  uint64_t app_wake_at_ = UINT64_MAX; // the application's (app_wake_at())
  // ngtcp2's and the application's (nghttp3's) memory for this
  // connection, counted (Endpoint::max_memory).
  ngtcp2_mem mem_;
  int64_t memory_ = 0;

public:
  uint64_t memory() const { return memory_ > 0 ? static_cast<uint64_t>(memory_) : 0; }
  void charge_memory(int64_t bytes);
  // Closes with app_error and frees the connection now, without the
  // closing period (the worker needs its memory back).
  void abandon(uint64_t app_error);
  // No longer active: frees the application (Endpoint::app_finished).
  void release_app() { app_.reset(); }

private:
  // The peer's stream resets (take_reset_token()).
  TokenBucket resets_;
  // Open request streams we sent STOP_SENDING for: the peer's RESET_STREAM
  // on them is the answer RFC 9000 requires, not a cancel of its own.
  std::vector<int64_t> stopped_reading_;
  // Open request streams whose reset is accounted for already: the peer's
  // RESET_STREAM (counted, or answering our STOP_SENDING), or our own
  // RESET_STREAM or STOP_SENDING.
  // One that closes reset without being here was cancelled by the peer's
  // STOP_SENDING, of which ngtcp2 tells nothing else: counted then.
  std::vector<int64_t> resets_seen_;
  // A client request stream: the peer's cancels are limited (rapid reset).
  static bool request_stream(int64_t id) { return ngtcp2_is_bidi_stream(id) && !(id & 1); }
  void reset_seen(int64_t stream_id);
  bool take_reset_token();
  // The last write() left the application with nothing to send (not cut
  // short by congestion, pacing, the packet budget or the sink).
  bool app_drained_ = false;
  // The pacer's instant after a write that left nothing to send, which no
  // timer was armed for (write()); UINT64_MAX when there is none.
  uint64_t pacer_at_ = UINT64_MAX;
  bool ack_held_ = false; // a read's ACK waits for the answer (hold_ack)
  uint64_t ack_timer_at_ = 0; // ngtcp2's ACK timer for the held read
  uint64_t hold_until_ = 0;   // when the held ACK leaves without the answer
  static constexpr uint64_t ACK_HOLD = 2'000'000; // ns
  static constexpr uint64_t STREAM_CREDIT_DELAY = 1'000'000; // ns
  // Bytes a connection sends before ngtcp2 may probe its path's MTU
  // (write()): about 27 datagrams of 1200 bytes, handshake included.
  static constexpr uint64_t PMTU_PROBE_AFTER = 32 * 1024;
};

} // namespace xdpq::quic
