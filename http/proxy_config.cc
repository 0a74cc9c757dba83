#include "http/proxy_config.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/un.h>

#include <charconv>
#include <cstring>

namespace xdpq::http {

UpstreamAddress parse_upstream_url(std::string_view url) {
  UpstreamAddress u;
  u.text.assign(url);
  auto bad = [&](const std::string &why) {
    return ProxyConfigError("upstream '" + std::string(url) + "': " + why);
  };
  if (url.starts_with("unix:")) {
    auto path = url.substr(5);
    if (path.empty() || path.front() != '/') throw bad("expected unix:/absolute/path");
    if (path.size() >= sizeof(sockaddr_un::sun_path)) throw bad("socket path too long");
    u.unix_path.assign(path);
    u.host_header = "localhost";
    return u;
  }
  if (!url.starts_with("http://")) {
    throw bad(url.starts_with("https://")
                  ? "https upstreams are not supported (plain http:// or unix:)"
                  : "expected http://HOST:PORT or unix:/path");
  }
  auto rest = url.substr(7);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos || rest.find('?') != std::string_view::npos) {
    throw bad("no path after HOST:PORT (the client's path is passed on unchanged)");
  }
  if (rest.empty()) throw bad("missing host");
  std::string host;
  std::string_view port_text = "80";
  if (rest.front() == '[') {
    auto close = rest.find(']');
    if (close == std::string_view::npos) throw bad("missing ']' after IPv6 address");
    host.assign(rest.substr(1, close - 1));
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw bad("expected ':PORT' after ']'");
      port_text = rest.substr(close + 2);
    }
  } else {
    auto colon = rest.rfind(':');
    if (colon != std::string_view::npos && rest.find(':') != colon) {
      // "::1:8000": which colon starts the port? (And the Host field
      // written from it would be malformed.)
      throw bad("an IPv6 address goes in brackets: http://[ADDRESS]:PORT");
    }
    if (colon != std::string_view::npos) {
      host.assign(rest.substr(0, colon));
      port_text = rest.substr(colon + 1);
    } else {
      host.assign(rest);
    }
  }
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() ||
      port == 0 || port > 65535) {
    throw bad("port must be a number from 1 to 65535");
  }
  if (host.empty()) throw bad("missing host");
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo *res = nullptr;
  auto service = std::to_string(port);
  int rv = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rv != 0 || !res) throw bad(std::string("cannot resolve host: ") + gai_strerror(rv));
  u.inet = dataplane::Address::from(res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  u.host_header = std::string(rest);
  return u;
}

Cidr parse_cidr(std::string_view text) {
  Cidr c;
  auto slash = text.find('/');
  std::string addr(text.substr(0, slash));
  if (inet_pton(AF_INET, addr.c_str(), c.bytes) == 1) {
    c.family = AF_INET;
    c.prefix = 32;
  } else if (inet_pton(AF_INET6, addr.c_str(), c.bytes) == 1) {
    c.family = AF_INET6;
    c.prefix = 128;
  } else {
    throw ProxyConfigError("'" + std::string(text) + "': expected ADDRESS[/PREFIX]");
  }
  if (slash != std::string_view::npos) {
    auto p = text.substr(slash + 1);
    unsigned n = 0;
    auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), n);
    if (p.empty() || ec != std::errc{} || end != p.data() + p.size() || n > c.prefix) {
      throw ProxyConfigError("'" + std::string(text) + "': prefix length out of range");
    }
    c.prefix = n;
  }
  return c;
}

bool Cidr::contains(const dataplane::Address &a) const {
  const uint8_t *b = nullptr;
  uint8_t mapped[4];
  if (a.family() == AF_INET && family == AF_INET) {
    b = reinterpret_cast<const uint8_t *>(&a.u.in.sin_addr);
  } else if (a.family() == AF_INET6 && family == AF_INET6) {
    b = a.u.in6.sin6_addr.s6_addr;
  } else if (a.family() == AF_INET6 && family == AF_INET &&
             IN6_IS_ADDR_V4MAPPED(&a.u.in6.sin6_addr)) {
    std::memcpy(mapped, a.u.in6.sin6_addr.s6_addr + 12, 4);
    b = mapped;
  } else {
    return false;
  }
  unsigned full = prefix / 8, rest = prefix % 8;
  if (std::memcmp(b, bytes, full) != 0) return false;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (b[full] & mask) == (bytes[full] & mask);
}

