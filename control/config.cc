#include "control/config.h"

#include <toml.hpp>

#include <fstream>
#include <sstream>

namespace xdpq::control {

namespace {

enum class Kind { string, integer, boolean, strings, flag_if_true, flag_if_false };

struct Key {
  const char *section;
  const char *name;
  Kind kind;
  const char *flag;
  const char *expect; // for messages
};

// One row per key: section, name, type, the flag it becomes.
constexpr Key KEYS[] = {
    {"server", "listen", Kind::strings, "--listen", "a list of \"ADDR:PORT\" strings"},
    {"server", "workers", Kind::integer, "--workers", "an integer"},
    {"server", "cpus", Kind::string, "--cpus", "a CPU list string like \"0-3\""},
    {"server", "log_level", Kind::string, "--log-level",
     "\"error\", \"warn\", \"info\" or \"debug\""},
    {"server", "control_socket", Kind::string, "--control-socket", "a path string"},
    {"server", "metrics", Kind::string, "--metrics", "an \"ADDR:PORT\" string"},
    {"server", "drain_timeout_ms", Kind::integer, "--drain-timeout", "milliseconds"},
    {"dataplane", "mode", Kind::string, "--dataplane", "\"socket\" or \"afxdp\""},
    {"dataplane", "interface", Kind::string, "--interface", "an interface name"},
    {"dataplane", "queues", Kind::string, "--queues", "a queue list string like \"0-1\""},
    {"dataplane", "xdp_mode", Kind::string, "--xdp-mode", "\"native\", \"generic\" or \"auto\""},
    {"dataplane", "zerocopy", Kind::string, "--zerocopy", "\"auto\", \"on\" or \"off\""},
    {"dataplane", "busy_poll", Kind::flag_if_true, "--busy-poll", "true or false"},
    {"dataplane", "xdp_replace", Kind::flag_if_true, "--xdp-replace", "true or false"},
    {"tls", "cert", Kind::string, "--cert", "a path string"},
    {"tls", "key", Kind::string, "--key", "a path string"},
    {"tls", "secrets", Kind::string, "--secrets", "a path string"},
    {"http", "docroot", Kind::string, "--docroot", "a directory path string"},
    {"http", "serve_dotfiles", Kind::flag_if_true, "--serve-dotfiles", "true or false"},
    {"http", "file_cache_entries", Kind::integer, "--file-cache-entries", "an integer"},
    {"http", "file_cache_bytes", Kind::integer, "--file-cache-bytes", "bytes"},
    {"http", "file_cache_max_file", Kind::integer, "--file-cache-max-file", "bytes"},
    {"http", "file_cache_revalidate_ms", Kind::integer, "--file-cache-revalidate-ms",
     "milliseconds"},
    {"http", "max_header_size", Kind::integer, "--max-header-size", "bytes"},
    {"http", "max_header_fields", Kind::integer, "--max-header-fields", "an integer"},
    {"http", "max_request_body", Kind::integer, "--max-request-body", "bytes"},
    {"http", "max_body_per_connection", Kind::integer, "--max-body-per-connection", "bytes"},
    {"http", "max_body_per_worker", Kind::integer, "--max-body-per-worker", "bytes"},
    {"quic", "retry", Kind::string, "--retry", "\"off\", \"on\" or \"auto\""},
    {"quic", "retry_threshold", Kind::integer, "--retry-threshold", "an integer"},
    {"quic", "retry_rate", Kind::integer, "--retry-rate", "handshakes per second"},
    {"server", "per_source_connections", Kind::integer, "--per-source-connections", "an integer"},
    {"server", "per_source_rate", Kind::integer, "--per-source-rate", "connections per second"},
    {"quic", "idle_timeout_ms", Kind::integer, "--idle-timeout", "milliseconds"},
    {"quic", "max_streams", Kind::integer, "--max-streams", "an integer"},
    {"quic", "max_connections", Kind::integer, "--max-connections", "an integer"},
    {"quic", "early_data", Kind::flag_if_false, "--no-early-data", "true or false"},
    {"tcp", "enabled", Kind::flag_if_false, "--no-tcp", "true or false"},
    {"tcp", "h2c_listen", Kind::strings, "--h2c-listen", "a list of \"ADDR:PORT\" strings"},
    {"tcp", "max_connections", Kind::integer, "--tcp-max-connections", "an integer"},
    {"tcp", "handshake_timeout_ms", Kind::integer, "--tcp-handshake-timeout", "milliseconds"},
    {"tcp", "header_timeout_ms", Kind::integer, "--tcp-header-timeout", "milliseconds"},
    {"tcp", "idle_timeout_ms", Kind::integer, "--tcp-idle-timeout", "milliseconds"},
    {"tcp", "write_timeout_ms", Kind::integer, "--tcp-write-timeout", "milliseconds"},
};

std::string where(const std::string &path, const toml::value &v) {
  auto loc = v.location();
  return path + ":" + std::to_string(loc.line());
}

[[noreturn]] void fail(const std::string &path, const toml::value &v, const std::string &key,
                       const std::string &what) {
  throw UsageError(where(path, v) + ": " + key + ": " + what);
}

const char *type_name(const toml::value &v) {
  switch (v.type()) {
  case toml::value_t::string: return "a string";
  case toml::value_t::integer: return "an integer";
  case toml::value_t::boolean: return "a boolean";
  case toml::value_t::floating: return "a float";
  case toml::value_t::array: return "an array";
  case toml::value_t::table: return "a table";
  default: return "a date or time";
  }
}

} // namespace

std::vector<std::string> config_file_flags(const std::string &path) {
  {
    std::ifstream probe(path);
    if (!probe) throw UsageError("--config " + path + ": cannot read: " + std::strerror(errno));
  }
  toml::value root;
  try {
    root = toml::parse(path);
  } catch (const toml::syntax_error &e) {
    // toml11 already names the file, the line and the column.
    throw UsageError(std::string("--config: syntax error:\n") + e.what());
  } catch (const std::exception &e) {
    throw UsageError("--config " + path + ": " + e.what());
  }
  std::vector<std::string> flags;
  for (const auto &[section, table] : root.as_table()) {
    if (!table.is_table()) {
      fail(path, table, section, "expected a [section] (server, dataplane, tls, http, quic, tcp)");
    }
    bool known_section = false;
    for (const auto &k : KEYS) known_section |= section == k.section;
    if (!known_section) {
      fail(path, table, "[" + section + "]",
           "unknown section; expected server, dataplane, tls, http, quic or tcp");
    }
    for (const auto &[name, v] : table.as_table()) {
      const Key *key = nullptr;
      for (const auto &k : KEYS) {
        if (section == k.section && name == k.name) key = &k;
      }
      std::string full = section + "." + name;
      if (!key) {
        std::string known;
        for (const auto &k : KEYS) {
          if (section == k.section) known += std::string(known.empty() ? "" : ", ") + k.name;
        }
        fail(path, v, full, "unknown key; [" + section + "] takes " + known);
      }
      // Where the flags below came from, for messages from the validator.
      flags.push_back("\x01" + where(path, v) + ": " + full);
      auto expect = [&](bool ok) {
        if (!ok) fail(path, v, full, std::string("expected ") + key->expect + ", got " + type_name(v));
      };
      switch (key->kind) {
      case Kind::string:
        expect(v.is_string());
        flags.push_back(key->flag);
        flags.push_back(v.as_string().str);
        break;
      case Kind::integer:
        expect(v.is_integer());
        if (v.as_integer() < 0) fail(path, v, full, std::string("expected ") + key->expect + " (not negative)");
        flags.push_back(key->flag);
        flags.push_back(std::to_string(v.as_integer()));
        break;
      case Kind::boolean:
        expect(v.is_boolean());
        break;
      case Kind::flag_if_true:
        expect(v.is_boolean());
        if (v.as_boolean()) flags.push_back(key->flag);
        break;
      case Kind::flag_if_false:
        expect(v.is_boolean());
        if (!v.as_boolean()) flags.push_back(key->flag);
        break;
      case Kind::strings:
        expect(v.is_array());
        for (const auto &item : v.as_array()) {
          if (!item.is_string()) fail(path, item, full, std::string("expected ") + key->expect);
          flags.push_back(key->flag);
          flags.push_back(item.as_string().str);
        }
        break;
      }
    }
  }
  return flags;
}

const char *default_config_text() {
  return R"(# xdpqd configuration. Every key is optional; shown with its default.
# Command-line flags override the file. Validate with: xdpqd --check-config FILE

[server]
listen = ["0.0.0.0:4433", "[::]:4433"]   # QUIC (UDP) and, unless tcp.enabled = false, TCP
# workers = 2                            # default: one per CPU in cpus, or per CPU
# cpus = "0-1"
log_level = "info"                       # error, warn, info, debug
# control_socket = "/run/xdpq/xdpqd.sock"
# metrics = "127.0.0.1:9464"             # Prometheus text format
drain_timeout_ms = 10000                 # SIGTERM: in-flight requests get this long
per_source_connections = 256             # per IPv4 address or IPv6 /64, per worker; 0: no cap
per_source_rate = 200                    # new connections/s per source, per worker; 0: no cap

[dataplane]
mode = "socket"                          # socket or afxdp
# interface = "eth0"                     # afxdp
# queues = "0"                           # afxdp: one worker per queue
xdp_mode = "auto"                        # native, generic, auto
zerocopy = "auto"                        # auto, on, off
busy_poll = false
xdp_replace = false

[tls]
# cert = "/etc/xdpq/cert.pem"            # without cert/key: a self-signed pair
# key = "/etc/xdpq/key.pem"
# secrets = "/var/lib/xdpq/secrets"      # created 0600 if missing

[http]
# docroot = "/srv/www"                   # default: an embedded page
serve_dotfiles = false                   # names starting with '.' (but .well-known): 404
file_cache_entries = 4096                # open files cached per worker
file_cache_bytes = 67108864              # file contents held in memory per worker
file_cache_max_file = 65536              # larger files are read on demand
file_cache_revalidate_ms = 1000          # a change on disk shows within this
max_header_size = 16384
max_header_fields = 128
max_request_body = 16777216              # 413 over it
max_body_per_connection = 16777216       # bodies held at once; over it: refused
max_body_per_worker = 268435456          # the same for all of a worker's connections

[quic]
retry = "auto"                           # off, on, auto
retry_threshold = 128                    # auto: Retry while this many handshakes are in progress
retry_rate = 1000                        # ... or while new ones arrive faster than this per second
idle_timeout_ms = 30000
max_streams = 100
max_connections = 65536
early_data = true

[tcp]
enabled = true                           # HTTP/2 + HTTP/1.1 over TLS on the listen addresses
h2c_listen = []                          # cleartext, for benchmarks only
max_connections = 10000
handshake_timeout_ms = 10000
header_timeout_ms = 10000
idle_timeout_ms = 60000
write_timeout_ms = 30000
)";
}

} // namespace xdpq::control
