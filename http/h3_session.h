#pragma once
// The HTTP/3 server session of one QUIC connection, on nghttp3: quic/'s
// Application for HTTP/3. It turns request streams into Requests for the
// Router and feeds Responses back to nghttp3. It knows nothing of the
// transport or dataplane under it: the QUIC connection implements
// quic::AppTransport and moves bytes in and out.

#include "base/counters.h"
#include "dataplane/histogram.h"
#include "http/access_log.h"
#include "http/body_credit.h"
#include "http/memory_budget.h"
#include "http/message.h"
#include "http/proxy.h"
#include "http/response_head.h"
#include "http/router.h"
#include "quic/application.h"

#include <nghttp3/nghttp3.h>

#include <cstdint>
#include <list>
#include <algorithm>
#include <memory>
#include <vector>

namespace xdpq::http {

class H3Session;

// What all of one worker's connections have read ahead from large files
// (each connection's own share is bounded too, H3Session::MAX_READ_AHEAD):
// past the limit a stream waits as for its connection's room, and a
// connection that lets go of some wakes the sessions waiting, oldest first.
struct ReadAheadPool {
  static constexpr uint64_t DEFAULT_LIMIT = 256u << 20;
  uint64_t limit = DEFAULT_LIMIT;
  uint64_t held = 0;
  std::list<H3Session *> waiting; // sessions with a stream waiting for room
  bool full() const { return held >= limit; }
  // Wakes up to WAKE_BATCH waiting sessions while there is room: each one
  // that still finds none queues again at the back.
  void wake();
  static constexpr size_t WAKE_BATCH = 8;
  // While sessions wait, one holding blocks none of which were acknowledged
  // for this long is closed (H3Session::read_ahead_stalled()).
  static constexpr uint64_t STALL = 10'000'000'000ull;
  // What such a connection must let go of within STALL (or all it holds,
  // if less) not to count as stalled: one file block. About 6.5 KB/s,
  // asked of a connection only while others wait for the pool.
  static constexpr uint64_t STALL_PROGRESS = 64 * 1024;
  // A connection whose client stopped reading (its windows shut, all that
  // was sent acknowledged) holds a little (about one read) and is given
  // longer: a paused download is no stall. But not for ever, or enough
  // such connections (from many addresses) would hold the pool for good.
  static constexpr uint64_t STOPPED_STALL = 60'000'000'000ull;
};

struct H3Limits {
  // Largest request header section (RFC 9114 4.2.2 size: name + value + 32
  // per field). Advertised in SETTINGS and enforced: 431 when exceeded.
  uint64_t max_field_section_size = 16384;
  size_t max_header_fields = 128; // enforced: 431 when exceeded
  // QPACK dynamic table offered to the client's encoder (SETTINGS); 0:
  // requests use the static table and literals only.
  uint64_t qpack_table_capacity = 0;
  size_t max_request_body = 16u << 20; // 413 when exceeded
  // Request bodies (and responses made from them) held per connection;
  // over it a request is refused with H3_REQUEST_REJECTED.
  size_t max_body_per_connection = 16u << 20;
  // The ceiling of the connection's receive window (ngtcp2 tunes it up to
  // there: quic::EndpointConfig::max_conn_window): proxied uploads leave
  // room for it in the body budget (BodyCredit).
  uint64_t max_conn_window = 8u << 20;
  // A request's header section must be whole this long after its HEADERS
  // frame began; past it the stream is abandoned both ways (0: no limit).
  uint64_t header_timeout = 10'000'000'000ull;
  // The worker's budget (shared by its connections); null: none.
  MemoryBudget *budget = nullptr;
  // The worker's reverse proxy; null: none configured.
  Proxy *proxy = nullptr;
  // The worker's file read-ahead; null: only the per-connection bound.
  ReadAheadPool *read_ahead = nullptr;
  // The worker's access log; null: none.
  AccessLogBuffer *access_log = nullptr;
  // Configured response fields (response_headers); null: none.
  const std::vector<Header> *response_headers = nullptr;
};

// Per-worker counters; plain fields, one writer (the worker).
#define XDPQ_H3_COUNTERS(X)                                                            \
  X(requests, "HTTP/3 requests")                                                       \
  X(responses_1xx, "HTTP/3 responses 1xx")                                             \
  X(responses_2xx, "HTTP/3 responses 2xx")                                             \
  X(responses_3xx, "HTTP/3 responses 3xx")                                             \
  X(responses_4xx, "HTTP/3 responses 4xx")                                             \
  X(responses_5xx, "HTTP/3 responses 5xx")                                             \
  X(header_limit_rejects, "HTTP/3 requests refused with 431 (header size or count)")   \
  X(body_limit_rejects, "HTTP/3 requests refused with 413 (body over its limit)")      \
  X(body_budget_refusals, "HTTP/3 requests refused: body budget of the connection or worker spent") \
  X(stream_errors, "HTTP/3 streams reset by the server")                               \
  X(read_ahead_waits, "HTTP/3 file reads deferred: the worker's read-ahead limit reached") \
  X(read_ahead_closes, "HTTP/3 connections closed: holding file read-ahead that others waited for, none of it acknowledged for 10 s") \
  X(too_early, "HTTP/3 requests in 0-RTT with an unsafe method, answered 425")            \
  X(header_timeouts, "HTTP/3 requests abandoned: header section not whole in time")     \
  X(incomplete_resets, "HTTP/3 requests the client reset before they were whole, abandoned both ways")

// Per-worker counters; plain fields, one writer (the worker).
struct H3Stats {
  XDPQ_COUNTER_FIELDS(XDPQ_H3_COUNTERS)
  dataplane::Histogram request_latency; // request headers to stream closed
  template <typename F> void visit(F &&f) const { XDPQ_COUNTER_VISIT(XDPQ_H3_COUNTERS) }
  void count_response(int status) { count_status_class(*this, status); }
};

class H3Session final : public quic::Application, public ProxyListener {
public:
  H3Session(quic::AppTransport &transport, std::shared_ptr<const Router> router,
            const H3Limits &limits, H3Stats &stats);
  ~H3Session() override;
  H3Session(const H3Session &) = delete;
  H3Session &operator=(const H3Session &) = delete;

