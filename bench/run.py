#!/usr/bin/python3
"""xdpq's side-by-side benchmark: the same server on AF_XDP and on kernel UDP
sockets, against ngtcp2's gtlsserver, Caddy, nginx 1.26 and HAProxy 3.0
(HTTP/3; the last two from a Debian 13 chroot, bench/peers.sh) and nginx
(HTTP/2 over TLS), under identical load, alternating A B A B, reporting
medians and ratios.

Topology: two network namespaces joined by a veth pair (GRO off on the
server side, which AF_XDP copy mode needs; the same for every variant).
Server pinned to one CPU, client to the other. All servers serve the same
static files from one document root.

One script (about 1100 lines): the variants' launch recipes, the matrix and
the report share one run's state; bench/summary.py and bench/breakdown.py
are the separate tools.

    bench/run.py --quick          # ~2 minutes
    bench/run.py                  # the full matrix, ~15 minutes
    bench/run.py --smoke          # one short cell: CI keeps the harness alive
    bench/run.py --compare OLD/build/release --variants xdpq-socket,base-socket \
        --cells '3B c=100'        # before/after a change, same client, alternating
    bench/peers.sh && bench/run.py --cells peers
                                  # xdpq (both dataplanes) against HAProxy 3.0 and
                                  # nginx 1.26 over HTTP/3, from a Debian 13 chroot
    bench/run.py --cells proxy    # the same four as reverse proxies in front of
                                  # one HTTP/1.1 upstream (Debian 12's nginx)

Writes OUT/results.json (raw runs, git commit, machine, exact commands),
OUT/report.md (medians, ratios) and OUT/*.png (plots). Benchmarks measure;
they never fail a build on a number.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from netns import Topology, sh  # noqa: E402

BODIES = {"3": 3, "16k": 16384, "64k": 65536, "1m": 1048576}
SERVER_CPU, CLIENT_CPU = "1", "0"
# nginx 1.26 and HAProxy 3.0 with HTTP/3 run from the Debian 13 chroot that
# bench/peers.sh makes (Debian 12 has neither HTTP/3 build).
CHROOT_PEERS = ("haproxy-h3", "nginx-h3")
DEFAULT_CHROOT = os.environ.get("XDPQ_TRIXIE", "/var/lib/xdpq-bench/trixie")
CHROOT_MARKER = ".xdpq-bench-complete"
# HAProxy answers from memory (`http-request return ... file`): the whole
# response must fit one buffer (tune.bufsize, raised to 32 KiB below), so it
# serves the 3 B and 16 KiB bodies only.
PEER_BODIES = {"haproxy-h3": ("3", "16k")}
# The peer comparison (--cells peers): the cells the product quotes, on the
# static files every server serves, and a handshake per request.
PEER_CELLS = [dict(body="3", c=c, m=m, handshake=False) for c, m in
              ((1, 1), (10, 1), (100, 1), (100, 32))]
PEER_CELLS += [dict(body="16k", c=10, m=1, handshake=False),
               dict(body="3", c=16, m=1, handshake=True)]
# The proxy comparison (--cells proxy): the same /b3 request, answered by one
# HTTP/1.1 upstream behind each proxy (class Upstream below).
PROXY_CELLS = [dict(body="3", c=c, m=m, handshake=False, proxy=True) for c, m in
               ((10, 1), (100, 32))]
# Servers that can proxy: xdpqd (--proxy) and the chroot's nginx and HAProxy.
PROXY_PEERS = CHROOT_PEERS
# The upstream shares the client's CPU, not the server's: the figure compared
# is the proxy's own CPU per request (its process, /proc/PID/stat), and on a
# 2-vCPU machine the server's core must hold the proxy alone so that the
# upstream neither steals its cycles nor evicts its caches between requests.
# The upstream's cost is the same for every proxy; it shows in machine CPU
# per request (and lowers every proxy's ceiling alike through the client).
UPSTREAM_CPU = CLIENT_CPU
UPSTREAM_PORT = 8081
# Idle keep-alive connections each proxy may keep to the upstream: as many
# as c=100 m=32 can have in flight (3200), so that no proxy closes and
# reopens connections for lack of room in its pool.
UPSTREAM_IDLE = 4096


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])  # utime + stime, in ticks
    except (OSError, IndexError):
        return 0


def peak_rss_kib(pid):
    """The process's peak resident set (VmHWM), in KiB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(pid):
    """pid and its children (ip netns exec / taskset exec in place, nginx forks)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    result = [pid]
    for k in kids:
        result += descendants(k)
    return result


def make_files(work):
    """The document root (BODIES as b3, b16k, ...) and a P-256 certificate
    under work: the same for every server. Returns (docroot, cert, key)."""
    docroot = os.path.join(work, "www")
    os.makedirs(docroot, exist_ok=True)
    for name, size in BODIES.items():
        with open(os.path.join(docroot, f"b{name}"), "wb") as f:
            f.write(b"x" * size)
    key = os.path.join(work, "key.pem")
    cert = os.path.join(work, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out",
                    cert, "-days", "2", "-subj", "/CN=localhost"], check=True,
                   capture_output=True)
    return docroot, cert, key


class Upstream:
    """The one HTTP/1.1 upstream every proxy variant forwards to: Debian 12's
    nginx (/usr/sbin/nginx, the host's, not the chroot's) in the server's
    namespace on 127.0.0.1:UPSTREAM_PORT, one worker pinned to UPSTREAM_CPU,
    keep-alive without a request limit, serving /b3 from its own document
    root (3 bytes: "u3" and a newline, so an answer that came through the
    upstream is told apart from the servers' own "xxx"). stub_status counts
    its accepted connections and requests: the run records both per cell,
    which shows whether a proxy reused its connections. Runs for the whole
    benchmark, so every proxy meets the same warm upstream."""

    BODY = b"u3\n"

    def __init__(self, work, ns):
        self.ns = ns
        self.dir = os.path.join(work, "upstream")
        root = os.path.join(self.dir, "www")
        os.makedirs(root, exist_ok=True)
        os.chmod(self.dir, 0o755)  # its worker runs as nobody
        with open(os.path.join(root, "b3"), "wb") as f:
            f.write(self.BODY)
        self.url = f"http://127.0.0.1:{UPSTREAM_PORT}"
        d = self.dir
        self.conf = f"""worker_processes 1;
worker_cpu_affinity {'10' if UPSTREAM_CPU == '1' else '01'};
worker_rlimit_nofile 20000;
daemon off; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 10000; }}
http {{ access_log off; default_type text/plain;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  keepalive_requests 1000000; keepalive_timeout 600s;
  # Head and body in one write (one segment) and the file's descriptor kept.
  sendfile off; open_file_cache max=16 inactive=600s; open_file_cache_valid 600s;
  server {{
    listen 127.0.0.1:{UPSTREAM_PORT} reuseport backlog=4096;
    root {root};
    location = /upstream-status {{ stub_status; }}
  }}
}}
"""
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(self.conf)
        self.command = ["taskset", "-c", UPSTREAM_CPU, "/usr/sbin/nginx", "-c",
                        os.path.join(d, "nginx.conf")]
        self.log = open(os.path.join(d, "stdout.log"), "w")
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, *self.command],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(100):
            if self.counters():
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not self.counters():
            self.close()
            raise RuntimeError("the upstream nginx did not start: "
                               + open(os.path.join(d, "error.log")).read()[-1000:])

    def pids(self):
        return descendants(self.proc.pid)

    def counters(self):
        """{'accepts': N, 'requests': N} from stub_status (its own request
        included), {} if it does not answer."""
        r = subprocess.run(["ip", "netns", "exec", self.ns, "curl", "-s", "--max-time", "2",
                            f"{self.url}/upstream-status"], capture_output=True, text=True)
        m = re.search(r"\n\s*(\d+)\s+(\d+)\s+(\d+)", r.stdout)
        return {"accepts": int(m.group(1)), "requests": int(m.group(3))} if m else {}

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # nginx: finish and exit
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def chroot_ready(chroot):
    return os.path.exists(os.path.join(chroot, CHROOT_MARKER))


class ChrootPeers:
    """nginx-h3 and haproxy-h3: Debian 13's nginx and HAProxy in the chroot
    from bench/peers.sh, given copies of the certificate, key and document
    root (under /xdpq-bench/RUN inside it, removed by close()), one worker or
    thread, pinned to the server CPU like every other variant."""

    def __init__(self, chroot, docroot, cert, key):
        if not chroot_ready(chroot):
            raise RuntimeError(f"no finished Debian 13 chroot at {chroot}: run bench/peers.sh "
                               f"{chroot} first (nginx-h3 and haproxy-h3 run from it)")
        self.chroot = chroot
        self.inside = f"/xdpq-bench/run-{os.getpid()}-{int(time.time())}"
        self.outside = chroot + self.inside
        os.makedirs(self.outside)
        os.chmod(self.outside, 0o755)  # nginx's worker runs as nobody
        shutil.copytree(docroot, self.outside + "/www")
        shutil.copy(cert, self.outside + "/cert.pem")
        shutil.copy(key, self.outside + "/key.pem")
        with open(self.outside + "/cert+key.pem", "w") as f:  # HAProxy's crt
            f.write(open(cert).read() + open(key).read())
        self.configs = {}

    def close(self):
        shutil.rmtree(self.outside, ignore_errors=True)

    def cmd(self, variant, ip, port=4433, upstream=None):
        """The command (to run inside the server namespace) and writes its
        configuration. Both answer /bN (the docroot's files) and /bytes/N
        (the same bodies, as xdpq's generated route); with upstream (a URL),
        they proxy every request to it instead."""
        d = self.inside
        if upstream:
            return self.proxy_cmd(variant, ip, port, upstream)
        if variant == "nginx-h3":
            exact = "".join(f"    location = /bytes/{size} {{ alias {d}/www/b{name}; }}\n"
                            for name, size in BODIES.items())
            conf = f"""worker_processes 1;
worker_cpu_affinity {'10' if SERVER_CPU == '1' else '01'};
daemon off; master_process on; pid {d}/nginx.pid; error_log stderr warn;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000; default_type text/plain;
  # Small files from memory-resident descriptors, like xdpq's file cache.
  open_file_cache max=64 inactive=600s; open_file_cache_valid 600s;
  server {{
    listen {ip}:{port} quic reuseport;
    http3 on; quic_gso on;
    ssl_protocols TLSv1.3;
    ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;
    root {d}/www;
{exact}  }}
}}
"""
            path, argv = "nginx.conf", ["nginx", "-c", f"{d}/nginx.conf"]
        elif variant == "haproxy-h3":
            ret = "".join(f"  http-request return status 200 content-type text/plain file "
                          f"{d}/www/b{name} if {{ path /b{name} /bytes/{BODIES[name]} }}\n"
                          for name in PEER_BODIES["haproxy-h3"])
            conf = f"""global
  # Debian's HAProxy 3.0 is built on OpenSSL's QUIC compatibility layer.
  limited-quic
  # Its descriptor need must fit the limit (5000 does).
  maxconn 5000
  nbthread 1
  cpu-map 1/1 {SERVER_CPU}
  # http-request return builds the whole response in one buffer.
  tune.bufsize 32768
