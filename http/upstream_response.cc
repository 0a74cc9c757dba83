#include "http/upstream_response.h"

#include "base/ascii.h"
#include "base/guard.h"

namespace xdpq::http {

namespace {

UpstreamResponseParser &me(http_parser *p) { return *static_cast<UpstreamResponseParser *>(p->data); }

} // namespace

UpstreamResponseParser::UpstreamResponseParser(const UpstreamResponseLimits &limits)
    : limits_(limits) {
  http_parser_settings_init(&settings_);
  settings_.on_message_begin = [](http_parser *p) {
    return guarded([&] { return me(p).on_message_begin(); }, -1);
  };
  settings_.on_status = [](http_parser *p, const char *, size_t n) {
    return guarded([&] { return me(p).account(n) ? me(p).on_status() : -1; }, -1);
  };
  settings_.on_header_field = [](http_parser *p, const char *at, size_t n) {
    return guarded([&] { return me(p).on_field(at, n); }, -1);
  };
  settings_.on_header_value = [](http_parser *p, const char *at, size_t n) {
    return guarded([&] { return me(p).on_value(at, n); }, -1);
  };
  settings_.on_headers_complete = [](http_parser *p) {
    return guarded([&] { return me(p).on_headers_complete(); }, -1);
  };
  settings_.on_body = [](http_parser *p, const char *at, size_t n) {
    return guarded([&] { return me(p).on_body(at, n); }, -1);
  };
  settings_.on_message_complete = [](http_parser *p) {
    return guarded([&] { return me(p).on_message_complete(); }, -1);
  };
}

void UpstreamResponseParser::reset(Handler *handler, bool head_request, bool tunnel) {
  http_parser_init(&parser_, HTTP_RESPONSE);
  parser_.data = this;
  framing_ = H1FramingCheck();
  framing_.limit_head(limits_.max_head + H1FramingCheck::HEAD_SLACK);
  handler_ = handler;
  head_request_ = head_request;
  tunnel_ = tunnel;
  switched_ = false;
  started_ = head_done_ = complete_ = interim_ = keep_alive_ = length_known_ = false;
  interims_ = 0;
  value_open_ = false;
  status_ = 0;
  content_length_ = 0;
  head_bytes_ = 0;
  fields_ = 0;
  field_.clear();
  value_.clear();
  headers_.clear();
  error_.clear();
}

void UpstreamResponseParser::fail(std::string_view why) {
  if (error_.empty()) error_.assign(why);
}

UpstreamResponseParser::Result UpstreamResponseParser::feed(const uint8_t *data, size_t len) {
  if (failed()) return Result::error;
  if (len == 0) return Result::ok;
  started_ = true;
  if (switched_) {
    // The tunnel's bytes, as they are.
    if (handler_) handler_->on_body(data, len);
    return failed() ? Result::error : Result::ok;
  }
  if (complete_) {
    fail("bytes after the end of the response");
    return Result::error;
  }
  size_t off = 0;
  while (off < len) {
    // As far as the framing is strict; at a head's end, until the parser
    // has said how its body is framed.
    const size_t ok = framing_.allow(data + off, len - off);
    if (ok == 0) {
      fail(framing_.head_over_limit()
               ? "response head over its size limit"
               : "malformed framing (a bare CR, or chunk framing without CRLF)");
      return Result::error;
    }
    size_t n = http_parser_execute(&parser_, &settings_, reinterpret_cast<const char *>(data) + off,
                                   ok);
    framing_.take(data + off, n);
    if (failed()) return Result::error;
    auto err = HTTP_PARSER_ERRNO(&parser_);
    if (err != HPE_OK) {
      fail(http_errno_description(err));
      return Result::error;
    }
    if (parser_.upgrade) {
      if (!switched_) {
        fail("protocol switch (101) is not proxied");
        return Result::error;
      }
      // http-parser stops right after the 101's head: the rest of this
      // read is the tunnel's.
      off += n;
      if (off < len && handler_) handler_->on_body(data + off, len - off);
      return failed() ? Result::error : Result::ok;
    }
    if (n != ok) {
      fail("malformed response");
      return Result::error;
    }
    off += n;
  }
  return Result::ok;
}

UpstreamResponseParser::Result UpstreamResponseParser::finish() {
  if (failed()) return Result::error;
  if (complete_) return Result::ok;
  if (switched_) {
    // A tunnel ends with the upstream's close.
    complete_ = true;
    if (handler_) handler_->on_complete();
    return Result::ok;
  }
  if (!started_) {
    fail("closed before any byte of a response");
    return Result::error;
  }
  // An empty read tells http-parser the stream ended: a body delimited by
  // the close completes; anything else cut short is an error.
  http_parser_execute(&parser_, &settings_, nullptr, 0);
  if (!failed() && !complete_) fail("closed in the middle of the response");
  return complete_ ? Result::ok : Result::error;
}

bool UpstreamResponseParser::account(size_t n) {
  head_bytes_ += n;
  if (head_bytes_ > limits_.max_head) {
    fail("response head over its size limit");
    return false;
  }
  return true;
}

int UpstreamResponseParser::on_message_begin() {
  if (head_done_) {
    fail("bytes after the end of the response");
    return -1;
  }
  head_bytes_ = 0;
  fields_ = 0;
  headers_.clear();
  field_.clear();
  value_.clear();
  value_open_ = false;
  return 0;
}

int UpstreamResponseParser::on_status() { return 0; }

bool UpstreamResponseParser::flush_field() {
  if (field_.empty()) return true;
  if (head_done_) {
    // A trailer field: dropped (trailers are not passed on).
    field_.clear();
    value_.clear();
    return true;
  }
  // Debian's http-parser takes spaces into a field name and leaves those
  // that end a value: whitespace before the colon is removed, as a proxy
  // must (RFC 9112 5.1), and a name still holding some is no name; a
  // value's trailing whitespace is not part of it (RFC 9110 5.5).
  auto ows = [](char c) { return c == ' ' || c == '\t'; };
  while (!field_.empty() && ows(field_.back())) field_.pop_back();
  if (field_.empty() || field_.find_first_of(" \t") != std::string::npos) {
    fail("whitespace in a field name");
    return false;
  }
  while (!value_.empty() && ows(value_.back())) value_.pop_back();
  // Debian's http-parser checks a value's bytes but not its first.
  if (!valid_field_value(value_)) {
    fail("control byte in a field value");
    return false;
  }
  ascii_lower_in_place(field_);
  headers_.add(field_, value_);
  field_.clear();
  value_.clear();
  return true;
}

int UpstreamResponseParser::on_field(const char *at, size_t n) {
  if (value_open_) {
    value_open_ = false;
    if (!flush_field()) return -1;
  }
  if (field_.empty() && ++fields_ > limits_.max_fields) {
    fail("too many response header fields");
    return -1;
  }
  if (!account(n + 4)) return -1;
  field_.append(at, n);
  return 0;
}

int UpstreamResponseParser::on_value(const char *at, size_t n) {
  value_open_ = true;
  if (!account(n)) return -1;
  value_.append(at, n);
  return 0;
}

namespace {
// No Transfer-Encoding, or one field whose value is "chunked" alone.
bool only_chunked(const HeaderList &h) {
  int n = 0;
  bool chunked = false;
  for (const auto &f : h) {
    if (f.name != "transfer-encoding") continue;
    chunked = ascii_iequals(trim_ows(f.value), "chunked");
    ++n;
  }
  return n == 0 || (n == 1 && chunked);
}
} // namespace

int UpstreamResponseParser::on_headers_complete() {
  value_open_ = false;
  if (!flush_field()) return -1;
  status_ = static_cast<int>(parser_.status_code);
  if (parser_.http_major != 1) {
    // "HTTP/2.0", "HTTP/0.9": not a version this proxy speaks upstream.
    fail("not an HTTP/1 response");
    return -1;
  }
  if (status_ < 100 || status_ > 599) {
    fail("status code out of range");
    return -1;
  }
  if (status_ == 101) {
    // Only to a request that asked for it (a WebSocket handshake), only
    // as a switch http-parser sees too (Upgrade and "Connection: upgrade"
    // in it), and only to what was asked.
    if (!tunnel_) {
      fail("protocol switch (101) is not proxied");
      return -1;
    }
    const std::string *to = headers_.find("upgrade");
    if (!parser_.upgrade || !to || !ascii_iequals(*to, "websocket")) {
      fail("101 without \"Upgrade: websocket\" and \"Connection: upgrade\"");
      return -1;
    }
    head_done_ = switched_ = true;
    keep_alive_ = false;
    length_known_ = false;
    content_length_ = 0;
    framing_.body_none();
    if (handler_) handler_->on_head(*this);
    if (failed()) return -1;
    return 1; // no body of its own: http-parser stops after the head
  }
  if (status_ < 200) {
    // 100 Continue, 103 Early Hints: skipped. An interim response has no
    // content (RFC 9110 15.2) whatever its fields say: 1 tells http-parser
    // to read none, so no byte of it can pass for the final response's.
    if (++interims_ > MAX_INTERIMS) {
      fail("more than 16 interim (1xx) responses");
      return -1;
    }
    interim_ = true;
    framing_.body_none();
    return 1;
  }
  head_done_ = true;
  // Trailers, if any, get limits of their own: the head's are spent on it.
  head_bytes_ = 0;
  fields_ = 0;
  // http-parser marks an answer to HEAD bodiless only once this returns:
  // until then it takes one without a length for delimited by the close,
  // which keeps no connection.
  if (head_request_) parser_.flags |= F_SKIPBODY;
  keep_alive_ = http_should_keep_alive(&parser_) != 0;
  length_known_ = !(parser_.flags & F_CHUNKED) && parser_.content_length != ULLONG_MAX;
  content_length_ = length_known_ ? parser_.content_length : 0;
  if (status_ == 204 || status_ == 304) {
    length_known_ = true;
    content_length_ = 0;
  }
  // A response to HEAD, a 204 and a 304 have no body, whatever their fields
  // announce (RFC 9110 6.4.1): read none.
  const bool bodiless = head_request_ || status_ == 204 || status_ == 304;
  if (!bodiless && !only_chunked(headers_)) {
    // The body is passed on decoded, and chunked is the one coding decoded
    // here: another (gzip; chunked listed twice) reached the client as
    // coded bytes labelled as none, or was read to the close. Refused
    // before the head is handed on: the client gets a 502, not a head
    // and then a reset.
    fail("a transfer coding other than one \"chunked\"");
    return -1;
  }
  if (handler_) handler_->on_head(*this);
  if (failed()) return -1;
  if (bodiless) {
    framing_.body_none();
  } else if (parser_.flags & F_CHUNKED) {
    framing_.body_chunked();
  } else if (length_known_) {
    framing_.body_length(content_length_);
  } else {
    framing_.body_to_close();
  }
  return bodiless ? 1 : 0;
}

int UpstreamResponseParser::on_body(const char *at, size_t n) {
  if (!head_done_ || complete_) {
    fail("body bytes outside the final response");
    return -1;
  }
  if (handler_) handler_->on_body(reinterpret_cast<const uint8_t *>(at), n);
  return failed() ? -1 : 0;
}

int UpstreamResponseParser::on_message_complete() {
  if (switched_) return 0; // the tunnel ends with the close (finish())
  if (interim_) {
    interim_ = false;
    return 0;
  }
  complete_ = true;
  keep_alive_ = keep_alive_ && http_should_keep_alive(&parser_) != 0;
  if (handler_) handler_->on_complete();
  return 0;
}

} // namespace xdpq::http
