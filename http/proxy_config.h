#pragma once
// What the reverse proxy is told at start-up: path prefixes, the upstreams
// each one goes to (http://HOST:PORT or unix:/path, plain HTTP/1.1), the
// timeouts and pool sizes, and which clients are trusted to bring their
// own forwarding headers. Immutable once built; every worker's Proxy reads
// the same one.

#include "dataplane/address.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq::http {

class ProxyConfigError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct UpstreamAddress {
  std::string text;           // as configured, for counters and logs
  dataplane::Address inet;    // http://HOST:PORT (resolved at start-up)
  std::string unix_path;      // unix:/path; empty for TCP
  std::string host_header;    // HOST:PORT, or "localhost" for a unix socket
};

// Parses http://HOST:PORT (HOST an address or a name resolved now;
// [v6] in brackets; PORT defaults to 80) or unix:/absolute/path.
// Throws ProxyConfigError with the reason.
UpstreamAddress parse_upstream_url(std::string_view url);

// An IPv4 or IPv6 network, "10.0.0.0/8", "::1/128" or a bare address.
struct Cidr {
  int family = 0;
  uint8_t bytes[16] = {};
  unsigned prefix = 0;
  bool contains(const dataplane::Address &a) const;
};
// Throws ProxyConfigError.
Cidr parse_cidr(std::string_view text);

enum class Balancing { round_robin, least_outstanding };

// What each route may set for itself (`--proxy PREFIX=URL;KEY=VALUE`, or
// keys of a [[proxy]] table); what it leaves unset comes from the
// --proxy-* defaults in ProxyConfig.
struct RouteSettings {
  Balancing balancing = Balancing::round_robin;
  uint64_t connect_timeout_ns = 5'000'000'000ull; // past two lost SYNs (1 s, then 2 s)
  uint64_t response_timeout_ns = 30'000'000'000ull; // to the response head, then silence mid-body
  uint64_t idle_timeout_ns = 30'000'000'000ull;     // a pooled connection unused
  size_t max_idle_per_upstream = 32;                // per worker
  size_t max_conns_per_upstream = 512;              // per worker
  // Requests that wait, per route and worker, for a connection while every
  // upstream of the route is at max_conns_per_upstream (0: none wait, 503
  // at once), and how long one may wait before its 503.
  size_t max_queue = 4096;
  uint64_t queue_timeout_ns = 5'000'000'000ull;
};

struct ProxyRoute {
  std::string prefix; // matched against the path; passed on unchanged
  std::vector<UpstreamAddress> upstreams;
  RouteSettings own;  // the fields named in own_set; the rest unused
  unsigned own_set = 0;
};

// The RouteSettings it derives from are the defaults of every route.
struct ProxyConfig : RouteSettings {
  std::vector<ProxyRoute> routes;
  uint64_t down_backoff_ns = 2'000'000'000ull;      // after a failed connect (doubles, to 32x)
  // A client that takes no byte of a proxied response for this long,
  // while the exchange holds its window full, has the stream reset and the
  // upstream connection closed (an upstream connection is no client's to
  // keep by not reading).
  uint64_t client_timeout_ns = 60'000'000'000ull;
  // A tunnel (WebSocket) with no byte either way for this long is closed.
  uint64_t tunnel_timeout_ns = 3600'000'000'000ull;
  std::string health_check_path;                    // empty: no active health checks
  uint64_t health_interval_ns = 2'000'000'000ull;   // between a probe's starts, per worker
  uint64_t health_timeout_ns = 1'000'000'000ull;    // a probe without a head by then fails
  std::vector<Cidr> trusted;                        // may send X-Forwarded-*
  bool forwarded_headers = true;                    // add X-Forwarded-For/-Proto/-Host
  bool via = false;                                 // add "via: 1.1 xdpq"

  // Parses "PREFIX=URL[,URL...][;KEY=VALUE...]" and adds the route. KEY is
  // one of balancing, connect_timeout_ms, timeout_ms, idle_timeout_ms,
  // max_idle, max_connections, queue, queue_timeout_ms. Throws
  // ProxyConfigError.
  void add_route(std::string_view spec);
  // A route's settings: its own where it set them, the defaults above
  // for the rest.
  RouteSettings settings(const ProxyRoute &r) const;
  // Routes, upstreams and settings as one line: equal texts, equal
  // configurations (a reload compares them).
  std::string describe() const;
  // The route whose prefix is the longest one path starts with, or null.
  const ProxyRoute *match(std::string_view path) const;
};

} // namespace xdpq::http