defaults
  mode http
  timeout client 30s
  timeout connect 5s
  timeout server 30s
frontend h3
  bind quic4@{ip}:{port} ssl crt {d}/cert+key.pem alpn h3
{ret}  http-request return status 404
"""
            path, argv = "haproxy.cfg", ["haproxy", "-db", "-f", f"{d}/haproxy.cfg"]
        else:
            raise ValueError(variant)
        with open(os.path.join(self.outside, path), "w") as f:
            f.write(conf)
        self.configs[variant] = conf
        return ["taskset", "-c", SERVER_CPU, "chroot", self.chroot, *argv]

    def proxy_cmd(self, variant, ip, port, upstream):
        """As cmd(), as a reverse proxy to upstream. Like xdpqd's --proxy:
        HTTP/1.1 to the upstream with idle connections kept for reuse (up to
        UPSTREAM_IDLE), the client's host passed on, and X-Forwarded-For,
        -Proto and -Host added (xdpqd adds them by default)."""
        d = self.inside
        if variant == "nginx-h3":
            conf = f"""worker_processes 1;
worker_cpu_affinity {'10' if SERVER_CPU == '1' else '01'};
worker_rlimit_nofile 20000;
daemon off; master_process on; pid {d}/nginx-proxy.pid; error_log stderr warn;
events {{ worker_connections 10000; }}
http {{ access_log off; keepalive_requests 1000000; default_type text/plain;
  upstream app {{
    server {upstream.split("//", 1)[1]};
    # Idle connections kept per worker, without a request limit (the default
    # closes one after 1000 requests).
    keepalive {UPSTREAM_IDLE}; keepalive_requests 1000000; keepalive_timeout 600s;
  }}
  server {{
    listen {ip}:{port} quic reuseport;
    http3 on; quic_gso on;
    ssl_protocols TLSv1.3;
    ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;
    location / {{
      proxy_pass http://app;
      # HTTP/1.1 without "Connection: close": the upstream connection is reused.
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $host;
    }}
  }}
}}
"""
            path, argv = "nginx-proxy.conf", ["nginx", "-c", f"{d}/nginx-proxy.conf"]
        elif variant == "haproxy-h3":
            conf = f"""global
  # Debian's HAProxy 3.0 is built on OpenSSL's QUIC compatibility layer.
  limited-quic
  # Its descriptor need must fit the limit (5000 does).
  maxconn 5000
  nbthread 1
  cpu-map 1/1 {SERVER_CPU}
  # Idle server connections are closed above 25 % of the descriptors by
  # default: let it keep as many as the others may.
  tune.pool-high-fd-ratio 90
  tune.pool-low-fd-ratio 80
