// HTTP/2 server session on nghttp2 1.52.

#include "http/tcp_session.h"

#include "http/body_credit.h"
#include "http/response_head.h"

#include "base/clock.h"
#include "base/guard.h"
#include "base/small_alloc.h"
#include "base/token_bucket.h"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace xdpq::http {

namespace {

struct H2Stream {
  int32_t id = 0;
  Request req;
  Response resp;
  uint64_t header_bytes = 0;
  size_t header_fields = 0;
  bool too_large = false;
  bool body_too_large = false;
  bool responded = false;
  bool refused = false;
  bool refused_by_us = false;    // reset for the server's doing (its body budget spent, a file that shrank), not the client's
  bool ended = false;            // the client's END_STREAM arrived
  bool discarding = false;       // answered at its head; its body is skipped as it comes
  uint64_t discarded = 0;        // body bytes dropped after its answer began
  bool answered = false;         // the answer's END_STREAM went out
  bool headers_done = false;
  bool trailers_open = false;    // its trailer block began and has not ended
  uint64_t started_ns = 0;
  size_t charged = 0; // bytes taken from the body budget
  uint64_t offset = 0; // response body bytes handed to nghttp2
  uint64_t begun_ns = 0; // its headers began (the access log's clock; 0: logged)
  int status = 0;        // the response's, once submitted
  TcpStats *stats = nullptr;
  ProxyExchange *exchange = nullptr; // a proxied response (owned by resp.body)
  BodyCredit::Stream flow;   // a proxied body's credit given (see BodyCredit)
  bool flush_queued = false; // in flush_: body bytes to write upstream after this input
  size_t kept = 0;           // idle in free_: the bytes SlotKeep counts for it
};

// Request latency: headers received to the whole response handed to nghttp2.
void record_latency(H2Stream &st) {
  if (st.started_ns && st.stats) {
    uint64_t now = monotonic_ns();
    if (now > st.started_ns) st.stats->request_latency.record(now - st.started_ns);
    st.started_ns = 0;
  }
}

class H2Session final : public TcpSession, public ProxyListener {
public:
  explicit H2Session(const SessionEnv &env)
      : env_(env), budget_(env.budget, env.limits.max_body_per_connection),
        body_credit_(BodyCredit::allowance(env.limits.max_body_per_connection, CONN_WINDOW)) {
    head_.set_extra(env.response_headers);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cb, on_invalid_frame);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_option *opt;
    nghttp2_option_new(&opt);
    nghttp2_option_set_stream_reset_rate_limit(opt, env_.limits.rst_burst, env_.limits.rst_rate);
    // A head of max_header_size bytes takes about that many on the wire
    // (literal fields), in 16 KiB frames: enough CONTINUATIONs for it.
    nghttp2_option_set_max_continuations(
        opt, std::max(env_.limits.max_continuations, env_.limits.max_header_size / 16384 + 2));
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_outbound_ack(opt, 256);
    // Credit is ours to give: at once for bodies we hold whole, and for a
    // proxied body the stream's only as it goes upstream (see on_proxy_data).
    nghttp2_option_set_no_auto_window_update(opt, 1);
    // Bound nghttp2's own HPACK buffering a little above what we enforce.
    nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024);
    // nghttp2's frames and HPACK strings come from the worker's block cache.
    static constexpr nghttp2_mem MEM = small_alloc::c_table<nghttp2_mem>();
    nghttp2_session_server_new3(&session_, cb, this, opt, const_cast<nghttp2_mem *>(&MEM));
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, env_.limits.max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(env_.limits.max_header_size)},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, iv, std::size(iv));
    nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);
    env_.stats->h2_connections += 1;
  }

  ~H2Session() override {
    // Requests open when the connection ends are logged as they stand.
    for (auto &st : pool_) log_request(*st);
    nghttp2_session_del(session_);
  }

  void on_input(const uint8_t *data, size_t len, uint64_t now_ns) override {
    now_ = now_ns;
    if (dead_) return;
    auto rv = nghttp2_session_mem_recv(session_, data, len);
    if (!flush_.empty()) flush_bodies();
    if (rv < 0) {
      // A fatal error (bad preface, flood, too many CONTINUATIONs): make
      // sure a GOAWAY goes out before the close, then stop reading.
      nghttp2_session_terminate_session(
          session_, rv == NGHTTP2_ERR_FLOODED || rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
                        ? NGHTTP2_ENHANCE_YOUR_CALM
                        : NGHTTP2_PROTOCOL_ERROR);
      dead_ = true;
    }
  }

  void produce(std::vector<uint8_t> &out, size_t limit) override {
    while (out.size() < limit) {
      const uint8_t *p = nullptr;
      auto n = nghttp2_session_mem_send(session_, &p);
      if (n <= 0) {
        if (n < 0) dead_ = true;
        break;
      }
      out.insert(out.end(), p, p + n);
    }
  }

  size_t idle_slot_bytes() const override {
    size_t n = 0;
    for (const H2Stream *st : free_) n += st->req.retained_bytes() + st->resp.headers.retained_bytes();
    return n;
  }
  bool finished() const override {
    return dead_ ? !nghttp2_session_want_write(session_)
                 : !nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_);
  }
  bool input_paused() const override { return dead_; }
  uint64_t headers_started() const override {
    // Streams whose HEADERS never completed; nghttp2 itself bounds the time
    // a CONTINUATION sequence may stay open by count, we bound it by time.
    return pending_headers_ ? headers_since_ : 0;
  }
  // Busy too while the graceful shutdown waits for its PING (one round
  // trip): the final GOAWAY must go out before the connection closes.
  // (Not once the client has closed its side: no PING ACK can come.)
  bool busy() const override {
    return active_ > 0 || (shutdown_ && !final_goaway_ && !input_ended_);
  }
  void input_ended() override { input_ended_ = true; }
  // Every open stream proxied and waiting on its upstream: the exchanges'
  // own deadlines bound them (--proxy-timeout to the answer's head and
  // through its body, --proxy-client-timeout), not the connection's write
  // timeout, which would close the connection before a 504 when the two
  // are equal, as by default. An answer an exchange has whole (an error
  // page, an END_STREAM held back by a shut window) is the client's to
  // take, under the write timeout.
  bool timed_by_session() const override {
    if (active_ == 0 || proxied_ != active_) return false;
    for (const auto &st : pool_) { // closed streams have no exchange
      if (st->exchange && (st->exchange->ended() || st->exchange->failed())) return false;
    }
    return true;
  }
  bool counts_activity() const override { return true; }
  uint64_t activity() const override { return activity_; }
  void shutdown() override {
    // RFC 9113 6.8: a GOAWAY naming no stream (2^31-1) and a PING first;
    // the final GOAWAY with the last stream we processed only when the
    // PING comes back, one round trip later, so requests the client sent
    // before it saw the first are served, not refused.
    if (!shutdown_) {
      shutdown_ = true;
      nghttp2_submit_shutdown_notice(session_);
      nghttp2_submit_ping(session_, NGHTTP2_FLAG_NONE, SHUTDOWN_PING);
    }
  }

