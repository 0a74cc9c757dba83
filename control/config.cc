#include "control/config.h"

// toml++ is compiled into this file alone (it is heavy to compile), from
// its headers rather than against Debian's libtomlplusplus.so, so that the
// sanitizer and fuzzer builds instrument the parser too. Formatters are not
// needed; parse errors arrive as exceptions (configuration is start-up only).
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#define TOML_ENABLE_FORMATTERS 0
#include <toml++/impl/preprocessor.h>
// The parser states what it expects of the next character as
// TOML_ASSERT_ASSUME: assert() without NDEBUG, __builtin_assume() with it
// (clang), and malformed files break those expectations ("[{" does).
// Assuming nothing, it goes on to report the error, as it does in GCC 12
// release builds (no __builtin_assume); the fuzzer checks what follows.
#undef TOML_ASSERT_ASSUME
#define TOML_ASSERT_ASSUME(expr) static_cast<void>(0)
#include <toml++/toml.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
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
    {"server", "access_log", Kind::string, "--access-log", "a path string"},
    {"server", "metrics", Kind::string, "--metrics", "an \"ADDR:PORT\" string"},
    {"server", "drain_timeout_ms", Kind::integer, "--drain-timeout", "milliseconds"},
    {"dataplane", "mode", Kind::string, "--dataplane", "\"socket\" or \"afxdp\""},
    {"dataplane", "interface", Kind::string, "--interface", "an interface name"},
    {"dataplane", "queues", Kind::string, "--queues", "a queue list string like \"0-1\""},
    {"dataplane", "xdp_mode", Kind::string, "--xdp-mode", "\"native\", \"generic\" or \"auto\""},
    {"dataplane", "zerocopy", Kind::string, "--zerocopy", "\"auto\", \"on\" or \"off\""},
    {"dataplane", "busy_poll", Kind::flag_if_true, "--busy-poll", "true or false"},
    {"dataplane", "xdp_replace", Kind::flag_if_true, "--xdp-replace", "true or false"},
    {"dataplane", "kernel_trains", Kind::integer, "--kernel-trains", "an integer (0 to 64)"},
    {"dataplane", "spin_us", Kind::integer, "--spin-us", "microseconds (0 to 1000000)"},
    {"tls", "cert", Kind::string, "--cert", "a path string"},
    {"tls", "key", Kind::string, "--key", "a path string"},
    {"tls", "secrets", Kind::string, "--secrets", "a path string"},
    {"http", "docroot", Kind::string, "--docroot", "a directory path string"},
    {"http", "response_headers", Kind::strings, "--response-header",
     "a list of \"Name: value\" strings"},
    {"http", "serve_dotfiles", Kind::flag_if_true, "--serve-dotfiles", "true or false"},
    {"http", "test_routes", Kind::flag_if_false, "--no-test-routes", "true or false"},
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
    {"server", "per_source_validated_rate", Kind::integer, "--per-source-validated-rate",
     "connections per second"},
    {"quic", "idle_timeout_ms", Kind::integer, "--idle-timeout", "milliseconds"},
    {"quic", "handshake_timeout_ms", Kind::integer, "--handshake-timeout", "milliseconds"},
    {"quic", "header_timeout_ms", Kind::integer, "--header-timeout", "milliseconds"},
    {"quic", "max_streams", Kind::integer, "--max-streams", "an integer"},
    {"quic", "qpack_table_capacity", Kind::integer, "--qpack-table-capacity",
     "bytes (0 to 65536)"},
    {"quic", "max_connections", Kind::integer, "--max-connections", "an integer"},
    {"quic", "memory_per_worker", Kind::integer, "--quic-memory-per-worker", "bytes"},
    {"quic", "early_data", Kind::flag_if_false, "--no-early-data", "true or false"},
    {"quic_lb", "server_id", Kind::string, "--quic-lb-server-id",
     "a hex string of 1 to 11 bytes like \"0a01\""},
    {"quic_lb", "config_id", Kind::integer, "--quic-lb-config-id", "an integer (0 to 6)"},
    {"quic_lb", "nonce_length", Kind::integer, "--quic-lb-nonce-length",
     "an integer (8 to 18)"},
    {"quic_lb", "mode", Kind::string, "--quic-lb-mode", "\"encrypted\" or \"plaintext\""},
    {"tcp", "enabled", Kind::flag_if_false, "--no-tcp", "true or false"},
    {"tcp", "h2c_listen", Kind::strings, "--h2c-listen", "a list of \"ADDR:PORT\" strings"},
    {"tcp", "max_connections", Kind::integer, "--tcp-max-connections", "an integer"},
    {"tcp", "handshake_timeout_ms", Kind::integer, "--tcp-handshake-timeout", "milliseconds"},
    {"tcp", "header_timeout_ms", Kind::integer, "--tcp-header-timeout", "milliseconds"},
    {"tcp", "idle_timeout_ms", Kind::integer, "--tcp-idle-timeout", "milliseconds"},
    {"tcp", "write_timeout_ms", Kind::integer, "--tcp-write-timeout", "milliseconds"},
    {"proxy_defaults", "connect_timeout_ms", Kind::integer, "--proxy-connect-timeout",
     "milliseconds"},
    {"proxy_defaults", "timeout_ms", Kind::integer, "--proxy-timeout", "milliseconds"},
    {"proxy_defaults", "idle_timeout_ms", Kind::integer, "--proxy-idle-timeout", "milliseconds"},
    {"proxy_defaults", "tunnel_timeout_ms", Kind::integer, "--proxy-tunnel-timeout",
     "milliseconds"},
    {"proxy_defaults", "client_timeout_ms", Kind::integer, "--proxy-client-timeout",
     "milliseconds"},
    {"proxy_defaults", "max_idle", Kind::integer, "--proxy-max-idle", "an integer"},
    {"proxy_defaults", "max_connections", Kind::integer, "--proxy-max-connections",
     "an integer"},
    {"proxy_defaults", "queue", Kind::integer, "--proxy-queue", "an integer"},
    {"proxy_defaults", "queue_timeout_ms", Kind::integer, "--proxy-queue-timeout",
     "milliseconds"},
    {"proxy_defaults", "balancing", Kind::string, "--proxy-balancing",
     "\"round-robin\" or \"least-outstanding\""},
    {"proxy_defaults", "trusted", Kind::strings, "--proxy-trusted",
     "a list of \"ADDR/PREFIX\" strings"},
    {"proxy_defaults", "via", Kind::flag_if_true, "--proxy-via", "true or false"},
    {"proxy_defaults", "forwarded_headers", Kind::flag_if_false, "--no-proxy-forwarded-headers",
     "true or false"},
    {"proxy_defaults", "health_check", Kind::string, "--proxy-health-check",
     "a path string starting with '/'"},
    {"proxy_defaults", "health_interval_ms", Kind::integer, "--proxy-health-interval",
     "milliseconds"},
    {"proxy_defaults", "health_timeout_ms", Kind::integer, "--proxy-health-timeout",
     "milliseconds"},
};