defaults
  mode http
  timeout client 30s
  timeout connect 5s
  timeout server 30s
  timeout http-keep-alive 600s
frontend h3
  bind quic4@{ip}:{port} ssl crt {d}/cert+key.pem alpn h3
  option forwardfor
  http-request set-header X-Forwarded-Proto https
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  default_backend app
backend app
  # Any idle connection serves any request, whichever client stream it
  # comes from: what nginx's keepalive and xdpqd's pool do. (The default,
  # "safe", keeps a client's first request off shared connections.)
  http-reuse always
  server app {upstream.split("//", 1)[1]}
"""
            path, argv = "haproxy-proxy.cfg", ["haproxy", "-db", "-f", f"{d}/haproxy-proxy.cfg"]
        else:
            raise ValueError(variant)
        with open(os.path.join(self.outside, path), "w") as f:
            f.write(conf)
        self.configs[variant + " proxy"] = conf
        return ["taskset", "-c", SERVER_CPU, "chroot", self.chroot, *argv]

    def curl(self, ns, ip, path="/b3", port=4433, body=False):
        """One request with the chroot's curl (OpenSSL 3.5's QUIC stack), HTTP/3
        only: an independent client. Returns "version status length" (and
        the body, repr'd, if asked)."""
        fmt = "%{http_version} %{http_code} %{size_download}"
        r = subprocess.run(["ip", "netns", "exec", ns, "chroot", self.chroot, "curl", "-sk",
                            "--http3-only", "--max-time", "5",
                            *(["-w", "\n" + fmt] if body else ["-o", "/dev/null", "-w", fmt]),
                            f"https://{ip}:{port}{path}"], capture_output=True, text=True)
        if not r.stdout.strip():
            return r.stderr.strip()
        if body:
            got, _, line = r.stdout.rpartition("\n")
            return f"{line} {got!r}"
        return r.stdout.strip()


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = args.build
        self.xdpqd = os.path.join(self.build, "xdpqd")
        # --compare: the same xdpq variants from another build ("base-*"), for
        # before/after figures measured in one run.
        self.base_xdpqd = os.path.join(args.compare, "xdpqd") if args.compare else None
        self.h3load = os.path.join(self.build, "h3load")
        self.udpecho = os.path.join(self.build, "udpecho")
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="xdpq-bench-")
        os.chmod(self.work, 0o755)  # nginx's workers run as nobody
        self.docroot, self.cert, self.key = make_files(self.work)
        self.peers = None  # ChrootPeers, made when a chroot variant first runs
        self.upstream = None  # Upstream, started when a proxy cell first runs
        self.curl_checks = {}
        self.runs = []
        self.helps = {}
        self.commands = {}
        self.round = 0

    # --- servers -------------------------------------------------------------

    def server_cmd(self, variant, topo, echo=False, proxy=False):
        pin = ["taskset", "-c", SERVER_CPU]
        common = ["--listen", f"{topo.srv_ip}:4433", "--cert", self.cert, "--key", self.key,
                  "--docroot", self.docroot] + (["--echo"] if echo else [])
        if proxy and is_xdpq(variant):
            # Every path to the upstream, idle connections pooled as the peers
            # do (UPSTREAM_IDLE). The connection limit is xdpqd's default
            # (512 per upstream and worker): past it requests wait in the
            # route's queue for a connection, as HAProxy's do past maxconn.
            # The connect timeout is xdpqd's default, 5 s, HAProxy's here
            # too (`timeout connect 5s`; nginx's default is 60 s).
            common += ["--proxy", f"/={self.upstream.url}", "--proxy-max-idle",
                       str(UPSTREAM_IDLE)]
        if is_xdpq(variant):
            # Its own control socket: the run reads its counters mid-run.
            common += ["--control-socket", self.control_socket(variant)]
        binary = self.xdpqd
        if variant.startswith("base-"):
            binary = self.base_xdpqd
            variant = "xdpq-" + variant[5:]
        help_text = self.help_text(binary)
        if "--per-source-rate" in help_text and "--per-source-validated-rate" not in help_text:
            # An older build (--compare) drops a source's Initials over its
            # rate: one client address opens every connection here, so its
            # caps would measure themselves. Current builds answer a Retry
            # instead and run on their default configuration.
            common = common + ["--per-source-connections", "0", "--per-source-rate", "0",
                               "--retry-rate", "0"]
        if proxy and is_xdpq(variant) and "--proxy-queue" not in help_text:
            # An older build answers 503 past its connection limit (no
            # queue): room for one connection per request in flight.
            common = common + ["--proxy-max-connections", str(UPSTREAM_IDLE)]
        if variant in ("xdpq-afxdp", "xdpq-afxdp-ring"):
            # -ring: every datagram through the AF_XDP TX ring, no hybrid TX
            # (only with --variants; the default is the binary's own policy).
            ring = ["--kernel-trains", "0"] if variant == "xdpq-afxdp-ring" else []
            return [binary, "--dataplane", "afxdp", "--interface", topo.srv_if,
                    "--xdp-mode", "native", "--cpus", SERVER_CPU, *ring, *common]
        if variant in ("xdpq-socket", "xdpq-h2"):
            return [binary, "--dataplane", "socket", "--workers", "1", "--cpus",
                    SERVER_CPU, *common]
        if variant == "gtlsserver":
            return pin + ["gtlsserver", "-q", "-d", self.docroot, topo.srv_ip, "4433",
                          self.key, self.cert]
        if variant == "caddy":
            # Debian's Caddy (quic-go): the HTTP/3 server most users would
            # pick. Pinned like the others; GOMAXPROCS matches one core.
            conf = os.path.join(self.work, "Caddyfile")
            with open(conf, "w") as f:
                f.write(f"""{{
  admin off
  auto_https off
  log {{
    level ERROR
  }}
}}
https://{topo.srv_ip}:4433 {{
  tls {self.cert} {self.key}
  root * {self.docroot}
  file_server
}}
""")
            return pin + ["env", f"HOME={self.work}", f"XDG_DATA_HOME={self.work}",
                          f"XDG_CONFIG_HOME={self.work}", "GOMAXPROCS=1", "caddy", "run",
                          "--config", conf, "--adapter", "caddyfile"]
        if variant in CHROOT_PEERS:
            if self.peers is None:
                self.peers = ChrootPeers(self.args.chroot, self.docroot, self.cert, self.key)
            return self.peers.cmd(variant, topo.srv_ip,
                                  upstream=self.upstream.url if proxy else None)
        if variant == "nginx-h2":
            conf = os.path.join(self.work, "nginx.conf")
            with open(conf, "w") as f:
                f.write(f"""worker_processes 1;
worker_cpu_affinity {'10' if SERVER_CPU == '1' else '01'};
daemon off; pid {self.work}/nginx.pid; error_log {self.work}/nginx.err warn;
events {{ worker_connections 4096; }}
http {{ access_log off; sendfile on; keepalive_requests 1000000;
  server {{ listen {topo.srv_ip}:4433 ssl http2; ssl_certificate {self.cert};
    ssl_certificate_key {self.key}; root {self.docroot}; }} }}
""")
            return ["nginx", "-c", conf]
        raise ValueError(variant)

    def help_text(self, binary):
        if binary not in self.helps:
            self.helps[binary] = subprocess.run([binary, "--help"], capture_output=True,
                                                text=True).stdout
        return self.helps[binary]

    def control_socket(self, variant):
        return os.path.join(self.work, f"{variant}.sock")

    def server_counters(self, variant, binary):
        """xdpqd's counters now (summed over workers), {} if unreadable."""
        ctl = os.path.join(os.path.dirname(binary), "xdpqctl")
        try:
            r = subprocess.run([ctl, "--socket", self.control_socket(variant), "--json", "stats"],
                               capture_output=True, text=True, timeout=10)
            return json.loads(r.stdout)["total"] if r.returncode == 0 else {}
        except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
            return {}

    def start_server(self, variant, topo, echo=False, proxy=False):
        cmd = self.server_cmd(variant, topo, echo, proxy)
        self.commands[variant + (" --echo" if echo else "") + (" proxy" if proxy else "")] = \
            " ".join(cmd)
        log = open(os.path.join(self.work, f"{variant}.log"), "w")
        env = dict(os.environ)
        if is_xdpq(variant):
            # Counts the worker threads' malloc calls (heap_allocations in
            # the exit stats): mallocs per request, next to the CPU figures.
            build = os.path.dirname(cmd[0])
            shim = os.path.join(build, "libxdpq_malloc_count.so")
            if os.path.exists(shim):
                env["LD_PRELOAD"] = shim
        proc = subprocess.Popen(["ip", "netns", "exec", topo.srv_ns, *cmd], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        time.sleep(1.0 if variant.startswith("nginx") or variant in CHROOT_PEERS else 0.8)
        if proc.poll() is not None:
            raise RuntimeError(f"{variant} exited: " + open(log.name).read()[-2000:])
        return proc, log

    def stop_server(self, proc, log, variant=""):
        # xdpqd drains on SIGTERM (up to its drain timeout while the load
        # generator's abandoned streams look in flight); SIGINT stops at once.
        proc.send_signal(signal.SIGINT if is_xdpq(variant) else signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

    # --- clients -------------------------------------------------------------

    def client_cmd(self, proto, topo, cell):
        if proto == "udp":
            return [self.udpecho, "-c", str(cell["c"]), "-w", str(cell["m"]), "-s",
                    str(BODIES.get(cell["body"], cell["body"])), "-D", str(self.args.seconds),
                    "--warm-up-time", "0.5", topo.srv_ip, "4433"]
        path = f"/bytes/{BODIES[cell['body']]}" if cell.get("gen") else f"/b{cell['body']}"
        url = f"https://{topo.srv_ip}:4433{path}"
        d = str(self.args.seconds)
        if proto == "h3":
            cmd = [self.h3load, "--json", "-D", d, "--warm-up-time", "0.5", "-c",
                   str(cell["c"]), "-m", str(cell["m"])]
            if cell["handshake"]:
                cmd.append("--new-connection-per-request")
            return cmd + [url]
        ms = f"{int(self.args.seconds * 1000)}ms"
        return ["h2load", "-D", ms, "--warm-up-time", "500ms", "-c", str(cell["c"]), "-m",
                str(cell["m"]), url]

    def run_cell(self, variant, proto, cell, topo):
        try:
            self._run_cell(variant, proto, cell, topo)
        except Exception as e:  # one broken cell must not lose the whole report
            print(f"  {variant:12s} {cell_name(cell):22s} FAILED: {e}", flush=True)
            self.runs.append({"variant": variant, "proto": proto, "round": self.round, **cell,
                              "req_per_s": 0, "succeeded": 0, "errors": str(e)[-500:],
                              "server_stats": {}})

    def _run_cell(self, variant, proto, cell, topo):
        proxy = bool(cell.get("proxy"))
        if proxy and self.upstream is None:
            self.upstream = Upstream(self.work, topo.srv_ns)
        proc, log = self.start_server(variant, topo, echo=proto == "udp", proxy=proxy)
        try:
            # The server's processes only (the upstream is no descendant).
            pids = descendants(proc.pid)
            up0 = self.upstream.counters() if proxy else {}
            upcpu0 = sum(proc_cpu(p) for p in self.upstream.pids()) if proxy else 0
            cmd = ["ip", "netns", "exec", topo.cli_ns, "taskset", "-c", CLIENT_CPU,
                   *self.client_cmd(proto, topo, cell)]
            busy0, total0 = cpu_times()
            srv0 = sum(proc_cpu(p) for p in pids)
            t0 = time.monotonic()
            client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            # Steady state: the server's counters from the middle of the run
            # (connections made, caches warm) to its end.
            mid = end = {}
            if is_xdpq(variant) and proto != "udp":
                time.sleep(self.args.seconds / 2 + 0.5)
                mid = self.server_counters(variant, self.server_cmd(variant, topo)[0])
            out, err = client.communicate(timeout=self.args.seconds * 4 + 60)
            r = subprocess.CompletedProcess(cmd, client.returncode, out, err)
            if mid:
                end = self.server_counters(variant, self.server_cmd(variant, topo)[0])
            elapsed = time.monotonic() - t0
            srv1 = sum(proc_cpu(p) for p in pids)
            busy1, total1 = cpu_times()
            upcpu1 = sum(proc_cpu(p) for p in self.upstream.pids()) if proxy else 0
            up1 = self.upstream.counters() if proxy else {}
            # Each cell starts its own server: its processes' peak resident
            # sets are this cell's (nginx's and HAProxy's workers summed).
            rss_kib = sum(peak_rss_kib(p) for p in pids)
        finally:
            self.stop_server(proc, log, variant)
        res = {"h3": parse_h3load, "h2": parse_h2load, "udp": parse_udpecho}[proto](r.stdout)
        server_stats = {}
        if is_xdpq(variant):
            m = re.search(r"stats (\{.*\})", open(log.name).read())
            if m:
                server_stats = {k: v for k, v in json.loads(m.group(1)).items() if v}
        hz = os.sysconf("SC_CLK_TCK")
        reqs = res.get("succeeded", 0)
        run = {"variant": variant, "proto": proto, "round": self.round, **cell,
               "command": " ".join(cmd),
               "elapsed_s": elapsed, **res,
               "server_cpu_s": (srv1 - srv0) / hz,
               "machine_cpu_s": (busy1 - busy0) / hz,
               "machine_cpu_util": (busy1 - busy0) / max(1, total1 - total0) * os.cpu_count(),
               "server_peak_rss_mib": rss_kib / 1024 if rss_kib else None,
               "server_stats": server_stats}
        # Every malloc on the worker threads over the whole run (handshakes and
        # warm-up included) per request the server counted.
        served = server_stats.get("requests", 0) + server_stats.get("tcp_requests", 0)
        run["mallocs_per_req"] = (server_stats["heap_allocations"] / served
                                  if served and "heap_allocations" in server_stats else None)
        # ... and in steady state: the second half of the run only.
        half = (end.get("requests", 0) + end.get("tcp_requests", 0)
                - mid.get("requests", 0) - mid.get("tcp_requests", 0))
        run["steady_mallocs_per_req"] = (
            (end.get("heap_allocations", 0) - mid.get("heap_allocations", 0)) / half
            if half > 0 and "heap_allocations" in end else None)
        # Packets per request each way, and the sends (syscalls or ring kicks)
        # that carried them out: fewer datagrams is the cheapest saving, and
        # datagrams per send is how well the dataplane batches.
        for key, counter in (("dgrams_in_per_req", "rx_datagrams"),
                             ("dgrams_out_per_req", "tx_datagrams"),
                             ("sends_per_req", "tx_sends")):
            run[key] = (server_stats.get(counter, 0) / served
                        if served and "rx_datagrams" in server_stats else None)
        if proxy:
            # What reached the upstream over the whole run (warm-up included;
            # minus the two status requests), the connections it accepted
            # (few: the proxy reuses them) and its own CPU, which machine CPU
            # includes and server CPU does not.
            run["upstream_requests"] = (up1.get("requests", 0) - up0.get("requests", 0) - 1
                                        if up0 and up1 else None)
            run["upstream_accepts"] = (up1.get("accepts", 0) - up0.get("accepts", 0) - 1
                                       if up0 and up1 else None)
            run["upstream_cpu_us_per_req"] = ((upcpu1 - upcpu0) / hz / reqs * 1e6
                                              if reqs else None)
        run["server_cpu_us_per_req"] = run["server_cpu_s"] / reqs * 1e6 if reqs else None
        run["machine_cpu_us_per_req"] = run["machine_cpu_s"] / reqs * 1e6 if reqs else None
        self.runs.append(run)
        print(f"  {variant:12s} {cell_name(cell):22s} {res.get('req_per_s', 0):10.0f} req/s  "
              f"p50 {res.get('p50_us', 0) / 1000:7.2f} ms  p99 {res.get('p99_us', 0) / 1000:7.2f} ms"
              f"  srv {run['server_cpu_us_per_req'] or 0:7.1f} us/req  "
              f"all {run['machine_cpu_us_per_req'] or 0:7.1f} us/req"
              f"{'  upstream ' + str(run['upstream_requests']) + ' req ' + str(run['upstream_accepts']) + ' conns' if proxy else ''}"
              f"{'  ERRORS ' + str(res.get('errors')) if res.get('errors') else ''}",
              flush=True)

    def matrix(self):
        a = self.args
        # gen: /bytes/N (generated in memory, xdpq only: isolates the dataplane
        # from file serving); otherwise the same static file for every server.
        echo_cells = [dict(body=b, c=4, m=32, handshake=False, echo=True) for b in ("64", "1200")]
        if a.preset == "peers":
            return [dict(c) for c in PEER_CELLS], [], []
        if a.preset == "proxy":
            if a.smoke:
                return [dict(body="3", c=2, m=4, handshake=False, proxy=True)], [], []
            return [dict(c) for c in PROXY_CELLS], [], []
        if a.smoke:
            h3_cells = [dict(body="3", c=2, m=4, handshake=False, gen=True)]
            h2_cells = []
            echo_cells = []
        elif a.quick:
            h3_cells = [dict(body=b, c=10, m=10, handshake=False, gen=True) for b in ("3", "64k")]
            h3_cells += [dict(body=b, c=10, m=10, handshake=False) for b in ("3", "64k")]
            h3_cells.append(dict(body="3", c=4, m=1, handshake=True))
            h2_cells = [dict(body=b, c=10, m=10, handshake=False) for b in ("3", "64k")]
        else:
            # 1 MiB with m=32 would put 3200 responses in flight at once: none
            # could finish within a run. Large bodies get one stream each.
            loads = lambda b: ((10, 1), (100, 1)) if b == "1m" else ((10, 1), (100, 32))  # noqa
            # c=1: unloaded latency (p50) of the dataplane, one request at a time.
            h3_cells = [dict(body="3", c=1, m=1, handshake=False, gen=True)]
            h3_cells += [dict(body=b, c=c, m=m, handshake=False, gen=True) for b in BODIES
                         for c, m in loads(b)]
            h3_cells += [dict(body=b, c=c, m=m, handshake=False) for b in BODIES
                         for c, m in loads(b)]
            # The peer comparison's other small-request shapes: one client
            # (latency) and many connections with one request in flight each.
            h3_cells += [dict(body="3", c=c, m=1, handshake=False) for c in (1, 100)]
            h3_cells += [dict(body="3", c=c, m=1, handshake=True) for c in (4, 16)]
            h2_cells = [dict(body=b, c=c, m=m, handshake=False) for b in BODIES
                        for c, m in loads(b)]
            # The proxy cells compare xdpq with the chroot's nginx and HAProxy:
            # in the full matrix when that chroot is there.
            if chroot_ready(a.chroot):
                h3_cells += [dict(c) for c in PROXY_CELLS]
        return h3_cells, h2_cells, echo_cells

    def wanted(self, variant, cell):
        a = self.args
        if a.variants and variant not in a.variants.split(","):
            return False
        if a.cells and not re.search(a.cells, cell_name(cell)):
            return False
        return True

    def run(self):
        h3_cells, h2_cells, echo_cells = self.matrix()
        h3_variants = ["xdpq-afxdp", "xdpq-socket"] + ([] if self.args.smoke else ["gtlsserver"])
        if self.args.variants and "xdpq-afxdp-ring" in self.args.variants.split(","):
            h3_variants.insert(1, "xdpq-afxdp-ring")
        if not self.args.smoke:
            if shutil.which("caddy"):
                h3_variants.append("caddy")
            else:
                print("caddy not installed (bench/run.sh installs it): no Caddy column",
                      flush=True)
            asked = [v for v in CHROOT_PEERS if self.args.variants
                     and v in self.args.variants.split(",")]
            if chroot_ready(self.args.chroot):
                h3_variants += list(CHROOT_PEERS)
            elif asked:
                sys.exit(f"{', '.join(asked)}: no Debian 13 chroot at {self.args.chroot}; "
                         f"make it with: bench/peers.sh {self.args.chroot}")
            else:
                print(f"no Debian 13 chroot at {self.args.chroot} (bench/peers.sh makes it): "
                      "no nginx-h3 or haproxy-h3 columns", flush=True)
        h2_variants = ["xdpq-h2", "nginx-h2"]
        echo_variants = ["xdpq-afxdp", "xdpq-socket"]
        if self.base_xdpqd:
            h3_variants += ["base-afxdp", "base-socket"]
            h2_variants.append("base-h2")
            echo_variants += ["base-afxdp", "base-socket"]
        with Topology() as topo:
            try:
                for rnd in range(self.args.rounds):
                    self.round = rnd
                    print(f"round {rnd + 1}/{self.args.rounds}", flush=True)
                    for proto, cells, variants in (("h3", h3_cells, h3_variants),
                                                   ("h2", h2_cells, h2_variants),
                                                   ("udp", echo_cells, echo_variants)):
                        for cell in cells:
                            # The order rotates from round to round, so no variant
                            # always runs first (after a cell change) or last.
                            k = rnd % len(variants)
                            for v in variants[k:] + variants[:k]:
                                if cell.get("gen") and not is_xdpq(v):
                                    continue  # /bytes/N is xdpq's own route
                                if cell.get("proxy"):
                                    if not (is_xdpq(v) or v in PROXY_PEERS):
                                        continue  # gtlsserver and Caddy do not proxy here
                                elif v in PEER_BODIES and cell["body"] not in PEER_BODIES[v]:
                                    continue  # HAProxy answers small bodies only
                                if self.wanted(v, cell):
                                    self.run_cell(v, proto, cell, topo)
                    if rnd == 0 and self.peers and self.args.rounds:
                        self.check_peers(topo)
                    if rnd == 0 and self.upstream:
                        self.check_proxies(topo, [v for v in h3_variants if is_xdpq(v) or
                                                  v in PROXY_PEERS])
            finally:
                if self.upstream:
                    self.upstream.close()  # before its namespace goes
        if self.peers:
            self.peers.close()
        self.report()

    def check_peers(self, topo):
        """Once: the chroot's curl (an independent HTTP/3 client) fetches
        /b3 from each chroot peer that ran; the answers go in the report."""
        for v in [v for v in self.peers.configs if v in CHROOT_PEERS]:
            try:
                proc, log = self.start_server(v, topo)
            except RuntimeError as e:
                self.curl_checks[v] = f"did not start: {e}"[:300]
                continue
            try:
                self.curl_checks[v] = self.peers.curl(topo.cli_ns, topo.srv_ip)
            finally:
                self.stop_server(proc, log, v)
            print(f"  {v:12s} curl --http3-only /b3: {self.curl_checks[v]}", flush=True)

    def check_proxies(self, topo, variants):
        """Once: the chroot's curl fetches /b3 through each proxy variant that
        ran a proxy cell; the answer must be the upstream's body ("u3" and a
        newline), and the upstream must count the request. Without the
        chroot (CI) there is no HTTP/3 curl: the cells' upstream counters
        stand in."""
        if not chroot_ready(self.args.chroot):
            return
        if self.peers is None:
            self.peers = ChrootPeers(self.args.chroot, self.docroot, self.cert, self.key)
        for v in variants:
            if not any(r["variant"] == v and r.get("proxy") for r in self.runs):
                continue
            key = v + " proxy"
            try:
                proc, log = self.start_server(v, topo, proxy=True)
            except RuntimeError as e:
                self.curl_checks[key] = f"did not start: {e}"[:300]
                continue
            try:
                before = self.upstream.counters().get("requests", 0)
                got = self.peers.curl(topo.cli_ns, topo.srv_ip, body=True)
                seen = self.upstream.counters().get("requests", 0) - before - 1
                self.curl_checks[key] = f"{got}; upstream counted {seen}"
            finally:
                self.stop_server(proc, log, v)
            print(f"  {v:12s} curl --http3-only /b3 through the proxy: {self.curl_checks[key]}",
                  flush=True)

    # --- report --------------------------------------------------------------

    def report(self):
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "git_commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                                         capture_output=True, text=True).stdout.strip(),
            "git_dirty": bool(subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                                              "--untracked-files=no"],
                                             capture_output=True, text=True).stdout.strip()),
            "machine": {"kernel": platform.release(), "cpus": os.cpu_count(),
                        "cpu_model": cpu_model()},
            "command": " ".join(sys.argv),
            "server_commands": self.commands,
            "server_configs": self.peers.configs if self.peers else {},
            "upstream": ({"command": " ".join(self.upstream.command), "config": self.upstream.conf,
                          "cpu": UPSTREAM_CPU} if self.upstream else None),
            "curl_http3_checks": self.curl_checks,
            "seconds_per_run": self.args.seconds, "rounds": self.args.rounds,
            "topology": "two netns, veth pair, GRO off on the server side; server on CPU "
                        f"{SERVER_CPU}, client on CPU {CLIENT_CPU}",
        }
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "runs": self.runs}, f, indent=1)
        rows = summarize(self.runs)
        md = [f"# xdpq benchmark ({meta['date'][:19]}Z)", "",
              f"Commit `{meta['git_commit'][:12]}`, kernel {meta['machine']['kernel']}, "
              f"{meta['machine']['cpus']} CPUs ({meta['machine']['cpu_model']}).",
              f"Command: `{meta['command']}`; {self.args.rounds} rounds of "
              f"{self.args.seconds} s per variant, alternating; medians shown.",
              f"Topology: {meta['topology']}.", "",
              "| proto | cell | variant | req/s (udp: round trips/s) | p50 ms | p99 ms | "
              "server CPU us/req | machine CPU us/req | mallocs/req steady (run) | "
              "datagrams/req in, out "
              "(sends) |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            dg = (f"{fmt(r['dg_in'], 2)}, {fmt(r['dg_out'], 2)} ({fmt(r['sends'], 2)})"
                  if r["dg_in"] is not None else "-")
            md.append(f"| {r['proto']} | {r['cell']} | {r['variant']} | {r['rps']:.0f} | "
                      f"{r['p50'] / 1000:.2f} | {r['p99'] / 1000:.2f} | {fmt(r['srv'])} | "
                      f"{fmt(r['all'])} | {fmallocs(r)} | {dg} |")
        md += ["", "Ratios A/B of requests/s, computed per round (A and B run back to back) "
               "and summarized by their median and range. A direction is stated only when "
               "every round agrees by more than 5 %; otherwise the difference is within this "
               "machine's noise.", "",
               "| cell | A vs B | req/s ratio (median) | range over rounds | verdict | "
               "machine CPU/req B/A |", "|---|---|---:|---|---|---:|"]
        for cell, a, b, med, lo, hi, verdict, cpu in paired_ratios(self.runs):
            md.append(f"| {cell} | {a} vs {b} | {med:.2f} | {lo:.2f}-{hi:.2f} | {verdict} | "
                      f"{fmt(cpu, 2)} |")
        md += ["", "mallocs/req: malloc calls on xdpqd's worker threads per request it served, "
               "counted by bench/malloc_count.c preloaded into xdpqd: in steady state (from "
               "the middle of the run to its end, read with xdpqctl) and, in parentheses, over "
               "the whole run (start and every handshake included, which dominates cells "
               "with few requests per connection).",
               "", "datagrams/req: UDP datagrams xdpqd received and sent per request it served "
               "(handshakes included); sends: the system calls or TX-ring kicks that sent them "
               "(a GSO train or a ring batch is one).",
               "", "Server CPU is the server process's own time; on veth the receive work of "
               "the sender's packets runs in softirq on the sender's core, so the machine-wide "
               "figure is the fairer cost."]
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        plots(rows, self.out)
        print("\n".join(md))


