#include "http/h1_framing.h"

#include <algorithm>

namespace xdpq::http {

namespace {

int hex_value(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

} // namespace

size_t H1FramingCheck::allow(const uint8_t *p, size_t n) const {
  allowed_ = st_;
  allowed_n_ = scan(allowed_, p, n);
  // A scan that stopped at a failure ended in another state than a scan of
  // only the bytes before it would: not kept.
  allowed_at_ = allowed_.state == State::failed ? nullptr : p;
  return allowed_n_;
}

void H1FramingCheck::take(const uint8_t *p, size_t n) {
  size_t i;
  if (p == allowed_at_ && n == allowed_n_) {
    st_ = allowed_;
    i = n;
  } else {
    i = scan(st_, p, n);
  }
  allowed_at_ = nullptr;
  if (st_.state == State::await_body && pending_ != Pending::unknown) {
    const Pending framing = pending_;
    pending_ = Pending::unknown;
    switch (framing) {
    case Pending::none: st_.state = State::start; break;
    case Pending::length:
      st_.left = pending_length_;
      st_.state = pending_length_ == 0 ? State::start : State::length;
      break;
    case Pending::chunked:
      st_.state = State::chunk_size;
      st_.size = 0;
      st_.digits = 0;
      st_.ext = false;
      st_.ext_open = false;
      st_.cr = false;
      st_.line = 0;
      break;
    case Pending::to_close: st_.state = State::to_close; break;
    case Pending::unknown: break;
    }
    i += scan(st_, p + i, n - i);
  }
  // The parser took bytes the check did not allow: the two no longer agree
  // on where the message is.
  if (i < n) st_.state = State::failed;
}

void H1FramingCheck::body_none() { pending_ = Pending::none; }

void H1FramingCheck::body_length(uint64_t n) {
  pending_ = Pending::length;
  pending_length_ = n;
}

void H1FramingCheck::body_chunked() { pending_ = Pending::chunked; }

void H1FramingCheck::body_to_close() { pending_ = Pending::to_close; }

bool H1FramingCheck::chunk_line_byte(Scan &s, uint8_t b) {
  if (++s.line > MAX_CHUNK_LINE) return false;
  if (!s.ext) {
    const int v = hex_value(b);
    if (v >= 0) {
      if (s.digits == 16) return false; // past 64 bits
      s.size = s.size << 4 | static_cast<uint64_t>(v);
      s.digits += 1;
      return true;
    }
    // A chunk extension (RFC 9112 7.1.1), after optional whitespace.
    if (s.digits == 0 || (b != ';' && b != ' ' && b != '\t')) return false;
    s.ext = true;
    s.ext_open = b == ';';
    return true;
  }
  if (!s.ext_open) {
    // Whitespace after the size leads only to a ';' or the line's end:
    // "1 foo" is no chunk size a strict hop reads.
    if (b == ';') s.ext_open = true;
    return b == ';' || b == ' ' || b == '\t';
  }
  // Tokens, quoted strings, '=' and whitespace: visible characters, obs-text,
  // SP and HTAB; never a control character (a bare LF least of all).
  return b == ' ' || b == '\t' || (b >= 0x21 && b != 0x7f);
}

void H1FramingCheck::line_tail(Scan &s, const uint8_t *p, size_t n) {
  for (size_t k = n > 9 ? n - 9 : 0; k < n; ++k) {
    s.before_tail = static_cast<uint8_t>(s.tail >> 56);
    s.tail = s.tail << 8 | p[k];
    if (s.tail_n < 9) ++s.tail_n;
  }
}

bool H1FramingCheck::request_line_ends_well(const Scan &s) {
  if (s.tail_n < 9 || s.before_tail != ' ') return false;
  uint8_t v[8];
  for (int k = 0; k < 8; ++k) v[k] = static_cast<uint8_t>(s.tail >> (8 * (7 - k)));
  auto digit = [](uint8_t c) { return c >= '0' && c <= '9'; };
  return v[0] == 'H' && v[1] == 'T' && v[2] == 'T' && v[3] == 'P' && v[4] == '/' &&
         digit(v[5]) && v[6] == '.' && digit(v[7]);
}

size_t H1FramingCheck::scan(Scan &s, const uint8_t *p, size_t n) {
  size_t i = 0;
  auto fail = [&] {
    s.state = State::failed;
    return i;
  };
  while (i < n) {
    const uint8_t b = p[i];
    switch (s.state) {
    case State::start:
      // Empty lines before a request are ignored (RFC 9112 2.2).
      if (b == '\r' || b == '\n') {
        ++i;
        break;
      }
      s.state = State::head;
      s.cr = false;
      s.line = 0;
      s.first_line = s.request;
      s.tail_n = 0;
      s.head_bytes = 0;
      break;
    case State::head:
      if (s.head_limit != 0 && s.head_bytes > s.head_limit) {
        s.head_over = true;
        return fail();
      }
      if (s.cr && b != '\n') return fail(); // a bare CR
      // A line that begins with whitespace: obs-fold, a field value
      // continued (RFC 9112 5.2), which the parser would join to the field
      // before it without the space ("Transfer-Encoding:" then " chunked"
      // is chunked to it, and no framing at all to a hop that keeps the
      // fold): refused, as RFC 9112 lets a server do.
      if (s.line == 0 && (b == ' ' || b == '\t')) return fail();
      if (b > '\r') {
        // Most of a line: no CR or LF among these bytes.
        const size_t from = i;
        for (++i; i < n && p[i] > '\r';) ++i;
        s.line += i - from;
        s.head_bytes += i - from;
        if (s.first_line) line_tail(s, p + from, i - from);
        break;
      }
      ++s.head_bytes;
      if (b == '\r') {
        s.cr = true;
        ++i;
        break;
      }
      ++i;
      if (b != '\n') {
        ++s.line;
        if (s.first_line) line_tail(s, &b, 1);
        break;
      }
      s.cr = false;
      if (s.line == 0) {
        s.state = State::await_body; // the empty line: the head ends here
        return i;
      }
      if (s.first_line) {
        s.first_line = false;
        if (!request_line_ends_well(s)) {
          --i; // the parser takes none of its end
          return fail();
        }
      }
      s.line = 0;
      break;
    case State::await_body: return i;
    case State::length: {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(s.left, n - i));
      i += k;
      s.left -= k;
      if (s.left == 0) s.state = State::start;
      break;
    }
    case State::chunk_size:
      if (s.cr) {
        if (b != '\n' || s.digits == 0) return fail();
        ++i;
        s.cr = false;
        s.line = 0;
        if (s.size == 0) {
          s.state = State::trailers;
          s.trailer_bytes = 0;
        } else {
          s.state = State::chunk_data;
          s.left = s.size;
        }
        break;
      }
      if (b == '\r') {
        s.cr = true;
        ++i;
        break;
      }
      if (!chunk_line_byte(s, b)) return fail();
      ++i;
      break;
    case State::chunk_data: {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(s.left, n - i));
      i += k;
      s.left -= k;
      if (s.left == 0) {
        s.state = State::chunk_end;
        s.cr = false;
      }
      break;
    }
    case State::chunk_end:
      if (!s.cr) {
        if (b != '\r') return fail();
        s.cr = true;
        ++i;
        break;
      }
      if (b != '\n') return fail();
      ++i;
      s.cr = false;
      s.state = State::chunk_size;
      s.size = 0;
      s.digits = 0;
      s.ext = false;
      s.ext_open = false;
      s.line = 0;
      break;
    case State::trailers:
      if (++s.trailer_bytes > MAX_TRAILERS) return fail();
      if (s.cr) {
        if (b != '\n') return fail();
        ++i;
        s.cr = false;
        if (s.line == 0) {
          s.state = State::start; // the empty line ends the message
        } else {
          s.line = 0;
        }
        break;
      }
      if (b == '\n') return fail(); // chunked framing ends its lines in CRLF
      if (b == '\r') {
        s.cr = true;
      } else {
        ++s.line;
      }
      ++i;
      break;
    case State::to_close: return n;
    case State::failed: return i;
    }
  }
  return i;
}

} // namespace xdpq::http