  // quic::Application. Errors are nghttp3's (negative) codes.
  // start(): opens our control and QPACK streams through the transport.
  int start(uint64_t max_client_bidi_streams) override;
  // early: the bytes arrived in 0-RTT (replayable): requests that begin in
  // them and are not safe methods get 425 Too Early (RFC 8470).
  int64_t read_stream(int64_t stream_id, const uint8_t *data, size_t len, bool fin,
                      bool early) override;
  int64_t writev_stream(int64_t &stream_id, int &fin, ngtcp2_vec *vec, size_t veccnt) override;
  int64_t before_write() override {
    if (!heading_.empty() || !opening_.empty()) time_heads();
    if (read_ahead_held_ > 0 && ra_pool_) {
      if (!others_wait_for_pool()) {
        stall_since_ = 0; // timed afresh when others wait again
      } else if (read_ahead_stalled()) {
        return ERR_READ_AHEAD_STALLED;
      }
    }
    send_resets();
    if (conn_waiting_ > 0) wake_readers();
    return 0;
  }
  // What nghttp3 allocates and frees, counted with the connection's memory.
  void charge_memory(int64_t bytes) { transport_.app_charge_memory(bytes); }
  void after_write() override {
    // Nothing in flight once the write is done (lost packets are sent again
    // by then): what is held waits for the peer's flow control (a client
    // that stopped reading: nghttp3 takes a little past its window), not
    // for acknowledgements, and is timed with the longer limit
    // (STOPPED_STALL). Sampled here, not before the write, where a peer
    // that keeps one packet unacknowledged could show none in flight each
    // time ngtcp2 has just declared it lost. A little is about one read: a
    // block read for each of many streams whose windows stay at a few
    // bytes is a share of the pool kept from others without progress, and
    // is timed like a stall. Once seen stopped, the longer limit holds
    // until the clock restarts (a frame of ours in flight now and then,
    // such as DATA_BLOCKED, does not make it a stall); going back and
    // forth does not restart the clock.
    if (stall_since_ && read_ahead_held_ > 0 && read_ahead_held_ <= READ_AHEAD && ra_pool_ &&
        others_wait_for_pool() && !transport_.app_awaits_acks())
      ra_stopped_ = true;
  }
  int add_write_offset(int64_t stream_id, size_t n) override;
  int add_ack_offset(int64_t stream_id, uint64_t n) override;
  void block_stream(int64_t stream_id) override;
  int unblock_stream(int64_t stream_id) override;
  void shutdown_stream_write(int64_t stream_id) override;
  void shutdown_stream_read(int64_t stream_id) override;
  // A request the client reset before it was whole is answered by nothing:
  // our side is abandoned too (H3_REQUEST_INCOMPLETE, RFC 9114 4.1.2).
  void peer_reset(int64_t stream_id) override;
  bool answered(int64_t stream_id) const override;
  void stream_opened(int64_t stream_id) override;
  int close_stream(int64_t stream_id, uint64_t app_error) override;
  // nghttp3 freed the stream (its stream_close callback).
  void stream_freed(int64_t stream_id) {
    freed_ |= stream_id == closing_;
    if (!gone_.empty()) std::erase(gone_, stream_id);
  }
  // The transport closed the stream while nghttp3 kept it (see gone_).
  bool transport_gone(int64_t stream_id) const { return gone(stream_id); }
  // nghttp3 resets a request stream over the peer's bytes (a malformed
  // message): counted, and charged as the peer's cancel (see
  // AppTransport::app_charge_cancel); a stream refused after GOAWAY
  // began no work and is not charged.
  void message_error_reset(uint64_t app_error) {
    stats_.stream_errors += 1;
    // Once spent, the connection is closing: one count of it, not one per
    // stream the same read unblocked.
    if (app_error != NGHTTP3_H3_REQUEST_REJECTED && !cancels_spent_ &&
        !transport_.app_charge_cancel())
      cancels_spent_ = true;
  }
  void set_max_client_streams_bidi(uint64_t n) override;
  // GOAWAY with the largest id, then the final one; streams in flight finish.
  void shutdown_notice() override;
  void shutdown_final() override;
  // Requests begun, and streams opened whose HEADERS have not begun yet
  // (the head is on its way, or lost and sent again; the GOAWAY covers
  // them): a drain waits for them, or for their header timeout.
  size_t active_streams() const override { return active_ + opening_.size(); }
  bool answer_pending() const override { return awaiting_ > 0; }
  uint64_t app_error_code(int64_t error) const override;
  uint64_t no_error_code() const override { return NGHTTP3_H3_NO_ERROR; }

