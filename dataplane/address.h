#pragma once
// Socket addresses (IPv4 and IPv6) as a value type, and their text form.

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xdpq::dataplane {

struct Address {
  union {
    sockaddr sa;
    sockaddr_in in;
    sockaddr_in6 in6;
  } u{};
  socklen_t len = 0;

  int family() const { return u.sa.sa_family; }
  uint16_t port() const;
  void set_port(uint16_t port);
  bool is_unspecified() const; // 0.0.0.0 or ::
  std::string to_string() const; // "1.2.3.4:443" or "[::1]:443"
  bool operator==(const Address &o) const;

  static Address from(const sockaddr *sa, socklen_t len);
};

// Parses "ADDR:PORT" with IPv6 in brackets ("[::1]:4433", "0.0.0.0:443").
// Returns nullopt with a reason in *why on failure.
std::optional<Address> parse_address(std::string_view text, std::string *why = nullptr);

// IPv6 address bytes (16) that never arrive from a network: the loopback
// ::1, and IPv4-mapped addresses (::ffff:0:0/96, RFC 4291 2.5.5.2), with
// which a packet could claim any IPv4 address, loopback and multicast
// included. The kernel drops both.
inline bool ipv6_loopback(const uint8_t *a) {
  for (int i = 0; i < 15; ++i)
    if (a[i] != 0) return false;
  return a[15] == 1;
}
inline bool ipv6_mapped(const uint8_t *a) {
  for (int i = 0; i < 10; ++i)
    if (a[i] != 0) return false;
  return a[10] == 0xff && a[11] == 0xff;
}

struct AddressHash {
  size_t operator()(const Address &a) const;
};

} // namespace xdpq::dataplane