def is_xdpq(variant):
    return variant.startswith("xdpq") or variant.startswith("base-")


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def fmallocs(r):
    if r.get("steady_mallocs") is None:
        return fmt(r["mallocs"], 2)
    return f"{fmt(r['steady_mallocs'], 2)} ({fmt(r['mallocs'], 2)})"


def cell_name(c):
    if c.get("echo"):
        return f"UDP echo {c['body']}B x{c['c']} w={c['m']}"
    kind = " /bytes" if c.get("gen") else (" proxy" if c.get("proxy") else " file")
    return f"{c['body']}B c={c['c']} m={c['m']}" + (" newconn" if c.get("handshake") else "") + kind


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def parse_h3load(out):
    try:
        j = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"req_per_s": 0, "succeeded": 0, "errors": "no output"}
    req = j["requests"]
    return {"req_per_s": j["req_per_s"], "succeeded": req["succeeded"],
            "errors": req["failed"] + req["errored"] + j["connect_failures"],
            "p50_us": j["latency_us"]["request"]["p50"],
            "p99_us": j["latency_us"]["request"]["p99"], "bytes_per_s": j["bytes_per_s"],
            "status": j.get("status", {})}


def parse_udpecho(out):
    try:
        j = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"req_per_s": 0, "succeeded": 0, "errors": "no output"}
    return {"req_per_s": j["round_trips_per_s"], "succeeded": j["received"], "errors": 0,
            "p50_us": j["p50_us"], "p99_us": j["p99_us"], "bytes_per_s": j["bytes_per_s"]}