  // nghttp3 callbacks, public for the C trampolines only.
  struct Stream;
  int on_begin_headers(int64_t stream_id);
  int on_header(Stream &s, int32_t token, nghttp3_rcbuf *name, nghttp3_rcbuf *value);
  int on_trailer(Stream &s, nghttp3_rcbuf *name, nghttp3_rcbuf *value);
  int on_end_headers(Stream &s, bool fin);
  int on_data(Stream &s, const uint8_t *data, size_t len);
  int on_end_stream(Stream &s);
  void on_stream_close(Stream &s);
  nghttp3_ssize on_read_body(Stream &s, nghttp3_vec *vec, size_t veccnt, uint32_t *flags);
  void on_acked(Stream &s, uint64_t n);
  // nghttp3 reset the stream (a malformed request) or it closed while
  // nghttp3 keeps it: no longer timed, taken or answered.
  void abandoned(Stream &s);
  quic::AppTransport &transport() { return transport_; }
  // The worker's read-ahead pool has room again: write soon (before_write()
  // resumes the streams waiting).
  void wake_for_read_ahead();
  // ProxyListener: tag is the Stream.
  void proxy_progress(void *tag) override;

private:
  // A request whose head is complete: to the proxy if a prefix matches
  // (its body, if one follows, streams upstream), else the router once the
  // body is in (body_follows false).
  void dispatch(Stream &s, bool body_follows);
  void on_proxy_data(Stream &s, const uint8_t *data, size_t len);
  // Flow-control credit for the body bytes that left the exchange.
  bool credit(Stream &s);
  // Writes the bodies that on_data() handed to exchanges during one read.
  void flush_bodies();
  void send_resets(); // the streams in aborted_ and cancelled_, reset both ways
  // The proxied request cannot go on (body cut, overrun, over budget):
  // the stream is reset both ways, the upstream connection closed.
  // by_client: the client reset the request (counted as incomplete).
  void abort_request(Stream &s, bool by_client = false);
  nghttp3_ssize read_streamed(Stream &s, nghttp3_vec *vec, size_t veccnt, uint32_t *flags);
  void respond(Stream &s);
  void settle(Stream &s); // no longer awaiting its upstream's head
  // Over the connection's or worker's body budget: H3_REQUEST_REJECTED
  // both ways, bytes discarded and given back.
  void refuse(Stream &s);
  void release_body(Stream &s);
  void record_latency(Stream &s);
  void log_request(Stream &s); // to the access log, once
  Stream *acquire(int64_t stream_id);
  Stream *find(int64_t stream_id) const; // an open stream of ours, or null (a scan)
  // Streams the transport closed while nghttp3 keeps them, waiting for
  // QPACK insertions (at most its blocked-stream limit): whatever nghttp3
  // still delivers for them is not answered, as nothing can be sent.
  std::vector<int64_t> gone_;
  int64_t closing_ = -1; // close_stream() asks nghttp3 to free it...
  bool freed_ = false;   // ...and it did
  bool gone(int64_t stream_id) const {
    return !gone_.empty() && std::find(gone_.begin(), gone_.end(), stream_id) != gone_.end();
  }
  // Request streams whose header section began and is not whole yet, in
  // the order they began (head_since, stamped at the first write after).
  std::vector<Stream *> heading_;
  // Request streams opened whose HEADERS frame has not begun (nghttp3
  // knows nothing of them yet: a lone frame-type byte, reserved frames),
  // with when (0: not stamped yet), in the order they opened. Timed as
  // heads are.
  struct Opening {
    int64_t id;
    uint64_t since;
  };
  std::vector<Opening> opening_;
  void stop_opening(int64_t stream_id);
  void stop_heading(Stream &s);
  // Abandons the heads past limits_.header_timeout; a wake for the next.
  void time_heads();
  // The application's wakes (app_wake_at()) for the read-ahead stall and
  // the header timeout: one asked for at a time, the earliest.
  uint64_t wake_armed_ = UINT64_MAX;
  void wake_at(uint64_t at, uint64_t now);

