// HTTP/1.1 server session on Debian's http-parser: keep-alive, pipelining,
// chunked request bodies, HEAD. Responses are written in request order.

#include "http/tcp_session.h"

#include "base/ascii.h"
#include "base/guard.h"
#include "http/h1_framing.h"
#include "http/response_head.h"

#include <http_parser.h>

#include <cstdio>
#include <deque>

namespace xdpq::http {

namespace {

struct Queued {
  std::string head; // status line and headers
  size_t head_off = 0;
  std::unique_ptr<Body> body;
  uint64_t body_off = 0;
  bool close_after = false;
  size_t charged = 0; // body budget held until the response is written
  ProxyExchange *ex = nullptr; // a proxied response (owned by body); head empty until it arrives
  bool chunked = false;        // ... of unknown length, sent chunked
  bool http10 = false;         // asked in HTTP/1.0: no chunked framing
  bool close_delimited = false; // ... so the close ends its body
  // For the access log (when there is one): what was asked, when, and the
  // answer's status (a proxied one's once its head is in).
  std::unique_ptr<Request> logged;
  uint64_t begun_ns = 0;
  int status = 0;
  bool logged_http10 = false;
};

class H1Session final : public TcpSession, public ProxyListener {
public:
  ~H1Session() override {
    for (auto &q : queue_) finish_log(q); // answers cut short by the close
    log_cut_short();
  }

  // A request whose body was still arriving when the connection or the
  // client's input ended (a proxied one is queued at its head, and logged
  // with the queue): status 0, none sent.
  void log_cut_short() {
    if (in_message_ && !in_headers_ && !proxied_) {
      log_request(env_, req_, http10() ? "HTTP/1.0" : "HTTP/1.1", 0, 0, started_);
    }
  }

  explicit H1Session(const SessionEnv &env)
      : env_(env), budget_(env.budget, env.limits.max_body_per_connection) {
    head_.set_extra(env.response_headers);
    framing_.check_request_line();
    init_h1_parsing();
    framing_.limit_head(env.limits.max_header_size + H1FramingCheck::HEAD_SLACK);
    http_parser_init(&parser_, HTTP_REQUEST);
    parser_.data = this;
    http_parser_settings_init(&settings_);
    settings_.on_message_begin = [](http_parser *p) {
      return guarded([&] { return me(p).message_begin(); }, -1);
    };
    settings_.on_url = [](http_parser *p, const char *at, size_t n) {
      return guarded([&] { return me(p).url(at, n); }, -1);
    };
    settings_.on_header_field = [](http_parser *p, const char *at, size_t n) {
      return guarded([&] { return me(p).field(at, n); }, -1);
    };
    settings_.on_header_value = [](http_parser *p, const char *at, size_t n) {
      return guarded([&] { return me(p).value(at, n); }, -1);
    };
    settings_.on_headers_complete = [](http_parser *p) {
      return guarded([&] { return me(p).headers_complete(); }, -1);
    };
    settings_.on_body = [](http_parser *p, const char *at, size_t n) {
      return guarded([&] { return me(p).body(at, n); }, -1);
    };
    settings_.on_message_complete = [](http_parser *p) {
      return guarded([&] { return me(p).message_complete(); }, -1);
    };
    env_.stats->h1_connections += 1;
  }

  void on_input(const uint8_t *data, size_t len, uint64_t now_ns) override {
    if (tunnel_) return tunnel_input(data, len);
    parse_input(data, len, now_ns);
    input_done();
  }

