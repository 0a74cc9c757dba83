#include "http/proxy_headers.h"

#include "base/ascii.h"

namespace xdpq::http {

namespace {

constexpr auto iequals = ascii_iequals;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether name is one of the comma-separated tokens of list.
bool listed(std::string_view list, std::string_view name) {
  while (!list.empty()) {
    auto comma = list.find(',');
    if (iequals(trim(list.substr(0, comma)), name)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

bool writable(std::string_view s) { return valid_field_value(s); }

// A request line's method or target: no whitespace or control byte, where
// a hop could split the line otherwise than we did (RFC 9112 3).
bool line_token(std::string_view s) {
  for (unsigned char c : s) {
    if (c <= 0x20 || c == 0x7f) return false;
  }
  return !s.empty();
}

// Fields in which a client would claim an address, scheme, host, port,
// path prefix or URL, as applications and their frameworks read them: CGI,
// WSGI and PHP turn '-' and '_' alike into HTTP_X_FORWARDED_FOR;
// applications written for nginx's realip module read X-Real-IP; address
// libraries read X-Client-IP, Client-IP (PHP's idiom), True-Client-IP,
// CF-Connecting-IP, Fastly-Client-IP, X-Cluster-Client-IP, X-Forwarded,
// Forwarded-For and X-Original-Forwarded-For; proxy-fix middleware reads
// X-Forwarded-Port, -Prefix, -Scheme, -Ssl and -Server, and X-Host; some
// routers take X-Original-URL and X-Rewrite-URL for the path. From an
// untrusted client they are dropped. A spelling with '_' for '-' is a
// look-alike, which no proxy of ours sends: dropped whoever sends it.
// (Names are lower case here.)
enum class Forwarding { none, field, lookalike };
Forwarding forwarding_field(std::string_view name) {
  static constexpr std::string_view NAMES[] = {
      "x-forwarded-for",    "x-forwarded-proto",  "x-forwarded-host",   "forwarded",
      "x-real-ip",          "x-client-ip",        "true-client-ip",     "cf-connecting-ip",
      "x-cluster-client-ip", "x-forwarded-port",  "x-forwarded-prefix", "x-forwarded-scheme",
      "x-forwarded-ssl",    "x-original-url",     "x-rewrite-url",      "client-ip",
      "x-forwarded",        "forwarded-for",      "fastly-client-ip",   "x-forwarded-server",
      "x-host",             "x-original-forwarded-for"};
  for (std::string_view n : NAMES) {
    if (n.size() != name.size()) continue;
    size_t i = 0;
    bool underscore = false;
    for (; i < n.size(); ++i) {
      if (name[i] == n[i]) continue;
      if (n[i] != '-' || name[i] != '_') break;
      underscore = true;
    }
    if (i == n.size()) return underscore ? Forwarding::lookalike : Forwarding::field;
  }
  return Forwarding::none;
}

// All values of one field, joined as the field's list (cookie: with "; ").
void joined(const HeaderList &h, std::string_view name, std::string &out,
            std::string_view sep = ", ") {
  for (const auto &f : h) {
    if (f.name != name) continue;
    if (!out.empty()) out += sep;
    out += f.value;
  }
}

void field(std::string &out, std::string_view name, std::string_view value) {
  out += name;
  out += ": ";
  out += value;
  out += "\r\n";
}

} // namespace

bool is_hop_by_hop(std::string_view name, std::string_view connection) {
  if (iequals(name, "connection") || iequals(name, "keep-alive") || iequals(name, "te") ||
      iequals(name, "upgrade") || iequals(name, "transfer-encoding") ||
      iequals(name, "trailer") ||
      (name.size() >= 6 && iequals(name.substr(0, 6), "proxy-"))) {
    return true;
  }
  return !connection.empty() && listed(connection, name);
}

bool build_upstream_request(const Request &req, const ForwardContext &ctx, std::string &out) {
  if (!line_token(req.method) || !line_token(req.path) || req.path.front() != '/' ||
      !valid_host_field(req.authority) ||
      (ctx.framing == RequestFraming::tunnel && (ctx.upgrade.empty() || !writable(ctx.upgrade)))) {
    return false;
  }
  std::string connection;
  joined(req.headers, "connection", connection);
  for (const auto &f : req.headers) {
    if (!writable(f.name) || !writable(f.value) || f.name.empty() ||
        f.name.find_first_of(" \t") != std::string::npos) {
      return false;
    }
  }
  out += req.method;
  out += ' ';
  out += req.path;
  out += " HTTP/1.1\r\n";
  const std::string *host = req.authority.empty() ? req.find("host") : &req.authority;
  // The Host field stands in for a missing :authority (HTTP/2, HTTP/3): it
  // is checked as :authority is (no userinfo, no stray bytes).
  if (host && !valid_host_field(*host)) return false;
  // Without one (an HTTP/1.0 client's request) an empty Host, which
  // HTTP/1.1 requires (RFC 9112 3.2).
  field(out, "host", host ? std::string_view(*host) : std::string_view());
  bool cookie_written = false;
  for (const auto &f : req.headers) {
    // Framing is the proxy's (below); Expect is not passed on: the body is
    // streamed as the client sends it.
    if (f.name == "host" || f.name == "content-length" || f.name == "expect" ||
        is_hop_by_hop(f.name, connection)) {
      continue;
    }
    // "Proxy" names no proxy of ours: CGI-style applications read it as
    // HTTP_PROXY, their own outbound proxy (the "httpoxy" attack).
    if (f.name == "proxy") continue;
    // An untrusted client's own are dropped whether or not we add ours.
    const Forwarding fwd = forwarding_field(f.name);
    if (fwd == Forwarding::lookalike || (fwd == Forwarding::field && !ctx.trusted)) continue;
    if (ctx.forwarded_headers && (f.name == "x-forwarded-for" || f.name == "x-forwarded-proto" ||
                                  f.name == "x-forwarded-host")) {
      continue; // written below, once
    }
    if (f.name == "via" && ctx.via) continue;
    if (f.name == "early-data" && ctx.early) continue; // written below, as "1"
    if (f.name == "cookie") {
      // HTTP/2 and HTTP/3 clients may split it into crumbs; HTTP/1.1 has
      // one line (RFC 9113 8.2.3, RFC 9114 4.2.1). Written at the first.
      if (!cookie_written) {
        cookie_written = true;
        std::string v;
        joined(req.headers, "cookie", v, "; ");
        field(out, "cookie", v);
      }
      continue;
    }
    field(out, f.name, f.value);
  }
  if (ctx.forwarded_headers) {
    std::string v;
    if (ctx.trusted) joined(req.headers, "x-forwarded-for", v);
    if (!v.empty()) v += ", ";
    v += ctx.client_ip;
    field(out, "x-forwarded-for", v);
    const std::string *p = ctx.trusted ? req.find("x-forwarded-proto") : nullptr;
    field(out, "x-forwarded-proto", p ? std::string_view(*p) : ctx.proto);
    const std::string *h = ctx.trusted ? req.find("x-forwarded-host") : nullptr;
    if (h) field(out, "x-forwarded-host", *h);
    else if (host && !host->empty()) field(out, "x-forwarded-host", *host);
  }
  // The upstream may then answer 425 to make the client retry after its
  // handshake. Always "1" in early data, whatever the client sent (RFC 8470
  // 5.1); outside it, a client's own (an earlier hop's) passed above.
  if (ctx.early) field(out, "early-data", "1");
  if (ctx.via) {
    std::string v;
    joined(req.headers, "via", v);
    if (!v.empty()) v += ", ";
    v += "1.1 xdpq";
    field(out, "via", v);
  }
  switch (ctx.framing) {
  case RequestFraming::length:
    field(out, "content-length", std::to_string(ctx.content_length));
    break;
  case RequestFraming::chunked: field(out, "transfer-encoding", "chunked"); break;
  case RequestFraming::tunnel:
    // The one hop-by-hop pair that crosses: the switch the client asked
    // for, asked of the upstream (RFC 9110 7.8).
    field(out, "connection", "upgrade");
    field(out, "upgrade", ctx.upgrade);
    break;
  case RequestFraming::none:
    // A method that defines a body still says it has none.
    if (method_defines_body(req.method)) {
      field(out, "content-length", "0");
    }
    break;
  }
  out += "\r\n";
  return true;
}

void copy_response_fields(const HeaderList &upstream, HeaderList &out) {
  std::string connection;
  joined(upstream, "connection", connection);
  for (const auto &f : upstream) {
    if (f.name == "content-length" || f.name == "server" || is_hop_by_hop(f.name, connection)) {
      continue;
    }
    if (f.name.find_first_of(std::string_view("\r\n\0:", 4)) != std::string::npos) continue;
    out.add(f.name, f.value);
  }
}

bool has_dot_segment(std::string_view path) {
  // One segment at a time: its dots counted, anything else ends the hope.
  size_t dots = 0;
  bool only_dots = true;
  for (size_t i = 0; i <= path.size();) {
    char c = i < path.size() ? path[i] : '/';
    size_t len = 1;
    if (c == '%' && i + 2 < path.size()) {
      const char hi = path[i + 1], lo = static_cast<char>(path[i + 2] | 0x20);
      if (hi == '2' && lo == 'e') {
        c = '.';
        len = 3;
      } else if ((hi == '2' && lo == 'f') || (hi == '5' && lo == 'c')) {
        c = '/';
        len = 3;
      }
    }
    // ';' too: Tomcat and Spring read "/..;/" as "/../" (path parameters).
    if (c == '/' || c == '\\' || c == ';') {
      if (only_dots && (dots == 1 || dots == 2)) return true;
      dots = 0;
      only_dots = true;
    } else if (c == '.') {
      dots += 1;
    } else {
      only_dots = false;
    }
    i += len;
  }
  return false;
}

} // namespace xdpq::http
