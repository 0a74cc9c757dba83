#pragma once
// The HTTP/1.1 response of an upstream (a proxied application), parsed
// with Debian's http-parser in response mode: status line, header fields
// within limits, 1xx interim responses skipped, and the body with its
// framing removed (Content-Length, chunked, or delimited by the
// connection's close). Everything it reads is hostile: a head over the
// limits, a malformed line or an invalid chunk size is an error, never a
// guess. A 101 (Switching Protocols) is taken only in answer to a request
// that asked to switch (tunnel): the bytes after its head are the new
// protocol's, passed on as they are until the upstream closes.

#include "http/h1_framing.h"
#include "http/message.h"

#include <http_parser.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace xdpq::http {

struct UpstreamResponseLimits {
  size_t max_head = 32 * 1024; // status line and fields, per response (1xx each)
  size_t max_fields = 100;
};

class UpstreamResponseParser {
public:
  class Handler {
  public:
    // The final (non-1xx) response head is complete (read it from p).
    virtual void on_head(const UpstreamResponseParser &p) = 0;
    // Body bytes, framing removed.
    virtual void on_body(const uint8_t *data, size_t len) = 0;
    // The whole response arrived.
    virtual void on_complete() = 0;

  protected:
    ~Handler() = default;
  };

  enum class Result { ok, error };

  explicit UpstreamResponseParser(const UpstreamResponseLimits &limits = {});
  UpstreamResponseParser(const UpstreamResponseParser &) = delete;
  UpstreamResponseParser &operator=(const UpstreamResponseParser &) = delete;

  // Ready for the response to a new request. head_request: it answers a
  // HEAD, so it has no body whatever its fields say. tunnel: the request
  // was a WebSocket handshake: a 101 with "Upgrade: websocket" and
  // "Connection: upgrade" is its final answer, and what follows its head
  // is body, raw, until finish().
  void reset(Handler *handler, bool head_request, bool tunnel = false);

  // Parses bytes. After an error nothing more is parsed; error() says why.
  Result feed(const uint8_t *data, size_t len);
  // The upstream closed the connection: completes a body delimited by the
  // close, an error if the response was cut short.
  Result finish();

  bool head_done() const { return head_done_; }
  // A 101 came: everything after its head is the tunnel's.
  bool switched() const { return switched_; }
  bool complete() const { return complete_; }
  bool failed() const { return !error_.empty(); }
  // Any byte of the response arrived (an idempotent request may be
  // retried elsewhere only before that).
  bool started() const { return started_; }
  std::string_view error() const { return error_; }

  // Valid from on_head() on: the status, the fields as received (names
  // lower-cased), and the body length when the upstream announced one.
  int status() const { return status_; }
  const HeaderList &headers() const { return headers_; }
  bool length_known() const { return length_known_; }
  uint64_t content_length() const { return content_length_; }
  // The connection may carry another request after complete().
  bool keep_alive() const { return keep_alive_; }

  // http-parser callbacks, public for the C trampolines only.
  int on_message_begin();
  int on_status();
  int on_field(const char *at, size_t n);
  int on_value(const char *at, size_t n);
  int on_headers_complete();
  int on_body(const char *at, size_t n);
  int on_message_complete();

private:
  bool account(size_t n);
  bool flush_field(); // false: malformed (failed)
  void fail(std::string_view why);

  UpstreamResponseLimits limits_;
  http_parser parser_{};
  http_parser_settings settings_{};
  H1FramingCheck framing_; // the strictness Debian's http-parser leaves out
  Handler *handler_ = nullptr;
  bool head_request_ = false;
  bool tunnel_ = false;
  bool switched_ = false;
  bool started_ = false;
  bool head_done_ = false;
  bool complete_ = false;
  bool interim_ = false; // the message being parsed is a 1xx
  // Interim responses so far: a few (100 Continue, 103 Early Hints) are
  // real; more are an upstream looping, whose heads, small and never-ending,
  // would otherwise keep the worker parsing with no answer to show.
  size_t interims_ = 0;
  static constexpr size_t MAX_INTERIMS = 16;
  bool keep_alive_ = false;
  bool length_known_ = false;
  bool value_open_ = false;
  int status_ = 0;
  uint64_t content_length_ = 0;
  size_t head_bytes_ = 0;
  size_t fields_ = 0;
  std::string field_, value_;
  HeaderList headers_;
  std::string error_;
};

} // namespace xdpq::http