  void parse_input(const uint8_t *data, size_t len, uint64_t now_ns) {
    now_ = now_ns;
    if (closing_) return;
    if (last_) {
      buffered_.clear(); // after a request that asked to close: dropped
      return;
    }
    // Bytes that arrived while paused (pipelining backpressure) are kept
    // and parsed first.
    if (!buffered_.empty() || blocked()) {
      buffered_.append(reinterpret_cast<const char *>(data), len);
      if (blocked()) return;
      data = reinterpret_cast<const uint8_t *>(buffered_.data());
      len = buffered_.size();
    }
    // A proxied body is parsed only as far as its exchange has room: the
    // rest waits here (at most one read) and the socket is not read meanwhile.
    size_t n = 0;
    bool misframed = false;
    while (n < len) {
      size_t take = len - n;
      if (body_ex_) take = std::min(take, body_ex_->body_room());
      if (take == 0) break;
      // As far as the framing is strict; at a head's end, until the parser
      // has said how its body is framed.
      const size_t ok = framing_.allow(data + n, take);
      if (ok == 0) {
        misframed = true;
        break;
      }
      size_t k = http_parser_execute(&parser_, &settings_,
                                     reinterpret_cast<const char *>(data) + n, ok);
      framing_.take(data + n, k);
      n += k;
      // A request that asked to switch ends the HTTP/1.1 input once it is
      // whole (its body, if any, parsed as usual).
      if (k < ok || HTTP_PARSER_ERRNO(&parser_) != HPE_OK || switch_asked() || closing_ ||
          last_)
        break;
    }
    flush_body(nullptr);
    if (!buffered_.empty()) {
      buffered_.erase(0, n);
    } else if (n < len && (HTTP_PARSER_ERRNO(&parser_) == HPE_PAUSED || body_ex_)) {
      buffered_.assign(reinterpret_cast<const char *>(data) + n, len - n);
    }
    if (switch_asked()) {
      // A tunnel's: what followed the head is the new protocol's, kept
      // above (input paused: at most this read) until the upstream switches.
      if (tunnel_) return;
      // No other upgrades (h2c goes through prior knowledge on the
      // cleartext port): answer what we parsed, then close.
      closing_ = true;
      return;
    }
    if (misframed || framing_.failed() ||
        (HTTP_PARSER_ERRNO(&parser_) != HPE_OK && HTTP_PARSER_ERRNO(&parser_) != HPE_PAUSED)) {
      if (body_ex_) {
        // A broken proxied body (a bad chunk size): its exchange answers
        // 400 or is cut, and the upstream connection is closed.
        env_.stats->bad_requests += 1;
        abort_proxy_body();
      } else if (!closing_ && !last_) {
        const bool in_head = in_headers_;
        if (in_head) {
          // A request refused before its head ended counts as one, as do
          // those refused at its end, with its method for the log (and a
          // HEAD's answer without a body). A method not read whole is none:
          // http-parser guesses one from the first byte ("H": HEAD). It was
          // read if the target began, or if the parser itself found an
          // error past it; where the framing check stopped the parser
          // (errno still OK) before any target, it may not have been.
          const auto parser_error = HTTP_PARSER_ERRNO(&parser_);
          const bool method_read = parser_error != HPE_INVALID_METHOD &&
                                   (!req_.path.empty() || parser_error != HPE_OK);
          req_.method =
              method_read ? http_method_str(static_cast<http_method>(parser_.method)) : "";
          env_.stats->requests += 1;
          in_headers_ = false;
        }
        if (in_head && (too_large_ || framing_.head_over_limit() ||
                        HTTP_PARSER_ERRNO(&parser_) == HPE_HEADER_OVERFLOW)) {
          env_.stats->header_limit_rejects += 1;
          fail(431);
        } else {
          fail(400);
        }
      }
      return;
    }
    (void)n;
  }

  void produce(std::vector<uint8_t> &out, size_t limit) override {
    const size_t before = out.size();
    produce_queued(out, limit);
    if (out.size() != before) activity_ += 1; // a response moved
  }

  void produce_queued(std::vector<uint8_t> &out, size_t limit) {
    while (out.size() < limit && !queue_.empty()) {
      Queued &q = queue_.front();
      if (q.ex && q.head.empty()) {
        if (!q.ex->head_ready()) return; // the upstream has not answered yet
        proxy_head(q);
      }
      if (q.head_off < q.head.size()) {
        size_t take = std::min(q.head.size() - q.head_off, limit - out.size());
        out.insert(out.end(), q.head.begin() + static_cast<long>(q.head_off),
                   q.head.begin() + static_cast<long>(q.head_off + take));
        q.head_off += take;
        continue;
      }
      if (q.ex) {
        if (q.ex->has_body()) {
          auto c = q.ex->chunk(q.body_off);
          if (!c.empty()) {
            size_t room = limit - out.size();
            if (q.chunked && room <= CHUNK_FRAMING) return; // next time
            size_t take = std::min(c.size(), q.chunked ? room - CHUNK_FRAMING : room);
            if (q.chunked) append_chunk_size(out, take);
            out.insert(out.end(), c.data(), c.data() + take);
            if (q.chunked) out.insert(out.end(), {'\r', '\n'});
            q.body_off += take;
            q.ex->release(q.body_off);
            continue;
          }
          if (q.ex->failed()) {
            // The upstream broke off: closing the connection (before the
            // last chunk, or short of the length) is how HTTP/1.1 says
            // the body is not complete.
            abort_output();
            return;
          }
          if (!q.ex->ended()) return; // more is on its way
          if (q.chunked) {
            static constexpr std::string_view LAST = "0\r\n\r\n";
            out.insert(out.end(), LAST.begin(), LAST.end());
          }
        }
      } else if (q.body && q.body_off < q.body->size()) {
        auto c = q.body->chunk(q.body_off);
        if (c.empty()) {
          // The content went away (a file truncated under us): the length
          // we promised cannot be kept, so the connection ends here.
          abort_output();
          return;
        }
        size_t take = std::min(c.size(), limit - out.size());
        out.insert(out.end(), c.data(), c.data() + take);
        q.body_off += take;
        q.body->release(q.body_off);
        continue;
      }
      const bool ends_connection = q.close_after;
      if (ends_connection) closing_ = true;
      if (q.ex && q.ex == body_ex_) {
        // Answered before its body was all in: the rest of the body is not
        // read (nor parsed for the next request); the connection ends here.
        body_ex_ = nullptr;
        closing_ = true;
      }
      if (q.ex && q.ex == flush_ex_) flush_ex_ = nullptr;
      if (q.ex && q.ex == serial_ex_) serial_ex_ = nullptr;
      budget_.give_back(q.charged);
      finish_log(q);
      queue_.pop_front();
      if (ends_connection) {
        // Its end is the connection's: an answer queued behind it (an
        // HTTP/1.0 keep-alive client's next request, behind a body that
        // only the close delimits) would be read as part of that body.
        if (!queue_.empty()) abort_output(false);
        return;
      }
      if (paused_ && !serial_ex_ && queue_.size() < env_.limits.max_pipelined / 2) {
        http_parser_pause(&parser_, 0);
        paused_ = false;
      }
    }
  }

