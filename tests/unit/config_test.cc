#include "control/config.h"
#include "control/options.h"

#include "parse_args.h"

#include <gtest/gtest.h>

#include <fstream>
#include <unistd.h>

using namespace xdpq::control;

namespace {

std::string write_config(const std::string &text) {
  static int n = 0;
  std::string path = "/tmp/xdpq-config-test-" + std::to_string(getpid()) + "-" +
                     std::to_string(n++) + ".toml";
  std::ofstream(path) << text;
  return path;
}

Options parse(const std::vector<std::string> &args) { return xdpq::testing::parse_args(args); }
std::string error_of(const std::vector<std::string> &args) {
  return xdpq::testing::parse_error(args);
}

} // namespace

TEST(Config, FileSetsOptionsAndFlagsOverride) {
  auto path = write_config(R"(
[server]
listen = ["127.0.0.1:7000", "[::1]:7000"]
log_level = "debug"
[quic]
retry = "on"
max_streams = 50
early_data = false
[tcp]
enabled = false
[http]
test_routes = false
)");
  auto o = parse({"--config", path});
  EXPECT_FALSE(o.test_routes);
  EXPECT_TRUE(parse({}).test_routes);
  ASSERT_EQ(o.listen.size(), 2u);
  EXPECT_EQ(o.listen[0].to_string(), "127.0.0.1:7000");
  EXPECT_EQ(o.log_level, "debug");
  EXPECT_EQ(o.retry, xdpq::quic::RetryMode::on);
  EXPECT_EQ(o.max_streams, 50u);
  EXPECT_FALSE(o.early_data);
  EXPECT_FALSE(o.tcp);
  // Flags win, and a --listen on the command line replaces the file's list.
  auto f = parse({"--config", path, "--retry", "off", "--listen", "127.0.0.1:9"});
  EXPECT_EQ(f.retry, xdpq::quic::RetryMode::off);
  ASSERT_EQ(f.listen.size(), 1u);
  EXPECT_EQ(f.listen[0].to_string(), "127.0.0.1:9");
}

// Regression: a switch the file turned on or off could not be turned back
// from the command line (there was --no-tcp, but no --tcp), though flags
// override the file.
TEST(Config, TheCommandLineUndoesAFilesSwitchEitherWay) {
  auto path = write_config(R"(
[dataplane]
busy_poll = false
[http]
test_routes = false
serve_dotfiles = true
[quic]
early_data = false
[tcp]
enabled = false
[proxy_defaults]
via = true
forwarded_headers = false
)");
  auto o = parse({"--config", path, "--tcp", "--early-data", "--test-routes",
                  "--no-serve-dotfiles", "--no-proxy-via", "--proxy-forwarded-headers"});
  EXPECT_TRUE(o.tcp);
  EXPECT_TRUE(o.early_data);
  EXPECT_TRUE(o.test_routes);
  EXPECT_FALSE(o.serve_dotfiles);
  EXPECT_FALSE(o.proxy.via);
  EXPECT_TRUE(o.proxy.forwarded_headers);
  EXPECT_TRUE(o.at({"--no-tcp", "--tcp"}).empty()); // not the file's any more
  // The last one given wins.
  EXPECT_FALSE(parse({"--tcp", "--no-tcp"}).tcp);
  EXPECT_TRUE(parse({"--no-tcp", "--tcp"}).tcp);
  // A reload names the file's change as overridden, not as applied.
  std::vector<std::string> overridden;
  auto kept = changed_config_keys({"--no-tcp"}, {}, {}, {"--tcp"}, &overridden);
  EXPECT_TRUE(kept.empty());
  ASSERT_EQ(overridden.size(), 1u);
  EXPECT_EQ(overridden[0], "tcp.enabled");
}

