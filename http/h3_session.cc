#include "http/h3_session.h"

#include "base/clock.h"
#include "base/guard.h"
#include "base/small_alloc.h"

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <stdexcept>

namespace xdpq::http {

struct H3Session::Stream {
  int64_t id = -1;
  Request req;
  Response resp;
  uint64_t body_offset = 0; // response bytes handed to nghttp3
  uint64_t header_bytes = 0;
  size_t header_fields = 0;
  bool headers_too_large = false;
  bool trailers_refused = false; // over the header limits: 431 or reset
  bool body_too_large = false;
  bool refused = false;
  bool responded = false;
  bool aborted = false; // the body failed mid-way: reset, not finished
  bool early = false;   // its headers arrived in 0-RTT
  uint64_t started_ns = 0;
  uint64_t begun_ns = 0; // its headers completed (the access log's clock; 0: logged)
  int status = 0;        // the response's, once submitted
  size_t charged = 0; // bytes taken from the body budget
  uint64_t acked = 0; // response body bytes the peer acknowledged
  ProxyExchange *exchange = nullptr; // a proxied response (owned by resp.body)
  BodyCredit::Stream flow;    // a proxied body's credit given (see BodyCredit)
  bool flush_queued = false;  // in flush_: body bytes to write upstream after this read
  bool stop_sent = false;     // STOP_SENDING: the rest of the body is not wanted
  bool awaiting = false;      // proxied, its response head not yet come (awaiting_)
  // In read_waiting_: no credit or room to read its file. waits_for_conn:
  // the connection's window or room, else the stream's own window.
  bool read_waiting = false;
  bool waits_for_conn = false;
  bool answered = false; // the whole response went to nghttp3 (its end given)
  bool heading = false;  // in heading_: its header section is not whole yet
  uint64_t head_since = 0; // when it began (0: not stamped yet)
  size_t kept = 0;         // idle in free_: the bytes SlotKeep counts for it
  size_t head_held = 0;    // its head's bytes in heads_held_

