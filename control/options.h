#pragma once
// xdpqd's command line. Parsing never exits: errors come back as
// UsageError (exit status 2 in main) naming the flag and what was expected.

#include "dataplane/address.h"
#include "http/message.h"
#include "http/proxy_config.h"
#include "quic/endpoint.h"

#include <initializer_list>
#include <map>
#include <optional>
#include <string_view>
#include <stdexcept>
#include <string>
#include <vector>

namespace xdpq::control {

class UsageError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct Options {
  // Where a flag's value came from when a configuration file set it
  // ("FILE:LINE: section.key"), for errors that involve several settings.
  std::map<std::string, std::string> flag_origins;
  // "FILE:LINE: section.key: " for the first of flags the file gave, to
  // lead an error about them; empty when none came from the file.
  std::string at(std::initializer_list<const char *> flags) const;
  // The flags the configuration file gave, in its order (config_file_flags):
  // a reload compares the file's new ones with these.
  std::vector<std::string> file_flags;
  std::vector<dataplane::Address> listen; // default: 0.0.0.0:4433 and [::]:4433
  std::string dataplane = "socket";
  // AF_XDP dataplane.
  std::string interface;
  std::vector<int> queues;         // default: queue 0
  std::string xdp_mode = "auto";   // native, generic, auto
  std::string zerocopy = "auto";   // auto, on, off
  bool busy_poll = false;
  bool xdp_replace = false;
  // AF_XDP hybrid TX: trains this long leave via kernel UDP GSO; 0 off;
  // -1 (auto): 4 in copy mode, 0 in zero-copy mode.
  int kernel_trains = -1;
  uint64_t spin_us = 0; // workers poll without sleeping this long after work
  std::string cert_file;
  std::string key_file;
  std::string docroot; // empty: the embedded page
  bool serve_dotfiles = false;
  bool test_routes = true; // /echo and /bytes/N
  uint64_t file_cache_entries = 4096;
  uint64_t file_cache_bytes = 64u << 20;
  uint64_t file_cache_max_file = 64u << 10;
  uint64_t file_cache_revalidate_ms = 1000;
  std::string secrets_file; // empty: secrets live in memory only
  // QUIC-LB connection IDs (draft-ietf-quic-load-balancers); off while
  // quic_lb_server_id is empty.
  std::vector<uint8_t> quic_lb_server_id;
  int quic_lb_config_id = -1;     // -1: 0
  size_t quic_lb_nonce_length = 0; // 0: 16 minus the server ID's length, at least 8
  std::string quic_lb_mode;       // encrypted (default) or plaintext
  int workers = 0;          // 0: one per CPU in cpus (or per available CPU)
  std::vector<int> cpus;    // pin worker i to cpus[i % size]
  quic::RetryMode retry = quic::RetryMode::automatic;
  size_t retry_threshold = 128;
  uint64_t retry_rate = 5000;          // new handshakes/s per worker that turn auto Retry on
  uint64_t per_source_connections = 256; // QUIC and TCP, each, per worker; 0: no cap
  uint64_t per_source_rate = 5000;     // unvalidated new connections/s per source per worker
                                       // before Retry; 0: no cap
  uint64_t per_source_validated_rate = 5000; // proven sources (Retry token, NEW_TOKEN, TCP)
  std::string log_level = "info";
  std::string access_log; // path; empty: none
  std::vector<http::Header> response_headers; // added to every response lacking them
  uint64_t idle_timeout_ms = 30000;
  uint64_t handshake_timeout_ms = 10000;
  uint64_t header_timeout_ms = 10000; // an HTTP/3 request's header section
  uint64_t max_streams = 100;
  uint64_t qpack_table_capacity = 0; // QPACK dynamic table offered to clients (bytes)
  uint64_t max_header_size = 16384;
  size_t max_header_fields = 128;
  size_t max_connections = 65536;
  uint64_t quic_memory_per_worker = 1ull << 30; // ngtcp2's and nghttp3's buffers, all connections (0: none)
  uint64_t max_request_body = 16u << 20;      // per request: 413
  uint64_t max_body_per_connection = 16u << 20; // held at once per connection
  uint64_t max_body_per_worker = 256u << 20;  // held at once per worker
  bool early_data = true;
  // TCP side: HTTP/2 and HTTP/1.1 over TLS on the same addresses and ports.
  bool tcp = true;
  std::vector<dataplane::Address> h2c_listen; // cleartext, for benchmarks only
  size_t tcp_max_connections = 10000;
  uint64_t tcp_handshake_timeout_ms = 10000;
  uint64_t tcp_header_timeout_ms = 10000;
  uint64_t tcp_idle_timeout_ms = 60000;
  uint64_t tcp_write_timeout_ms = 30000;
  // Reverse proxy: routes, upstreams, timeouts (docs/proxy.md).
  http::ProxyConfig proxy;
  std::string config_file;
  std::string control_socket; // empty: the default path
  std::optional<dataplane::Address> metrics;
  uint64_t drain_timeout_ms = 10000;
  bool listen_set = false;
  bool print_default_config = false;
  bool echo = false; // benchmark: UDP echo instead of QUIC
  bool help = false;
  bool version = false;
  bool check_config = false;
};

// Parses argv (argv[0] is skipped). Throws UsageError.
Options parse_options(int argc, const char *const *argv);

const char *usage_text();

// The opposite of an on/off switch ("--tcp" for "--no-tcp" and back), or
// empty for any other flag.
std::string_view opposite_switch(std::string_view flag);

} // namespace xdpq::control