namespace {

enum RouteKey : unsigned {
  own_balancing = 1,
  own_connect_timeout = 2,
  own_timeout = 4,
  own_idle_timeout = 8,
  own_max_idle = 16,
  own_max_connections = 32,
  own_queue = 64,
  own_queue_timeout = 128,
};

uint64_t route_number(std::string_view spec, std::string_view key, std::string_view v,
                      uint64_t min, uint64_t max) {
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc{} || end != v.data() + v.size() || n < min || n > max) {
    throw ProxyConfigError("'" + std::string(spec) + "': " + std::string(key) +
                           ": expected a number from " + std::to_string(min) + " to " +
                           std::to_string(max) + ", got '" + std::string(v) + "'");
  }
  return n;
}

// One ";KEY=VALUE" of a route. The ranges are the --proxy-* flags'.
void set_route_option(ProxyRoute &r, std::string_view spec, std::string_view option) {
  auto eq = option.find('=');
  auto key = option.substr(0, eq);
  if (eq == std::string_view::npos) {
    throw ProxyConfigError("'" + std::string(spec) + "': expected KEY=VALUE after ';', got '" +
                           std::string(option) + "'");
  }
  auto v = option.substr(eq + 1);
  constexpr uint64_t MS = 1'000'000, HOUR_MS = 3'600'000;
  unsigned bit;
  if (key == "balancing") {
    bit = own_balancing;
    if (v == "round-robin") r.own.balancing = Balancing::round_robin;
    else if (v == "least-outstanding") r.own.balancing = Balancing::least_outstanding;
    else {
      throw ProxyConfigError("'" + std::string(spec) +
                             "': balancing: expected round-robin or least-outstanding, got '" +
                             std::string(v) + "'");
    }
  } else if (key == "connect_timeout_ms") {
    bit = own_connect_timeout;
    r.own.connect_timeout_ns = route_number(spec, key, v, 1, HOUR_MS) * MS;
  } else if (key == "timeout_ms") {
    bit = own_timeout;
    r.own.response_timeout_ns = route_number(spec, key, v, 1, HOUR_MS) * MS;
  } else if (key == "idle_timeout_ms") {
    bit = own_idle_timeout;
    r.own.idle_timeout_ns = route_number(spec, key, v, 1, HOUR_MS) * MS;
  } else if (key == "max_idle") {
    bit = own_max_idle;
    r.own.max_idle_per_upstream = route_number(spec, key, v, 0, 1u << 16);
  } else if (key == "max_connections") {
    bit = own_max_connections;
    r.own.max_conns_per_upstream = route_number(spec, key, v, 1, 1u << 20);
  } else if (key == "queue") {
    bit = own_queue;
    r.own.max_queue = route_number(spec, key, v, 0, 1u << 20);
  } else if (key == "queue_timeout_ms") {
    bit = own_queue_timeout;
    r.own.queue_timeout_ns = route_number(spec, key, v, 1, HOUR_MS) * MS;
  } else {
    throw ProxyConfigError("'" + std::string(spec) + "': unknown route setting '" +
                           std::string(key) +
                           "'; a route takes balancing, connect_timeout_ms, timeout_ms, "
                           "idle_timeout_ms, max_idle, max_connections, queue, "
                           "queue_timeout_ms");
  }
  if (r.own_set & bit) {
    throw ProxyConfigError("'" + std::string(spec) + "': " + std::string(key) + " given twice");
  }
  r.own_set |= bit;
}

} // namespace

