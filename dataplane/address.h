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

struct AddressHash {
  size_t operator()(const Address &a) const;
};

} // namespace xdpq::dataplane
