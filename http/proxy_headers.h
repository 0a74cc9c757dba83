#pragma once
// How a request crosses the proxy and how its response comes back (RFC
// 9110 7.6): hop-by-hop fields (Connection and every field it names, TE,
// Keep-Alive, Upgrade, Transfer-Encoding, Trailer, Proxy-*) never cross in
// either direction; HTTP/3 and HTTP/2 pseudo-headers become the request
// line and Host; X-Forwarded-For/-Proto/-Host are set by the proxy, and
// the client's own are kept only when it is a trusted proxy itself.

#include "http/message.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace xdpq::http {

// How the request body goes upstream: none, Content-Length (the client's
// own), chunked (the client announced no length), or a tunnel (an
// HTTP/1.1 client's Upgrade, WebSocket: after the upstream's 101 the
// client's bytes go up as they are, until it closes).
enum class RequestFraming : uint8_t { none, length, chunked, tunnel };

struct ForwardContext {
  std::string_view client_ip; // the client's address without port
  std::string_view proto;     // "https" (both listeners are TLS) or "http"
  bool trusted = false;       // the client may bring X-Forwarded-* / Forwarded
  bool forwarded_headers = true;
  bool via = false;
  RequestFraming framing = RequestFraming::none;
  uint64_t content_length = 0; // framing length
  bool early = false;          // in 0-RTT: "Early-Data: 1" goes with it (RFC 8470 5.1)
  std::string_view upgrade;    // framing tunnel: the client's Upgrade, passed on
};

// True for a field that never crosses a proxy (connection lists the names
// the message's Connection field adds; empty if none).
bool is_hop_by_hop(std::string_view name, std::string_view connection);

// POST, PUT and PATCH define a body: sent without one, they say
// "content-length: 0".
inline bool method_defines_body(std::string_view method) {
  return method == "POST" || method == "PUT" || method == "PATCH";
}

// The HTTP/1.1 request head for the upstream, appended to out, with the
// body framing ctx says (Content-Length, Transfer-Encoding: chunked, or
// none; a POST, PUT or PATCH without a body still says "content-length:
// 0"). The client's own framing fields and Expect never cross (the body is
// streamed as it comes; the upstream is not asked to confirm it). Returns false, adding
// nothing, when a field cannot be written as HTTP/1.1 (CR, LF or NUL in
// it, an empty method or path): the caller answers 400.
bool build_upstream_request(const Request &req, const ForwardContext &ctx, std::string &out);

// The upstream response's fields as they go to the client: lower-case
// names, hop-by-hop fields, Content-Length (the transport writes its own)
// and Server (ours) left out.
void copy_response_fields(const HeaderList &upstream, HeaderList &out);

// The path has a "." or ".." segment, plain or percent-encoded (%2e),
// between "/" or "\\" separators (plain or %2f, %5c), or before a ";"
// (path parameters: "/..;/"). Such a request is not
// forwarded: it matched its route's prefix as written, and an upstream
// that resolves the segments would serve a path outside the prefix
// ("/app/../admin").
bool has_dot_segment(std::string_view path);

} // namespace xdpq::http
