#include "http/message.h"

#include <array>
#include <algorithm>
#include <cctype>
#include <cstring>

namespace xdpq::http {

namespace {
// What a pooled request or response (a stream slot: up to max_streams of
// them per connection, kept for the connection's life) may keep for reuse:
// a peer must not make every slot hold the largest head it ever sent.
constexpr size_t KEEP_BODY_CAPACITY = 16 * 1024;
constexpr size_t KEEP_LIST_BYTES = 16 * 1024; // field slots and their strings
constexpr size_t KEEP_LINE_CAPACITY = 1024;   // method, scheme, authority, path

// Past the small-string buffer, a string holds its capacity on the heap.
size_t heap_of(const std::string &s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }
size_t heap_of(const Header &h) { return heap_of(h.name) + heap_of(h.value); }

void trim_line(std::string &s) {
  if (s.capacity() > KEEP_LINE_CAPACITY) std::string().swap(s);
  else s.clear();
}
} // namespace

void HeaderList::add(std::string_view name, std::string_view value) {
  if (size_ < fields_.size()) {
    Header &h = fields_[size_];
    const size_t before = heap_of(h); // assign() only ever grows a buffer
    h.name.assign(name);
    h.value.assign(value);
    heap_ += heap_of(h) - before;
  } else {
    fields_.push_back(Header{std::string(name), std::string(value)});
    heap_ += heap_of(fields_.back());
  }
  ++size_;
}

void HeaderList::count_heap() {
  heap_ = 0;
  for (const auto &f : fields_) heap_ += heap_of(f);
}

void HeaderList::trim() {
  if (heap_ + fields_.capacity() * sizeof(Header) > KEEP_LIST_BYTES) {
    release();
  } else {
    clear();
  }
}

size_t HeaderList::retained_bytes() const { return fields_.capacity() * sizeof(Header) + heap_; }

void HeaderList::release() {
  fields_.clear();
  fields_.shrink_to_fit();
  size_ = 0;
  heap_ = 0;
}

const std::string *HeaderList::find(std::string_view name) const {
  for (const auto &h : *this) {
    if (h.name == name) {
      return &h.value;
    }
  }
  return nullptr;
}

void Request::reset() {
  trim_line(method);
  trim_line(scheme);
  trim_line(authority);
  trim_line(path);
  headers.trim();
  if (body.capacity() > KEEP_BODY_CAPACITY) {
    std::string().swap(body);
  } else {
    body.clear();
  }
}

size_t Request::retained_bytes() const {
  return heap_of(method) + heap_of(scheme) + heap_of(authority) + heap_of(path) +
         headers.retained_bytes() + heap_of(body);
}

void Request::release() {
  for (std::string *s : {&method, &scheme, &authority, &path, &body}) std::string().swap(*s);
  headers.release();
}

void SlotKeep::park(Request &req, HeaderList &resp_headers, size_t &slot_kept) {
  const size_t kept = req.retained_bytes() + resp_headers.retained_bytes();
  const size_t excess = kept > SLOT_ALLOWANCE ? kept - SLOT_ALLOWANCE : 0;
  if (excess > 0 && kept_ + excess > KEEP_PER_CONNECTION) {
    req.release();
    resp_headers.release();
    slot_kept = 0;
    return;
  }
  kept_ += excess;
  slot_kept = excess;
}

std::span<const uint8_t> MemoryBody::chunk(uint64_t offset) const {
  auto *p = reinterpret_cast<const uint8_t *>(data_.data());
  return {p + offset, data_.size() - offset};
}

std::span<const uint8_t> StaticBody::chunk(uint64_t offset) const {
  auto *p = reinterpret_cast<const uint8_t *>(data_.data());
  return {p + offset, data_.size() - offset};
}

namespace {
constexpr size_t PATTERN_PERIOD = 26;
// 64 KiB of whole periods plus one period of slack, so a chunk can start at
// any phase and still be 64 KiB long.
constexpr size_t PATTERN_CHUNK = 65536;
constexpr size_t PATTERN_BUF = PATTERN_CHUNK + PATTERN_PERIOD;

constexpr std::array<uint8_t, PATTERN_BUF> make_pattern() {
  std::array<uint8_t, PATTERN_BUF> a{};
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint8_t>('a' + i % PATTERN_PERIOD);
  }
  return a;
}
constexpr auto PATTERN = make_pattern();
} // namespace

std::span<const uint8_t> PatternBody::chunk(uint64_t offset) const {
  size_t phase = offset % PATTERN_PERIOD;
  uint64_t left = size_ - offset;
  size_t n = left < PATTERN_CHUNK ? static_cast<size_t>(left) : PATTERN_CHUNK;
  return {PATTERN.data() + phase, n};
}

void Response::set(int s, std::string_view content_type, std::unique_ptr<Body> b) {
  status = s;
  content_length = b ? b->size() : 0;
  body = std::move(b);
  if (!content_type.empty()) {
    add_header("content-type", content_type);
  }
}

void Response::add_header(std::string_view name, std::string_view value) {
  headers.add(name, value);
}

void Response::reset() {
  status = 200;
  headers.trim();
  body.reset();
  content_length = 0;
  length_unknown = false;
}

bool valid_field_value(std::string_view value) {
  for (unsigned char c : value) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

bool valid_host_field(std::string_view value) {
  std::string_view port;
  if (!value.empty() && value.front() == '[') {
    const size_t close = value.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (char c : value.substr(1, close - 1)) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
    }
    const std::string_view rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port = rest.substr(1);
    }
  } else {
    const size_t colon = value.find(':');
    const std::string_view name = value.substr(0, colon);
    if (colon != std::string_view::npos) port = value.substr(colon + 1);
    // unreserved, pct-encoded and sub-delims
    constexpr std::string_view other = "-._~%!$&'()*+,;=";
    for (char c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && other.find(c) == std::string_view::npos)
        return false;
    }
  }
  for (char c : port) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

std::string_view reason_phrase(int status) {
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 412: return "Precondition Failed";
  case 413: return "Content Too Large";
  case 416: return "Range Not Satisfiable";
  case 417: return "Expectation Failed";
  case 425: return "Too Early";
  case 409: return "Conflict";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 505: return "HTTP Version Not Supported";
  default: return "Unknown";
  }
}

void make_error(Response &resp, int status, bool head_only) {
  std::string text = std::to_string(status);
  text += ' ';
  text += reason_phrase(status);
  text += '\n';
  resp.reset();
  resp.status = status;
  resp.add_header("content-type", "text/plain; charset=utf-8");
  resp.content_length = text.size();
  if (!head_only) {
    resp.body = std::make_unique<MemoryBody>(std::move(text));
  }
}

size_t Body::copy(uint64_t offset, uint8_t *dst, size_t len) const {
  size_t n = 0;
  while (n < len && offset + n < size()) {
    auto c = chunk(offset + n);
    if (c.empty()) break;
    size_t take = std::min(c.size(), len - n);
    std::memcpy(dst + n, c.data(), take);
    n += take;
  }
  return n;
}

} // namespace xdpq::http
