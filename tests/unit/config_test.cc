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
)");
  auto o = parse({"--config", path});
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

TEST(Config, ErrorsNameFileLineKeyAndExpectation) {
  auto unknown = write_config("[server]\nlisten = [\"127.0.0.1:1\"]\nlisen = 3\n");
  auto e = error_of({"--config", unknown});
  EXPECT_NE(e.find(unknown + ":3"), std::string::npos) << e;
  EXPECT_NE(e.find("server.lisen"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key"), std::string::npos) << e;

  auto section = write_config("[sever]\nlisten = []\n");
  e = error_of({"--config", section});
  EXPECT_NE(e.find("unknown section"), std::string::npos) << e;

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
  EXPECT_NE(e.find("1 to 15 bytes"), std::string::npos) << e;
  auto typo = write_config("[quic_lb]\nserver = \"01\"\n");
  e = error_of({"--config", typo});
  EXPECT_NE(e.find(typo + ":2: quic_lb.server"), std::string::npos) << e;
  EXPECT_NE(e.find("server_id, config_id, nonce_length, mode"), std::string::npos) << e;
}