def parse_h2load(out):
    res = {"req_per_s": 0, "succeeded": 0}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("finished in"):
            res["req_per_s"] = float(line.split(",")[1].split()[0])
        if line.startswith("requests:"):
            parts = line.split(",")
            res["succeeded"] = int(parts[3].split()[0])
            res["errors"] = int(parts[4].split()[0]) + int(parts[5].split()[0])
        if line.startswith("time for request:"):
            vals = line.split(":")[1].split()
            res["mean_us"] = to_us(vals[2])
    # h2load prints no percentiles: report the mean as p50 and max as p99 proxies.
    for line in lines:
        if line.startswith("time for request:"):
            vals = line.split(":")[1].split()
            res["p50_us"] = to_us(vals[2])
            res["p99_us"] = to_us(vals[1])
    return res


def to_us(s):
    for unit, mul in (("us", 1), ("ms", 1e3), ("s", 1e6)):
        if s.endswith(unit):
            return float(s[:-len(unit)]) * mul
    return 0.0


def summarize(runs):
    groups = {}
    for r in runs:
        key = (r["proto"], cell_name(r), r["variant"])
        groups.setdefault(key, []).append(r)
    rows = []
    for (proto, cell, variant), rs in groups.items():
        med = lambda k: statistics.median([x[k] for x in rs if x.get(k) is not None]) \
            if any(x.get(k) is not None for x in rs) else None  # noqa: E731
        rows.append({"proto": proto, "cell": cell, "variant": variant, "rps": med("req_per_s"),
                     "p50": med("p50_us") or 0, "p99": med("p99_us") or 0,
                     "srv": med("server_cpu_us_per_req"), "all": med("machine_cpu_us_per_req"),
                     "mallocs": med("mallocs_per_req"),
                     "steady_mallocs": med("steady_mallocs_per_req"),
                     "dg_in": med("dgrams_in_per_req"), "dg_out": med("dgrams_out_per_req"),
                     "sends": med("sends_per_req"),
                     "n": len(rs)})
    return rows