  void reset(int64_t stream_id) {
    id = stream_id;
    req.reset();
    resp.reset();
    body_offset = 0;
    header_bytes = 0;
    header_fields = 0;
    headers_too_large = false;
    trailers_refused = false;
    body_too_large = false;
    refused = false;
    responded = false;
    aborted = false;
    early = false;
    started_ns = 0;
    begun_ns = 0;
    status = 0;
    charged = 0;
    acked = 0;
    exchange = nullptr;
    flow = {};
    flush_queued = false;
    stop_sent = false;
    awaiting = false;
    read_waiting = false;
    waits_for_conn = false;
    answered = false;
    heading = false;
    head_since = 0;
  }
};

namespace {

H3Session &session_of(void *conn_user_data) { return *static_cast<H3Session *>(conn_user_data); }

int cb_begin_headers(nghttp3_conn *, int64_t stream_id, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (sud)
          return 0; // already ours
        return session_of(ud).on_begin_headers(stream_id);
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_recv_header(nghttp3_conn *, int64_t, int32_t token, nghttp3_rcbuf *name,
                   nghttp3_rcbuf *value, uint8_t, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (!sud)
          return 0;
        return session_of(ud).on_header(*static_cast<H3Session::Stream *>(sud), token, name, value);
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_begin_trailers(nghttp3_conn *, int64_t, void *, void *sud) {
  if (sud) {
    auto &st = *static_cast<H3Session::Stream *>(sud);
    st.header_bytes = 0; // a section of its own, under the same limits
    st.header_fields = 0;
  }
  return 0;
}

int cb_recv_trailer(nghttp3_conn *, int64_t, int32_t, nghttp3_rcbuf *name, nghttp3_rcbuf *value,
                    uint8_t, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (!sud)
          return 0;
        return session_of(ud).on_trailer(*static_cast<H3Session::Stream *>(sud), name, value);
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_end_headers(nghttp3_conn *, int64_t, int fin, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (!sud)
          return 0;
        return session_of(ud).on_end_headers(*static_cast<H3Session::Stream *>(sud), fin != 0);
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_recv_data(nghttp3_conn *, int64_t stream_id, const uint8_t *data, size_t len, void *ud,
                 void *sud) {
  return guarded(
      [&]() -> int {
        auto &s = session_of(ud);
        // DATA payload is ours to credit (on_data() does, at once or, for
        // a proxied body, as the bytes go upstream).
        if (!sud) {
          s.transport().app_consume(stream_id, len);
          return 0;
        }
        return s.on_data(*static_cast<H3Session::Stream *>(sud), data, len);
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_deferred_consume(nghttp3_conn *, int64_t stream_id, size_t consumed, void *ud, void *) {
  return guarded(
      [&]() -> int {
        session_of(ud).transport().app_consume(stream_id, consumed);
        return 0;
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_end_stream(nghttp3_conn *, int64_t, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (!sud)
          return 0;
        return session_of(ud).on_end_stream(*static_cast<H3Session::Stream *>(sud));
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_stream_close(nghttp3_conn *, int64_t stream_id, uint64_t, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        session_of(ud).stream_freed(stream_id);
        // Streams without user data never began a request (control and
        // QPACK streams, or reset before their headers).
        if (sud)
          session_of(ud).on_stream_close(*static_cast<H3Session::Stream *>(sud));
        return 0;
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_stop_sending(nghttp3_conn *, int64_t stream_id, uint64_t app_error, void *ud, void *) {
  return guarded(
      [&]() -> int {
        if (session_of(ud).transport_gone(stream_id)) return 0;
        session_of(ud).transport().app_stop_reading(stream_id, app_error);
        return 0;
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_reset_stream(nghttp3_conn *, int64_t stream_id, uint64_t app_error, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (sud) session_of(ud).abandoned(*static_cast<H3Session::Stream *>(sud));
        // A stream the client reset already (charged then) gets no reset.
        if (session_of(ud).transport_gone(stream_id)) return 0;
        session_of(ud).message_error_reset(app_error);
        session_of(ud).transport().app_reset_writing(stream_id, app_error);
        return 0;
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

int cb_acked_stream_data(nghttp3_conn *, int64_t, uint64_t n, void *ud, void *sud) {
  return guarded(
      [&]() -> int {
        if (sud)
          session_of(ud).on_acked(*static_cast<H3Session::Stream *>(sud), n);
        return 0;
      },
      int{NGHTTP3_ERR_CALLBACK_FAILURE});
}

nghttp3_ssize cb_read_body(nghttp3_conn *, int64_t, nghttp3_vec *vec, size_t veccnt,
                           uint32_t *flags, void *ud, void *sud) {
  return guarded(
      [&]() -> nghttp3_ssize {
        if (!sud) {
          *flags |= NGHTTP3_DATA_FLAG_EOF;
          return 0;
        }
        return session_of(ud).on_read_body(*static_cast<H3Session::Stream *>(sud), vec, veccnt,
                                           flags);
      },
      nghttp3_ssize{NGHTTP3_ERR_CALLBACK_FAILURE});
}

std::string_view view(nghttp3_rcbuf *b) {
  auto v = nghttp3_rcbuf_get_buf(b);
  return {reinterpret_cast<const char *>(v.base), v.len};
}

// nghttp3 copies (and lower-cases) what it is not told to leave: the
// names are lower-case literals or live in the stream's Response, as do
// the values but the builder's, and nghttp3 encodes the HEADERS frame
// before the stream closes, which is when the Response is reset.
nghttp3_nv make_nv(std::string_view name, std::string_view value, bool copy_value) {
  return nghttp3_nv{reinterpret_cast<uint8_t *>(const_cast<char *>(name.data())),
                    reinterpret_cast<uint8_t *>(const_cast<char *>(value.data())), name.size(),
                    value.size(),
                    static_cast<uint8_t>(NGHTTP3_NV_FLAG_NO_COPY_NAME |
                                         (copy_value ? 0 : NGHTTP3_NV_FLAG_NO_COPY_VALUE))};
}

} // namespace

H3Session::H3Session(quic::AppTransport &transport, std::shared_ptr<const Router> router,
                     const H3Limits &limits, H3Stats &stats)
    : transport_(transport), router_(std::move(router)), limits_(limits), stats_(stats),
      budget_(limits.budget, limits.max_body_per_connection),
      body_credit_(BodyCredit::allowance(limits.max_body_per_connection, limits.max_conn_window)),
      ra_pool_(limits.read_ahead) {
  head_.set_extra(limits.response_headers);
  nghttp3_callbacks cbs{};
  cbs.stream_close = cb_stream_close;
  cbs.recv_data = cb_recv_data;
  cbs.deferred_consume = cb_deferred_consume;
  cbs.begin_headers = cb_begin_headers;
  cbs.recv_header = cb_recv_header;
  cbs.end_headers = cb_end_headers;
  cbs.begin_trailers = cb_begin_trailers;
  cbs.recv_trailer = cb_recv_trailer;
  cbs.stop_sending = cb_stop_sending;
  cbs.end_stream = cb_end_stream;
  cbs.reset_stream = cb_reset_stream;
  cbs.acked_stream_data = cb_acked_stream_data;
  nghttp3_settings settings;
  nghttp3_settings_default(&settings);
  settings.max_field_section_size = limits_.max_field_section_size;
  settings.qpack_max_dtable_capacity = limits_.qpack_table_capacity;
  settings.qpack_blocked_streams = limits_.qpack_table_capacity ? 100 : 0;
  // Our encoder uses no dynamic table, whatever the client offers: its
  // instructions would queue on the encoder stream for as long as the
  // client withholds that stream's credit, and each new Date or file type
  // is a new entry. Static table and literals only, as nginx and HAProxy
  // encode theirs.
  settings.qpack_encoder_max_dtable_capacity = 0;
  // nghttp3's per-stream buffers and QPACK strings come from the worker's
  // per-thread block cache, charged to the connection: a client can make
  // nghttp3 hold much for little (a field value's announced length is
  // allocated, twice over for Huffman, before a byte of it arrives), and
  // the worker's QUIC memory limit must see it.
  mem_ = small_alloc::counted_table<nghttp3_mem>(this);
  if (nghttp3_conn_server_new(&conn_, &cbs, &settings, &mem_, this) != 0) {
    throw std::bad_alloc();
  }
}

H3Session::~H3Session() {
  // Requests open when the connection ends are logged as they stand.
  for (auto &p : pool_) log_request(*p);
  charge_memory(-static_cast<int64_t>(heads_held_));
  nghttp3_conn_del(conn_);
  if (ra_pool_) {
    // Streams still open die with the connection: their share goes back.
    ra_pool_->held -= std::min(read_ahead_held_, ra_pool_->held);
    if (pool_waiting_) ra_pool_->waiting.erase(pool_place_);
    ra_pool_->wake();
  }
}

void ReadAheadPool::wake() {
  for (size_t i = 0; i < WAKE_BATCH && !waiting.empty() && !full(); ++i) {
    H3Session *s = waiting.front();
    waiting.pop_front();
    s->wake_for_read_ahead();
  }
}

void H3Session::log_request(Stream &s) {
  if (!s.begun_ns || !limits_.access_log) return;
  limits_.access_log->record(transport_.app_peer(), s.req, "HTTP/3", s.status, s.body_offset,
                             monotonic_ns() - s.begun_ns);
  s.begun_ns = 0;
}

void H3Session::wake_for_read_ahead() {
  pool_waiting_ = false;
  transport_.app_want_write();
}

void H3Session::wait_for_pool(bool front) {
  if (pool_waiting_ || !ra_pool_ || !ra_pool_->full()) return;
  pool_waiting_ = true;
  pool_place_ = front ? ra_pool_->waiting.insert(ra_pool_->waiting.begin(), this)
                      : ra_pool_->waiting.insert(ra_pool_->waiting.end(), this);
  stats_.read_ahead_waits += 1;
}

void H3Session::leave_pool_if_idle() {
  if (!pool_waiting_ || !read_waiting_.empty()) return;
  ra_pool_->waiting.erase(pool_place_);
  pool_waiting_ = false;
}

uint64_t H3Session::read_ahead_room() const {
  uint64_t room = read_ahead_held_ < MAX_READ_AHEAD ? MAX_READ_AHEAD - read_ahead_held_ : 0;
  if (ra_pool_) room = std::min(room, ra_pool_->full() ? 0 : ra_pool_->limit - ra_pool_->held);
  return room;
}

void H3Session::hold_read_ahead(uint64_t n) {
  if (read_ahead_held_ == 0) stall_since_ = 0; // a fresh hold: not stalled
  read_ahead_held_ += n;
  if (ra_pool_) ra_pool_->held += n;
}

void H3Session::release_read_ahead(uint64_t n) {
  n = std::min(n, read_ahead_held_);
  read_ahead_held_ -= n;
  ra_released_ += n;
  if (conn_waiting_ > 0) transport_.app_want_write(); // room for them: before_write()
  if (ra_pool_ && n > 0) {
    ra_pool_->held -= std::min(n, ra_pool_->held);
    ra_pool_->wake();
  }
}

int H3Session::start(uint64_t max_client_bidi_streams) {
  set_max_client_streams_bidi(max_client_bidi_streams);
  int64_t ctrl = transport_.app_open_uni_stream();
  int64_t qenc = transport_.app_open_uni_stream();
  int64_t qdec = transport_.app_open_uni_stream();
  if (ctrl < 0 || qenc < 0 || qdec < 0)
    return NGHTTP3_ERR_STREAM_NOT_FOUND;
  int rv = nghttp3_conn_bind_control_stream(conn_, ctrl);
  if (rv != 0) return rv;
  return nghttp3_conn_bind_qpack_streams(conn_, qenc, qdec);
}

bool H3Session::read_ahead_stalled() {
  const uint64_t now = transport_.app_now();
  // Progress is a block's worth let go of (or all that was held, if less)
  // within the period, not any acknowledgement: a few bytes now and then
  // would keep the rest held for ever.
  const bool restart = stall_since_ == 0 || ra_released_ - stall_seen_ >= stall_need_;
  if (restart) {
    stall_since_ = now;
    stall_seen_ = ra_released_;
    stall_need_ = std::min(read_ahead_held_, ReadAheadPool::STALL_PROGRESS);
    ra_stopped_ = false;
  }
  // The longer limit only while what is held is still a little.
  const uint64_t limit = ra_stopped_ && read_ahead_held_ <= READ_AHEAD
                             ? ReadAheadPool::STOPPED_STALL
                             : ReadAheadPool::STALL;
  if (!restart && now - stall_since_ >= limit) {
    stats_.read_ahead_closes += 1;
    return true;
  }
  // Checked again when the limit is up, even if the peer stays silent (a
  // loss probe's backoff can be longer); one wake at a time, moved on only
  // once it has come.
  wake_at(stall_since_ + limit, now);
  return false;
}

void H3Session::wake_at(uint64_t at, uint64_t now) {
  // One wake at a time, moved only earlier until it has come.
  if (now >= wake_armed_ || at < wake_armed_) {
    wake_armed_ = at;
    transport_.app_wake_at(at);
  }
}

void H3Session::stream_opened(int64_t stream_id) { opening_.push_back({stream_id, 0}); }

void H3Session::stop_opening(int64_t stream_id) {
  // Mostly the oldest: streams begin their HEADERS in the order they open.
  auto it = std::find_if(opening_.begin(), opening_.end(),
                         [&](const Opening &o) { return o.id == stream_id; });
  if (it != opening_.end()) opening_.erase(it);
}

void H3Session::time_heads() {
  const uint64_t now = transport_.app_now();
  // Streams that never began a HEADERS frame: reset both ways, like heads
  // not whole in time.
  size_t gone_by = 0;
  for (auto &o : opening_) {
    if (o.since == 0) o.since = now;
    if (limits_.header_timeout == 0 || now - o.since < limits_.header_timeout) break;
    ++gone_by;
  }
  for (size_t i = 0; i < gone_by; ++i) {
    stats_.header_timeouts += 1;
    transport_.app_stop_reading(opening_[i].id, NGHTTP3_H3_REQUEST_INCOMPLETE);
    transport_.app_reset_writing(opening_[i].id, NGHTTP3_H3_REQUEST_INCOMPLETE);
  }
  opening_.erase(opening_.begin(), opening_.begin() + static_cast<ptrdiff_t>(gone_by));
  for (auto &o : opening_) o.since = o.since ? o.since : now;
  size_t expired = 0;
  for (Stream *s : heading_) {
    if (s->head_since == 0) s->head_since = now; // began since the last write
    if (limits_.header_timeout == 0 || now - s->head_since < limits_.header_timeout) break;
    ++expired;
  }
  for (size_t i = 0; i < expired; ++i) {
    Stream &s = *heading_[i];
    s.heading = false;
    s.refused = true; // whatever comes of it now is discarded
    stats_.header_timeouts += 1;
    transport_.app_stop_reading(s.id, NGHTTP3_H3_REQUEST_INCOMPLETE);
    transport_.app_reset_writing(s.id, NGHTTP3_H3_REQUEST_INCOMPLETE);
  }
  heading_.erase(heading_.begin(), heading_.begin() + static_cast<ptrdiff_t>(expired));
  // Those begun since the last write are at the back, unstamped.
  for (auto it = heading_.rbegin(); it != heading_.rend() && (*it)->head_since == 0; ++it)
    (*it)->head_since = now;
  if (limits_.header_timeout != 0) {
    if (!heading_.empty()) wake_at(heading_.front()->head_since + limits_.header_timeout, now);
    if (!opening_.empty()) wake_at(opening_.front().since + limits_.header_timeout, now);
  }
}

void H3Session::abandoned(Stream &s) {
  if (s.heading) stop_heading(s);
  if (!s.exchange) s.refused = true; // nothing more of it is taken or answered
}

void H3Session::stop_heading(Stream &s) {
  s.heading = false;
  // Usually the newest, or the only one.
  for (size_t i = heading_.size(); i-- > 0;) {
    if (heading_[i] == &s) {
      heading_.erase(heading_.begin() + static_cast<ptrdiff_t>(i));
      break;
    }
  }
}

uint64_t H3Session::app_error_code(int64_t error) const {
  if (error == ERR_READ_AHEAD_STALLED || error == ERR_CANCELS_SPENT)
    return NGHTTP3_H3_EXCESSIVE_LOAD;
  return nghttp3_err_infer_quic_app_error_code(static_cast<int>(error));
}

void H3Session::shutdown_notice() { nghttp3_conn_submit_shutdown_notice(conn_); }

void H3Session::shutdown_final() { nghttp3_conn_shutdown(conn_); }

int64_t H3Session::read_stream(int64_t stream_id, const uint8_t *data, size_t len, bool fin,
                               bool early) {
  reading_early_ = early;
  auto n = nghttp3_conn_read_stream(conn_, stream_id, data, len, fin ? 1 : 0);
  reading_early_ = false;
  if (cancels_spent_) return ERR_CANCELS_SPENT;
  if (!flush_.empty()) flush_bodies();
  return n;
}

int64_t H3Session::writev_stream(int64_t &stream_id, int &fin, ngtcp2_vec *vec, size_t veccnt) {
  static_assert(sizeof(ngtcp2_vec) == sizeof(nghttp3_vec) &&
                    offsetof(ngtcp2_vec, len) == offsetof(nghttp3_vec, len),
                "ngtcp2_vec and nghttp3_vec share a layout");
  auto n = nghttp3_conn_writev_stream(conn_, &stream_id, &fin, reinterpret_cast<nghttp3_vec *>(vec),
                                      veccnt);
  send_resets(); // streams nghttp3's reads of their bodies found broken
  return n;
}

void H3Session::send_resets() {
  for (int64_t id : aborted_) {
    transport_.app_stop_reading(id, NGHTTP3_H3_INTERNAL_ERROR);
    transport_.app_reset_writing(id, NGHTTP3_H3_INTERNAL_ERROR);
  }
  aborted_.clear();
  for (int64_t id : cancelled_) {
    transport_.app_stop_reading(id, NGHTTP3_H3_REQUEST_CANCELLED);
    transport_.app_reset_writing(id, NGHTTP3_H3_REQUEST_CANCELLED);
  }
  cancelled_.clear();
}

int H3Session::add_write_offset(int64_t stream_id, size_t n) {
  return nghttp3_conn_add_write_offset(conn_, stream_id, n);
}

int H3Session::add_ack_offset(int64_t stream_id, uint64_t n) {
  return nghttp3_conn_add_ack_offset(conn_, stream_id, n);
}

void H3Session::block_stream(int64_t stream_id) { nghttp3_conn_block_stream(conn_, stream_id); }

int H3Session::unblock_stream(int64_t stream_id) {
  // The peer raised the stream's window: a file body waiting for credit
  // reads again.
  if (auto it = std::find_if(read_waiting_.begin(), read_waiting_.end(),
                             [&](const Stream *w) { return w->id == stream_id; });
      it != read_waiting_.end() && !(*it)->waits_for_conn) {
    stop_waiting(**it);
    if (int rv = nghttp3_conn_resume_stream(conn_, stream_id); rv != 0) return rv;
  }
  return nghttp3_conn_unblock_stream(conn_, stream_id);
}

void H3Session::wait_to_read(Stream &s, bool for_connection) {
  if (s.read_waiting) stop_waiting(s);
  s.read_waiting = true;
  s.waits_for_conn = for_connection;
  conn_waiting_ += for_connection;
  read_waiting_.push_back(&s);
}

void H3Session::stop_waiting(Stream &s) {
  if (!s.read_waiting) return;
  conn_waiting_ -= s.waits_for_conn;
  s.read_waiting = s.waits_for_conn = false;
  std::erase(read_waiting_, &s);
}

// At the start of a write (never inside nghttp3's callbacks): the streams
// waiting for the connection's window or room read again once both are
// there; each re-checks when nghttp3 asks it.
void H3Session::wake_readers() {
  if (transport_.app_conn_credit() == 0) return;
  if (read_ahead_room() == 0) {
    // Woken by the pool, and others took the room first: wait again, at
    // the front (nothing else would wake this session).
    wait_for_pool(true);
    return;
  }
  for (size_t i = 0; i < read_waiting_.size();) {
    Stream *w = read_waiting_[i];
    if (!w->waits_for_conn) {
      ++i;
      continue;
    }
    stop_waiting(*w);
    nghttp3_conn_resume_stream(conn_, w->id);
  }
}

void H3Session::shutdown_stream_write(int64_t stream_id) {
  nghttp3_conn_shutdown_stream_write(conn_, stream_id);
}

int H3Session::close_stream(int64_t stream_id, uint64_t app_error) {
  if (!opening_.empty()) stop_opening(stream_id);
  // nghttp3 keeps a stream whose header section waits for QPACK insertions
  // (it closes it once they come, or with the connection): the transport's
  // stream is gone, so its head is timed no more.
  for (Stream *s : heading_) {
    if (s->id == stream_id) {
      abandoned(*s);
      break;
    }
  }
  closing_ = stream_id;
  freed_ = false;
  int rv = nghttp3_conn_close_stream(conn_, stream_id, app_error);
  closing_ = -1;
  if (rv == 0 && !freed_) gone_.push_back(stream_id); // kept: until nghttp3 frees it
  return rv == NGHTTP3_ERR_STREAM_NOT_FOUND ? 0 : rv; // a stream nghttp3 never saw
}

H3Session::Stream *H3Session::find(int64_t stream_id) const {
  for (const auto &p : pool_) {
    if (p->id == stream_id) return p.get();
  }
  return nullptr;
}

bool H3Session::answered(int64_t stream_id) const {
  // Rare (a stream closing reset by the peer's STOP_SENDING): a scan.
  const Stream *s = find(stream_id);
  return s && s->answered;
}

void H3Session::shutdown_stream_read(int64_t stream_id) {
  nghttp3_conn_shutdown_stream_read(conn_, stream_id);
  // The client reset its request (or stopped our response): a proxied body
  // still coming will not, and the upstream must not wait for it. Unless
  // the answer is whole already: then the body is not wanted (we may have
  // asked for this reset with STOP_SENDING) and the response goes on. Rare:
  // a scan of this connection's streams.
  Stream *s = find(stream_id);
  if (s && s->exchange && s->exchange->body_expected() && !s->exchange->ended())
    abort_request(*s, true);
}

void H3Session::peer_reset(int64_t stream_id) {
  shutdown_stream_read(stream_id);
  if ((stream_id & 3) != 0) return; // not a request stream
  // Answered, being answered (a proxied exchange: see above) or abandoned
  // by us already: nothing to do. Otherwise the request never became whole
  // (its head, or its body for a handler) and nothing will answer it.
  Stream *s = find(stream_id);
  if (s && (s->responded || s->refused || s->exchange || s->aborted)) return;
  if (s) {
    if (s->heading) stop_heading(*s);
    s->refused = true;
  }
  // A stream that is neither one of ours nor still opening was abandoned
  // by us already (its head timed out): the client's reset answers ours,
  // and is no second abandoned request.
  auto it = std::find_if(opening_.begin(), opening_.end(),
                         [&](const Opening &o) { return o.id == stream_id; });
  const bool opening = it != opening_.end();
  // Abandoned both ways now: no longer timed as well (its close, once the
  // client acknowledges our reset, may come after the deadline).
  if (opening) opening_.erase(it);
  if (s || opening) stats_.incomplete_resets += 1;
  transport_.app_reset_writing(stream_id, NGHTTP3_H3_REQUEST_INCOMPLETE);
}

void H3Session::set_max_client_streams_bidi(uint64_t n) {
  nghttp3_conn_set_max_client_streams_bidi(conn_, n);
}

H3Session::Stream *H3Session::acquire(int64_t stream_id) {
  Stream *s;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
    keep_.unpark(s->kept);
  } else {
    pool_.push_back(std::make_unique<Stream>());
    s = pool_.back().get();
  }
  s->reset(stream_id);
  return s;
}

int H3Session::on_begin_headers(int64_t stream_id) {
  if (!opening_.empty()) stop_opening(stream_id);
  Stream *s = acquire(stream_id);
  s->early = reading_early_;
  int rv = nghttp3_conn_set_stream_user_data(conn_, stream_id, s);
  if (rv != 0) {
    s->id = -1;
    free_.push_back(s);
    return rv;
  }
  active_ += 1;
  s->heading = true;
  heading_.push_back(s);
  return 0;
}

int H3Session::on_header(Stream &s, int32_t token, nghttp3_rcbuf *name, nghttp3_rcbuf *value) {
  auto n = view(name);
  auto v = view(value);
  s.header_bytes += n.size() + v.size() + 32;
  s.header_fields += counts_as_field(n);
  if (s.header_bytes > limits_.max_field_section_size ||
      s.header_fields > limits_.max_header_fields) {
    // Keep decoding (QPACK state must stay in sync) but store nothing more.
    s.headers_too_large = true;
    return 0;
  }
  const size_t held = n.size() + v.size() + 32;
  s.head_held += held;
  heads_held_ += held;
  charge_memory(static_cast<int64_t>(held));
  switch (token) {
  case NGHTTP3_QPACK_TOKEN__METHOD: s.req.method.assign(v); break;
  case NGHTTP3_QPACK_TOKEN__SCHEME: s.req.scheme.assign(v); break;
  case NGHTTP3_QPACK_TOKEN__AUTHORITY: s.req.authority.assign(v); break;
  case NGHTTP3_QPACK_TOKEN__PATH: s.req.path.assign(v); break;
  default:
    if (!n.empty() && n.front() != ':') {
      s.req.headers.add(n, v);
    }
  }
  return 0;
}

int H3Session::on_trailer(Stream &s, nghttp3_rcbuf *name, nghttp3_rcbuf *value) {
  // Trailers are not kept (nor passed on); they are counted against the
  // head's limits, or a client could stream fields on one request without
  // end, nghttp3 crediting their bytes as it decodes them.
  s.header_bytes += view(name).size() + view(value).size() + 32;
  s.header_fields += 1;
  if (s.trailers_refused ||
      (s.header_bytes <= limits_.max_field_section_size &&
       s.header_fields <= limits_.max_header_fields))
    return 0;
  s.trailers_refused = true;
  // Counted where refused here, not again for a request refused at its head.
  if (s.exchange) {
    if (s.aborted) return 0;
    stats_.header_limit_rejects += 1;
    abort_request(s); // its body went upstream already: reset
  } else if (!s.responded && !s.refused) {
    stats_.header_limit_rejects += 1;
    s.refused = true; // its end is not dispatched
    make_error(s.resp, 431, s.req.method == "HEAD");
    respond(s);
    transport_.app_stop_reading(s.id, NGHTTP3_H3_NO_ERROR);
  } else {
    transport_.app_stop_reading(s.id, NGHTTP3_H3_EXCESSIVE_LOAD); // answered: the rest unread
  }
  return 0;
}

int H3Session::on_end_headers(Stream &s, bool fin) {
  if (s.heading) stop_heading(s);
  if (s.refused || gone(s.id)) return 0; // timed out already, or closed
  stats_.requests += 1;
  s.started_ns = monotonic_ns();
  s.begun_ns = s.started_ns;
  if (s.headers_too_large) {
    stats_.header_limit_rejects += 1;
    make_error(s.resp, 431, s.req.method == "HEAD");
    respond(s);
    if (!fin) {
      // RFC 9114 4.1: a complete response may precede the request's end.
      transport_.app_stop_reading(s.id, NGHTTP3_H3_NO_ERROR);
    }
    return 0;
  }
  if (s.early && s.req.method != "GET" && s.req.method != "HEAD" && s.req.method != "OPTIONS") {
    // A replayed 0-RTT packet must not repeat a request with side effects;
    // the client sends it again after the handshake (RFC 8470 5.2).
    stats_.too_early += 1;
    s.refused = true; // ignore its body
    make_error(s.resp, 425);
    respond(s);
    if (!fin)
      transport_.app_stop_reading(s.id, NGHTTP3_H3_NO_ERROR);
    return 0;
  }
  dispatch(s, !fin);
  return 0;
}

void H3Session::dispatch(Stream &s, bool body_follows) {
  if (limits_.proxy) {
    int route = limits_.proxy->match(s.req.path);
    if (route >= 0) {
      // Proxied at once: the body streams upstream as it arrives.
      Proxy::Client client;
      client.peer = transport_.app_peer();
      client.peer_proven = transport_.app_peer_proven();
      client.early = s.early;
      auto ex = limits_.proxy->start(route, s.req, body_follows, client, this, &s, &budget_);
      s.exchange = ex.get();
      s.resp.body = std::move(ex);
      if (s.exchange->head_ready()) {
        respond(s);
      } else {
        s.awaiting = true;
        awaiting_ += 1;
      }
      return;
    }
  }
  // A handler that reads the body gets the request once it is whole;
  // any other answers now, and the body is not read (RFC 9114 4.1: a
  // complete response may come before the request's end).
  if (body_follows && router_->takes_body(s.req)) return;
  router_->route(s.req, s.resp);
  respond(s);
  if (body_follows) transport_.app_stop_reading(s.id, NGHTTP3_H3_NO_ERROR);
}

void H3Session::proxy_progress(void *tag) {
  auto &s = *static_cast<Stream *>(tag);
  if (s.aborted || gone(s.id)) return;
  credit(s);
  const bool head_now = !s.responded && s.exchange->head_ready();
  if (head_now) respond(s);
  if (!s.responded) {
    // No head yet.
  } else if (s.exchange->failed()) {
    // Reset from here, not when nghttp3 next asks for data: it may never
    // ask (a client that grants no stream window, with bytes still in the
    // ring), and the stream would hold its ring and budget meanwhile. The
    // client discards a reset stream's data anyway.
    s.aborted = true;
    aborted_.push_back(s.id);
    stats_.stream_errors += 1;
  } else if (!head_now) {
    nghttp3_conn_resume_stream(conn_, s.id);
  }
  transport_.app_want_write();
}

bool H3Session::credit(Stream &s) {
  const auto c = body_credit_.left(s.flow, s.exchange->body_out());
  if (c.stream) transport_.app_consume_stream(s.id, c.stream);
  if (c.conn) transport_.app_consume_conn(c.conn);
  return c.stream || c.conn;
}

void H3Session::flush_bodies() {
  bool credited = false;
  for (size_t i = 0; i < flush_.size(); ++i) {
    Stream &s = *flush_[i];
    s.flush_queued = false;
    if (!s.exchange || s.aborted) continue;
    s.exchange->flush_body();
    credited |= credit(s);
  }
  flush_.clear();
  // Credit for the client goes out now; nothing else to write otherwise
  // (an exchange that progressed has told us through proxy_progress).
  if (credited) transport_.app_want_write();
}

void H3Session::abort_request(Stream &s, bool by_client) {
  s.exchange->abort_body();
  if (s.aborted) return;
  s.aborted = true;
  s.responded = true; // whatever the exchange says now, the stream is reset
  settle(s);
  if (by_client) {
    // The client reset its request mid-body: an incomplete request, not
    // the server's error; our side goes with H3_REQUEST_CANCELLED.
    stats_.incomplete_resets += 1;
    cancelled_.push_back(s.id);
  } else {
    stats_.stream_errors += 1;
    aborted_.push_back(s.id);
  }
  transport_.app_want_write();
}

// A proxied request's body: into the exchange, credited as BodyCredit
// says (a stream whose upstream is slow or stalled holds up no other).
void H3Session::on_proxy_data(Stream &s, const uint8_t *data, size_t len) {
  if (s.aborted || s.refused) {
    transport_.app_consume(s.id, len);
    return;
  }
  if (!s.exchange->put_body(data, len)) {
    // Past its content-length, or over the body budget.
    transport_.app_consume(s.id, len);
    abort_request(s);
    return;
  }
  if (uint64_t now = body_credit_.arrived(s.flow, len, budget_.held()))
    transport_.app_consume_conn(now);
  if (s.exchange->ended() && !s.stop_sent) {
    // Answered whole already: the rest of the body is not wanted
    // (RFC 9114 4.1).
    s.stop_sent = true;
    transport_.app_stop_reading(s.id, NGHTTP3_H3_NO_ERROR);
  }
  if (!s.flush_queued) {
    s.flush_queued = true;
    flush_.push_back(&s);
  }
}

int H3Session::on_data(Stream &s, const uint8_t *data, size_t len) {
  if (s.exchange) {
    on_proxy_data(s, data, len);
    return 0;
  }
  transport_.app_consume(s.id, len);
  if (s.responded || s.refused) return 0;
  if (s.req.body.size() + len > limits_.max_request_body) {
    s.body_too_large = true;
    stats_.body_limit_rejects += 1;
    release_body(s);
    make_error(s.resp, 413, s.req.method == "HEAD");
    respond(s);
    transport_.app_stop_reading(s.id, NGHTTP3_H3_NO_ERROR);
    return 0;
  }
  if (!budget_.try_take(len)) {
    refuse(s);
    return 0;
  }
  s.charged += len;
  s.req.body.append(reinterpret_cast<const char *>(data), len);
  return 0;
}

void H3Session::release_body(Stream &s) {
  budget_.give_back(s.charged);
  s.charged = 0;
  std::string().swap(s.req.body);
}

void H3Session::refuse(Stream &s) {
  s.refused = true;
  stats_.body_budget_refusals += 1;
  release_body(s);
  // Nothing of the request was processed: the client may retry it.
  transport_.app_stop_reading(s.id, NGHTTP3_H3_REQUEST_REJECTED);
  transport_.app_reset_writing(s.id, NGHTTP3_H3_REQUEST_REJECTED);
}

int H3Session::on_end_stream(Stream &s) {
  if (gone(s.id)) return 0; // unblocked after its close: nothing can answer it
  if (s.exchange) {
    if (s.aborted) return 0;
    if (!s.exchange->end_body()) return abort_request(s), 0; // short of its content-length
    if (!s.flush_queued) {
      s.flush_queued = true;
      flush_.push_back(&s);
    }
    return 0;
  }
  if (!s.responded && !s.refused) dispatch(s, false);
  return 0;
}

void H3Session::settle(Stream &s) {
  if (!s.awaiting) return;
  s.awaiting = false;
  awaiting_ -= 1;
}

void H3Session::on_stream_close(Stream &s) {
  active_ -= 1;
  heads_held_ -= s.head_held;
  charge_memory(-static_cast<int64_t>(s.head_held));
  s.head_held = 0;
  if (s.heading) stop_heading(s);
  settle(s);
  budget_.give_back(s.charged); // the body, or the response made from it
  s.charged = 0;
  if (s.exchange && s.exchange->body_expected()) s.exchange->abort_body(); // reset mid-body
  // Bytes held without the connection's credit die with the stream.
  if (s.exchange) {
    if (uint64_t owed = body_credit_.closed(s.flow, s.exchange->body_in()))
      transport_.app_consume_conn(owed);
  }
  if (s.resp.body && s.resp.body->reads_ahead() && s.body_offset > s.acked)
    release_read_ahead(s.body_offset - s.acked);
  stop_waiting(s);
  leave_pool_if_idle();
  std::erase(aborted_, s.id); // closed already: nothing to reset
  std::erase(cancelled_, s.id);
  log_request(s);
  s.req.reset();
  s.exchange = nullptr;
  s.resp.reset(); // releases the body (a cached file entry, a proxied exchange) now
  s.id = -1;      // find() passes it by
  keep_.park(s.req, s.resp.headers, s.kept);
  free_.push_back(&s);
}

void H3Session::respond(Stream &s) {
  s.responded = true;
  // nghttp3 would queue the answer of a stream it is about to free.
  if (gone(s.id)) return;
  settle(s);
  // A connection holding an ACK for a proxied answer writes this one now.
  if (awaiting_) transport_.app_want_write();
  const auto &resp = s.exchange ? s.exchange->head() : s.resp;
  stats_.count_response(resp.status);
  s.status = resp.status;

  head_.build(resp);
  nva_.clear();
  nva_.push_back(make_nv(":status", head_.status(), true));
  for (const auto &f : head_.fields())
    nva_.push_back(make_nv(f.name, f.value, f.value_in_builder));
  nghttp3_data_reader dr{cb_read_body};
  bool has_body = s.exchange ? s.exchange->has_body() : resp.body && resp.body->size() > 0;
  int rv = nghttp3_conn_submit_response(conn_, s.id, nva_.data(), nva_.size(),
                                        has_body ? &dr : nullptr);
  if (!has_body) {
    s.answered = rv == 0; // the HEADERS frame ends the stream
    record_latency(s);
  }
  if (rv != 0) {
    stats_.stream_errors += 1;
    transport_.app_reset_writing(s.id, NGHTTP3_H3_INTERNAL_ERROR);
  }
}

// Request latency: from the request's headers to the whole response handed
// to QUIC (not to its acknowledgement, which a departing client may skip).
void H3Session::record_latency(Stream &s) {
  if (s.started_ns) {
    stats_.request_latency.record(monotonic_ns() - s.started_ns);
    s.started_ns = 0;
  }
}

nghttp3_ssize H3Session::on_read_body(Stream &s, nghttp3_vec *vec, size_t veccnt,
                                      uint32_t *flags) {
  if (s.exchange) return read_streamed(s, vec, veccnt, flags);
  const Body *body = s.resp.body.get();
  if (!body) {
    *flags |= NGHTTP3_DATA_FLAG_EOF;
    s.answered = true;
    return 0;
  }
  if (s.aborted)
    return NGHTTP3_ERR_WOULDBLOCK; // reset after this write pass
  size_t n = 0;
  uint64_t size = body->size();
  uint64_t given = 0;
  // A read-ahead of about one block: what we hand out stays referenced
  // until acknowledged, so handing out everything would hold it all.
  uint64_t limit = READ_AHEAD;
  const bool ahead = body->reads_ahead();
  if (ahead && s.body_offset < size) {
    // A file: read no further than the peer lets us send (a client that
    // keeps its windows shut holds nothing), and no more per connection
    // than MAX_READ_AHEAD unacknowledged.
    const uint64_t room = read_ahead_room();
    const uint64_t stream_credit = transport_.app_stream_credit(s.id);
    const uint64_t conn_credit = transport_.app_conn_credit();
    limit = std::min<uint64_t>({limit, stream_credit, conn_credit, room});
    if (limit == 0) {
      wait_to_read(s, stream_credit > 0);
      // The worker's limit, not ours: woken when another connection lets
      // go of some.
      if (room == 0) wait_for_pool(false);
      return NGHTTP3_ERR_WOULDBLOCK;
    }
    // It reads (woken by the pool, its window, or another's release): a
    // session none of whose streams waits any more leaves the pool's queue
    // (one still waiting keeps its place there).
    leave_pool_if_idle();
  }
  while (n < veccnt && s.body_offset < size && given < limit) {
    auto c = body->chunk(s.body_offset);
    if (c.empty()) {
      // The content went away (a file truncated under us): the promised
      // length cannot be kept, so the stream is reset once nghttp3 is done.
      s.aborted = true;
      aborted_.push_back(s.id);
      stats_.stream_errors += 1;
      if (ahead) hold_read_ahead(given); // what went before is held like any
      return n ? static_cast<nghttp3_ssize>(n) : NGHTTP3_ERR_WOULDBLOCK;
    }
    vec[n].base = const_cast<uint8_t *>(c.data());
    vec[n].len = c.size();
    s.body_offset += c.size();
    given += c.size();
    ++n;
  }
  if (ahead) hold_read_ahead(given);
  if (s.body_offset >= size) {
    *flags |= NGHTTP3_DATA_FLAG_EOF;
    s.answered = true;
    record_latency(s);
  }
  return static_cast<nghttp3_ssize>(n);
}

// A proxied body: what has arrived, "would block" until more does (the
// proxy resumes the stream), a reset if the upstream broke off.
nghttp3_ssize H3Session::read_streamed(Stream &s, nghttp3_vec *vec, size_t veccnt,
                                       uint32_t *flags) {
  if (s.aborted) return NGHTTP3_ERR_WOULDBLOCK; // reset after this write pass
  const ProxyExchange &ex = *s.exchange;
  size_t n = 0;
  uint64_t given = 0;
  while (n < veccnt && given < READ_AHEAD) {
    auto c = ex.chunk(s.body_offset);
    if (c.empty()) break;
    vec[n].base = const_cast<uint8_t *>(c.data());
    vec[n].len = c.size();
    s.body_offset += c.size();
    given += c.size();
    ++n;
  }
  if (s.body_offset == ex.received()) {
    if (ex.failed()) {
      s.aborted = true;
      aborted_.push_back(s.id);
      stats_.stream_errors += 1;
      return n ? static_cast<nghttp3_ssize>(n) : NGHTTP3_ERR_WOULDBLOCK;
    }
    if (ex.ended()) {
      *flags |= NGHTTP3_DATA_FLAG_EOF;
      s.answered = true;
      record_latency(s);
    } else if (n == 0) {
      return NGHTTP3_ERR_WOULDBLOCK;
    }
  }
  return static_cast<nghttp3_ssize>(n);
}

void H3Session::on_acked(Stream &s, uint64_t n) {
  s.acked += n;
  if (s.resp.body) {
    s.resp.body->release(s.acked);
    if (s.resp.body->reads_ahead()) release_read_ahead(n);
  }
}

} // namespace xdpq::http
