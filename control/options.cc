#include "control/options.h"

#include "bpf/xdpq_shared.h"
#include "control/config.h"
#include "base/hex.h"
#include "base/log.h"
#include "dataplane/cpu.h"
#include "http/response_head.h"

#include <net/if.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace xdpq::control {

const char *usage_text() {
  return R"(Usage: xdpqd [OPTIONS]

xdpq: an HTTP/3 server (QUIC on ngtcp2, HTTP/3 on nghttp3).

Listening and dataplane:
  --listen ADDR:PORT      Address to serve QUIC on; repeatable. IPv6 in
                          brackets: [::1]:4433. Default: 0.0.0.0:4433 and
                          [::]:4433.
  --dataplane socket|afxdp
                          Datagram path: 'socket' (kernel UDP sockets with
                          GSO/GRO, the default) or 'afxdp' (an XDP program
                          steers the listen addresses' UDP into AF_XDP
                          sockets; needs --interface and root or
                          CAP_NET_ADMIN+CAP_BPF+CAP_PERFMON+CAP_NET_RAW+
                          CAP_IPC_LOCK).
  --interface IF          AF_XDP: the network interface to attach to.
  --queues LIST           AF_XDP: NIC queues to serve (default 0). One
                          worker each, unless --workers is smaller: then
                          worker i serves queues i, i+N, i+2N... of the
                          list on one shared UMEM. Steer QUIC to them
                          with ethtool flow rules or RSS.
  --xdp-mode MODE         AF_XDP: native, generic or auto (default: auto,
                          native, falling back to generic with the reason
                          logged; native fails where the driver has none).
  --zerocopy MODE         AF_XDP: auto (default), on or off.
  --busy-poll             AF_XDP: preferred busy polling (SO_PREFER_BUSY_POLL,
                          SO_BUSY_POLL_BUDGET): while it spins (at least
                          50 us after its last work, --spin-us for more)
                          each worker runs its queues' NAPI through
                          recvfrom() instead of waiting for interrupts.
  --xdp-replace           AF_XDP: replace an XDP program someone else
                          attached (default: refuse, naming it).
  --kernel-trains N       AF_XDP hybrid TX: a train of N or more datagrams
                          to one peer leaves through the kernel's UDP
                          socket as one UDP GSO send; receive and shorter
                          runs stay on AF_XDP. 0 turns it off. Default:
                          4 in copy mode (where the TX ring costs an skb
                          per frame), 0 in zero-copy mode.
  --spin-us N             Each worker keeps polling, without sleeping,
                          for N microseconds after its last work (lower
                          wakeup latency for a core's idle time; default
                          0: sleep in epoll as soon as idle).
  --workers N             Number of worker threads (one UDP socket per
                          listen address each, SO_REUSEPORT). Default: one
                          per CPU in --cpus, or per available CPU; with
                          --dataplane afxdp, one per queue of --queues.
  --cpus LIST             Pin worker i to the i-th CPU of LIST ("0-3,6").

TLS and content:
  --cert FILE             Certificate chain (PEM). Without --cert/--key a
                          self-signed certificate is generated at start-up
                          and its SHA-256 fingerprint logged.
  --key FILE              Private key (PEM) for --cert.
  --docroot DIR           Serve files under DIR. Default: an embedded page.
                          Regular files only; names starting with '.' (but
                          .well-known) are 404 unless --serve-dotfiles.
  --serve-dotfiles        Also serve dotfiles (.git/, .env, ...).
  --no-test-routes        No /echo and /bytes/N (the benchmark and test
                          routes): those paths come from the document root.
  --file-cache-entries N  Open files each worker keeps cached (default 4096).
  --file-cache-bytes N    File contents each worker keeps in memory
                          (default 67108864).
  --file-cache-max-file N Files up to N bytes are served from memory, larger
                          ones read on demand (default 65536).
  --file-cache-revalidate-ms MS
                          A cached file is checked against the disk at most
                          this often: changes show within MS (default 1000).
  --secrets FILE          Keys for stateless reset, address-validation
                          tokens and session tickets; created (mode 0600)
                          if missing and reused across restarts. Default:
                          generated in memory for this run only.

Scale-out behind a load balancer (QUIC-LB, see docs/scale-out.md):
  --quic-lb-server-id HEX This node's server ID (1 to 11 bytes in hex) in
                          every connection ID it issues, in the format of
                          draft-ietf-quic-load-balancers, so a balancer with
                          the same configuration routes a connection to
                          this node whatever the client's address. Needs
                          --secrets: every node shares its keys.
  --quic-lb-config-id N   The configuration's rotation codepoint, 0 to 6
                          (default 0).
  --quic-lb-nonce-length N
                          Nonce bytes after the server ID, 8 to 18 (its
                          first byte names the worker; the rest must not
                          repeat); server ID and nonce together at most 19
                          (default: 16 minus the server ID's length, so
                          that encrypted IDs take one AES block, and at
                          least 8).
  --quic-lb-mode MODE     encrypted (default: AES-128 with quic_lb_key from
                          the secrets file) or plaintext (the server ID
                          readable by anyone on the path).

QUIC behaviour and limits:
  --retry off|on|auto     Address validation with Retry: never, always, or
                          (auto, default) while at least
                          --retry-threshold handshakes are in progress.
  --retry-threshold N     Handshakes in progress per worker before auto
                          Retry starts (default 128).
  --retry-rate N          Auto Retry also starts while new handshakes arrive
                          faster than N per second per worker, as in a flood
                          of junk Initials that fail fast (default 5000,
                          above one core's handshake rate; 0: never).
  --per-source-connections N
                          Connections one source (an IPv4 address or an
                          IPv6 /64) may hold per worker, QUIC and TCP each
                          (default 256; 0: no cap).
  --per-source-rate N     New QUIC connections per second one source may open
                          per worker before it must prove its address: past
                          it (bursts of twice that) an Initial without a
                          token gets a Retry, which costs the server one
                          packet and a forged source its flood (default
                          5000, as a proven source's: one load-generating
                          host needs no Retry; 0: no cap).
  --per-source-validated-rate N
                          New connections per second a proven source (a
                          Retry token, or a TCP handshake) may
                          open per worker; past it QUIC answers
                          CONNECTION_REFUSED and TCP closes the connection
                          (default 5000, above one core's handshake rate,
                          so one load-generating host is not throttled;
                          0: no cap).
  --idle-timeout MS       Idle timeout in milliseconds (default 30000).
  --handshake-timeout MS  A QUIC handshake not complete after MS is dropped
                          (default 10000). On very lossy paths (30 % each
                          way) retransmission backoff alone can pass 10 s.
  --header-timeout MS     An HTTP/3 request whose header section is not whole
                          MS after it began is reset (default 10000; TCP's
                          is --tcp-header-timeout).
  --max-streams N         Concurrent request streams per connection
                          (default 100).
  --qpack-table-capacity N
                          Bytes of QPACK dynamic table clients may use to
                          compress request headers (default 0: none; each
                          reference to it costs an acknowledgement, a
                          datagram of its own when the response waits on
                          an upstream, and the table is memory a client
                          fills on every connection).
  --max-header-size N     Largest request header section in bytes, enforced
                          with 431 (default 16384).
  --max-header-fields N   Most request header fields, enforced with 431
                          (default 128).
  --max-connections N     Connections per worker (default 65536).
  --quic-memory-per-worker N
                          Bytes ngtcp2 and nghttp3 may hold for a worker's
                          connections (out-of-order data, packets in
                          flight, header sections); past it the
                          connections holding the most are closed
                          (default 1073741824; 0: no limit).
  --max-request-body N    Largest request body in bytes, on every protocol;
                          over it: 413 (default 16777216).
  --max-body-per-connection N
                          Request bodies (and /echo responses made from
                          them) one connection may make a worker hold at
                          once; over it the request is refused (HTTP/3
                          H3_REQUEST_REJECTED, HTTP/2 REFUSED_STREAM,
                          HTTP/1.1 503). Default 16777216.
  --max-body-per-worker N The same for all of a worker's connections
                          together (default 268435456).
  --no-early-data         Refuse 0-RTT.

TCP side (HTTP/2 and HTTP/1.1 over TLS, advertising HTTP/3 with Alt-Svc):
  --no-tcp                Do not listen on TCP (default: TLS on every --listen
                          address and port, answered by the kernel's TCP).
  --h2c-listen ADDR:PORT  Also serve cleartext HTTP/2 (prior knowledge) and
                          HTTP/1.1 there; repeatable; for benchmarks only.
  --tcp-max-connections N TCP connections per worker (default 10000).
  --tcp-handshake-timeout MS  TLS handshake deadline (default 10000).
  --tcp-header-timeout MS     a request's headers must arrive within this
                              (default 10000; slow clients are closed).
  --tcp-idle-timeout MS       idle keep-alive connections (default 60000).
  --tcp-write-timeout MS      output pending without progress (a client
                              that stopped reading; default 30000).

Reverse proxy (see docs/proxy.md):
  --proxy PREFIX=URL[,URL...]
                          Requests whose path starts with PREFIX go to
                          these upstreams (plain HTTP/1.1: http://HOST:PORT
                          or unix:/path), the path unchanged; repeatable,
                          the longest prefix wins; the rest is served as
                          before. Several URLs are balanced, skipping ones
                          that refused a connection (for a back-off of 2 s,
                          doubling to 64 s while they keep refusing).
  --proxy-connect-timeout MS
                          A connect to an upstream not done within MS
                          fails (the next upstream is tried, else 502;
                          default 5000).
  --proxy-timeout MS      No response head within MS of the request being
                          sent: 504; after the head, MS without a byte
                          either way resets the client's stream
                          (default 30000).
  --proxy-client-timeout MS
                          A client that takes no byte of a proxied
                          response for MS while the proxy holds all it may
                          of it (or all of it) gets its stream reset, and
                          the upstream connection is closed (default
                          60000).
  --proxy-tunnel-timeout MS
                          A tunnel (an HTTP/1.1 client's WebSocket switched
                          by the upstream's 101) with no byte either way
                          for MS is closed (default 3600000).
  --proxy-idle-timeout MS Pooled keep-alive connections unused for MS are
                          closed (default 30000).
  --proxy-max-idle N      Keep-alive connections pooled per upstream and
                          worker (default 32).
  --proxy-max-connections N
                          Connections per upstream and worker (default
                          512); when every upstream of a route is at it,
                          requests wait in the route's queue.
  --proxy-queue N         Requests waiting per route and worker for a
                          connection (default 4096); past it: 503. 0: none
                          wait.
  --proxy-queue-timeout MS
                          A request waiting longer for a connection gets
                          503 (default 5000).
  --proxy-balancing round-robin|least-outstanding
                          How a route picks among its upstreams (default
                          round-robin).
  --proxy-trusted CIDR    Clients in CIDR (other proxies) may send their own
                          X-Forwarded-For/-Proto/-Host, which are kept and
                          appended to; repeatable. From anyone else they
                          are removed and replaced. Default: nobody.
  --proxy-via             Add "via: 1.1 xdpq" to proxied requests.
  --no-proxy-forwarded-headers
                          Pass requests without adding X-Forwarded-* (the
                          client's own are still removed unless trusted).
  --proxy-health-check PATH
                          Active health checks (default: none): every
                          worker sends GET PATH to each upstream on a
                          connection of its own; a 2xx or 3xx passes, and
                          an upstream failing one gets no requests until
                          one passes.
  --proxy-health-interval MS
                          Time between a worker's checks of an upstream
                          (default 2000).
  --proxy-health-timeout MS
                          A check without a response head within MS fails
                          (default 1000).

Operation:
  --config FILE           Read a TOML configuration file (see
                          --print-default-config); flags override it.
  --print-default-config  Print every key with its default and exit.
  --control-socket PATH   Unix socket for xdpqctl (mode 0600, owner only).
                          Default: /run/xdpq/xdpqd.sock as root or where
                          /run/xdpq is writable (the unit's user), else
                          $XDG_RUNTIME_DIR/xdpqd.sock, else
                          /tmp/xdpqd-UID.sock.
  --metrics ADDR:PORT     Serve Prometheus metrics over HTTP there (keep it on
                          loopback or an admin network). Default: off.
  --echo                  Benchmark mode: echo every UDP datagram back on the
                          chosen dataplane, no QUIC and no TCP (the bare
                          packet path); refused with --proxy or --h2c-listen.
  --drain-timeout MS      SIGTERM / 'xdpqctl drain': GOAWAY, let requests in
                          flight finish for up to MS (default 10000), then
                          close everything and detach XDP.
  --log-level LEVEL       error, warn, info (default) or debug.
  --response-header 'NAME: VALUE'
                          Add this field to every response that lacks it
                          (repeatable): Strict-Transport-Security,
                          Cache-Control, a Server of your own...
  --access-log PATH       Log every request to PATH, one line each in the
                          combined format with the request time; reopened
                          on SIGUSR1 (logrotate) and SIGHUP. Default: no
                          access log.
  --check-config [FILE]   Validate the options and FILE (files readable,
                          addresses valid, the control socket's path
                          usable; on AF_XDP the interface and its
                          queues present), print the result and exit.
  --help                  This text.
  --version               Version.

Every on/off switch has its opposite, to undo what a configuration file
set: --tcp, --early-data, --test-routes, --proxy-forwarded-headers,
--no-busy-poll, --no-xdp-replace, --no-serve-dotfiles, --no-proxy-via.

Routes on every protocol: --proxy prefixes first, then the built-in
/healthz, /bytes/N (N bytes, up to 64 MiB) and POST /echo (the last two
not with --no-test-routes); everything else from the document root.

Exit status: 0 on clean shutdown (SIGINT/SIGTERM), 1 on a runtime failure,
2 for a usage or configuration error (the reason on stderr).
)";
}

namespace {

// Each on/off switch and its opposite.
constexpr std::pair<std::string_view, std::string_view> SWITCHES[] = {
    {"--no-tcp", "--tcp"},
    {"--no-early-data", "--early-data"},
    {"--no-test-routes", "--test-routes"},
    {"--no-proxy-forwarded-headers", "--proxy-forwarded-headers"},
    {"--busy-poll", "--no-busy-poll"},
    {"--xdp-replace", "--no-xdp-replace"},
    {"--serve-dotfiles", "--no-serve-dotfiles"},
    {"--proxy-via", "--no-proxy-via"},
};

} // namespace

std::string_view opposite_switch(std::string_view flag) {
  for (const auto &[a, b] : SWITCHES) {
    if (flag == a) return b;
    if (flag == b) return a;
  }
  return {};
}

namespace {

uint64_t parse_number(std::string_view flag, std::string_view v, uint64_t min, uint64_t max) {
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc{} || end != v.data() + v.size() || n < min || n > max) {
    throw UsageError(std::string(flag) + ": expected a number from " + std::to_string(min) +
                     " to " + std::to_string(max) + ", got '" + std::string(v) + "'");
  }
  return n;
}

} // namespace

namespace {

// Applies one layer of flags (the config file's, then the command line's).
// Within a layer the first --listen / --h2c-listen replaces what earlier
// layers set; later ones add to it.
void apply_flags(Options &o, const std::vector<std::string> &args) {
  bool listen_given = false;
  bool h2c_given = false;
  bool proxy_given = false;
  bool trusted_given = false;
  std::string origin; // "file:line: key" for flags that came from a file
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].empty() && args[i][0] == '\x01') {
      origin = args[i].substr(1);
      continue;
    }
    try {
    std::string_view arg = args[i];
    std::string_view value;
    bool has_inline = false;
    if (arg.starts_with("--") && arg.find('=') != std::string_view::npos) {
      auto eq = arg.find('=');
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    bool took_value = false;
    auto need = [&]() -> std::string_view {
      took_value = true;
      if (has_inline) return value;
      if (i + 1 >= args.size()) throw UsageError(std::string(arg) + ": missing value");
      return args[++i];
    };
    // An empty path would quietly mean the built-in default (a self-signed
    // certificate, keys in memory, the embedded page).
    auto need_path = [&]() -> std::string {
      std::string v(need());
      if (v.empty()) throw UsageError(std::string(arg) + ": expected a path, got an empty one");
      return v;
    };
    if (arg == "--help" || arg == "-h") {
      o.help = true;
    } else if (arg == "--version") {
      o.version = true;
    } else if (arg == "--check-config") {
      o.check_config = true;
      took_value = true; // its FILE, if any, was read before the other flags
      if (!has_inline && i + 1 < args.size() && !args[i + 1].starts_with("--")) ++i;
    } else if (arg == "--config") {
      took_value = true; // read before the other flags
      if (!has_inline) ++i;
    } else if (arg == "--print-default-config") {
      o.print_default_config = true;
    } else if (arg == "--control-socket") {
      o.control_socket = need_path();
    } else if (arg == "--metrics") {
      auto v = need();
      std::string why;
      auto a = dataplane::parse_address(v, &why);
      if (!a) throw UsageError("--metrics " + std::string(v) + ": " + why);
      o.metrics = *a;
    } else if (arg == "--proxy") {
      auto v = need();
      if (!proxy_given) o.proxy.routes.clear();
      proxy_given = true;
      try {
        o.proxy.add_route(v);
      } catch (const http::ProxyConfigError &e) {
        throw UsageError(std::string("--proxy ") + e.what());
      }
    } else if (arg == "--proxy-connect-timeout") {
      o.proxy.connect_timeout_ns = parse_number(arg, need(), 1, 3600'000) * 1'000'000ull;
    } else if (arg == "--proxy-timeout") {
      o.proxy.response_timeout_ns = parse_number(arg, need(), 1, 3600'000) * 1'000'000ull;
    } else if (arg == "--proxy-client-timeout") {
      o.proxy.client_timeout_ns = parse_number(arg, need(), 1, 3600'000) * 1'000'000ull;
    } else if (arg == "--proxy-tunnel-timeout") {
      o.proxy.tunnel_timeout_ns = parse_number(arg, need(), 1, 86'400'000) * 1'000'000ull;
    } else if (arg == "--proxy-idle-timeout") {
      o.proxy.idle_timeout_ns = parse_number(arg, need(), 1, 3600'000) * 1'000'000ull;
    } else if (arg == "--proxy-max-idle") {
      o.proxy.max_idle_per_upstream = parse_number(arg, need(), 0, 1u << 16);
    } else if (arg == "--proxy-max-connections") {
      o.proxy.max_conns_per_upstream = parse_number(arg, need(), 1, 1u << 20);
    } else if (arg == "--proxy-queue") {
      o.proxy.max_queue = parse_number(arg, need(), 0, 1u << 20);
    } else if (arg == "--proxy-queue-timeout") {
      o.proxy.queue_timeout_ns = parse_number(arg, need(), 1, 3600'000) * 1'000'000ull;
    } else if (arg == "--proxy-balancing") {
      auto v = need();
      if (v == "round-robin") o.proxy.balancing = http::Balancing::round_robin;
      else if (v == "least-outstanding") o.proxy.balancing = http::Balancing::least_outstanding;
      else {
        throw UsageError("--proxy-balancing: expected round-robin or least-outstanding, got '" +
                         std::string(v) + "'");
      }
    } else if (arg == "--proxy-trusted") {
      auto v = need();
      if (!trusted_given) o.proxy.trusted.clear();
      trusted_given = true;
      try {
        o.proxy.trusted.push_back(http::parse_cidr(v));
      } catch (const http::ProxyConfigError &e) {
        throw UsageError(std::string("--proxy-trusted ") + e.what());
      }
    } else if (arg == "--proxy-via" || arg == "--no-proxy-via") {
      o.proxy.via = arg == "--proxy-via";
    } else if (arg == "--no-proxy-forwarded-headers" || arg == "--proxy-forwarded-headers") {
      o.proxy.forwarded_headers = arg == "--proxy-forwarded-headers";
    } else if (arg == "--proxy-health-check") {
      std::string v(need());
      const bool printable =
          std::all_of(v.begin(), v.end(), [](char c) { return c > ' ' && c < 0x7f; });
      if (!v.starts_with('/') || v.size() > 1024 || !printable) {
        throw UsageError("--proxy-health-check: expected a path starting with '/' (visible ASCII, "
                         "at most 1024 bytes), got '" + v + "'");
      }
      o.proxy.health_check_path = std::move(v);
    } else if (arg == "--proxy-health-interval") {
      o.proxy.health_interval_ns = parse_number(arg, need(), 10, 3600'000) * 1'000'000ull;
    } else if (arg == "--proxy-health-timeout") {
      o.proxy.health_timeout_ns = parse_number(arg, need(), 10, 3600'000) * 1'000'000ull;
    } else if (arg == "--echo") {
      o.echo = true;
    } else if (arg == "--drain-timeout") {
      o.drain_timeout_ms = parse_number(arg, need(), 0, 3600'000);
    } else if (arg == "--no-early-data" || arg == "--early-data") {
      o.early_data = arg == "--early-data";
    } else if (arg == "--listen") {
      auto v = need();
      std::string why;
      auto a = dataplane::parse_address(v, &why);
      if (!a) throw UsageError("--listen " + std::string(v) + ": " + why);
      if (!listen_given) o.listen.clear();
      listen_given = true;
      o.listen.push_back(*a);
      o.listen_set = true;
    } else if (arg == "--dataplane") {
      auto v = need();
      if (v == "afxdp") {
#ifndef XDPQ_HAVE_AFXDP
        throw UsageError("--dataplane afxdp: this xdpqd was built without AF_XDP "
                         "(XDPQ_AFXDP=OFF); use --dataplane socket");
#endif
      } else if (v != "socket") {
        throw UsageError("--dataplane: expected socket or afxdp, got '" + std::string(v) + "'");
      }
      o.dataplane = v;
    } else if (arg == "--interface") {
      o.interface = need();
    } else if (arg == "--queues") {
      auto v = need();
      std::string why;
      auto q = dataplane::parse_cpu_list(v, &why);
      if (!q) throw UsageError("--queues " + std::string(v) + ": " + why);
      o.queues = *q;
    } else if (arg == "--xdp-mode") {
      auto v = need();
      if (v != "native" && v != "generic" && v != "auto") {
        throw UsageError("--xdp-mode: expected native, generic or auto, got '" + std::string(v) + "'");
      }
      o.xdp_mode = v;
    } else if (arg == "--zerocopy") {
      auto v = need();
      if (v != "auto" && v != "on" && v != "off") {
        throw UsageError("--zerocopy: expected auto, on or off, got '" + std::string(v) + "'");
      }
      o.zerocopy = v;
    } else if (arg == "--no-tcp" || arg == "--tcp") {
      o.tcp = arg == "--tcp";
    } else if (arg == "--h2c-listen") {
      auto v = need();
      std::string why;
      auto a = dataplane::parse_address(v, &why);
      if (!a) throw UsageError("--h2c-listen " + std::string(v) + ": " + why);
      if (!h2c_given) o.h2c_listen.clear();
      h2c_given = true;
      o.h2c_listen.push_back(*a);
    } else if (arg == "--tcp-max-connections") {
      o.tcp_max_connections = parse_number(arg, need(), 1, 1u << 20);
    } else if (arg == "--tcp-handshake-timeout") {
      o.tcp_handshake_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--tcp-header-timeout") {
      o.tcp_header_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--tcp-idle-timeout") {
      o.tcp_idle_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--tcp-write-timeout") {
      o.tcp_write_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--busy-poll" || arg == "--no-busy-poll") {
      o.busy_poll = arg == "--busy-poll";
    } else if (arg == "--xdp-replace" || arg == "--no-xdp-replace") {
      o.xdp_replace = arg == "--xdp-replace";
    } else if (arg == "--spin-us") {
      o.spin_us = parse_number(arg, need(), 0, 1000000);
    } else if (arg == "--kernel-trains") {
      o.kernel_trains = static_cast<int>(parse_number(arg, need(), 0, 64));
    } else if (arg == "--cert") {
      o.cert_file = need_path();
    } else if (arg == "--key") {
      o.key_file = need_path();
    } else if (arg == "--docroot") {
      o.docroot = need_path();
    } else if (arg == "--serve-dotfiles" || arg == "--no-serve-dotfiles") {
      o.serve_dotfiles = arg == "--serve-dotfiles";
    } else if (arg == "--no-test-routes" || arg == "--test-routes") {
      o.test_routes = arg == "--test-routes";
    } else if (arg == "--file-cache-entries") {
      o.file_cache_entries = parse_number(arg, need(), 0, 1u << 24);
    } else if (arg == "--file-cache-bytes") {
      o.file_cache_bytes = parse_number(arg, need(), 0, 1ull << 40);
    } else if (arg == "--file-cache-max-file") {
      o.file_cache_max_file = parse_number(arg, need(), 0, 1ull << 32);
    } else if (arg == "--file-cache-revalidate-ms") {
      o.file_cache_revalidate_ms = parse_number(arg, need(), 0, 3600'000);
    } else if (arg == "--secrets") {
      o.secrets_file = need_path();
    } else if (arg == "--quic-lb-server-id") {
      auto v = need();
      auto id = parse_hex(v);
      // With a nonce of 8 bytes or more, 11 fit in a connection ID's 19.
      if (!id || id->empty() || id->size() > 11) {
        throw UsageError("--quic-lb-server-id: expected 1 to 11 bytes in hex, got '" +
                         std::string(v) + "'");
      }
      o.quic_lb_server_id = *id;
    } else if (arg == "--quic-lb-config-id") {
      o.quic_lb_config_id = static_cast<int>(parse_number(arg, need(), 0, 6));
    } else if (arg == "--quic-lb-nonce-length") {
      o.quic_lb_nonce_length = parse_number(arg, need(), 8, 18);
    } else if (arg == "--quic-lb-mode") {
      auto v = need();
      if (v != "encrypted" && v != "plaintext") {
        throw UsageError("--quic-lb-mode: expected encrypted or plaintext, got '" +
                         std::string(v) + "'");
      }
      o.quic_lb_mode = v;
    } else if (arg == "--workers") {
      o.workers = static_cast<int>(parse_number(arg, need(), 1, 127));
    } else if (arg == "--cpus") {
      auto v = need();
      std::string why;
      auto cpus = dataplane::parse_cpu_list(v, &why);
      if (!cpus) throw UsageError("--cpus " + std::string(v) + ": " + why);
      o.cpus = *cpus;
    } else if (arg == "--retry") {
      auto v = need();
      if (v == "off") o.retry = quic::RetryMode::off;
      else if (v == "on") o.retry = quic::RetryMode::on;
      else if (v == "auto") o.retry = quic::RetryMode::automatic;
      else throw UsageError("--retry: expected off, on or auto, got '" + std::string(v) + "'");
    } else if (arg == "--retry-threshold") {
      o.retry_threshold = parse_number(arg, need(), 0, 1u << 20);
    } else if (arg == "--retry-rate") {
      o.retry_rate = parse_number(arg, need(), 0, 1u << 24);
    } else if (arg == "--per-source-connections") {
      o.per_source_connections = parse_number(arg, need(), 0, 1u << 24);
    } else if (arg == "--per-source-rate") {
      o.per_source_rate = parse_number(arg, need(), 0, 1u << 24);
    } else if (arg == "--per-source-validated-rate") {
      o.per_source_validated_rate = parse_number(arg, need(), 0, 1u << 24);
    } else if (arg == "--response-header") {
      auto v = need();
      http::Header h;
      std::string why = http::parse_response_field(v, h);
      if (!why.empty()) throw UsageError("--response-header '" + std::string(v) + "': " + why);
      // A name given again replaces the earlier value.
      std::erase_if(o.response_headers, [&](const http::Header &x) { return x.name == h.name; });
      o.response_headers.push_back(std::move(h));
    } else if (arg == "--access-log") {
      o.access_log = need_path();
    } else if (arg == "--log-level") {
      auto v = need();
      if (!log::parse_level(v)) {
        throw UsageError("--log-level: expected error, warn, info or debug, got '" +
                         std::string(v) + "'");
      }
      o.log_level = v;
    } else if (arg == "--handshake-timeout") {
      o.handshake_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--header-timeout") {
      o.header_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--idle-timeout") {
      o.idle_timeout_ms = parse_number(arg, need(), 100, 3600'000);
    } else if (arg == "--qpack-table-capacity") {
      o.qpack_table_capacity = parse_number(arg, need(), 0, 65536);
    } else if (arg == "--max-streams") {
      o.max_streams = parse_number(arg, need(), 1, 1u << 16);
    } else if (arg == "--max-header-size") {
      o.max_header_size = parse_number(arg, need(), 256, http::MAX_HEADER_SIZE_CEILING);
    } else if (arg == "--max-header-fields") {
      o.max_header_fields = parse_number(arg, need(), 8, 4096);
    } else if (arg == "--max-request-body") {
      o.max_request_body = parse_number(arg, need(), 0, 1ull << 32);
    } else if (arg == "--max-body-per-connection") {
      o.max_body_per_connection = parse_number(arg, need(), 0, 1ull << 34);
    } else if (arg == "--max-body-per-worker") {
      o.max_body_per_worker = parse_number(arg, need(), 0, 1ull << 40);
    } else if (arg == "--max-connections") {
      o.max_connections = parse_number(arg, need(), 1, 1u << 24);
    } else if (arg == "--quic-memory-per-worker") {
      o.quic_memory_per_worker = parse_number(arg, need(), 0, 1ull << 44);
    } else {
      throw UsageError("unknown option '" + args[i] + "' (see --help)");
    }
    // "--serve-dotfiles=false" must not turn a switch on.
    if (has_inline && !took_value) {
      throw UsageError(std::string(arg) + " takes no value (got '" + args[i] + "')");
    }
    if (!origin.empty()) {
      o.flag_origins[std::string(arg)] = origin;
    } else {
      o.flag_origins.erase(std::string(arg)); // the command line overrides the file
      if (auto other = opposite_switch(arg); !other.empty()) o.flag_origins.erase(std::string(other));
    }
    } catch (const UsageError &e) {
      if (origin.empty()) throw;
      throw UsageError(origin + ": " + e.what());
    }
  }
}

} // namespace

std::string Options::at(std::initializer_list<const char *> flags) const {
  for (const char *f : flags) {
    if (auto it = flag_origins.find(f); it != flag_origins.end()) return it->second + ": ";
  }
  return {};
}

Options parse_options(int argc, const char *const *argv) {
  std::vector<std::string> cli(argv + 1, argv + argc);
  // --config FILE (or --check-config FILE) is read first; flags override it.
  std::string config;
  bool config_given = false;
  for (size_t i = 0; i < cli.size(); ++i) {
    std::string_view a = cli[i];
    std::optional<std::string> file;
    if (a.starts_with("--config=")) file = std::string(a.substr(9));
    else if (a == "--config" && i + 1 < cli.size()) file = cli[++i];
    else if (a == "--config") throw UsageError("--config: missing value");
    else if (a.starts_with("--check-config=")) file = std::string(a.substr(15));
    else if (a == "--check-config" && i + 1 < cli.size() && !cli[i + 1].starts_with("--")) {
      file = cli[++i];
    }
    if (!file) continue;
    // An empty name (an unset variable) would start on the defaults, and
    // a second file would drop the first: neither without a word.
    if (file->empty()) {
      throw UsageError(std::string(a.substr(0, a.find('='))) +
                       ": expected a path, got an empty one");
    }
    if (config_given && *file != config) {
      throw UsageError("--config: one configuration file only (got '" + config + "' and '" +
                       *file + "')");
    }
    config_given = true;
    config = std::move(*file);
  }
  Options o;
  if (!config.empty()) {
    o.config_file = config;
    o.file_flags = config_file_flags(config);
    apply_flags(o, o.file_flags);
  }
  apply_flags(o, cli);
  // An error about settings that a file gave says where: the first of
  // flags that came from the file.
  auto at = [&o](std::initializer_list<const char *> flags) { return o.at(flags); };
  if (!o.listen_set) {
    o.listen.push_back(*dataplane::parse_address("0.0.0.0:4433"));
    o.listen.push_back(*dataplane::parse_address("[::]:4433"));
  }
  // Checked here, not at the bind, so that --check-config finds them and
  // names the file's line.
  // (Port 0 binds a port of the kernel's choosing each time: no conflict.)
  auto twice = [](const std::vector<dataplane::Address> &v) -> const dataplane::Address * {
    for (size_t i = 0; i < v.size(); ++i) {
      for (size_t j = i + 1; j < v.size(); ++j) {
        if (v[i] == v[j] && v[i].port() != 0) return &v[i];
      }
    }
    return nullptr;
  };
  if (auto *d = twice(o.listen)) {
    throw UsageError(at({"--listen"}) + "--listen: " + d->to_string() + " is listed twice");
  }
  if (auto *d = twice(o.h2c_listen)) {
    throw UsageError(at({"--h2c-listen"}) + "--h2c-listen: " + d->to_string() +
                     " is listed twice");
  }
  if (o.tcp && !o.echo) {
    for (const auto &a : o.h2c_listen) {
      if (a.port() != 0 && std::find(o.listen.begin(), o.listen.end(), a) != o.listen.end()) {
        throw UsageError(at({"--h2c-listen", "--listen"}) + "--h2c-listen " + a.to_string() +
                         ": TLS over TCP already listens there (a --listen address); use "
                         "another port, or --no-tcp");
      }
    }
  }
  if (o.dataplane == "afxdp") {
    for (const auto &a : o.listen) {
      if (a.port() == 0) {
        throw UsageError(at({"--listen"}) + "--listen " + a.to_string() +
                         ": --dataplane afxdp needs an explicit port");
      }
    }
    if (o.interface.empty()) {
      throw UsageError(at({"--dataplane"}) + "--dataplane afxdp needs --interface IF");
    }
    if (o.interface.size() >= IFNAMSIZ) {
      throw UsageError(at({"--interface"}) + "--interface " + o.interface +
                       ": longer than an interface name can be (" +
                       std::to_string(IFNAMSIZ - 1) + " bytes)");
    }
    if (o.queues.empty()) o.queues.push_back(0);
    for (int q : o.queues) {
      if (q >= XDPQ_MAX_QUEUES) {
        throw UsageError(at({"--queues"}) + "--queues: queue " + std::to_string(q) + " is past the XDP program's " +
                         std::to_string(XDPQ_MAX_QUEUES) + " queues (0-" +
                         std::to_string(XDPQ_MAX_QUEUES - 1) + ")");
      }
    }
    auto sorted = o.queues;
    std::sort(sorted.begin(), sorted.end());
    if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
      throw UsageError(at({"--queues"}) + "--queues: queue " + std::to_string(*d) +
                       " is listed twice");
    }
    if (o.workers > static_cast<int>(o.queues.size())) {
      throw UsageError(at({"--workers", "--queues"}) + "--workers " + std::to_string(o.workers) +
                       ": more workers than the " +
                       std::to_string(o.queues.size()) +
                       " queues of --queues (each worker serves at least one queue)");
    }
    if (o.workers == 0 && o.queues.size() > 127) {
      throw UsageError(at({"--queues"}) + "--queues: more than 127 queues need --workers N (at most 127), each "
                       "worker serving several queues");
    }
  } else {
    // AF_XDP's own settings would be ignored without a word on sockets.
    const char *given = !o.interface.empty()       ? "--interface"
                        : !o.queues.empty()        ? "--queues"
                        : o.xdp_mode != "auto"     ? "--xdp-mode"
                        : o.zerocopy != "auto"     ? "--zerocopy"
                        : o.busy_poll              ? "--busy-poll"
                        : o.xdp_replace            ? "--xdp-replace"
                        : o.kernel_trains >= 0     ? "--kernel-trains"
                                                   : nullptr;
    if (given) {
      throw UsageError(at({given, "--dataplane"}) + given +
                       " goes with --dataplane afxdp (the dataplane is " + o.dataplane + ")");
    }
  }
  {
    // Worker i runs on the i-th CPU: one listed twice would pin two
    // workers to one core, and leave a core the operator meant to use idle.
    auto sorted = o.cpus;
    std::sort(sorted.begin(), sorted.end());
    if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
      throw UsageError(at({"--cpus"}) + "--cpus: CPU " + std::to_string(*d) +
                       " is listed twice (two workers would share it)");
    }
  }
  if (o.echo && (!o.proxy.routes.empty() || !o.h2c_listen.empty())) {
    // Echo mode serves no HTTP at all.
    throw UsageError(at({"--echo", "--proxy", "--h2c-listen"}) +
                     "--echo (UDP echo, no HTTP) cannot go with " +
                     (o.proxy.routes.empty() ? "--h2c-listen" : "--proxy"));
  }
  if (o.max_body_per_connection < o.max_request_body) {
    throw UsageError(at({"--max-body-per-connection", "--max-request-body"}) +
                     "--max-body-per-connection (" + std::to_string(o.max_body_per_connection) +
                     ") must be at least --max-request-body (" +
                     std::to_string(o.max_request_body) + ")");
  }
  if (o.max_body_per_worker < o.max_body_per_connection) {
    throw UsageError(at({"--max-body-per-worker", "--max-body-per-connection"}) +
                     "--max-body-per-worker (" + std::to_string(o.max_body_per_worker) +
                     ") must be at least --max-body-per-connection (" +
                     std::to_string(o.max_body_per_connection) + ")");
  }
  if (o.quic_lb_server_id.empty()) {
    if (o.quic_lb_config_id >= 0 || o.quic_lb_nonce_length || !o.quic_lb_mode.empty()) {
      throw UsageError(at({"--quic-lb-config-id", "--quic-lb-nonce-length", "--quic-lb-mode"}) +
                       "--quic-lb-config-id, --quic-lb-nonce-length and --quic-lb-mode go with "
                       "--quic-lb-server-id");
    }
  } else {
    const size_t sid = o.quic_lb_server_id.size();
    if (o.quic_lb_config_id < 0) o.quic_lb_config_id = 0;
    if (o.quic_lb_mode.empty()) o.quic_lb_mode = "encrypted";
    if (o.quic_lb_nonce_length == 0) o.quic_lb_nonce_length = sid <= 8 ? 16 - sid : 8;
    if (sid + o.quic_lb_nonce_length > 19) {
      throw UsageError(at({"--quic-lb-server-id", "--quic-lb-nonce-length"}) +
                       "--quic-lb-server-id (" + std::to_string(sid) +
                       " bytes) and --quic-lb-nonce-length (" +
                       std::to_string(o.quic_lb_nonce_length) +
                       ") exceed 19 bytes together (a connection ID holds 20)");
    }
    if (o.secrets_file.empty()) {
      throw UsageError(at({"--quic-lb-server-id"}) +
                       "--quic-lb-server-id needs --secrets FILE: the nodes behind a balancer "
                       "must share their stateless reset, token and ticket keys (copy one "
                       "secrets file to every node)");
    }
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    throw UsageError(at({"--cert", "--key"}) +
                     "--cert and --key go together: give both, or neither for a "
                     "self-signed certificate");
  }
  return o;
}

} // namespace xdpq::control