  // Ends the connection with the answers still queued. cut: the one at the
  // front was cut short (its upstream broke off, its file shrank), and
  // where only the close delimits it (an HTTP/1.0 client, no length) a
  // clean close would make it look whole: the connection then ends
  // without TLS's close_notify, which tells a client it was truncated.
  void abort_output(bool cut = true) {
    cut_short_ = cut_short_ || cut;
    closing_ = true;
    body_ex_ = flush_ex_ = serial_ex_ = nullptr; // their exchanges go with the queue
    for (auto &q : queue_) {
      budget_.give_back(q.charged);
      finish_log(q);
    }
    queue_.clear();
  }

  bool finished() const override { return closing_ && queue_.empty(); }
  // Also when the connection ends (a deadline, the server's stop) with an
  // answer at the front that only the close delimits: it is not whole (a
  // whole one leaves the queue as it ends).
  bool cut_short() const override {
    return cut_short_ || (!queue_.empty() && queue_.front().close_delimited);
  }

  void proxy_progress(void *) override {
    if (host_) host_->session_wake();
  }
  bool has_buffered_input() const override { return !buffered_.empty() && !blocked(); }
  // Input held unparsed holds the socket too: read on meanwhile, a client
  // that pipelines faster than its answers go out would grow it without
  // bound, a read at a time.
  bool input_paused() const override { return blocked() || !buffered_.empty(); }
  void input_ended() override {
    // The client left in the middle of a proxied body: the upstream must
    // not wait for the rest. What it sent before is parsed first (a client
    // that half-closes after a large body has most of it waiting here).
    eof_ = true;
    input_done();
  }
  // After the client's last byte is parsed: a proxied body still short is
  // cut, and a request still short of its end (its head, or a body kept
  // here) can never be whole: it is dropped, and the connection ends after
  // the answers to the requests before it, not at a deadline.
  void input_done() {
    if (!eof_ || !buffered_.empty()) return;
    if (body_ex_) return end_of_proxy_input();
    if (in_message_ && !tunnel_) {
      // Its body is given back now, not when the answers before it end.
      log_cut_short();
      release_body();
      in_message_ = false;
      in_headers_ = false;
      closing_ = true;
    }
  }
  uint64_t headers_started() const override { return in_headers_ ? started_ : 0; }
  bool busy() const override { return in_message_ || !queue_.empty(); }
  // Requests, their bodies, responses and tunnelled bytes: the empty lines
  // a client may send between requests (RFC 9112 2.2) keep nothing alive.
  bool counts_activity() const override { return true; }
  uint64_t activity() const override { return activity_; }
  // A proxied request first in line (what follows waits for it), or a
  // switched tunnel with nothing queued before it: the exchange's own
  // deadlines bound it (--proxy-timeout to its answer's head and through
  // its body, --proxy-client-timeout, --proxy-tunnel-timeout), not the
  // connection's write timeout, which would close the connection before
  // a 504 when the two are equal, as by default.
  bool timed_by_session() const override {
    if (queue_.empty() || !queue_.front().ex) return false;
    return !queue_.front().ex->switched() || (tunnel_ && queue_.size() == 1);
  }
  void shutdown() override {
    if (!busy()) {
      closing_ = true;
      return;
    }
    // The answer to the last request read says "connection: close" and the
    // connection ends after it: a keep-alive answer would have the client
    // send its next request into the close. Nothing read after it is
    // served (RFC 9112 9.6).
    close_after_current_ = true;
    if (in_message_) {
      keep_alive_ = false; // its answer says close; nothing after it is read
      if (proxied_ && !queue_.empty()) announce_close(queue_.back()); // queued at its head
    } else {
      last_ = true;
      if (!queue_.empty()) announce_close(queue_.back());
    }
  }

private:
  static H1Session &me(http_parser *p) { return *static_cast<H1Session *>(p->data); }

