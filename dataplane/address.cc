#include "dataplane/address.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>
#include <functional>

namespace xdpq::dataplane {

uint16_t Address::port() const {
  if (family() == AF_INET) return ntohs(u.in.sin_port);
  if (family() == AF_INET6) return ntohs(u.in6.sin6_port);
  return 0;
}

void Address::set_port(uint16_t port) {
  if (family() == AF_INET) u.in.sin_port = htons(port);
  if (family() == AF_INET6) u.in6.sin6_port = htons(port);
}

bool Address::is_unspecified() const {
  if (family() == AF_INET) return u.in.sin_addr.s_addr == INADDR_ANY;
  if (family() == AF_INET6) return IN6_IS_ADDR_UNSPECIFIED(&u.in6.sin6_addr);
  return true;
}

std::string Address::to_string() const {
  // Built with append: GCC 12 at -O3 warns falsely (-Wrestrict) on chains of
  // std::string operator+.
  char buf[INET6_ADDRSTRLEN];
  std::string s;
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &u.in.sin_addr, buf, sizeof(buf));
    s.append(buf);
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &u.in6.sin6_addr, buf, sizeof(buf));
    s.append("[").append(buf).append("]");
  } else {
    return "(none)";
  }
  s.append(":").append(std::to_string(port()));
  return s;
}

bool Address::operator==(const Address &o) const {
  if (family() != o.family()) return false;
  if (family() == AF_INET) {
    return u.in.sin_port == o.u.in.sin_port && u.in.sin_addr.s_addr == o.u.in.sin_addr.s_addr;
  }
  if (family() == AF_INET6) {
    return u.in6.sin6_port == o.u.in6.sin6_port &&
           std::memcmp(&u.in6.sin6_addr, &o.u.in6.sin6_addr, sizeof(in6_addr)) == 0;
  }
  return true;
}

Address Address::from(const sockaddr *sa, socklen_t len) {
  Address a;
  if (len > sizeof(a.u)) len = sizeof(a.u);
  std::memcpy(&a.u, sa, len);
  a.len = len;
  return a;
}

std::optional<Address> parse_address(std::string_view text, std::string *why) {
  auto fail = [&](const char *reason) -> std::optional<Address> {
    if (why) *why = reason;
    return std::nullopt;
  };
  std::string host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) return fail("missing ']' after IPv6 address");
    host.assign(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      return fail("expected ':PORT' after ']'");
    }
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return fail("expected ADDR:PORT");
    host.assign(text.substr(0, colon));
    if (host.find(':') != std::string::npos) {
      return fail("IPv6 addresses need brackets: [ADDR]:PORT");
    }
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return fail("port must be a number from 0 to 65535");
  }
  Address a;
  if (inet_pton(AF_INET, host.c_str(), &a.u.in.sin_addr) == 1) {
    a.u.in.sin_family = AF_INET;
    a.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &a.u.in6.sin6_addr) == 1) {
    a.u.in6.sin6_family = AF_INET6;
    a.len = sizeof(sockaddr_in6);
  } else {
    return fail("not a numeric IPv4 or IPv6 address");
  }
  a.set_port(static_cast<uint16_t>(port));
  return a;
}

size_t AddressHash::operator()(const Address &a) const {
  size_t h = std::hash<uint32_t>{}(static_cast<uint32_t>(a.family()) << 16 | a.port());
  if (a.family() == AF_INET) {
    h ^= std::hash<uint32_t>{}(a.u.in.sin_addr.s_addr) * 31;
  } else if (a.family() == AF_INET6) {
    const auto *w = reinterpret_cast<const uint64_t *>(&a.u.in6.sin6_addr);
    h ^= std::hash<uint64_t>{}(w[0]) * 31 ^ std::hash<uint64_t>{}(w[1]) * 131;
  }
  return h;
}

} // namespace xdpq::dataplane
