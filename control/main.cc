// xdpqd: the xdpq daemon.

#include "base/log.h"
#include "control/config.h"
#include "control/options.h"
#include "control/server.h"
#include "http/tcp_session.h"
#include "http/tcp_tls.h"

#include <cstdio>

#include "xdpq_version.h"

int main(int argc, char **argv) {
  using namespace xdpq::control;
  // Before anything touches OpenSSL.
  if (!xdpq::http::use_block_cache_for_openssl())
    std::fprintf(stderr, "xdpqd: OpenSSL allocated before start; its buffers use malloc\n");
  block_server_signals();
  xdpq::http::init_h1_parsing(); // process-wide, before any worker parses
  // Started by a running xdpqd (binary upgrade): a failure from here on is
  // reported to it too, so `xdpqctl upgrade` can say why.
  const int upgrade_fd = take_upgrade_fd();
  Options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "xdpqd: %s\n", e.what());
    report_upgrade_failure(upgrade_fd, e.what());
    return 2;
  }
  if (opts.help) {
    std::fputs(usage_text(), stdout);
    return 0;
  }
  if (opts.print_default_config) {
    std::fputs(default_config_text(), stdout);
    return 0;
  }
  if (opts.version) {
    std::printf("xdpqd %s\n", XDPQ_VERSION);
    return 0;
  }
  try {
    if (!opts.check_config) raise_descriptor_limit();
    Server server(opts, std::vector<std::string>(argv, argv + argc), upgrade_fd);
    if (opts.check_config) {
      std::printf("xdpqd: configuration OK\n");
      return 0;
    }
    return server.run();
  } catch (const UsageError &e) {
    std::fprintf(stderr, "xdpqd: %s\n", e.what());
    report_upgrade_failure(upgrade_fd, e.what());
    return 2;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "xdpqd: %s\n", e.what());
    report_upgrade_failure(upgrade_fd, e.what());
    return 1;
  }
}