  int message_begin() {
    // A request after the one we failed, or after one that asked to close:
    // stop here.
    if (closing_ || last_) return 1;
    req_.reset();
    field_.clear();
    value_.clear();
    header_bytes_ = 0;
    header_fields_ = 0;
    host_fields_ = 0;
    too_large_ = false;
    malformed_ = false;
    body_too_large_ = false;
    discard_body_ = false;
    discarded_ = 0;
    in_message_ = true;
    in_headers_ = true;
    started_ = now_;
    activity_ += 1;
    return 0;
  }

  bool account(size_t n) {
    header_bytes_ += n;
    if (header_bytes_ > env_.limits.max_header_size) too_large_ = true;
    return !too_large_;
  }

  int url(const char *at, size_t n) {
    // Debian's http-parser lets a tab and a form feed into the target;
    // another hop may split the request line there (RFC 9112 3).
    for (size_t i = 0; i < n; ++i) {
      const auto c = static_cast<unsigned char>(at[i]);
      if (c <= 0x20 || c == 0x7f) malformed_ = true;
    }
    if (account(n)) req_.path.append(at, n);
    return head_over_limits();
  }

  // A head over the limits is answered (431) as soon as it is, not once
  // it ends: stopping the parser here (a callback's error) ends its input.
  int head_over_limits() const { return too_large_ ? 1 : 0; }

  // A target in the absolute form ("https://host/path", RFC 9112 3.2.2),
  // which a server must accept: the authority is the target's, the Host
  // field is ignored, the path is what follows. False when that authority
  // names no host.
  bool absolute_form() {
    std::string &t = req_.path;
    if (t.empty() || t[0] == '/') return true; // the origin form, nearly always
    size_t skip = 0;
    for (std::string_view scheme : {"http://", "https://"}) {
      if (t.size() >= scheme.size() && ascii_iequals(std::string_view(t).substr(0, scheme.size()),
                                                     scheme)) {
        skip = scheme.size();
      }
    }
    if (skip == 0) return true; // the origin form
    const size_t end = std::min(t.find_first_of("/?#", skip), t.size());
    req_.authority.assign(t, skip, end - skip);
    if (req_.authority.empty() || !valid_host_field(req_.authority)) return false;
    t.erase(0, end);
    if (t.empty() || t[0] != '/') t.insert(0, "/");
    return true;
  }

  void flush_header() {
    if (field_.empty()) return;
    // Whitespace in a field name (before the colon, which Debian's
    // http-parser takes in) must be refused (RFC 9112 5.1): another hop
    // may read "Host : x" as Host. A value's trailing whitespace is not
    // part of it (RFC 9110 5.5).
    if (field_.find_first_of(" \t") != std::string::npos) malformed_ = true;
    while (!value_.empty() && (value_.back() == ' ' || value_.back() == '\t')) value_.pop_back();
    // Debian's http-parser checks a value's bytes but not its first.
    if (!valid_field_value(value_)) malformed_ = true;
    if (++header_fields_ > env_.limits.max_header_fields) too_large_ = true;
    if (!too_large_) {
      ascii_lower_in_place(field_);
      if (field_ == "host") {
        req_.authority = value_;
        host_fields_ += 1;
      }
      req_.headers.add(field_, value_);
    }
    field_.clear();
    value_.clear();
  }

  // A chunked body's trailer fields come through the same callbacks: they
  // are not part of the request's header section (RFC 9110 6.5.1), which
  // has been routed on already, and are dropped (the framing bounds them).
  int field(const char *at, size_t n) {
    if (!in_headers_) return 0;
    if (!value_.empty() || value_started_) {
      flush_header();
      value_started_ = false;
    }
    if (account(n + 32)) field_.append(at, n);
    return head_over_limits();
  }

