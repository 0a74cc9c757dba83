#pragma once
// Protocol-neutral HTTP request and response. HTTP/3 (h3_session) and the
// TCP side build a Request, hand it to the Router, and serialise the
// Response in their own framing. Objects are reused across requests on a
// stream slot (reset() keeps string capacity), so steady state reuses memory.

#include "base/small_alloc.h"

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq::http {

// The largest request header section a configuration may allow
// (--max-header-size, for every protocol).
inline constexpr size_t MAX_HEADER_SIZE_CEILING = 1u << 20;

struct Header {
  std::string name; // lower case
  std::string value;
};

// Header fields of one message. clear() keeps every field's strings (and
// their capacity) for the next message on the same stream slot, so a
// steady stream of requests with the same shape allocates nothing.
class HeaderList {
public:
  HeaderList() = default;
  HeaderList(std::initializer_list<Header> fields) : fields_(fields), size_(fields_.size()) {
    count_heap();
  }
  HeaderList(std::vector<Header> fields) : fields_(std::move(fields)), size_(fields_.size()) {
    count_heap();
  }

  void add(std::string_view name, std::string_view value);
  void clear() { size_ = 0; }
  // Frees the strings too (a connection going idle, a huge header).
  void release();
  // Empty for reuse: clear(), or release() if the slots kept (all of
  // them, not only the last request's) hold more than is worth keeping.
  void trim();
  // Field slots kept for reuse (their strings' buffers with them).
  size_t slots() const { return fields_.size(); }
  // Heap bytes those slots hold.
  size_t retained_bytes() const;
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const Header *begin() const { return fields_.data(); }
  const Header *end() const { return fields_.data() + size_; }
  // The first field with this (lower-case) name, or nullptr.
  const std::string *find(std::string_view name) const;

private:
  std::vector<Header> fields_; // [0, size_) in use; the rest kept for reuse
  size_t size_ = 0;
  size_t heap_ = 0; // the slots' strings' heap bytes (kept up to date by add())
  void count_heap();
};

struct Request {
  std::string method;
  std::string scheme;
  std::string authority;
  std::string path; // as sent, including the query
  HeaderList headers;
  // mutable: the handler is the body's last reader and may move it out
  // (/echo does), so a body is never held twice.
  mutable std::string body;

  // Returns the first header with this (lower-case) name, or nullptr.
  const std::string *find(std::string_view name) const { return headers.find(name); }
  // Clears for the next request, keeping small buffers for reuse and
  // freeing large ones (a big upload must not stay allocated in a pooled
  // stream slot).
  void reset();
  // Frees every buffer.
  void release();
  // Heap bytes its buffers hold.
  size_t retained_bytes() const;
};

// A response body: a byte sequence read front to back. The memory a chunk
// points to stays valid until the transport calls release() past it (or
// the Body dies), so transports can keep references until the peer
// acknowledges the bytes (nghttp3 does).
class Body {
public:
  // One or more bodies per response: from the worker's block cache.
  XDPQ_SMALL_ALLOC_OPERATORS
  virtual ~Body() = default;
  virtual uint64_t size() const = 0;
  // Largest contiguous chunk starting at offset (offset < size()). Empty
  // when the content is no longer there (a file truncated under us): the
  // transport then aborts the response (the promised length cannot be
  // kept) instead of sending anything else.
  virtual std::span<const uint8_t> chunk(uint64_t offset) const = 0;
  // The transport needs no byte before offset any more (acknowledged, or
  // copied into its own buffers): bodies that read on demand free them.
  virtual void release(uint64_t offset) { (void)offset; }
  // Chunks are read on demand into memory held until release(): the
  // transport reads only as far ahead as the peer lets it send.
  virtual bool reads_ahead() const { return false; }
  // For a transport that copies anyway (HTTP/2): up to len bytes from
  // offset into dst, without keeping them; the count, 0 when the content
  // went away.
  virtual size_t copy(uint64_t offset, uint8_t *dst, size_t len) const;
};

// Body held in memory (error pages, /echo, /healthz).
class MemoryBody final : public Body {
public:
  explicit MemoryBody(std::string data) : data_(std::move(data)) {}
  uint64_t size() const override { return data_.size(); }
  std::span<const uint8_t> chunk(uint64_t offset) const override;

private:
  std::string data_;
};

// Body pointing at memory that outlives every request (embedded pages).
class StaticBody final : public Body {
public:
  explicit StaticBody(std::string_view data) : data_(data) {}
  uint64_t size() const override { return data_.size(); }
  std::span<const uint8_t> chunk(uint64_t offset) const override;

private:
  std::string_view data_;
};

// N bytes of the repeating alphabet "abc...z": byte i is 'a' + i % 26.
// Served from one static buffer, so a 64 MiB body costs no memory.
class PatternBody final : public Body {
public:
  explicit PatternBody(uint64_t n) : size_(n) {}
  uint64_t size() const override { return size_; }
  std::span<const uint8_t> chunk(uint64_t offset) const override;

private:
  uint64_t size_;
};

struct Response {
  int status = 200;
  HeaderList headers;          // without content-length; transports add it
  std::unique_ptr<Body> body;  // may be null: no body
  // Content-Length to announce. For HEAD this is the length a GET would
  // have returned, while body stays null.
  uint64_t content_length = 0;
  // No Content-Length at all: the body's end is signalled by the
  // transport's framing (a proxied response the upstream did not size).
  bool length_unknown = false;

  void set(int status, std::string_view content_type, std::unique_ptr<Body> body);
  void add_header(std::string_view name, std::string_view value);
  void reset();
};

// The buffers one connection's stream slots keep for reuse. reset() bounds
// what one slot keeps (16 KiB of fields and more); a client opening many
// streams with large heads would still leave that behind in each (up to
// the stream limit, for the connection's life). Each slot keeps
// SLOT_ALLOWANCE freely: an ordinary request and response head need 1-3
// KiB, so ordinary traffic, however many streams, reuses everything (no
// allocation per request). What slots keep beyond it is summed per
// connection, and a slot closing while that sum is at
// KEEP_PER_CONNECTION gives its buffers back instead.
class SlotKeep {
public:
  static constexpr size_t SLOT_ALLOWANCE = 4 * 1024;
  static constexpr size_t KEEP_PER_CONNECTION = 128 * 1024;
  // A closed slot's request and response head, reset already: kept (what
  // they hold past the allowance counted in slot_kept) or released.
  void park(Request &req, HeaderList &resp_headers, size_t &slot_kept);
  // The slot is in use again: what it keeps is no longer idle.
  void unpark(size_t &slot_kept) {
    kept_ -= slot_kept;
    slot_kept = 0;
  }
  size_t kept() const { return kept_; }

private:
  size_t kept_ = 0;
};

// Fills resp with a short text/plain error page for status.
void make_error(Response &resp, int status, bool head_only = false);
std::string_view reason_phrase(int status);

// Whether a Host field's value is uri-host [":" port] (RFC 9112 3.2, RFC
// 3986 3.2.2): a registered name or IPv4 address, or an IPv6 address in
// brackets, and digits after a colon. Empty is valid (an empty authority).
bool valid_host_field(std::string_view value);
// A field value as RFC 9110 5.5 allows it: no control byte but HTAB. NUL,
// CR and LF would let another hop end or split the field; the others are
// refused by HTTP/2 and HTTP/3 peers, so such a value cannot be passed on.
bool valid_field_value(std::string_view value);

// Whether a field of an HTTP/2 or HTTP/3 head counts against the limit on
// fields as HTTP/1.1 counts its lines: pseudo-header fields are the
// request line's, and cookie crumbs (RFC 9113 8.2.3, RFC 9114 4.2.1: a
// browser splits its Cookie line into a field per cookie) are the one
// line's. Their bytes count all the same.
inline bool counts_as_field(std::string_view name) {
  return !name.starts_with(':') && name != "cookie";
}

} // namespace xdpq::http