// The keys of a [[proxy]] table (one route): prefix and upstreams, and
// what it may set for itself, which become ";KEY=VALUE" in its --proxy.
struct RouteKey {
  const char *name;
  Kind kind;
  const char *expect;
};
constexpr RouteKey ROUTE_KEYS[] = {
    {"prefix", Kind::string, "a path prefix string starting with '/'"},
    {"upstreams", Kind::strings, "a list of \"http://HOST:PORT\" or \"unix:/path\" strings"},
    {"balancing", Kind::string, "\"round-robin\" or \"least-outstanding\""},
    {"connect_timeout_ms", Kind::integer, "milliseconds"},
    {"timeout_ms", Kind::integer, "milliseconds"},
    {"idle_timeout_ms", Kind::integer, "milliseconds"},
    {"max_idle", Kind::integer, "an integer"},
    {"max_connections", Kind::integer, "an integer"},
    {"queue", Kind::integer, "an integer"},
    {"queue_timeout_ms", Kind::integer, "milliseconds"},
};

constexpr const char *SECTIONS =
    "server, dataplane, tls, http, quic, quic_lb, tcp, proxy_defaults, or [[proxy]] tables";

[[noreturn]] void fail(const std::string &path, int line, const std::string &key,
                       const std::string &what) {
  throw UsageError(path + ":" + std::to_string(line) + ": " + key + ": " + what);
}

int line_of(const toml::source_region &where) {
  return static_cast<int>(where.begin.line);
}

