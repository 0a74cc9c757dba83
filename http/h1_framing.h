#pragma once
// A strict check of HTTP/1.1 message framing, run over the bytes before
// http-parser sees them. Debian's http-parser is built without its strict
// checks (HTTP_PARSER_STRICT=0): it takes any byte after a CR for the LF
// that ends a head line, any two bytes after chunk data for its CRLF, and
// a bare LF inside a chunk extension. Another hop that reads those bytes as
// RFC 9112 says frames the message differently (request smuggling). This
// check stops the parser where a message stops being well framed:
// - a head line ends in CRLF or a bare LF (RFC 9112 2.2 lets a recipient
//   take LF alone), never in a CR followed by anything else;
// - a chunked body is 1*HEXDIG, an optional extension of visible
//   characters, spaces and tabs, CRLF; the data; CRLF; and after the last
//   chunk, trailer lines and an empty line, each ended by CRLF.
// - a request line (check_request_line()) ends in SP "HTTP/" DIGIT "."
//   DIGIT: Debian's build takes any four bytes for the "HTTP" and reads a
//   line without a version as HTTP/0.9.
// The framing of a body (none, a length, chunked) comes from the parser's
// reading of the head: the caller says which once the head is parsed.

#include <cstddef>
#include <cstdint>

namespace xdpq::http {

class H1FramingCheck {
public:
  // How many of the n bytes at p the parser may take now: all of them,
  // or fewer where a head ends (its body's framing is needed first:
  // body_*()) or where the framing breaks. 0 (for n > 0): the first byte
  // breaks it, or the parser did not end the head where the check did.
  // Looks only: take() moves past what the parser took.
  size_t allow(const uint8_t *p, size_t n) const;
  // The parser took these n bytes (at most what allow() gave).
  void take(const uint8_t *p, size_t n);
  // Each head's first line is a request line (not a status line).
  void check_request_line() { st_.request = true; }
  // A head of more than n bytes on the wire breaks the framing (0: no
  // bound). The parser's callbacks see less than that (not the whitespace
  // around a value or the target, say): this bounds what they do not.
  void limit_head(size_t n) { st_.head_limit = n; }
  // Where the framing broke: a head over that bound.
  bool head_over_limit() const {
    // (A look that failed at its first byte: the parser took none of it.)
    return st_.head_over || (allowed_n_ == 0 && allowed_.head_over);
  }
  // What limit_head() allows past a limit the parser's callbacks count
  // (each field line's ": " and CRLF, the request line's method and
  // version, counted there as less than the 32 bytes a field adds).
  static constexpr size_t HEAD_SLACK = 4096;

  // The head just parsed frames its body so (call from the parser's
  // headers-complete callback): take() applies it where the head ends.
  void body_none();
  void body_length(uint64_t n);
  void body_chunked();
  // A response delimited by the connection's close: every byte after the
  // head is its body.
  void body_to_close();

  // At the end of a head, waiting for its framing.
  bool awaiting_body() const { return st_.state == State::await_body; }
  // The parser took bytes the check had not allowed.
  bool failed() const { return st_.state == State::failed; }
  // Between messages (nothing of one taken yet).
  bool idle() const { return st_.state == State::start; }

  // Bounds on what the check reads without the parser learning anything:
  // a chunk-size line with its extension, and the trailer section.
  static constexpr size_t MAX_CHUNK_LINE = 4096;
  static constexpr size_t MAX_TRAILERS = 16 * 1024;

private:
  enum class State : uint8_t {
    start,       // before a message: empty lines are skipped, as the parser does
    head,        // a head's lines
    await_body,  // the head ended; its framing not known yet
    length,      // a body of a known length
    chunk_size,  // a chunk-size line, its extension
    chunk_data,  // a chunk's data
    chunk_end,   // the CRLF after a chunk's data
    trailers,    // trailer lines after the last chunk
    to_close,    // a body delimited by the close
    failed,
  };
  struct Scan {
    State state = State::start;
    bool cr = false;         // the previous byte was a CR
    bool ext = false;        // past the size: whitespace, then an extension
    bool ext_open = false;   // the extension's ';' seen
    uint8_t digits = 0;      // hex digits of the chunk size
    size_t line = 0;         // bytes of the current line (head, size line, trailer)
    size_t trailer_bytes = 0;
    bool request = false;    // check_request_line()
    bool head_over = false;  // failed: a head over head_limit
    size_t head_limit = 0;   // limit_head()
    size_t head_bytes = 0;   // of the current head
    bool first_line = false; // in a request's first line
    uint8_t tail_n = 0;      // bytes of that line seen (counted to 9)
    uint8_t before_tail = 0; // the byte before the last 8
    uint64_t tail = 0;       // its last 8 bytes, the latest lowest
    uint64_t left = 0;       // body or chunk bytes still to come
    uint64_t size = 0;       // the chunk size being read
  };
  // Advances s over up to n bytes at p; returns how many it passed (fewer
  // than n where it stops: a head's end, a failure).
  static size_t scan(Scan &s, const uint8_t *p, size_t n);
  static bool chunk_line_byte(Scan &s, uint8_t b);
  static void line_tail(Scan &s, const uint8_t *p, size_t n);
  static bool request_line_ends_well(const Scan &s);
  enum class Pending : uint8_t { unknown, none, length, chunked, to_close };
  Scan st_;
  // What the last allow() scanned to, so that take() of exactly those
  // bytes (the usual case) need not scan them again.
  mutable Scan allowed_;
  mutable const uint8_t *allowed_at_ = nullptr; // null: none
  mutable size_t allowed_n_ = 0;
  Pending pending_ = Pending::unknown;
  uint64_t pending_length_ = 0;
};

} // namespace xdpq::http