  quic::AppTransport &transport_;
  std::shared_ptr<const Router> router_;
  H3Limits limits_;
  H3Stats &stats_;
  BudgetAccount budget_;
  BodyCredit body_credit_; // proxied bodies' flow-control credit
  nghttp3_conn *conn_ = nullptr;
  nghttp3_mem mem_{}; // nghttp3's allocator (counted_table: charge_memory())
  size_t awaiting_ = 0; // proxied requests whose response head has not come
  size_t active_ = 0;                         // request streams between begin_headers and close
  std::vector<std::unique_ptr<Stream>> pool_; // every Stream ever made
  std::vector<Stream *> free_;                // reusable ones
  SlotKeep keep_;                             // what free_'s slots keep, summed
  std::vector<nghttp3_nv> nva_;               // scratch for submit_response
  std::vector<int64_t> aborted_;              // streams to reset after this write
  std::vector<int64_t> cancelled_;            // ... whose client cancelled them
  std::vector<Stream *> flush_;               // proxied bodies to write after this read
  bool reading_early_ = false;                // read_stream() is feeding 0-RTT bytes
  static constexpr uint64_t READ_AHEAD = 128 * 1024;
  // Bodies read on demand (files): what the connection's streams handed
  // nghttp3 and the peer has not acknowledged yet, at most MAX_READ_AHEAD
  // (as a kernel socket's send buffer), and read only when the peer's flow
  // control lets something out. A stream that may not read waits in
  // read_waiting_: for its own window (woken by unblock_stream()), or for
  // the connection's window or room (woken by before_write()).
  static constexpr uint64_t MAX_READ_AHEAD = 4u << 20;
  uint64_t read_ahead_held_ = 0;
  // The request heads its open streams keep (each up to the field section
  // limit, for as long as the stream stays open: a peer that lets no
  // answer out keeps it open), counted with the connection's memory.
  uint64_t heads_held_ = 0;
  ReadAheadPool *ra_pool_ = nullptr; // the worker's (limits_.read_ahead)
  bool pool_waiting_ = false;        // in ra_pool_->waiting, at pool_place_
  std::list<H3Session *>::iterator pool_place_;
  // A stream of ours waits for the worker's pool: queue there (front: a
  // session woken that found the room taken again keeps its turn).
  void wait_for_pool(bool front);
  // No stream of ours waits any more (they ended, or one read again and
  // none other waits): out of the pool's queue, so a wake goes to a
  // session that needs it.
  void leave_pool_if_idle();
  void hold_read_ahead(uint64_t n);
  void release_read_ahead(uint64_t n);
  uint64_t read_ahead_room() const;
  // A peer that never acknowledges some block it was sent (or nothing at
  // all) keeps its read-ahead as long as it keeps the connection alive. So
  // while other sessions wait for the worker's pool, a connection that let
  // go of less than ReadAheadPool::STALL_PROGRESS (or all it held) in
  // ReadAheadPool::STALL, with packets in flight at the end of each of its
  // writes meanwhile, is closed with H3_EXCESSIVE_LOAD, at its first write
  // (a read, a timer, a wake asked for at the limit) past it. Nothing is
  // timed while nobody waits.
  static constexpr int64_t ERR_READ_AHEAD_STALLED = -100000; // not one of nghttp3's
  // The peer's cancels, its malformed messages among them, spent the
  // connection's allowance: its read fails with H3_EXCESSIVE_LOAD.
  static constexpr int64_t ERR_CANCELS_SPENT = -100001; // not one of nghttp3's
  bool cancels_spent_ = false;
  uint64_t ra_released_ = 0; // read-ahead bytes ever released
  uint64_t stall_seen_ = 0;  // ra_released_ when stall_since_ was set
  uint64_t stall_need_ = 0;  // released since then that restarts the timing
  uint64_t stall_since_ = 0; // 0: not timing
  bool ra_stopped_ = false;  // seen stopped reading since stall_since_ (after_write())
  bool others_wait_for_pool() const {
    return ra_pool_->waiting.size() > (pool_waiting_ ? 1u : 0u);
  }
  bool read_ahead_stalled();
  std::vector<Stream *> read_waiting_;
  size_t conn_waiting_ = 0; // of read_waiting_, those waiting for the connection
  void wait_to_read(Stream &s, bool for_connection);
  void stop_waiting(Stream &s);
  void wake_readers();
  ResponseHead head_;
};

// Makes the HTTP/3 session of each new connection of one worker, and keeps
// that worker's HTTP/3 counters.
class H3ApplicationFactory final : public quic::ApplicationFactory {
public:
  H3ApplicationFactory(std::shared_ptr<const Router> router, const H3Limits &limits)
      : router_(std::move(router)), limits_(limits) {
    if (!limits_.read_ahead) limits_.read_ahead = &read_ahead_;
  }
  // The worker's proxy, for connections made from now on.
  void set_proxy(Proxy *p) { limits_.proxy = p; }
  // The worker's access log, for connections made from now on.
  void set_access_log(AccessLogBuffer *l) { limits_.access_log = l; }
  std::unique_ptr<quic::Application> create(quic::AppTransport &transport) override {
    return std::make_unique<H3Session>(transport, router_, limits_, stats_);
  }
  uint64_t no_error_code() const override { return NGHTTP3_H3_NO_ERROR; }
  uint64_t excessive_load_code() const override { return NGHTTP3_H3_EXCESSIVE_LOAD; }
  const H3Stats &stats() const { return stats_; }

private:
  std::shared_ptr<const Router> router_;
  H3Limits limits_;
  H3Stats stats_;
  ReadAheadPool read_ahead_;
};

} // namespace xdpq::http