const char *type_name(const toml::node &v) {
  switch (v.type()) {
  case toml::node_type::string:
    return "a string";
  case toml::node_type::integer:
    return "an integer";
  case toml::node_type::boolean:
    return "a boolean";
  case toml::node_type::array:
    return "an array";
  case toml::node_type::table:
    return "a table";
  case toml::node_type::floating_point:
    return "a float";
  case toml::node_type::date:
    return "a date";
  case toml::node_type::time:
    return "a time";
  case toml::node_type::date_time:
    return "a date-time";
  case toml::node_type::none:
    break;
  }
  return "?";
}

// Inputs toml++ 3.3 cannot be trusted with, refused before it sees them:
// - It recurses once per level of nesting when it finishes and when it
//   frees a document, so a key of some thousands of dotted parts overflows
//   the stack. Every level opens with a '.', '[' or '{' outside strings and
//   comments; capping those per statement (a line, or the lines of an
//   array or inline table left open) bounds the depth far above anything
//   the configuration needs (it uses a dozen or so), whatever the number
//   of statements.
// - Its test for Unicode whitespace reaches __builtin_unreachable() for
//   most non-ASCII code points (U+00A1 to U+0499 among them: 'é'), and it
//   asks that question of any character where whitespace could be: outside
//   strings and comments (where TOML allows only ASCII anyway), after a
//   backslash in a """ string, and after a line-ending backslash there.
constexpr int MAX_STRUCTURE = 1024;

struct Refusal {
  int line = 0; // 0: none
  std::string why;
};

// Tells strings and comments from the rest as the parser will, or more
// strictly: a quote opens a string only where one may start (after '=',
// '[', '{', ',' or '.', or first on its line), and never inside a number,
// date or time, which the parser reads ahead through up to the next blank,
// ',', ']', '}' or '#' whatever the characters in between. Elsewhere the
// text is not valid TOML and the parser stops at that point.
Refusal refuse_before_parsing(std::string_view text) {
  enum class In { code, comment, basic, literal, multi_basic, multi_literal };
  In in = In::code;
  bool in_number = false;
  bool after_line_end_backslash = false; // in a """ string: skipping whitespace
  char before = '\0';                    // the last non-blank code character on the line
  int line = 1;
  int structure = 0; // in this statement
  int open = 0;      // '[' and '{' not yet closed
  auto non_ascii = [](char c) { return static_cast<unsigned char>(c) >= 0x80; };
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  auto key_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  };
  // A closing triple quote may be followed by up to two more quotes, which
  // belong to the string.
  auto close_triple = [&](size_t &i, char q) {
    i += 2;
    for (int k = 0; k < 2 && i + 1 < text.size() && text[i + 1] == q; ++k)
      ++i;
    in = In::code;
    before = q;
  };
  size_t i = text.starts_with("\xef\xbb\xbf") ? 3 : 0; // a byte order mark
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      if (in != In::multi_basic && in != In::multi_literal)
        in = In::code;
      if (open == 0 && in == In::code)
        structure = 0; // the statement ended
      in_number = false;
      before = '\0';
      continue;
    }
    switch (in) {
    case In::code: {
      char prev = i > 0 ? text[i - 1] : '\0';
      if (blank(c) || c == ',' || c == ']' || c == '}' || c == '#')
        in_number = false;
      if ((c == ']' || c == '}') && open > 0)
        --open;
      else if (c == '[' || c == '{')
        ++open;
      else if (((c >= '0' && c <= '9') || c == '+' || c == '-') && !key_char(prev))
        in_number = true;
      if (c == '#') {
        in = In::comment;
      } else if ((c == '"' || c == '\'') && !in_number &&
                 (before == '\0' ||
                  std::string_view("=[{,.").find(before) != std::string_view::npos)) {
        bool triple = text.substr(i, 3) == std::string(3, c);
        in = c == '"' ? (triple ? In::multi_basic : In::basic)
                      : (triple ? In::multi_literal : In::literal);
        if (triple)
          i += 2;
      } else if ((c == '.' || c == '[' || c == '{') && ++structure > MAX_STRUCTURE) {
        return {line, "more than " + std::to_string(MAX_STRUCTURE) +
                          " '.', '[' and '{' outside strings and comments in one statement"};
      } else if (non_ascii(c)) {
        return {line, "a non-ASCII character outside strings and comments"};
      }
      if (!blank(c))
        before = c;
      break;
    }
    case In::comment:
      break;
    case In::basic:
      if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
        ++i;
      } else if (c == '"') {
        in = In::code;
        before = c;
      }
      break;
    case In::multi_basic:
      if (after_line_end_backslash) {
        if (blank(c))
          break;
        after_line_end_backslash = false;
        if (non_ascii(c))
          return {line, "a non-ASCII character after a line-ending backslash"};
      }
      if (c == '\\' && i + 1 < text.size()) {
        char next = text[i + 1];
        if (non_ascii(next))
          return {line, "a non-ASCII character after a backslash"};
        if (blank(next) || next == '\n')
          after_line_end_backslash = true;
        else
          ++i;
      } else if (c == '"' && text.substr(i, 3) == R"(""")") {
        close_triple(i, '"');
      }
      break;
    case In::literal:
      if (c == '\'') {
        in = In::code;
        before = c;
      }
      break;
    case In::multi_literal:
      if (text.substr(i, 3) == "'''")
        close_triple(i, '\'');
      break;
    }
  }
  return {};
}