PAIRS = (("xdpq-afxdp", "xdpq-socket"), ("xdpq-afxdp", "gtlsserver"),
         ("xdpq-socket", "gtlsserver"), ("xdpq-socket", "caddy"), ("xdpq-h2", "nginx-h2"),
         ("xdpq-afxdp", "base-afxdp"), ("xdpq-socket", "base-socket"), ("xdpq-h2", "base-h2"),
         ("xdpq-afxdp", "xdpq-afxdp-ring"), ("xdpq-afxdp-ring", "xdpq-socket"),
         ("xdpq-afxdp", "haproxy-h3"), ("xdpq-socket", "haproxy-h3"),
         ("xdpq-afxdp", "nginx-h3"), ("xdpq-socket", "nginx-h3"))


def paired_ratios(runs):
    """Per-round A/B ratios for each cell and pair, with a verdict."""
    by = {}
    for r in runs:
        by[(cell_name(r), r["variant"], r["round"])] = r
    cells = []
    for r in runs:
        if cell_name(r) not in cells:
            cells.append(cell_name(r))
    out = []
    for cell in cells:
        for a, b in PAIRS:
            rs, cpus = [], []
            for (c, v, rnd), ra in by.items():
                rb = by.get((c, b, rnd))
                if c != cell or v != a or not rb or not rb["req_per_s"] or not ra["req_per_s"]:
                    continue
                rs.append(ra["req_per_s"] / rb["req_per_s"])
                if ra.get("machine_cpu_us_per_req") and rb.get("machine_cpu_us_per_req"):
                    cpus.append(rb["machine_cpu_us_per_req"] / ra["machine_cpu_us_per_req"])
            if not rs:
                continue
            lo, hi = min(rs), max(rs)
            if lo > 1.05:
                verdict = f"{a} faster"
            elif hi < 1 / 1.05:
                verdict = f"{b} faster"
            else:
                verdict = "no clear difference"
            out.append((cell, a, b, statistics.median(rs), lo, hi, verdict,
                        statistics.median(cpus) if cpus else None))
    return out