  int value(const char *at, size_t n) {
    if (!in_headers_) return 0;
    value_started_ = true;
    if (account(n)) value_.append(at, n);
    return head_over_limits();
  }

  int headers_complete() {
    flush_header();
    value_started_ = false;
    in_headers_ = false;
    req_.method = http_method_str(static_cast<http_method>(parser_.method));
    req_.scheme = "https";
    keep_alive_ = http_should_keep_alive(&parser_) && !close_after_current_;
    env_.stats->requests += 1;
    if (too_large_) {
      env_.stats->header_limit_rejects += 1;
      fail(431);
      return 0;
    }
    if (malformed_) {
      fail(400);
      return 0;
    }
    if (parser_.http_major != 1) {
      // "HTTP/2.0" or later on this parser, or before 1.0: not a version
      // spoken here (RFC 9110 15.6.6), whatever the request looks like.
      fail(505);
      return 0;
    }
    const bool http11 = parser_.http_major == 1 && parser_.http_minor >= 1;
    if (host_fields_ > 1 || (host_fields_ == 0 && http11) ||
        (host_fields_ == 1 && !valid_host_field(req_.authority))) {
      // Which one names the target? Neither; and an HTTP/1.1 request
      // without one, or with one that names no host, is as malformed
      // (RFC 9112 3.2).
      fail(400);
      return 0;
    }
    if (!absolute_form()) {
      fail(400);
      return 0;
    }
    if (const int refused = transfer_coding_refused(http11)) {
      // A body whose length or coding is not what http-parser makes of it:
      // never guessed (RFC 9112 6.1, 6.3).
      fail(refused);
      return 0;
    }
    if (parser_.flags & F_CHUNKED) {
      framing_.body_chunked();
    } else if (parser_.flags & F_CONTENTLENGTH) {
      framing_.body_length(parser_.content_length);
    } else {
      framing_.body_none();
    }
    const bool body_follows = (parser_.flags & F_CHUNKED) ||
                              ((parser_.flags & F_CONTENTLENGTH) && parser_.content_length > 0);
    int route = env_.proxy ? env_.proxy->match(req_.path) : -1;
    if (!answer_expect(body_follows, route >= 0)) return 0;
    // A WebSocket opening handshake (RFC 6455 4.1: a GET asking to switch
    // to "websocket" alone, with its key and version), on a proxied route,
    // without a body: a tunnel to the upstream if it answers 101. Nothing
    // else is switched (h2c or raw TCP to an upstream would escape the
    // routing and the forwarded fields): anything else that asks is
    // answered as a request and the connection closes after it (what
    // follows the head is not HTTP/1.1).
    const std::string *upgrade = req_.find("upgrade");
    tunnel_ = route >= 0 && parser_.upgrade && parser_.method == HTTP_GET && http11 &&
              !body_follows && upgrade && ascii_iequals(*upgrade, "websocket") &&
              req_.find("sec-websocket-key") && req_.find("sec-websocket-version");
    if (route >= 0) {
      // Proxied at once: the body streams upstream as it is parsed.
      Queued q;
      // A switch asked for and not made (or made: a tunnel) ends the
      // connection after this answer, which says so.
      q.close_after = !keep_alive_ || parser_.upgrade;
      q.http10 = parser_.http_major == 1 && parser_.http_minor == 0;
      auto ex = start_proxy(route, req_, body_follows, this, nullptr, budget_, env_,
                            tunnel_ ? std::string_view(*upgrade) : std::string_view());
      q.ex = ex.get();
      q.body = std::move(ex);
      note_for_log(q);
      queue_.push_back(std::move(q));
      proxied_ = true;
      if (body_follows || tunnel_) body_ex_ = queue_.back().ex;
    } else if (body_follows && !env_.router->takes_body(req_)) {
      discard_body_ = true; // parsed to find the next request, never held
    }
    return 0;
  }

  // Transfer-Encoding is taken as one field saying "chunked" in HTTP/1.1,
  // nothing else: another hop could read two fields, or a list, otherwise
  // than http-parser does (request smuggling), and a coding other than
  // chunked is not decoded here. 0 if the request's framing stands, else
  // the status to refuse it with: 400 where its length cannot be known
  // (HTTP/1.0, which has no Transfer-Encoding; two fields; chunked not
  // last), 501 for a coding not implemented (RFC 9112 6.1).
  int transfer_coding_refused(bool http11) const {
    const std::string *value = nullptr;
    for (const auto &f : req_.headers) {
      if (f.name != "transfer-encoding") continue;
      if (value) return 400;
      value = &f.value;
    }
    if (!value) return 0;
    if (!http11) return 400;
    const std::string_view v = trim_ows(*value);
    if (ascii_iequals(v, "chunked") && (parser_.flags & F_CHUNKED)) return 0;
    const size_t comma = v.rfind(',');
    const std::string_view last = trim_ows(comma == std::string_view::npos ? v : v.substr(comma + 1));
    return ascii_iequals(last, "chunked") ? 501 : 400;
  }