private:
  static H2Session &self(void *ud) { return *static_cast<H2Session *>(ud); }

  static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
    return guarded(
        [&]() -> int {
          auto &me = self(ud);
          if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_HEADERS) {
            // Trailers: a section of their own, under the head's limits.
            // Timed like a head: a block left open (no END_HEADERS) is
            // abandoned at the header deadline.
            if (auto *st = static_cast<H2Stream *>(
                    nghttp2_session_get_stream_user_data(s, f->hd.stream_id))) {
              st->header_bytes = 0;
              st->header_fields = 0;
              if (!st->trailers_open) {
                st->trailers_open = true;
                me.header_block_began();
              }
            }
            return 0;
          }
          if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
            return 0;
          H2Stream *st;
          if (!me.free_.empty()) {
            st = me.free_.back();
            me.free_.pop_back();
            me.keep_.unpark(st->kept);
          } else {
            me.pool_.push_back(std::make_unique<H2Stream>());
            st = me.pool_.back().get();
          }
          st->req.reset();
          st->resp.reset();
          st->id = f->hd.stream_id;
          st->header_bytes = 0;
          st->header_fields = 0;
          st->too_large = st->body_too_large = st->responded = st->headers_done = false;
          st->trailers_open = false;
          st->refused = st->refused_by_us = st->ended = st->discarding = false;
          st->discarded = 0;
          st->answered = false;
          st->charged = 0;
          st->offset = 0;
          st->exchange = nullptr;
          st->flow = {};
          st->flush_queued = false;
          st->started_ns = me.now_;
          st->begun_ns = me.now_;
          st->status = 0;
          st->stats = me.env_.stats;
          if (nghttp2_session_set_stream_user_data(s, f->hd.stream_id, st) != 0) {
            me.free_.push_back(st);
            return NGHTTP2_ERR_CALLBACK_FAILURE;
          }
          me.active_ += 1;
          me.header_block_began();
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                       size_t namelen, const uint8_t *value, size_t valuelen, uint8_t,
                       void *ud) {
    return guarded(
        [&]() -> int {
          auto &me = self(ud);
          auto *st =
              static_cast<H2Stream *>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
          if (!st || f->hd.type != NGHTTP2_HEADERS)
            return 0;
          std::string_view n(reinterpret_cast<const char *>(name), namelen);
          std::string_view v(reinterpret_cast<const char *>(value), valuelen);
          st->header_bytes += namelen + valuelen + 32;
          st->header_fields += counts_as_field(n);
          if (st->header_bytes > me.env_.limits.max_header_size ||
              st->header_fields > me.env_.limits.max_header_fields) {
            st->too_large = true;
            // Far past the limit: stop decoding for this stream altogether.
            if (st->header_bytes > 4 * me.env_.limits.max_header_size) {
              return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
            }
            return 0;
          }
          // Trailers are not part of the request's header section (RFC
          // 9110 6.5.1): a request answered at its end would see them.
          if (f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
          if (n == ":method")
            st->req.method.assign(v);
          else if (n == ":scheme")
            st->req.scheme.assign(v);
          else if (n == ":authority")
            st->req.authority.assign(v);
          else if (n == ":path")
            st->req.path.assign(v);
          else if (!n.empty() && n[0] != ':')
            st->req.headers.add(n, v);
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
    return guarded(
        [&]() -> int {
          auto &me = self(ud);
          if (f->hd.type == NGHTTP2_PING && (f->hd.flags & NGHTTP2_FLAG_ACK) && me.shutdown_ &&
              !me.final_goaway_ && std::memcmp(f->ping.opaque_data, SHUTDOWN_PING, 8) == 0) {
            me.final_goaway_ = true;
            nghttp2_submit_goaway(s, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(s),
                                  NGHTTP2_NO_ERROR, nullptr, 0);
            return 0;
          }
          if (f->hd.type == NGHTTP2_RST_STREAM) me.client_reset();
          me.control_frame(*f);
          if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
            return 0;
          if (f->hd.type == NGHTTP2_HEADERS) me.activity_ += 1; // DATA: on_data_chunk
          auto *st =
              static_cast<H2Stream *>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
          if (!st)
            return 0;
          if (f->hd.type == NGHTTP2_HEADERS && st->trailers_open) {
            st->trailers_open = false;
            me.header_block_ended();
          }
          if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
            st->headers_done = true;
            me.header_block_ended();
            me.env_.stats->requests += 1;
            if (st->too_large) {
              // Whole (END_STREAM): the answer ends the stream, with no
              // RST_STREAM after it (see on_frame_send).
              if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) st->ended = true;
              me.env_.stats->header_limit_rejects += 1;
              make_error(st->resp, 431, st->req.method == "HEAD");
              me.respond(*st);
              return 0;
            }
            if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
              me.dispatch(*st, true); // a proxied request starts now
              return 0;
            }
          }
          if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
            return 0;
          st->ended = true;
          if (f->hd.type == NGHTTP2_HEADERS && st->too_large) {
            // Trailers over the limits (they end the stream): 431 if the
            // answer has not begun; a proxied body went upstream already,
            // and is reset.
            // Counted where refused here: a head refused with 431 is not
            // counted again for its trailers.
            if (st->exchange) {
              if (st->refused) return 0;
              me.env_.stats->header_limit_rejects += 1;
              me.abort_request(*st);
            } else if (!st->responded && !st->refused) {
              me.env_.stats->header_limit_rejects += 1;
              make_error(st->resp, 431, st->req.method == "HEAD");
              me.respond(*st);
            }
            return 0;
          }
          if (st->exchange) {
            if (st->refused) return 0;
            if (!st->exchange->end_body()) me.abort_request(*st); // short of its length
            else me.queue_flush(*st);
          } else if (!st->responded && !st->refused) {
            me.dispatch(*st, false);
          }
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  static int on_data_chunk(nghttp2_session *s, uint8_t, int32_t id, const uint8_t *data,
                           size_t len, void *ud) {
    return guarded(
        [&]() -> int {
          auto &me = self(ud);
          if (len > 0) me.activity_ += 1; // a request body moved
          auto *st = static_cast<H2Stream *>(nghttp2_session_get_stream_user_data(s, id));
          if (st && st->exchange) {
            me.on_proxy_data(*st, data, len);
            return 0;
          }
          if (st && (st->discarding || st->responded) && !st->refused) {
            // Answered before its body ended (at its head, or 413, 431):
            // the body is read and dropped, up to the request body limit.
            // Past it the stream's credit stops (the connection's comes
            // back): the client can send no more on it, and is told to stop
            // (RST_STREAM NO_ERROR, RFC 9113 8.1) once the answer is all
            // out, not before.
            st->discarded += len;
            if (st->discarded <= me.env_.limits.max_request_body) {
              nghttp2_session_consume(s, id, len);
            } else {
              nghttp2_session_consume_connection(s, len);
              if (st->answered && !st->ended) me.stop_body(*st);
            }
            return 0;
          }
          nghttp2_session_consume(s, id, len);
          if (!st || st->responded || st->refused)
            return 0;
          if (st->req.body.size() + len > me.env_.limits.max_request_body) {
            me.env_.stats->body_limit_rejects += 1;
            me.release_body(*st);
            make_error(st->resp, 413, st->req.method == "HEAD");
            me.respond(*st);
            return 0;
          }
          if (!me.budget_.try_take(len)) {
            // Over the connection's or worker's budget: refuse, hold nothing.
            st->refused = true;
            // The worker's budget spent by all clients is no fault of this
            // one's; its connection's own part full is.
            st->refused_by_us = !me.budget_.own_limit_refused();
            me.env_.stats->body_budget_refusals += 1;
            me.release_body(*st);
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_REFUSED_STREAM);
            return 0;
          }
          st->charged += len;
          st->req.body.append(reinterpret_cast<const char *>(data), len);
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  static int on_stream_close(nghttp2_session *s, int32_t id, uint32_t, void *ud) {
    return guarded(
        [&]() -> int {
          auto &me = self(ud);
          auto *st = static_cast<H2Stream *>(nghttp2_session_get_stream_user_data(s, id));
          if (!st)
            return 0; // never began a request
          nghttp2_session_set_stream_user_data(s, id, nullptr);
          if ((!st->headers_done || st->trailers_open) && me.pending_headers_ > 0)
            --me.pending_headers_; // (the deadline of the others stays)
          if (st->exchange) {
            me.proxied_ -= 1;
            if (st->exchange->body_expected()) st->exchange->abort_body(); // reset mid-body
            // Bytes held without the connection's credit die with the stream.
            if (uint64_t owed = me.body_credit_.closed(st->flow, st->exchange->body_in()))
              nghttp2_session_consume_connection(s, static_cast<size_t>(owed));
          }
          me.budget_.give_back(st->charged); // the body or the response made from it
          st->charged = 0;
          me.log_request(*st);
          st->req.reset();
          st->exchange = nullptr;
          st->resp.reset(); // drop the body (a cached file entry, a proxied exchange) now
          me.active_ -= 1;
          me.keep_.park(st->req, st->resp.headers, st->kept);
          me.free_.push_back(st);
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  static int on_invalid_frame(nghttp2_session *, const nghttp2_frame *f, int, void *ud) {
    return guarded(
        [&]() -> int {
          auto &me = self(ud);
          me.protocol_error();
          // On a stream, nghttp2 resets it when it next writes: that
          // RST_STREAM is this same error, not another. (Past the few
          // remembered, a reset counts again: the limit only comes sooner.)
          if (f->hd.stream_id != 0 && me.invalid_streams_.size() < 64) {
            me.invalid_streams_.push_back(f->hd.stream_id);
          }
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  static int on_frame_send(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
    return guarded(
        [&]() -> int {
          // A server-sent RST_STREAM is usually the client's doing (the
          // "MadeYouReset" class): count them with the other protocol errors.
          // Our NO_ERROR "stop sending" after an early response is not one,
          // nor a reset for an upstream that broke off or for a spent body
          // budget: that is no fault of the client's, and must not close
          // its connection.
          if (f->hd.type == NGHTTP2_RST_STREAM && f->rst_stream.error_code != NGHTTP2_NO_ERROR) {
            auto *st =
                static_cast<H2Stream *>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
            const bool ours =
                st && (st->refused_by_us || (st->exchange && st->exchange->upstream_failed()));
            auto &me = self(ud);
            auto seen = std::find(me.invalid_streams_.begin(), me.invalid_streams_.end(),
                                  f->hd.stream_id);
            if (seen != me.invalid_streams_.end()) {
              me.invalid_streams_.erase(seen); // counted when the invalid frame came
            } else if (!ours) {
              me.protocol_error();
            }
          }
          if (f->hd.type == NGHTTP2_HEADERS || (f->hd.type == NGHTTP2_DATA && f->hd.length > 0))
            self(ud).activity_ += 1; // a response moved
          if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) &&
              (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
            auto *st =
                static_cast<H2Stream *>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
            if (st) st->answered = true;
            auto &me = self(ud);
            if (st && !st->ended &&
                (!st->discarding || st->discarded > me.env_.limits.max_request_body)) {
              // The response went out before the request ended (413, 431,
              // or a body past the limit): tell the client to stop sending
              // (RFC 9113 8.1) instead of reading and discarding the rest.
              me.stop_body(*st);
            }
          }
          // Counted here: nghttp2 also sends GOAWAYs of its own (rate limits).
          if (f->hd.type == NGHTTP2_GOAWAY)
            self(ud).env_.stats->goaways_sent += 1;
          return 0;
        },
        int{NGHTTP2_ERR_CALLBACK_FAILURE});
  }

  void release_body(H2Stream &st) {
    budget_.give_back(st.charged);
    st.charged = 0;
    std::string().swap(st.req.body);
  }

  // A body whose answer is out: the client is told to stop sending it
  // (RST_STREAM NO_ERROR, RFC 9113 8.1), once.
  void stop_body(H2Stream &st) {
    st.ended = true; // nothing more of it is waited for
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, st.id, NGHTTP2_NO_ERROR);
  }

  // The client's RST_STREAMs, limited as nghttp2 is told to limit them (a
  // burst, then a rate per second), here too: nghttp2 stops counting once
  // a GOAWAY is submitted, and a graceful shutdown's notice is one, while
  // new streams are taken until the final GOAWAY, which waits for the
  // client's PING ACK. A client that withheld it could otherwise open and
  // reset streams without limit for the whole drain.
  void client_reset() {
    if (!resets_.take(1, env_.limits.rst_rate, env_.limits.rst_burst, now_)) calm_down();
  }

  // Frames that ask work of the server and carry no request: SETTINGS
  // (each INITIAL_WINDOW_SIZE entry walks every stream nghttp2 keeps, up
  // to a few hundred), PING, PRIORITY (a move in nghttp2's priority tree),
  // and empty DATA that does not end its stream. nghttp2 1.52 bounds only
  // the replies a client does not read; a client that reads them could
  // send such frames without end, each costing the worker more than it
  // cost the client. A burst, then a rate, as for resets: far above what a
  // browser sends, and a gRPC client's bandwidth probes (a PING a round
  // trip) on a fast network.
  static constexpr double CONTROL_BURST = 1000; // frames (a SETTINGS: 1 + its entries)
  static constexpr double CONTROL_RATE = 1000;  // per second
  void control_frame(const nghttp2_frame &f) {
    double cost = 0;
    switch (f.hd.type) {
    case NGHTTP2_SETTINGS:
      if (!(f.hd.flags & NGHTTP2_FLAG_ACK)) cost = 1 + static_cast<double>(f.settings.niv);
      break;
    case NGHTTP2_PING:
      if (!(f.hd.flags & NGHTTP2_FLAG_ACK)) cost = 1;
      break;
    case NGHTTP2_PRIORITY: cost = 1; break;
    case NGHTTP2_DATA:
      // No data once its padding (and the pad length's byte) is taken off.
      if (f.hd.length <= f.data.padlen && !(f.hd.flags & NGHTTP2_FLAG_END_STREAM)) cost = 1;
      break;
    default: break;
    }
    if (cost > 0 && !control_.take(cost, CONTROL_RATE, CONTROL_BURST, now_)) calm_down();
  }

  void calm_down() {
    if (dead_) return;
    env_.stats->protocol_error_closes += 1;
    nghttp2_session_terminate_session(session_, NGHTTP2_ENHANCE_YOUR_CALM);
    dead_ = true;
  }

  // Header blocks (heads, trailers) begun and not yet whole: the oldest
  // one's start, roughly, is what the header deadline is measured from.
  void header_block_began() {
    if (pending_headers_++ == 0) headers_since_ = now_;
  }
  void header_block_ended() {
    if (pending_headers_ > 0 && --pending_headers_ > 0) headers_since_ = now_;
  }

  void protocol_error() {
    if (++protocol_errors_ == env_.limits.max_protocol_errors) calm_down();
  }

  static ssize_t read_body(nghttp2_session *, int32_t, uint8_t *buf, size_t length,
                           uint32_t *flags, nghttp2_data_source *src, void *) {
    return guarded(
        [&]() -> ssize_t {
          auto *st = static_cast<H2Stream *>(src->ptr);
          if (st->exchange) return read_streamed(*st, buf, length, flags);
          const Body *body = st->resp.body.get();
          size_t n = 0;
          // Copied straight into nghttp2's frame: a file is read for what
          // the window lets out now, and nothing is held for a client that
          // keeps its window small.
          while (body && n < length && st->offset < body->size()) {
            size_t got = body->copy(st->offset, buf + n, length - n);
            // The content went away (a file truncated under us): nghttp2 resets
            // the stream (INTERNAL_ERROR) rather than send a short body. The
            // server's doing: no protocol error of the client's.
            if (got == 0) {
              st->refused_by_us = true;
              return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
            }
            n += got;
            st->offset += got;
          }
          if (body)
            st->resp.body->release(st->offset); // copied: no longer needed
          if (!body || st->offset >= body->size()) {
            *flags |= NGHTTP2_DATA_FLAG_EOF;
            record_latency(*st);
          }
          return static_cast<ssize_t>(n);
        },
        ssize_t{NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE});
  }

  // A proxied body: what has arrived, "deferred" until more does (the
  // proxy resumes the data), a stream reset if the upstream broke off.
  static ssize_t read_streamed(H2Stream &st, uint8_t *buf, size_t length, uint32_t *flags) {
    ProxyExchange &ex = *st.exchange;
    size_t n = 0;
    while (n < length) {
      auto c = ex.chunk(st.offset);
      if (c.empty()) break;
      size_t take = std::min(c.size(), length - n);
      std::memcpy(buf + n, c.data(), take);
      n += take;
      st.offset += take;
    }
    ex.release(st.offset); // copied: the window has room again
    if (st.offset == ex.received()) {
      if (ex.failed())
        return n ? static_cast<ssize_t>(n) : ssize_t{NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE};
      if (ex.ended()) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        record_latency(st);
      } else if (n == 0) {
        return NGHTTP2_ERR_DEFERRED;
      }
    }
    return static_cast<ssize_t>(n);
  }

  // A request whose head is complete: to the proxy if a prefix matches
  // (its body, if one follows, streams upstream), else the router once the
  // body is in (body_follows false).
  void dispatch(H2Stream &st, bool body_follows) {
    if (env_.proxy) {
      int route = env_.proxy->match(st.req.path);
      if (route >= 0) {
        auto ex = start_proxy(route, st.req, body_follows, this, &st, budget_, env_);
        st.exchange = ex.get();
        st.resp.body = std::move(ex);
        proxied_ += 1;
        if (body_follows) {
          // Past the initial window, the client gets credit for at most a
          // request window more than the upstream took.
          nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, st.id,
                                                ProxyExchange::REQUEST_WINDOW);
        }
        if (st.exchange->head_ready()) respond(st);
        return;
      }
    }
    // A handler that reads the body gets the request once it is whole; any
    // other answers now rather than have its body held.
    if (body_follows && env_.router->takes_body(st.req)) return;
    // Its body is dropped as it arrives (no reset: curl 7.88 takes a
    // NO_ERROR reset during its upload for a failure, answer and all).
    st.discarding = body_follows;
    env_.router->route(st.req, st.resp);
    respond(st);
  }

  // A proxied request's body: into the exchange, credited as BodyCredit
  // says (a stream whose upstream is slow or stalled holds up no other).
  void on_proxy_data(H2Stream &st, const uint8_t *data, size_t len) {
    if (st.refused) {
      nghttp2_session_consume(session_, st.id, len);
      return;
    }
    if (!st.exchange->put_body(data, len)) {
      // Past its content-length, or over the body budget.
      nghttp2_session_consume(session_, st.id, len);
      abort_request(st);
      return;
    }
    if (uint64_t now = body_credit_.arrived(st.flow, len, budget_.held()))
      nghttp2_session_consume_connection(session_, static_cast<size_t>(now));
    queue_flush(st);
  }

  void queue_flush(H2Stream &st) {
    if (!st.flush_queued) {
      st.flush_queued = true;
      flush_.push_back(&st);
    }
  }

  // Writes the bodies handed to exchanges during one input pass.
  void flush_bodies() {
    for (size_t i = 0; i < flush_.size(); ++i) {
      H2Stream &st = *flush_[i];
      st.flush_queued = false;
      if (!st.exchange || st.refused) continue;
      st.exchange->flush_body();
      credit(st);
    }
    flush_.clear();
  }

  // Flow-control credit for the body bytes that left the exchange.
  void credit(H2Stream &st) {
    const auto c = body_credit_.left(st.flow, st.exchange->body_out());
    if (c.stream) nghttp2_session_consume_stream(session_, st.id, static_cast<size_t>(c.stream));
    if (c.conn) nghttp2_session_consume_connection(session_, static_cast<size_t>(c.conn));
  }

  // The proxied request cannot go on (body overrun or short, over budget):
  // the stream is reset, the upstream connection closed.
  void abort_request(H2Stream &st) {
    st.exchange->abort_body();
    if (st.refused) return;
    st.refused = true;
    st.refused_by_us = st.exchange->worker_budget_refused();
    st.responded = true;
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, st.id, NGHTTP2_INTERNAL_ERROR);
  }

public:
  void proxy_progress(void *tag) override {
    auto &st = *static_cast<H2Stream *>(tag);
    if (st.refused) return;
    credit(st);
    const bool head_now = !st.responded && st.exchange->head_ready();
    if (head_now) respond(st);
    if (!st.responded) {
      // No head yet.
    } else if (st.exchange->failed()) {
      // Reset now, not from the data callback: a client that keeps its
      // window at 0 would never be asked for data, and never hear of it.
      // Also when the head came with the failure, in one read.
      st.refused = true;
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, st.id, NGHTTP2_INTERNAL_ERROR);
    } else if (!head_now) {
      nghttp2_session_resume_data(session_, st.id);
    }
    if (host_) host_->session_wake();
  }

private:
  // A request whose head was whole, once: to the access log.
  void log_request(H2Stream &st) {
    if (st.begun_ns && st.headers_done)
      TcpSession::log_request(env_, st.req, "HTTP/2", st.status, st.offset, st.begun_ns);
    st.begun_ns = 0;
  }

  void respond(H2Stream &st) {
    st.responded = true;
    const Response &resp = st.exchange ? st.exchange->head() : st.resp;
    env_.stats->count_response(resp.status);
    st.status = resp.status;
    head_.build(resp, env_.alt_svc);
    nva_.clear();
    auto nv = [this](std::string_view n, std::string_view v) {
      nva_.push_back(nghttp2_nv{reinterpret_cast<uint8_t *>(const_cast<char *>(n.data())),
                                reinterpret_cast<uint8_t *>(const_cast<char *>(v.data())),
                                n.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
    };
    nv(":status", head_.status());
    for (const auto &f : head_.fields())
      nv(f.name, f.value);
    nghttp2_data_provider dp{};
    dp.source.ptr = &st;
    dp.read_callback = read_body;
    bool has_body =
        st.exchange ? st.exchange->has_body() : st.resp.body && st.resp.body->size() > 0;
    nghttp2_submit_response(session_, st.id, nva_.data(), nva_.size(), has_body ? &dp : nullptr);
    if (!has_body) record_latency(st);
  }

  static constexpr int32_t CONN_WINDOW = 4 << 20; // the connection's receive window
  SessionEnv env_;
  BudgetAccount budget_;
  BodyCredit body_credit_; // proxied bodies' flow-control credit
  nghttp2_session *session_ = nullptr;
  // Streams are pooled per connection (at most its concurrent-stream limit
  // at once): nghttp2's stream user data points into pool_.
  std::vector<std::unique_ptr<H2Stream>> pool_;
  std::vector<H2Stream *> free_;
  SlotKeep keep_; // what free_'s slots keep, summed
  std::vector<H2Stream *> flush_; // proxied bodies to write after this input
  size_t active_ = 0;
  size_t proxied_ = 0; // of them, streams with a proxied exchange
  uint64_t activity_ = 0; // HEADERS and DATA with data, either way (counts_activity())
  std::vector<nghttp2_nv> nva_;
  ResponseHead head_;
  uint64_t now_ = 0;
  uint64_t headers_since_ = 0;
  size_t pending_headers_ = 0;
  uint32_t protocol_errors_ = 0;
  std::vector<int32_t> invalid_streams_; // invalid frames' streams, their RST not yet sent
  TokenBucket resets_;  // client_reset()'s
  TokenBucket control_; // control_frame()'s
  bool input_ended_ = false;
  bool dead_ = false;
  static constexpr uint8_t SHUTDOWN_PING[8] = {'x', 'd', 'p', 'q', 'b', 'y', 'e', 0};
  bool shutdown_ = false;
  bool final_goaway_ = false; // the shutdown PING came back
};

} // namespace

std::unique_ptr<TcpSession> make_h2_session(const SessionEnv &env) {
  return std::make_unique<H2Session>(env);
}

} // namespace xdpq::http