def plots(rows, out):
    """Requests/s and machine CPU per request by cell, one panel per
    protocol, log scale (bodies from 3 B to 1 MiB span four decades)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    protos = [p for p in ("h3", "h2", "udp") if any(r["proto"] == p for r in rows)]
    for metric, label, fname in (("rps", "requests/s (udp: round trips/s)", "throughput.png"),
                                 ("all", "machine CPU us per request", "cpu_per_request.png")):
        fig, axes = plt.subplots(len(protos), 1, figsize=(13, 3.6 * len(protos)), squeeze=False)
        for ax, proto in zip(axes[:, 0], protos):
            pr = [r for r in rows if r["proto"] == proto]
            cells = []
            for r in pr:
                if r["cell"] not in cells:
                    cells.append(r["cell"])
            variants = sorted({r["variant"] for r in pr})
            width = 0.8 / max(1, len(variants))
            for i, v in enumerate(variants):
                ys = []
                for c in cells:
                    m = [r[metric] for r in pr if r["variant"] == v and r["cell"] == c]
                    ys.append(m[0] if m and m[0] else 0)
                ax.bar([x + i * width for x in range(len(cells))], ys, width, label=v)
            ax.set_xticks([x + width * (len(variants) - 1) / 2 for x in range(len(cells))])
            ax.set_xticklabels(cells, rotation=20, ha="right", fontsize=7)
            vals = [r[metric] for r in pr if r[metric]]
            # Log only across decades; a narrow range on a log axis looks like
            # a difference that the verdicts may call noise.
            if vals and max(vals) / min(vals) > 10:
                ax.set_yscale("log")
            ax.set_ylabel(label, fontsize=8)
            ax.set_title({"h3": "HTTP/3", "h2": "HTTP/2 over TLS", "udp": "UDP echo (no QUIC)"}[proto],
                         fontsize=9)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=100)
        plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small matrix, ~2 minutes")
    p.add_argument("--smoke", action="store_true", help="one short cell (CI)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None, help="per run")
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "latest"))
    p.add_argument("--compare", metavar="BUILD",
                   help="also run the xdpq variants from this build dir (base-afxdp, "
                        "base-socket, base-h2): before/after figures in one run")
    p.add_argument("--variants", help="comma list: run only these variants")
    p.add_argument("--cells", help="regex: run only cells whose name matches; 'peers': the "
                   "peer comparison (3 B at c=1, 10, 100 m=1 and c=100 m=32, 16 KiB c=10 m=1, "
                   "a new connection per request at c=16; by default on xdpq-afxdp, "
                   "xdpq-socket, haproxy-h3, nginx-h3); 'proxy': the same variants as "
                   "reverse proxies to one HTTP/1.1 upstream (3 B at c=10 m=1 and c=100 m=32); "
                   "'peers:REGEX', 'proxy:REGEX': those cells whose name matches")
    p.add_argument("--chroot", default=DEFAULT_CHROOT,
                   help="the Debian 13 chroot made by bench/peers.sh (nginx-h3, haproxy-h3)")
    a = p.parse_args()
    a.preset = None
    preset, _, only = (a.cells or "").partition(":")
    if preset in ("peers", "proxy"):
        a.preset, a.cells = preset, only or None
        if not a.variants:
            a.variants = "xdpq-afxdp,xdpq-socket,haproxy-h3,nginx-h3"
    if a.rounds is None:
        a.rounds = 1 if a.smoke else 3
    if a.seconds is None:
        a.seconds = 1.0 if a.smoke else (3.0 if a.quick else 4.0)
    if os.geteuid() != 0:
        sys.exit("bench/run.py needs root (network namespaces, XDP)")
    Bench(a).run()


if __name__ == "__main__":
    main()