  // Expect (RFC 9110 10.1.1). A client that sent "100-continue" waits for
  // an interim 100 (curl: one second) before it sends the body, so the 100
  // is queued at once, after the responses to earlier requests, when this
  // request will read its body; a body already over the limit gets its 413
  // instead, and the client need not send it. Ignored in HTTP/1.0 and when
  // no body follows; any other expectation is refused with 417. False
  // when the request was answered here.
  bool answer_expect(bool body_follows, bool proxied) {
    const std::string *expect = req_.find("expect");
    if (expect == nullptr || parser_.http_major != 1 || parser_.http_minor == 0) return true;
    if (!ascii_iequals(*expect, "100-continue")) {
      env_.stats->expectation_failures += 1;
      fail(417);
      return false;
    }
    if (!body_follows) return true;
    if (!proxied && (parser_.flags & F_CONTENTLENGTH) &&
        parser_.content_length > env_.limits.max_request_body) {
      env_.stats->body_limit_rejects += 1;
      fail(413);
      return false;
    }
    Queued q;
    q.head = "HTTP/1.1 100 Continue\r\n\r\n";
    queue_.push_back(std::move(q));
    env_.stats->continues_sent += 1;
    return true;
  }

  // Writes what the exchange took in this input (once per input, so a
  // body that came with its head leaves in one write); next: the
  // exchange that takes bytes from now on.
  void flush_body(ProxyExchange *next) {
    if (flush_ex_ && flush_ex_ != next) flush_ex_->flush_body();
    flush_ex_ = next;
  }

  // The client's input ended with body_ex_ still taking it: a tunnel's
  // client closed its side (the upstream's side is closed too, the
  // upstream's answer still comes), else a body was cut short.
  void end_of_proxy_input() {
    if (tunnel_ && body_ex_->switched()) {
      body_ex_->end_body();
      body_ex_->flush_body();
      body_ex_ = flush_ex_ = nullptr;
      return;
    }
    abort_proxy_body();
  }

  // A tunnel's client bytes, as they are, as far as the upstream takes
  // them (input_paused() holds the socket meanwhile).
  void tunnel_input(const uint8_t *data, size_t len) {
    activity_ += len > 0;
    if (closing_ || !body_ex_) {
      buffered_.clear(); // the tunnel ended: nowhere to go
      return;
    }
    if (!buffered_.empty() || blocked()) {
      buffered_.append(reinterpret_cast<const char *>(data), len);
      if (blocked()) return;
      data = reinterpret_cast<const uint8_t *>(buffered_.data());
      len = buffered_.size();
    }
    const size_t take = std::min(len, body_ex_->body_room());
    if (take > 0 && !body_ex_->put_body(data, take)) {
      buffered_.clear();
      abort_proxy_body(); // over the body budget
      return;
    }
    if (take > 0) body_ex_->flush_body();
    if (!buffered_.empty()) {
      buffered_.erase(0, take);
    } else if (take < len) {
      buffered_.assign(reinterpret_cast<const char *>(data) + take, len - take);
    }
    if (eof_ && body_ex_ && buffered_.empty()) end_of_proxy_input();
  }

  void abort_proxy_body() {
    body_ex_->abort_body();
    body_ex_ = nullptr;
    flush_ex_ = nullptr;
    // What the client sends after it cannot be parsed as requests: the
    // connection ends after the answer already queued (400, or the cut one).
    closing_ = true;
  }

  int body(const char *at, size_t n) {
    activity_ += n > 0;
    if (proxied_) {
      if (!body_ex_ || closing_) return 0;
      if (!body_ex_->put_body(reinterpret_cast<const uint8_t *>(at), n)) {
        abort_proxy_body(); // over the body budget
        return 0;
      }
      flush_body(body_ex_);
      return 0;
    }
    if (closing_ || body_too_large_) return 0;
    if (discard_body_) discarded_ += n;
    const uint64_t length = discard_body_ ? discarded_ : req_.body.size() + n;
    if (length > env_.limits.max_request_body) {
      body_too_large_ = true;
      env_.stats->body_limit_rejects += 1;
      release_body();
      fail(413);
      return 0;
    }
    if (discard_body_) return 0;
    if (!budget_.try_take(n)) {
      // Over the connection's (pipelined bodies) or worker's budget.
      env_.stats->body_budget_refusals += 1;
      release_body();
      fail(503);
      return 0;
    }
    charged_ += n;
    req_.body.append(at, n);
    return 0;
  }