TEST(Config, ErrorsNameFileLineKeyAndExpectation) {
  auto unknown = write_config("[server]\nlisten = [\"127.0.0.1:1\"]\nlisen = 3\n");
  auto e = error_of({"--config", unknown});
  EXPECT_NE(e.find(unknown + ":3"), std::string::npos) << e;
  EXPECT_NE(e.find("server.lisen"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key; [server] takes listen, workers, cpus, log_level,"),
            std::string::npos)
      << e;

  auto section = write_config("[sever]\nlisten = []\n");
  e = error_of({"--config", section});
  EXPECT_NE(e.find(section + ":1: [sever]: unknown section"), std::string::npos) << e;

  auto type = write_config("[quic]\n\nmax_streams = \"many\"\n");
  e = error_of({"--config", type});
  EXPECT_NE(e.find(type + ":3"), std::string::npos) << e;
  EXPECT_NE(e.find("quic.max_streams"), std::string::npos) << e;
  EXPECT_NE(e.find("expected an integer, got a string"), std::string::npos) << e;

  auto addr = write_config("[server]\nlisten = [\"127.0.0.1\"]\n");
  e = error_of({"--config", addr});
  EXPECT_NE(e.find(addr + ":2"), std::string::npos) << e;
  EXPECT_NE(e.find("server.listen"), std::string::npos) << e;
  EXPECT_NE(e.find("ADDR:PORT"), std::string::npos) << e;

  auto value = write_config("[quic]\nretry = \"sometimes\"\n");
  e = error_of({"--config", value});
  EXPECT_NE(e.find("quic.retry"), std::string::npos) << e;
  EXPECT_NE(e.find("off, on or auto"), std::string::npos) << e;

  auto syntax = write_config("[server\nlisten = 1\n");
  e = error_of({"--config", syntax});
  EXPECT_NE(e.find(syntax + ":1:"), std::string::npos) << e;
  EXPECT_NE(e.find("syntax error"), std::string::npos) << e;

  e = error_of({"--config", "/nonexistent/xdpq.toml"});
  EXPECT_NE(e.find("/nonexistent/xdpq.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot read"), std::string::npos) << e;
}

TEST(Config, CheckConfigTakesTheFile) {
  auto path = write_config("[server]\nlog_level = \"warn\"\n");
  auto o = parse({"--check-config", path});
  EXPECT_TRUE(o.check_config);
  EXPECT_EQ(o.log_level, "warn");
  EXPECT_EQ(o.config_file, path);
}

TEST(Config, InlineFileNamesAreRead) {
  // --check-config=FILE checked the defaults, not FILE; --config=FILE
  // swallowed the flag after it.
  auto path = write_config("[server]\nlog_level = \"warn\"\n");
  auto c = parse({"--check-config=" + path});
  EXPECT_TRUE(c.check_config);
  EXPECT_EQ(c.log_level, "warn");
  EXPECT_EQ(c.config_file, path);
  auto bad = write_config("[server]\nworkers = 0\n");
  EXPECT_NE(error_of({"--check-config=" + bad}).find(bad + ":2"), std::string::npos);
  auto o = parse({"--config=" + path, "--no-tcp"});
  EXPECT_EQ(o.log_level, "warn");
  EXPECT_FALSE(o.tcp);
}

TEST(Config, ErrorsBetweenSettingsSayWhere) {
  // Checks between settings named only flags, so a file's mistake had no
  // file:line.
  auto path = write_config("[http]\n\nmax_request_body = 33554432\n");
  auto e = error_of({"--config", path});
  EXPECT_NE(e.find(path + ":3: http.max_request_body: --max-body-per-connection"),
            std::string::npos)
      << e;
  auto tls = write_config("[tls]\ncert = \"/etc/x.pem\"\n");
  e = error_of({"--config", tls});
  EXPECT_NE(e.find(tls + ":2: tls.cert: --cert and --key go together"), std::string::npos) << e;
  // The command line overrides the file: the error names the flag alone.
  e = error_of({"--config", tls, "--cert", "/etc/y.pem"});
  EXPECT_EQ(e.find(tls), std::string::npos) << e;
  EXPECT_NE(e.find("--cert and --key go together"), std::string::npos) << e;
}

TEST(Config, AfXdpSettingsWithTheSocketDataplaneAreErrors) {
  // They were ignored without a word: a file that set busy_poll (or
  // kernel_trains, zerocopy...) but kept the default socket dataplane
  // looked tuned and was not.
  auto path = write_config("[dataplane]\nmode = \"socket\"\n\nbusy_poll = true\n");
  auto e = error_of({"--config", path});
  EXPECT_NE(e.find(path + ":4: dataplane.busy_poll: --busy-poll goes with --dataplane afxdp"),
            std::string::npos)
      << e;
  for (std::vector<std::string> bad :
       {std::vector<std::string>{"--xdp-mode", "native"}, {"--zerocopy", "on"}, {"--busy-poll"},
        {"--xdp-replace"}, {"--kernel-trains", "0"}, {"--queues", "1"}}) {
    e = error_of(bad);
    EXPECT_NE(e.find(bad[0] + " goes with --dataplane afxdp"), std::string::npos) << e;
  }
  // Their defaults, as the printed default configuration gives them, pass.
  EXPECT_EQ(parse({"--xdp-mode", "auto", "--zerocopy", "auto"}).dataplane, "socket");
  EXPECT_TRUE(parse({"--dataplane", "afxdp", "--interface", "eth0", "--busy-poll",
                     "--kernel-trains", "0"})
                  .busy_poll);
}

TEST(Config, AMissingOrEmptyFileOrPathIsAnError) {
  // Each of these started on the built-in defaults without a word: a
  // self-signed certificate, keys in memory, the embedded page.
  EXPECT_NE(error_of({"--config"}).find("--config: missing value"), std::string::npos);
  EXPECT_NE(error_of({"--config="}).find("--config: expected a path"), std::string::npos);
  EXPECT_NE(error_of({"--config", ""}).find("--config: expected a path"), std::string::npos);
  auto a = write_config("");
  auto b = write_config("");
  EXPECT_NE(error_of({"--config", a, "--config=" + b}).find("one configuration file only"),
            std::string::npos);
  EXPECT_EQ(parse({"--config", a, "--check-config", a}).config_file, a); // the same one
  auto tls = write_config("[tls]\ncert = \"\"\nkey = \"\"\n");
  auto e = error_of({"--config", tls});
  EXPECT_NE(e.find(tls + ":2: tls.cert: --cert: expected a path"), std::string::npos) << e;
  for (const char *flag : {"--docroot", "--secrets", "--control-socket", "--access-log"}) {
    EXPECT_NE(error_of({flag, ""}).find(std::string(flag) + ": expected a path"),
              std::string::npos)
        << flag;
  }
}

TEST(Config, ListenAddressesTheStartWouldRefuse) {
  // An empty list listened on the built-in wildcard addresses.
  auto empty = write_config("[server]\nlisten = []\n");
  auto e = error_of({"--config", empty});
  EXPECT_NE(e.find(empty + ":2: server.listen: an empty list"), std::string::npos) << e;
  // These passed --check-config and failed only at the bind.
  auto twice = write_config("[server]\nlisten = [\"127.0.0.1:4433\", \"127.0.0.1:4433\"]\n");
  e = error_of({"--config", twice});
  EXPECT_NE(e.find(twice + ":2: server.listen: --listen: 127.0.0.1:4433 is listed twice"),
            std::string::npos)
      << e;
  e = error_of({"--listen", "127.0.0.1:4433", "--h2c-listen", "127.0.0.1:4433"});
  EXPECT_NE(e.find("TLS over TCP already listens there"), std::string::npos) << e;
  EXPECT_EQ(parse({"--listen", "127.0.0.1:4433", "--h2c-listen", "127.0.0.1:4433", "--no-tcp"})
                .h2c_listen.size(),
            1u);
  // Port 0 is a new port each time: no conflict.
  EXPECT_EQ(parse({"--listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--h2c-listen",
                   "127.0.0.1:0"})
                .listen.size(),
            2u);
  e = error_of({"--dataplane", "afxdp", "--interface", "eth0", "--listen", "10.0.0.1:0"});
  EXPECT_NE(e.find("--dataplane afxdp needs an explicit port"), std::string::npos) << e;
}

TEST(Config, EchoModeRefusesWhatItWouldNotServe) {
  auto e = error_of({"--echo", "--proxy", "/app=http://127.0.0.1:8080"});
  EXPECT_NE(e.find("--echo (UDP echo, no HTTP) cannot go with --proxy"), std::string::npos) << e;
  e = error_of({"--echo", "--h2c-listen", "127.0.0.1:8080"});
  EXPECT_NE(e.find("cannot go with --h2c-listen"), std::string::npos) << e;
  EXPECT_TRUE(parse({"--echo", "--no-tcp"}).echo);
}

TEST(Config, DefaultConfigTextParsesToTheDefaults) {
  auto path = write_config(default_config_text());
  auto o = parse({"--config", path});
  Options d = parse({});
  EXPECT_EQ(o.listen, d.listen);
  EXPECT_EQ(o.retry, d.retry);
  EXPECT_EQ(o.max_streams, d.max_streams);
  EXPECT_EQ(o.max_header_size, d.max_header_size);
  EXPECT_EQ(o.tcp_idle_timeout_ms, d.tcp_idle_timeout_ms);
  EXPECT_EQ(o.drain_timeout_ms, d.drain_timeout_ms);
  EXPECT_EQ(o.dataplane, d.dataplane);
}

TEST(Config, QuicLbSection) {
  auto path = write_config(R"([tls]
secrets = "/var/lib/xdpq/secrets"
[quic_lb]
server_id = "0a0b0c"
config_id = 3
nonce_length = 9
mode = "plaintext"
)");
  auto o = parse({"--config", path});
  EXPECT_EQ(o.quic_lb_server_id, (std::vector<uint8_t>{0x0a, 0x0b, 0x0c}));
  EXPECT_EQ(o.quic_lb_config_id, 3);
  EXPECT_EQ(o.quic_lb_nonce_length, 9u);
  EXPECT_EQ(o.quic_lb_mode, "plaintext");
  auto bad = write_config("[tls]\nsecrets = \"/s\"\n[quic_lb]\nserver_id = \"xyz\"\n");
  auto e = error_of({"--config", bad});
  EXPECT_NE(e.find(bad + ":4: quic_lb.server_id"), std::string::npos) << e;
  EXPECT_NE(e.find("1 to 11 bytes"), std::string::npos) << e;
  auto typo = write_config("[quic_lb]\nserver = \"01\"\n");
  e = error_of({"--config", typo});
  EXPECT_NE(e.find(typo + ":2: quic_lb.server"), std::string::npos) << e;
  EXPECT_NE(e.find("server_id, config_id, nonce_length, mode"), std::string::npos) << e;
}

// TOML the file may use beyond the default text: CRLF lines, comments and
// a trailing comma inside an array, literal strings, escapes, digit
// separators, dotted keys and inline tables.
TEST(Config, ReadsTheTomlAFileMayUse) {
  auto path = write_config("# comment\n"
                           "[server]\r\n"
                           "listen = [\"127.0.0.1:443\", # first\n"
                           "  '[::1]:443',  # literal\n"
                           "]\n"
                           "control_socket = \"/run/x\\u00e9\\t\\\"q\\\"\"\n"
                           "[http]\n"
                           "file_cache_entries = 1_000\n"
                           "docroot = '/srv/a\\b'\n");
  auto o = parse({"--config", path});
  ASSERT_EQ(o.listen.size(), 2u);
  EXPECT_EQ(o.listen[1].to_string(), "[::1]:443");
  EXPECT_EQ(o.control_socket, "/run/x\xc3\xa9\t\"q\"");
  EXPECT_EQ(o.file_cache_entries, 1000u);
  EXPECT_EQ(o.docroot, "/srv/a\\b"); // a literal string: no escapes
  // [http] then tcp.max_connections is http.tcp, a table: not a key of [http].
  auto nested = write_config("[http]\ntcp.max_connections = 7\n");
  auto e = error_of({"--config", nested});
  EXPECT_NE(e.find(nested + ":2: http.tcp: unknown key; [http] takes docroot,"), std::string::npos)
      << e;
  auto dotted = write_config("tcp.max_connections = 7\nquic = {max_streams = 9}\n");
  o = parse({"--config", dotted});
  EXPECT_EQ(o.tcp_max_connections, 7u);
  EXPECT_EQ(o.max_streams, 9u);
}

// Every bad file is a UsageError naming the file and line, whatever the
// parser or the checks after it found.
TEST(Config, BadFilesNameFileAndLine) {
  struct Case {
    const char *text;
    const char *line; // ":N" after the path
    const char *message;
  } cases[] = {
      // Regression (found by fuzz_config): Debian's toml11 read past a heap
      // buffer on these 4 bytes.
      {"'\xbc'[", ":1:", "syntax error"},
      // Regression (found by fuzz_config): toml++ asserts (or, with NDEBUG
      // under clang, assumes) what these break.
      {"[{", ":1:", "syntax error"},
      {"[server]\nlisten = [}\n", ":2:", "syntax error"},
      {"[server]\nworkers = 1\nworkers = 2\n", ":3:", "syntax error"},
      {"[server]\n[tcp]\n[server]\n", ":3:", "syntax error"},
      {"[server]\nworkers = 99999999999999999999\n", ":2:", "syntax error"},
      {"[server]\nlog_level = \"open\n", ":2:", "syntax error"},
      {"[server]\nlog_level = \"\\q\"\n", ":2:", "syntax error"},
      {"[server]\n\nlog_level = \"\xff\"\n", ":3:", "syntax error"},
      {"[server]\nlog_level = \"\xed\xa0\x80\"\n", ":2:", "syntax error"},
      {"[server]\nlog_level = 'a\x01b'\n", ":2:", "syntax error"},
      {"[server]\nlisten = [\"127.0.0.1:1\",\n", ":2:", "syntax error"},
      {"[server]\nworkers = 1 log_level = \"info\"\n", ":2:", "syntax error"},
      {"[server]\nworkers 1\n", ":2:", "syntax error"},
      {"[server]\n\n= 1\n", ":3:", "syntax error"},
      {"[server]\nworkers = 1.5\n", ":2: server.workers", "expected an integer, got a float"},
      {"[server]\nworkers = 1979-05-27\n", ":2: server.workers", "got a date"},
      {"[server]\nworkers = -2\n", ":2: server.workers", "not negative"},
      {"[server]\nworkers = {a = 1}\n", ":2: server.workers", "got a table"},
      {"[server]\nlisten = \"127.0.0.1:1\"\n", ":2: server.listen", "got a string"},
      {"[server]\nlisten = [\"127.0.0.1:1\",\n  [\"127.0.0.1:2\"]]\n", ":3: server.listen",
       "got an array in it"},
      {"[tcp]\nenabled = \"yes\"\n", ":2: tcp.enabled", "expected true or false, got a string"},
      {"\nworkers = 2\n", ":2: workers", "keys belong in a [section]"},
      {"[[server]]\n", ":1: [[server]]", "only [[proxy]] is an array of tables"},
      {"[server.extra]\n", ":1: server.extra", "unknown key; [server] takes listen, workers,"},
      {"[server]\n\"lis ten\" = 1\n", ":2: server.lis ten", "unknown key"},
  };
  for (const auto &c : cases) {
    auto path = write_config(c.text);
    std::string e = error_of({"--config", path});
    EXPECT_NE(e.find(path + c.line), std::string::npos) << c.text << " -> " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << " -> " << e;
  }
}

// toml++ orders keys by name; what is reported first is what comes first
// in the file.
TEST(Config, ErrorsComeInFileOrder) {
  auto path = write_config("[tcp]\nzz = 1\naa = 2\n");
  auto e = error_of({"--config", path});
  EXPECT_NE(e.find(path + ":2: tcp.zz: unknown key"), std::string::npos) << e;
  path = write_config("[zzz]\n[aaa]\n");
  e = error_of({"--config", path});
  EXPECT_NE(e.find(path + ":1: [zzz]: unknown section"), std::string::npos) << e;
}

// Regression: toml++ recurses once per level of nesting, and a key of
// thousands of dotted parts (or a header like it) overflowed the stack.
// Such files are refused before parsing; dots in strings and comments do
// not count.
TEST(Config, DeepNestingIsRefusedBeforeParsing) {
  std::string key = "a";
  for (int i = 0; i < 200000; ++i)
    key += ".a";
  for (const std::string &text : {"\n" + key + " = 1\n", "\n[" + key + "]\n"}) {
    auto path = write_config(text);
    auto e = error_of({"--config", path});
    EXPECT_NE(e.find(path + ":2: syntax error: more than 1024"), std::string::npos) << e;
  }
  std::string dots(5000, '.');
  auto path = write_config("# " + dots + "\n[server]\ncontrol_socket = \"" + dots + "\"\n" +
                           "[tls]\ncert = '" + dots + "'\nkey = \"\"\"\n" + dots + "\"\"\"\"\n" +
                           "secrets = '''" + dots + "''''\n");
  auto o = parse({"--config", path});
  EXPECT_EQ(o.control_socket, dots);
  EXPECT_EQ(o.cert_file, dots);
  EXPECT_EQ(o.key_file, dots + "\"");
  EXPECT_EQ(o.secrets_file, dots + "'");
}

// Regression: the cap on '.', '[' and '{' counted the whole file, so about
// 340 [[proxy]] routes were refused as a syntax error. It holds per
// statement; a deep statement is still refused (above), also across lines.
TEST(Config, ManyRoutesAreNotTooDeep) {
  std::string text;
  for (int i = 0; i < 600; ++i) {
    text += "[[proxy]]\nprefix = \"/r" + std::to_string(i) +
            "/\"\nupstreams = [\"http://127.0.0.1:8000\"]\n";
  }
  auto o = parse({"--config", write_config(text)});
  EXPECT_EQ(o.proxy.routes.size(), 600u);
  std::string deep = "[server]\nlisten = " + std::string(1100, '[') + "\n" +
                     std::string(1100, ']') + "\n";
  auto path = write_config(deep);
  EXPECT_NE(error_of({"--config", path}).find(path + ":2: syntax error: more than 1024"),
            std::string::npos);
}

// Regression (found by fuzz_config): toml++ 3.3's Unicode whitespace test
// reaches __builtin_unreachable() on most non-ASCII characters where
// whitespace could be. Those places are refused before parsing; non-ASCII
// text in strings and comments is fine.
TEST(Config, NonAsciiOnlyInStringsAndComments) {
  struct Case {
    const char *text;
    const char *line;
    const char *message;
  } cases[] = {
      {"[server]\n\xc3\xa9 = 1\n", ":2:", "outside strings and comments"},
      {"[server]\nlis999\xc7\x80 = 1\n", ":2:", "outside strings and comments"},
      {"[server]\nworkers = 1 \xc2\xa7\n", ":2:", "outside strings and comments"},
      // The parser reads a number, date or time ahead to the next blank,
      // quotes and all.
      {"[server]\nworkers = 8x\"\xd0\x8b\"\n", ":2:", "outside strings and comments"},
      {"[server]\nworkers = 1.\"\xc3\xa9\"\n", ":2:", "outside strings and comments"},
      {"[server]\nworkers = 1979-05-27 0=\"\xc3\xa9\"\n", ":2:", "outside strings and comments"},
      {"[server]\ncpus = \"\"\"\\\xc2\xa7\"\"\"\n", ":2:", "after a backslash"},
      {"[server]\ncpus = \"\"\"\\\n  \xc2\xa7\"\"\"\n", ":3:", "after a line-ending backslash"},
      {"[server]\ncpus = \"\"\"\\  \xc2\xa7\"\"\"\n", ":2:", "after a line-ending backslash"},
  };
  for (const auto &c : cases) {
    auto path = write_config(c.text);
    std::string e = error_of({"--config", path});
    EXPECT_NE(e.find(path + c.line + " syntax error: a non-ASCII character"), std::string::npos)
        << c.text << " -> " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << " -> " << e;
  }
  auto path = write_config("\xef\xbb\xbf# caf\xc3\xa9 \xe3\x80\x81\n[server]\n"
                           "control_socket = \"/run/caf\xc3\xa9\"  # \xc2\xa7\n[tls]\n"
                           "cert = '\xc2\xa7'\nkey = \"\"\"\n\xc2\xa7\\\n  x\"\"\"\n"
                           "secrets = '''\xc2\xa7\n'''\n");
  auto o = parse({"--config", path});
  EXPECT_EQ(o.control_socket, "/run/caf\xc3\xa9");
  EXPECT_EQ(o.cert_file, "\xc2\xa7");
  EXPECT_EQ(o.key_file, "\xc2\xa7x");
  EXPECT_EQ(o.secrets_file, "\xc2\xa7\n");
}

// [[proxy]] tables become --proxy routes with their own settings;
// [proxy_defaults] the --proxy-* flags.
TEST(Config, ProxyRoutesFromTables) {
  auto path = write_config(R"([proxy_defaults]
timeout_ms = 7000
trusted = ["10.0.0.0/8"]
via = true

[[proxy]]
prefix = "/api/"
upstreams = ["http://127.0.0.1:8000", "unix:/run/app.sock"]
balancing = "least-outstanding"
connect_timeout_ms = 200

[[proxy]]
prefix = "/"
upstreams = ["http://127.0.0.1:8001"]
)");
  auto o = parse({"--config", path});
  ASSERT_EQ(o.proxy.routes.size(), 2u);
  EXPECT_EQ(o.proxy.routes[0].prefix, "/api/");
  ASSERT_EQ(o.proxy.routes[0].upstreams.size(), 2u);
  EXPECT_EQ(o.proxy.routes[0].upstreams[1].unix_path, "/run/app.sock");
  auto api = o.proxy.settings(o.proxy.routes[0]);
  EXPECT_EQ(api.balancing, xdpq::http::Balancing::least_outstanding);
  EXPECT_EQ(api.connect_timeout_ns, 200'000'000u);
  EXPECT_EQ(api.response_timeout_ns, 7'000'000'000u);
  auto root = o.proxy.settings(o.proxy.routes[1]);
  EXPECT_EQ(root.balancing, xdpq::http::Balancing::round_robin);
  EXPECT_EQ(root.response_timeout_ns, 7'000'000'000u);
  EXPECT_EQ(o.proxy.trusted.size(), 1u);
  EXPECT_TRUE(o.proxy.via);
  // --proxy on the command line replaces the file's routes.
  auto f = parse({"--config", path, "--proxy", "/x=http://127.0.0.1:9"});
  ASSERT_EQ(f.proxy.routes.size(), 1u);
  EXPECT_EQ(f.proxy.routes[0].prefix, "/x");
}

TEST(Config, ProxyTableErrorsSayWhere) {
  struct Case {
    const char *text;
    const char *line;
    const char *message;
  };
  const Case cases[] = {
      {"[proxy]\nprefix = \"/\"\n", ":1: proxy", "[[proxy]] table (double brackets)"},
      {"[[proxy]]\nupstreams = [\"http://127.0.0.1:1\"]\n", ":1: [[proxy]]", "missing prefix"},
      {"[[proxy]]\nprefix = \"/a\"\n", ":1: [[proxy]]", "missing upstreams"},
      {"[[proxy]]\nprefix = \"a\"\nupstreams = [\"http://127.0.0.1:1\"]\n", ":2: proxy.prefix",
       "starting with '/'"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = []\n", ":3: proxy.upstreams",
       "at least one upstream"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = \"http://127.0.0.1:1\"\n", ":3: proxy.upstreams",
       "got a string"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:1\",\n 7]\n",
       ":4: proxy.upstreams", "got an integer in it"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://a:1,http://b:2\"]\n",
       ":3: proxy.upstreams", "cannot hold ','"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:1\"]\ntimeout = 5\n",
       ":4: proxy.timeout", "unknown key; [[proxy]] takes prefix, upstreams,"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:1\"]\ntimeout_ms = -5\n",
       ":4: proxy.timeout_ms", "not negative"},
      // The validator's own errors name the route's table.
      {"\n[[proxy]]\nprefix = \"/a\"\nupstreams = [\"https://127.0.0.1:1\"]\n",
       ":2: [[proxy]] prefix \"/a\"", "https upstreams are not supported"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:1\"]\ntimeout_ms = 0\n",
       ":1: [[proxy]] prefix \"/a\"", "timeout_ms: expected a number from 1"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:1\"]\n"
       "[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:2\"]\n",
       ":4: [[proxy]] prefix \"/a\"", "given twice"},
      {"[[proxy]]\nprefix = \"/a\"\nupstreams = [\"http://127.0.0.1:1\"]\n"
       "balancing = \"round-robin;max_connections=1\"\n",
       ":4: proxy.balancing", "expected \"round-robin\" or \"least-outstanding\", got"},
      {"[proxy_defaults]\nbalancing = \"random\"\n", ":2: proxy_defaults.balancing",
       "round-robin or least-outstanding"},
      {"[proxy_defaults]\ntrusted = [\"nonsense\"]\n", ":2: proxy_defaults.trusted",
       "ADDRESS[/PREFIX]"},
  };
  for (const auto &c : cases) {
    auto path = write_config(c.text);
    std::string e = error_of({"--config", path});
    EXPECT_NE(e.find(path + c.line), std::string::npos) << c.text << " -> " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << " -> " << e;
  }
}

TEST(Config, ProxyHealthChecksFromTheFile) {
  auto path = write_config("[proxy_defaults]\nhealth_check = \"/healthz\"\n"
                           "health_interval_ms = 500\nhealth_timeout_ms = 200\n");
  auto o = parse({"--config", path});
  EXPECT_EQ(o.proxy.health_check_path, "/healthz");
  EXPECT_EQ(o.proxy.health_interval_ns, 500'000'000u);
  EXPECT_EQ(o.proxy.health_timeout_ns, 200'000'000u);
  auto bad = write_config("[proxy_defaults]\nhealth_check = \"healthz\"\n");
  auto e = error_of({"--config", bad});
  EXPECT_NE(e.find(bad + ":2: proxy_defaults.health_check"), std::string::npos) << e;
}

TEST(Config, ResponseHeadersFromTheFile) {
  auto path = write_config("[http]\nresponse_headers = [\"Cache-Control: public, max-age=60\",\n"
                           "  \"X-Frame-Options: DENY\"]\n");
  auto o = parse({"--config", path, "--response-header", "X-Frame-Options: SAMEORIGIN"});
  ASSERT_EQ(o.response_headers.size(), 2u);
  EXPECT_EQ(o.response_headers[0].name, "cache-control");
  EXPECT_EQ(o.response_headers[0].value, "public, max-age=60");
  EXPECT_EQ(o.response_headers[1].value, "SAMEORIGIN"); // the command line's, later
  auto bad = write_config("[http]\n\nresponse_headers = [\"Date: yesterday\"]\n");
  auto e = error_of({"--config", bad});
  EXPECT_NE(e.find(bad + ":3"), std::string::npos) << e;
  EXPECT_NE(e.find("date is set by the server per response"), std::string::npos) << e;
}