void ProxyConfig::add_route(std::string_view spec) {
  auto eq = spec.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw ProxyConfigError("'" + std::string(spec) + "': expected PREFIX=URL[,URL...]");
  }
  ProxyRoute r;
  r.prefix.assign(spec.substr(0, eq));
  if (r.prefix.front() != '/') {
    throw ProxyConfigError("'" + std::string(spec) + "': the prefix must start with '/'");
  }
  if (r.prefix.find_first_of("?#") != std::string::npos) {
    // Matched against the path without its query: it would never match.
    throw ProxyConfigError("'" + std::string(spec) + "': the prefix is a path, without '?' or '#'");
  }
  auto rest = spec.substr(eq + 1);
  auto semi = rest.find(';');
  auto urls = rest.substr(0, semi);
  if (!urls.empty() && urls.back() == ',') {
    throw ProxyConfigError("'" + std::string(spec) + "': empty upstream URL");
  }
  while (!urls.empty()) {
    auto comma = urls.find(',');
    auto one = urls.substr(0, comma);
    if (one.empty()) throw ProxyConfigError("'" + std::string(spec) + "': empty upstream URL");
    r.upstreams.push_back(parse_upstream_url(one));
    urls = comma == std::string_view::npos ? std::string_view{} : urls.substr(comma + 1);
  }
  if (r.upstreams.empty()) {
    throw ProxyConfigError("'" + std::string(spec) + "': no upstream URL after '='");
  }
  while (semi != std::string_view::npos) {
    rest = rest.substr(semi + 1);
    semi = rest.find(';');
    set_route_option(r, spec, rest.substr(0, semi));
  }
  for (auto &existing : routes) {
    if (existing.prefix == r.prefix) {
      throw ProxyConfigError("prefix '" + r.prefix + "' is given twice");
    }
  }
  routes.push_back(std::move(r));
}

RouteSettings ProxyConfig::settings(const ProxyRoute &r) const {
  RouteSettings s = *this;
  if (r.own_set & own_balancing) s.balancing = r.own.balancing;
  if (r.own_set & own_connect_timeout) s.connect_timeout_ns = r.own.connect_timeout_ns;
  if (r.own_set & own_timeout) s.response_timeout_ns = r.own.response_timeout_ns;
  if (r.own_set & own_idle_timeout) s.idle_timeout_ns = r.own.idle_timeout_ns;
  if (r.own_set & own_max_idle) s.max_idle_per_upstream = r.own.max_idle_per_upstream;
  if (r.own_set & own_max_connections) s.max_conns_per_upstream = r.own.max_conns_per_upstream;
  if (r.own_set & own_queue) s.max_queue = r.own.max_queue;
  if (r.own_set & own_queue_timeout) s.queue_timeout_ns = r.own.queue_timeout_ns;
  return s;
}

std::string ProxyConfig::describe() const {
  std::string d;
  for (const auto &r : routes) {
    RouteSettings s = settings(r);
    d += r.prefix + "=";
    for (size_t i = 0; i < r.upstreams.size(); ++i) {
      // The resolved address too: a name that now resolves elsewhere is a change.
      d += (i ? "," : "") + r.upstreams[i].text + "@" +
           (r.upstreams[i].unix_path.empty() ? r.upstreams[i].inet.to_string() : "unix");
    }
    d += ";balancing=" +
         std::string(s.balancing == Balancing::round_robin ? "round-robin" : "least-outstanding") +
         ";connect_timeout_ns=" + std::to_string(s.connect_timeout_ns) +
         ";timeout_ns=" + std::to_string(s.response_timeout_ns) +
         ";idle_timeout_ns=" + std::to_string(s.idle_timeout_ns) +
         ";max_idle=" + std::to_string(s.max_idle_per_upstream) +
         ";max_connections=" + std::to_string(s.max_conns_per_upstream) +
         ";queue=" + std::to_string(s.max_queue) +
         ";queue_timeout_ns=" + std::to_string(s.queue_timeout_ns) + " ";
  }
  for (const auto &c : trusted) {
    char text[INET6_ADDRSTRLEN] = "";
    inet_ntop(c.family, c.bytes, text, sizeof(text));
    d += std::string("trusted=") + text + "/" + std::to_string(c.prefix) + " ";
  }
  d += "client_timeout_ns=" + std::to_string(client_timeout_ns) + " ";
  d += "tunnel_timeout_ns=" + std::to_string(tunnel_timeout_ns) + " ";
  d += "down_backoff_ns=" + std::to_string(down_backoff_ns) +
       (forwarded_headers ? " forwarded" : "") + (via ? " via" : "");
  if (!health_check_path.empty()) {
    d += " health_check=" + health_check_path + ";interval_ns=" +
         std::to_string(health_interval_ns) + ";timeout_ns=" + std::to_string(health_timeout_ns);
  }
  return d;
}

const ProxyRoute *ProxyConfig::match(std::string_view path) const {
  const ProxyRoute *best = nullptr;
  for (const auto &r : routes) {
    if (path.starts_with(r.prefix) && (!best || r.prefix.size() > best->prefix.size())) best = &r;
  }
  return best;
}

} // namespace xdpq::http