// One key = value of a section, with where its key sits in the file.
struct Entry {
  std::string section;
  std::string key;
  const toml::node *value;
  toml::source_position at;
};

// A [[proxy]] table as "--proxy PREFIX=URL,URL;KEY=VALUE...".
void route_flags(const std::string &path, const toml::table &t, int line,
                 std::vector<std::string> &flags) {
  std::string prefix, urls, options;
  bool has_prefix = false, has_upstreams = false;
  for (const auto &entry : t) {
    // Not a structured binding: the lambda below captures node.
    const toml::key &name = entry.first;
    const toml::node &node = entry.second;
    const std::string full = "proxy." + std::string(name.str());
    const int at = static_cast<int>(name.source().begin.line);
    const RouteKey *key = nullptr;
    for (const auto &k : ROUTE_KEYS) {
      if (name.str() == k.name) key = &k;
    }
    if (!key) {
      std::string known;
      for (const auto &k : ROUTE_KEYS)
        known += std::string(known.empty() ? "" : ", ") + k.name;
      fail(path, at, full, "unknown key; [[proxy]] takes " + known);
    }
    auto expect = [&](bool ok) {
      if (!ok) fail(path, at, full, std::string("expected ") + key->expect + ", got " + type_name(node));
    };
    switch (key->kind) {
    case Kind::string: {
      expect(node.is_string());
      const std::string &v = node.as_string()->get();
      if (name.str() == "prefix") {
        if (v.empty() || v.front() != '/') fail(path, at, full, "expected a prefix starting with '/'");
        if (v.find('=') != std::string::npos) fail(path, at, full, "a prefix cannot hold '='");
        prefix = v;
        has_prefix = true;
      } else {
        // It becomes ";KEY=VALUE" in the flag: it must not add another.
        if (v.find_first_of(";=") != std::string::npos)
          fail(path, at, full, std::string("expected ") + key->expect + ", got '" + v + "'");
        options += ";" + std::string(name.str()) + "=" + v;
      }
      break;
    }
    case Kind::integer: {
      expect(node.is_integer());
      int64_t n = node.as_integer()->get();
      if (n < 0) fail(path, at, full, std::string("expected ") + key->expect + " (not negative)");
      options += ";" + std::string(name.str()) + "=" + std::to_string(n);
      break;
    }
    default: // upstreams
      expect(node.is_array());
      for (const auto &item : *node.as_array()) {
        const int item_line = line_of(item.source());
        if (!item.is_string()) {
          fail(path, item_line, full,
               std::string("expected ") + key->expect + ", got " + type_name(item) + " in it");
        }
        const std::string &url = item.as_string()->get();
        if (url.find_first_of(",;") != std::string::npos)
          fail(path, item_line, full, "an upstream URL cannot hold ',' or ';'");
        urls += (urls.empty() ? "" : ",") + url;
      }
      if (urls.empty()) fail(path, at, full, "expected at least one upstream URL");
      has_upstreams = true;
      break;
    }
  }
  if (!has_prefix) fail(path, line, "[[proxy]]", "missing prefix = \"/PATH\"");
  if (!has_upstreams) fail(path, line, "[[proxy]]", "missing upstreams = [\"http://HOST:PORT\"]");
  // Where the route came from, for messages from the validator (a bad URL).
  flags.push_back("\x01" + path + ":" + std::to_string(line) + ": [[proxy]] prefix \"" + prefix +
                  "\"");
  flags.push_back("--proxy");
  flags.push_back(prefix + "=" + urls + options);
}

} // namespace

