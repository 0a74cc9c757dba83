#include "control/options.h"

#include "parse_args.h"

#include <gtest/gtest.h>

using namespace xdpq::control;

namespace {
Options parse(const std::vector<std::string> &args) { return xdpq::testing::parse_args(args); }
std::string error_of(const std::vector<std::string> &args) {
  return xdpq::testing::parse_error(args);
}
} // namespace

TEST(Options, Defaults) {
  auto o = parse({});
  ASSERT_EQ(o.listen.size(), 2u);
  EXPECT_EQ(o.listen[0].to_string(), "0.0.0.0:4433");
  EXPECT_EQ(o.listen[1].to_string(), "[::]:4433");
  EXPECT_EQ(o.retry, xdpq::quic::RetryMode::automatic);
}

TEST(Options, AfXdpFlags) {
  auto o = parse({"--dataplane", "afxdp", "--interface", "veth0", "--queues", "0-2", "--xdp-mode",
                  "generic", "--zerocopy", "off", "--busy-poll"});
  EXPECT_EQ(o.dataplane, "afxdp");
  EXPECT_EQ(o.queues, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(o.xdp_mode, "generic");
  EXPECT_TRUE(o.busy_poll);
  auto d = parse({"--dataplane", "afxdp", "--interface", "veth0"});
  EXPECT_EQ(d.queues, std::vector<int>{0});
  // Fewer workers than queues: they share them out.
  auto w = parse({"--dataplane", "afxdp", "--interface", "veth0", "--queues", "0-3", "--workers",
                  "2"});
  EXPECT_EQ(w.workers, 2);
}

TEST(Options, ParsesFlags) {
  auto o = parse({"--listen", "127.0.0.1:1", "--listen=[::1]:2", "--retry", "on", "--workers",
                  "3", "--cpus", "0-1", "--log-level", "debug", "--docroot", "/tmp"});
  ASSERT_EQ(o.listen.size(), 2u);
  EXPECT_EQ(o.listen[1].to_string(), "[::1]:2");
  EXPECT_EQ(o.retry, xdpq::quic::RetryMode::on);
  EXPECT_EQ(o.workers, 3);
  EXPECT_EQ(o.cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(o.docroot, "/tmp");
}

TEST(Options, ErrorsNameTheFlag) {
  EXPECT_NE(error_of({"--listen", "nope"}).find("--listen"), std::string::npos);
  EXPECT_NE(error_of({"--retry", "sometimes"}).find("off, on or auto"), std::string::npos);
  EXPECT_NE(error_of({"--bogus"}).find("unknown option"), std::string::npos);
  EXPECT_NE(error_of({"--workers"}).find("missing value"), std::string::npos);
  EXPECT_NE(error_of({"--workers", "0"}).find("from 1 to 127"), std::string::npos);
  EXPECT_NE(error_of({"--cert", "x.pem"}).find("--cert and --key"), std::string::npos);
  EXPECT_NE(error_of({"--dataplane", "afxdp"}).find("needs --interface"), std::string::npos);
  EXPECT_NE(error_of({"--interface", "eth0"}).find("--dataplane afxdp"), std::string::npos);
  EXPECT_NE(error_of({"--dataplane", "afxdp", "--interface", "eth0", "--xdp-mode", "fast"})
                .find("--xdp-mode"),
            std::string::npos);
  EXPECT_NE(error_of({"--dataplane", "afxdp", "--interface", "eth0", "--queues", "0-1",
                      "--workers", "3"})
                .find("more workers than the 2 queues"),
            std::string::npos);
  EXPECT_NE(error_of({"--dataplane", "afxdp", "--interface", "eth0", "--queues", "255-256"})
                .find("queue 256 is past"),
            std::string::npos);
  EXPECT_NE(error_of({"--dataplane", "afxdp", "--interface", "eth0", "--queues", "0-2,1"})
                .find("queue 1 is listed twice"),
            std::string::npos);
  // Two workers pinned to one CPU: it was taken without a word.
  EXPECT_NE(error_of({"--cpus", "0-2,1"}).find("--cpus: CPU 1 is listed twice"), std::string::npos);
  EXPECT_NE(error_of({"--log-level", "loud"}).find("--log-level"), std::string::npos);
}

TEST(Options, SwitchesTakeNoInlineValue) {
  // "--serve-dotfiles=false" turned dotfile serving on.
  for (const char *bad : {"--serve-dotfiles=false", "--xdp-replace=no", "--no-tcp=1",
                          "--version=2"}) {
    EXPECT_NE(error_of({bad}).find("takes no value"), std::string::npos) << bad;
  }
  EXPECT_EQ(parse({"--workers=3"}).workers, 3);
}

TEST(Options, HelpDocumentsEveryFlag) {
  std::string help = usage_text();
  for (const char *flag :
       {"--listen", "--dataplane", "--workers", "--cpus", "--cert", "--key", "--docroot",
        "--secrets", "--retry", "--retry-threshold", "--idle-timeout", "--max-streams",
        "--max-header-size", "--max-header-fields", "--max-connections", "--no-early-data",
        "--log-level", "--check-config", "--help", "--version", "--interface", "--queues",
        "--xdp-mode", "--zerocopy", "--busy-poll", "--xdp-replace", "--no-tcp", "--h2c-listen",
        "--tcp-max-connections", "--tcp-handshake-timeout", "--tcp-header-timeout",
        "--tcp-idle-timeout", "--tcp-write-timeout"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

TEST(Options, QuicLb) {
  auto o = parse({"--quic-lb-server-id", "0A01", "--secrets", "/tmp/s"});
  EXPECT_EQ(o.quic_lb_server_id, (std::vector<uint8_t>{0x0a, 0x01}));
  EXPECT_EQ(o.quic_lb_config_id, 0);
  EXPECT_EQ(o.quic_lb_nonce_length, 14u); // one AES block with the server ID
  EXPECT_EQ(o.quic_lb_mode, "encrypted");
  auto p = parse({"--quic-lb-server-id", "010203040506070809", "--quic-lb-config-id", "6",
                  "--quic-lb-nonce-length", "10", "--quic-lb-mode", "plaintext", "--secrets",
                  "/tmp/s"});
  EXPECT_EQ(p.quic_lb_config_id, 6);
  EXPECT_EQ(p.quic_lb_nonce_length, 10u);
  EXPECT_EQ(p.quic_lb_mode, "plaintext");
  EXPECT_EQ(parse({"--quic-lb-server-id", "0102030405060708090a0b", "--secrets", "/s"})
                .quic_lb_nonce_length,
            8u);
  // The draft allows 4-byte nonces; with our worker byte in them they would
  // repeat after a few thousand CIDs: 8 at least, so 11 server ID bytes
  // (12 to 15 were taken, then refused with any nonce).
  EXPECT_NE(error_of({"--quic-lb-server-id", "0102030405060708090a0b0c", "--secrets", "/s"})
                .find("1 to 11 bytes"),
            std::string::npos);
  EXPECT_TRUE(parse({}).quic_lb_server_id.empty());

  EXPECT_NE(error_of({"--quic-lb-server-id", "01"}).find("needs --secrets"), std::string::npos);
  for (const char *bad : {"", "0", "zz", "0102030405060708090a0b0c0d0e0f10"}) {
    EXPECT_NE(error_of({"--quic-lb-server-id", bad, "--secrets", "/s"}).find("1 to 11 bytes"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of({"--quic-lb-server-id", "01", "--secrets", "/s", "--quic-lb-config-id", "7"})
                .find("from 0 to 6"),
            std::string::npos);
  EXPECT_NE(error_of({"--quic-lb-server-id", "01", "--secrets", "/s", "--quic-lb-nonce-length",
                      "3"})
                .find("from 8 to 18"),
            std::string::npos);
  EXPECT_NE(error_of({"--quic-lb-server-id", "0102", "--secrets", "/s", "--quic-lb-nonce-length",
                      "18"})
                .find("exceed 19 bytes"),
            std::string::npos);
  EXPECT_NE(error_of({"--quic-lb-server-id", "01", "--secrets", "/s", "--quic-lb-mode", "rot13"})
                .find("encrypted or plaintext"),
            std::string::npos);
  EXPECT_NE(error_of({"--quic-lb-mode", "plaintext"}).find("go with --quic-lb-server-id"),
            std::string::npos);
  for (const char *flag : {"--quic-lb-server-id", "--quic-lb-config-id", "--quic-lb-nonce-length",
                           "--quic-lb-mode"}) {
    EXPECT_NE(std::string(usage_text()).find(flag), std::string::npos) << flag;
  }
}

TEST(Options, ResponseHeaders) {
  auto o = parse({"--response-header", "Strict-Transport-Security:  max-age=63072000 ",
                  "--response-header", "Server: edge", "--response-header", "server: edge-2"});
  ASSERT_EQ(o.response_headers.size(), 2u);
  EXPECT_EQ(o.response_headers[0].name, "strict-transport-security");
  EXPECT_EQ(o.response_headers[0].value, "max-age=63072000");
  EXPECT_EQ(o.response_headers[1].name, "server"); // given again: replaced
  EXPECT_EQ(o.response_headers[1].value, "edge-2");
  EXPECT_NE(error_of({"--response-header", "no colon"}).find("expected \"Name: value\""),
            std::string::npos);
  EXPECT_NE(error_of({"--response-header", "Bad Name: x"}).find("is not a token"),
            std::string::npos);
  EXPECT_NE(error_of({"--response-header", std::string("X-A: b\r\nSet-Cookie: c", 22)})
                .find("control character"),
            std::string::npos);
  EXPECT_NE(error_of({"--response-header", "Content-Length: 5"}).find("not configurable"),
            std::string::npos);
  EXPECT_NE(error_of({"--response-header", "Transfer-Encoding: chunked"}).find("not configurable"),
            std::string::npos);
  EXPECT_NE(error_of({"--response-header", ":status: 200"}).find("expected"), std::string::npos);
}