  void release_body() {
    budget_.give_back(charged_);
    charged_ = 0;
    std::string().swap(req_.body);
  }

  int message_complete() {
    in_message_ = false;
    const bool proxied = proxied_;
    proxied_ = false;
    if (proxied && body_ex_ && !tunnel_) {
      body_ex_->end_body(); // http-parser saw the whole length or the last chunk
      flush_body(body_ex_);
      body_ex_ = nullptr;
    }
    if (closing_) return 0;
    if (!proxied) {
      Response resp;
      env_.router->route(req_, resp);
      enqueue(resp, !keep_alive_ || parser_.upgrade); // see headers_complete()
    }
    // The body (or the response made from it) stays charged until written.
    queue_.back().charged = charged_;
    charged_ = 0;
    // A proxied request's successor is parsed once its answer is whole:
    // pipelined requests are served in parallel only when all are safe
    // (RFC 9112 9.3.2), and one behind an answer that ends the connection
    // (an HTTP/1.0 answer only the close delimits) must not be sent at all.
    if (proxied && !tunnel_ && !queue_.back().close_after) serial_ex_ = queue_.back().ex;
    if (serial_ex_ || queue_.size() >= env_.limits.max_pipelined) {
      http_parser_pause(&parser_, 1); // let the responses drain first
      paused_ = true;
    }
    // "Connection: close": no request after this one is processed (RFC
    // 9112 9.6); what follows is read and dropped.
    if (!keep_alive_ && !parser_.upgrade) last_ = true;
    return 0;
  }

  // Answers with status and closes the connection afterwards (the request
  // stream is no longer in a state we trust).
  void fail(int status) {
    if (status == 400 || status == 505) env_.stats->bad_requests += 1;
    Response resp;
    // A HEAD gets the head alone, an error's too: once this message's head
    // is parsed (before, req_ may still hold the previous request's).
    make_error(resp, status, in_message_ && !in_headers_ && req_.method == "HEAD");
    log_blank_ = !in_message_;
    enqueue(resp, true);
    log_blank_ = false;
    in_message_ = false;
    in_headers_ = false;
    // Nothing more is parsed: the connection ends after this response. (Not
    // http_parser_pause(): on a parser in its error state that asserts, and
    // Debian's http-parser keeps its asserts: one malformed request aborted
    // the whole daemon.)
    closing_ = true;
  }

  static constexpr size_t CHUNK_FRAMING = 16 + 4; // hex size, CRLF, CRLF

  static void append_chunk_size(std::vector<uint8_t> &out, size_t n) {
    char hex[20];
    int len = std::snprintf(hex, sizeof(hex), "%zx\r\n", n);
    out.insert(out.end(), hex, hex + len);
  }

  // The proxied response's head, once it arrived. Without a length from
  // the upstream the body goes chunked, so that a body the upstream cut
  // short can never look complete; an HTTP/1.0 client knows no chunks
  // (RFC 9112 7.1), so for it the close ends the body.
  void proxy_head(Queued &q) {
    const Response &r = q.ex->head();
    env_.stats->count_response(r.status);
    q.status = r.status;
    if (q.ex->switched()) {
      // The upstream's switch, its Upgrade with it; then the tunnel's
      // bytes as they come, until either side closes.
      head_.build(r, {});
      q.head.reserve(256);
      head_.append_http1(q.head, false);
      q.head.insert(q.head.size() - 2, "connection: upgrade\r\n");
      q.chunked = false;
      return;
    }
    head_.build(r, env_.alt_svc);
    const bool unknown = r.length_unknown && q.ex->has_body();
    q.chunked = unknown && !q.http10;
    if (unknown && q.http10) q.close_after = q.close_delimited = true;
    q.head.reserve(256);
    head_.append_http1(q.head, q.close_after);
    if (q.chunked) q.head.insert(q.head.size() - 2, "transfer-encoding: chunked\r\n");
  }

  // A queued answer ends the connection, and says so if its head has not
  // begun to go out (a proxied one's head is written when it comes).
  static void announce_close(Queued &q) {
    if (q.close_after) return;
    q.close_after = true;
    static constexpr std::string_view CLOSE = "connection: close\r\n";
    if (!q.head.empty() && q.head_off == 0 && q.head.ends_with("\r\n\r\n")) {
      q.head.insert(q.head.size() - 2, CLOSE);
    }
  }