namespace {

// Flag -> its values, in the order given (a flag without a value, one
// such as --busy-poll, maps to none).
std::map<std::string, std::vector<std::string>> by_flag(const std::vector<std::string> &flags) {
  std::map<std::string, std::vector<std::string>> m;
  std::vector<std::string> *cur = nullptr;
  for (const auto &f : flags) {
    if (f.starts_with("--")) {
      cur = &m[f];
    } else if (cur && !f.starts_with('\x01')) { // not an origin marker (FILE:LINE)
      cur->push_back(f);
    }
  }
  return m;
}

std::string key_of_flag(const std::string &flag) {
  for (const auto &k : KEYS) {
    if (flag == k.flag) return std::string(k.section) + "." + k.name;
  }
  return flag == "--proxy" ? "[[proxy]]" : flag;
}

} // namespace

std::vector<std::string> changed_config_keys(const std::vector<std::string> &before,
                                             const std::vector<std::string> &after,
                                             const std::vector<std::string_view> &except,
                                             const std::vector<std::string> &args,
                                             std::vector<std::string> *overridden) {
  const auto a = by_flag(before), b = by_flag(after);
  std::vector<std::string> keys;
  auto on_command_line = [&](const std::string &flag) {
    // The one flag that adds to the file's list rather than replacing it.
    if (flag == "--response-header") return false;
    const std::string_view other = opposite_switch(flag); // a switch's opposite overrides it too
    for (const auto &x : args) {
      if (x == flag || (x.starts_with(flag) && x.size() > flag.size() && x[flag.size()] == '=') ||
          (!other.empty() && x == other)) {
        return true;
      }
    }
    return false;
  };
  auto excepted = [&](std::string_view key) {
    for (auto e : except) {
      if (key == e || (e.ends_with(".*") && key.starts_with(e.substr(0, e.size() - 1)))) {
        return true;
      }
    }
    return false;
  };
  auto note = [&](const std::string &flag) {
    const auto x = a.find(flag), y = b.find(flag);
    if (x != a.end() && y != b.end() && x->second == y->second) return;
    std::string k = key_of_flag(flag);
    if (on_command_line(flag)) {
      if (overridden && std::find(overridden->begin(), overridden->end(), k) == overridden->end())
        overridden->push_back(std::move(k));
      return;
    }
    if (excepted(k) || std::find(keys.begin(), keys.end(), k) != keys.end()) return;
    keys.push_back(std::move(k));
  };
  for (const auto &f : after) {
    if (f.starts_with("--")) note(f);
  }
  for (const auto &f : before) {
    if (f.starts_with("--")) note(f); // a key the file no longer has
  }
  return keys;
}

