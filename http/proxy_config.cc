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
  auto urls = spec.substr(eq + 1);
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
  for (auto &existing : routes) {
    if (existing.prefix == r.prefix) {
      throw ProxyConfigError("prefix '" + r.prefix + "' is given twice");
    }
  }
  routes.push_back(std::move(r));
}

const ProxyRoute *ProxyConfig::match(std::string_view path) const {
  const ProxyRoute *best = nullptr;
  for (const auto &r : routes) {
    if (path.starts_with(r.prefix) && (!best || r.prefix.size() > best->prefix.size())) best = &r;
  }
  return best;
}

} // namespace xdpq::http