  void enqueue(Response &resp, bool close) {
    env_.stats->count_response(resp.status);
    Queued q;
    head_.build(resp, env_.alt_svc);
    q.head.reserve(256);
    head_.append_http1(q.head, close);
    q.body = std::move(resp.body);
    q.close_after = close;
    q.status = resp.status;
    note_for_log(q);
    queue_.push_back(std::move(q));
  }

  // The request being answered, kept for the access log: the next one may
  // be parsed (pipelining) before this answer is written.
  void note_for_log(Queued &q) {
    if (!env_.access_log) return;
    q.logged = std::make_unique<Request>();
    if (log_blank_) {
      // Refused before the parser began a message (a bad method byte on a
      // kept-alive connection): req_ still holds the previous request.
      q.begun_ns = now_;
      return;
    }
    q.logged->method = req_.method;
    q.logged->path = req_.path;
    for (const char *name : {"referer", "user-agent"}) {
      if (const std::string *v = req_.find(name)) q.logged->headers.add(name, *v);
    }
    q.begun_ns = started_ ? started_ : now_;
    q.logged_http10 = http10();
  }

  bool http10() const { return parser_.http_major == 1 && parser_.http_minor == 0; }
  bool switch_asked() const { return parser_.upgrade && !in_message_; }
  // Nothing more can be parsed now: a full queue of answers, the end of
  // the connection, or a proxied body's exchange without room.
  bool blocked() const { return paused_ || closing_ || (body_ex_ && body_ex_->body_room() == 0); }

  void finish_log(Queued &q) {
    if (!q.logged) return;
    // Status 0: its head never left (the connection ended before it).
    log_request(env_, *q.logged, q.logged_http10 ? "HTTP/1.0" : "HTTP/1.1",
                q.head_off == 0 ? 0 : q.status, q.body_off, q.begun_ns);
    q.logged.reset();
  }

  SessionEnv env_;
  ResponseHead head_;
  BudgetAccount budget_;
  size_t charged_ = 0; // the request body being received
  http_parser parser_{};
  http_parser_settings settings_{};
  // Stops the parser where the framing stops being strict (http-parser's
  // own strict checks are compiled out in Debian's build).
  H1FramingCheck framing_;
  Request req_;
  std::string field_, value_;
  bool value_started_ = false;
  size_t header_bytes_ = 0;
  size_t header_fields_ = 0;
  unsigned host_fields_ = 0;
  bool too_large_ = false;
  bool malformed_ = false; // a control byte in the target, whitespace in a field name
  bool body_too_large_ = false;
  bool discard_body_ = false; // its handler reads no body: skipped as it arrives
  uint64_t discarded_ = 0;     // ... so far (max_request_body still bounds it)
  bool keep_alive_ = true;
  bool last_ = false; // the request asked to close: nothing after it is parsed
  bool in_message_ = false;
  bool in_headers_ = false;
  bool paused_ = false;
  ProxyExchange *serial_ex_ = nullptr; // a proxied answer the next request waits for
  bool closing_ = false;
  bool cut_short_ = false; // see abort_output()
  bool close_after_current_ = false;
  bool log_blank_ = false; // fail() before a message began: req_ is not this one
  uint64_t started_ = 0;
  uint64_t now_ = 0;
  std::deque<Queued> queue_;
  std::string buffered_;
  bool eof_ = false; // the client's input ended (read side closed)
  uint64_t activity_ = 0; // counts_activity()
  bool proxied_ = false;             // the request being parsed went to the proxy
  bool tunnel_ = false;              // ... asking to switch: the connection's last request
  ProxyExchange *body_ex_ = nullptr; // ... and its body is being received (in queue_)
  ProxyExchange *flush_ex_ = nullptr; // took body bytes not yet flushed (in queue_)
};

} // namespace

void init_h1_parsing() {
  // http-parser's own cap on a head (80 KiB, one for the process) is raised
  // above any configurable limit: ours (with the framing check's bound on
  // the wire bytes) is the one that holds. The parser counts each field's
  // line, less than the 32 bytes a field adds to our count.
  static const bool once = [] {
    http_parser_set_max_header_size(MAX_HEADER_SIZE_CEILING + 64 * 1024);
    return true;
  }();
  (void)once;
}

std::unique_ptr<TcpSession> make_h1_session(const SessionEnv &env) {
  return std::make_unique<H1Session>(env);
}

} // namespace xdpq::http