std::vector<std::string> config_file_flags(const std::string &path) {
  std::string text;
  {
    // A regular file of at most 1 MiB, read no further than that: a path
    // to /dev/zero or a FIFO must not eat memory or hang a reload.
    constexpr size_t MAX = 1u << 20;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw UsageError("--config " + path + ": cannot read: " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw UsageError("--config " + path + ": not a regular file");
    }
    text.resize(MAX + 1);
    size_t got = 0;
    while (got < text.size()) {
      ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw UsageError("--config " + path + ": cannot read: " + std::strerror(err));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    if (got > MAX) throw UsageError("--config " + path + ": larger than 1 MiB");
    text.resize(got);
  }
  if (Refusal r = refuse_before_parsing(text); r.line)
    throw UsageError(path + ":" + std::to_string(r.line) + ": syntax error: " + r.why);
  toml::table doc;
  try {
    doc = toml::parse(text);
  } catch (const toml::parse_error &e) {
    // toml++ words its errors "Error while parsing <what>: <why>".
    std::string_view what = e.description();
    std::string_view prefix = "Error while parsing ";
    std::string message = what.starts_with(prefix)
                              ? "syntax error in " + std::string(what.substr(prefix.size()))
                              : "syntax error: " + std::string(what);
    throw UsageError(path + ":" + std::to_string(e.source().begin.line) + ":" +
                     std::to_string(e.source().begin.column) + ": " + message);
  }
  // toml++ keeps keys sorted; messages and flags go in file order.
  auto by_place = [](const auto &a, const auto &b) {
    return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
  };
  struct Section {
    std::string name;
    const toml::node *node;
    toml::source_position at;
  };
  std::vector<Section> sections;
  for (const auto &[name, node] : doc)
    sections.push_back(Section{std::string(name.str()), &node, name.source().begin});
  std::sort(sections.begin(), sections.end(), by_place);
  std::vector<Entry> entries;
  for (const auto &sec : sections) {
    int line = static_cast<int>(sec.at.line);
    if (sec.name == "proxy") {
      if (!sec.node->is_array_of_tables()) {
        fail(path, line, "proxy", "a route is a [[proxy]] table (double brackets), one per prefix");
      }
      // One entry per route, at its [[proxy]] line; flags made below.
      for (const auto &route : *sec.node->as_array())
        entries.push_back(Entry{"proxy", "", &route, route.source().begin});
      continue;
    }
    if (sec.node->is_array_of_tables()) {
      fail(path, line, "[[" + sec.name + "]]",
           std::string("only [[proxy]] is an array of tables; expected one of ") + SECTIONS);
    }
    if (!sec.node->is_table()) {
      fail(path, line, sec.name, std::string("keys belong in a [section]: ") + SECTIONS);
    }
    bool known = false;
    for (const auto &k : KEYS)
      known |= sec.name == k.section;
    if (!known) {
      fail(path, line, "[" + sec.name + "]", std::string("unknown section; expected ") + SECTIONS);
    }
    for (const auto &[name, node] : *sec.node->as_table())
      entries.push_back(Entry{sec.name, std::string(name.str()), &node, name.source().begin});
  }
  std::sort(entries.begin(), entries.end(), by_place);
  std::vector<std::string> flags;
  for (const auto &e : entries) {
    const toml::node &v = *e.value;
    int line = static_cast<int>(e.at.line);
    if (e.section == "proxy") {
      route_flags(path, *v.as_table(), line, flags);
      continue;
    }
    const Key *key = nullptr;
    for (const auto &k : KEYS) {
      if (e.section == k.section && e.key == k.name)
        key = &k;
    }
    std::string full = e.section + "." + e.key;
    if (!key) {
      std::string known;
      for (const auto &k : KEYS) {
        if (e.section == k.section)
          known += std::string(known.empty() ? "" : ", ") + k.name;
      }
      fail(path, line, full, "unknown key; [" + e.section + "] takes " + known);
    }
    // Where the flags below came from, for messages from the validator.
    flags.push_back("\x01" + path + ":" + std::to_string(line) + ": " + full);
    auto expect = [&](bool ok) {
      if (!ok) {
        fail(path, line, full, std::string("expected ") + key->expect + ", got " + type_name(v));
      }
    };
    switch (key->kind) {
    case Kind::string:
      expect(v.is_string());
      flags.push_back(key->flag);
      flags.push_back(v.as_string()->get());
      break;
    case Kind::integer: {
      expect(v.is_integer());
      int64_t n = v.as_integer()->get();
      if (n < 0) {
        fail(path, line, full, std::string("expected ") + key->expect + " (not negative)");
      }
      flags.push_back(key->flag);
      flags.push_back(std::to_string(n));
      break;
    }
    case Kind::boolean:
      expect(v.is_boolean());
      break;
    case Kind::flag_if_true:
      expect(v.is_boolean());
      if (v.as_boolean()->get())
        flags.push_back(key->flag);
      break;
    case Kind::flag_if_false:
      expect(v.is_boolean());
      if (!v.as_boolean()->get())
        flags.push_back(key->flag);
      break;
    case Kind::strings:
      expect(v.is_array());
      // No flag at all would leave the built-in addresses, the opposite
      // of what an empty list says.
      if (v.as_array()->empty() && std::string_view(key->flag) == "--listen") {
        fail(path, line, full, "an empty list: give at least one address (an empty list does "
                               "not mean no QUIC)");
      }
      for (const auto &item : *v.as_array()) {
        if (!item.is_string()) {
          fail(path, line_of(item.source()), full,
               std::string("expected ") + key->expect + ", got " + type_name(item) + " in it");
        }
        flags.push_back(key->flag);
        flags.push_back(item.as_string()->get());
      }
      break;
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
# access_log = "/var/log/xdpq/access.log"  # one line per request (combined format); default: none
# metrics = "127.0.0.1:9464"             # Prometheus text format
drain_timeout_ms = 10000                 # SIGTERM: in-flight requests get this long
per_source_connections = 256             # per IPv4 address or IPv6 /64, per worker; 0: no cap
per_source_rate = 5000                   # new QUIC connections/s per source, per worker, before Retry; 0: no cap
per_source_validated_rate = 5000         # ... from a proven source (token, TCP); over it: refused; 0: no cap

[dataplane]
mode = "socket"                          # socket or afxdp
# interface = "eth0"                     # afxdp
# queues = "0"                           # afxdp: one worker per queue; with fewer
                                         # workers, worker i serves queues i, i+N... (shared UMEM)
xdp_mode = "auto"                        # native, generic, auto
zerocopy = "auto"                        # auto, on, off
busy_poll = false
xdp_replace = false
spin_us = 0                              # poll this long after work before sleeping (0: never spin)
# kernel_trains = 4                      # afxdp: trains of N+ datagrams leave via kernel UDP GSO;
                                         # 0 off; default 4 in copy mode, 0 in zero-copy mode

[tls]
# cert = "/etc/xdpq/cert.pem"            # without cert/key: a self-signed pair
# key = "/etc/xdpq/key.pem"
# secrets = "/var/lib/xdpq/secrets"      # created 0600 if missing

[http]
# docroot = "/srv/www"                   # default: an embedded page
# response_headers = ["Strict-Transport-Security: max-age=31536000"]  # added where missing
serve_dotfiles = false                   # names starting with '.' (but .well-known): 404
test_routes = true                       # /echo and /bytes/N (benchmarks, tests); false in production
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
retry_rate = 5000                        # ... or while new ones arrive faster than this per second
idle_timeout_ms = 30000
handshake_timeout_ms = 10000             # a handshake not done by then is dropped
header_timeout_ms = 10000                # a request head not whole by then is reset
max_streams = 100
qpack_table_capacity = 0                 # bytes of QPACK dynamic table a client may use for requests
max_connections = 65536
memory_per_worker = 1073741824           # ngtcp2's and nghttp3's buffers for a worker's connections; 0: no limit
early_data = true

[quic_lb]                                # scale-out behind a QUIC-LB balancer (docs/scale-out.md)
# server_id = "01"                       # this node's ID (hex, 1-11 bytes); unset: QUIC-LB off
# config_id = 0                          # config rotation codepoint, 0-6
# nonce_length = 15                      # 8-18; default 16 minus the server ID's length
# mode = "encrypted"                     # or "plaintext"; the key: quic_lb_key in tls.secrets

[tcp]
enabled = true                           # HTTP/2 + HTTP/1.1 over TLS on the listen addresses
h2c_listen = []                          # cleartext, for benchmarks only
max_connections = 10000
handshake_timeout_ms = 10000
header_timeout_ms = 10000
idle_timeout_ms = 60000
write_timeout_ms = 30000

[proxy_defaults]                         # reverse proxy (docs/proxy.md); each route a [[proxy]] table
connect_timeout_ms = 5000                # a connect not done by then fails (the upstream is held down)
timeout_ms = 30000                       # to the response head (504), then the longest silence mid-body
idle_timeout_ms = 30000                  # pooled keep-alive connections unused this long are closed
client_timeout_ms = 60000                # a client taking no byte of a held-full response: reset
tunnel_timeout_ms = 3600000              # a WebSocket tunnel silent both ways this long is closed
max_idle = 32                            # pooled connections per upstream and worker
max_connections = 512                    # connections per upstream and worker; past it: queue
queue = 4096                             # requests waiting per route and worker; past it: 503
queue_timeout_ms = 5000                  # a request waiting longer for a connection: 503
balancing = "round-robin"                # or "least-outstanding"
trusted = []                             # clients whose own X-Forwarded-* are kept, "10.0.0.0/8"
via = false                              # add "via: 1.1 xdpq"
forwarded_headers = true                 # add X-Forwarded-For, -Proto and -Host
# health_check = "/healthz"              # GET it on every upstream (each worker); unset: no checks
health_interval_ms = 2000                # one check per upstream and worker this often
health_timeout_ms = 1000                 # a check not answered by then fails

# [[proxy]]                              # one table per route; the longest prefix wins
# prefix = "/api/"                       # matched against the path, passed on unchanged
# upstreams = ["http://127.0.0.1:8000", "unix:/run/app/app.sock"]
# timeout_ms = 5000                      # a route may set its own balancing, timeouts,
                                         # max_idle, max_connections, queue and
                                         # queue_timeout_ms
)";
}

} // namespace xdpq::control
