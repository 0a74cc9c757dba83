#!/usr/bin/python3
"""The daemon and its control plane: a config file, xdpqctl status/stats/conns
moving with real traffic, capture read back by tcpdump, keylog, SIGHUP with a
new certificate during a download, SIGTERM drain (AF_XDP, nothing left
attached), stateless reset after a restart with the same secrets, the control
socket refusing others and surviving garbage, Prometheus metrics, sd_notify."""

import concurrent.futures
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from harness import (H3LOAD, XDPQD, Server, TimedTestCase, free_udp_port,  # noqa: E402
                     gtlsclient, make_cert, pattern, read_pcap, read_to_end, require_tools,
                     sha256, xdpqctl)
from netns import Topology  # noqa: E402



def thread_named(pid, name):
    """The id of the thread of pid whose name is name (ps -L shows it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if f.read().strip() == name:
                return int(tid)
    raise AssertionError(f"no thread named {name} in process {pid}")


class StoppedThread:
    """Stops one thread of a process, not the others, while in the with
    block: ptrace(PTRACE_SEIZE) and PTRACE_INTERRUPT act on a single thread
    (a signal would stop them all)."""
    SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000

    def __init__(self, tid):
        self.tid = tid
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                     ctypes.c_void_p]

    def _ptrace(self, req):
        if self.libc.ptrace(req, self.tid, None, None) != 0:
            raise OSError(ctypes.get_errno(), f"ptrace({req:#x}, {self.tid})")

    def __enter__(self):
        self._ptrace(self.SEIZE)
        self._ptrace(self.INTERRUPT)
        os.waitpid(self.tid, self.WALL)  # it has stopped
        return self

    def __exit__(self, *exc):
        self._ptrace(self.DETACH)


class ControlTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()
        cls.tmp = tempfile.mkdtemp(prefix="xdpq-control-")

    def test_a_socket_path_too_long_is_refused_not_cut_short(self):
        # Regression (review): xdpqctl cut a path longer than a Unix socket
        # address holds to its first 107 bytes, and asked whatever daemon
        # listened there.
        d = tempfile.mkdtemp(prefix="xdpq-longpath-", dir=self.tmp)
        path = os.path.join(d, "x" * (107 - len(d) - 1))
        self.assertEqual(len(path), 107)
        with Server("--control-socket", path) as srv:
            rc, out, _ = xdpqctl(path, "status")
            self.assertEqual(rc, 0, out)  # the longest path there is works
            rc, out, err = xdpqctl(path + ".other", "status")
            self.assertEqual(rc, 2, out + err)
            self.assertIn("path too long (at most 107 bytes)", err)
            self.assertEqual(out, "")
            srv.stop()

    def test_a_live_socket_with_a_full_backlog_is_refused_not_waited_on(self):
        # Regression (review): the check for another server on the path was
        # a blocking connect, which waits for good on a listener whose
        # backlog is full (a hung server its clients kept calling).
        path = os.path.join(tempfile.mkdtemp(prefix="xdpq-ctl-", dir=self.tmp), "ctl")
        hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hung.bind(path)
        hung.listen(0)
        callers = []
        while True:  # fill the backlog
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(path)
            except BlockingIOError:
                c.close()
                break
            callers.append(c)
        try:
            r = subprocess.run([XDPQD, "--listen", f"127.0.0.1:{free_udp_port()}", "--no-tcp",
                                "--control-socket", path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=10)
        finally:
            for c in callers:
                c.close()
            hung.close()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("another xdpqd is listening there", r.stderr)

    def test_a_stopped_worker_still_answers_for_its_figures(self):
        # Regression: in a drain a worker with nothing left stops at once,
        # and status, stats and /metrics then waited 500 ms on it, one
        # worker after another on the control thread, and reported it as
        # not answering. A stopped worker's figures are read directly.
        with Server("--workers", "2", "--drain-timeout", "20000", workers=0) as srv:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["http/1.1"])
            raw = socket.create_connection((srv.host, srv.port), timeout=10)
            with ctx.wrap_socket(raw) as busy:
                # A download nobody reads: its worker stays in the drain.
                busy.sendall(b"GET /bytes/60000000 HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertIn(b"200 OK", busy.recv(4096))
                self.assertEqual(xdpqctl(srv, "drain")[0], 0)
                for _ in range(100):  # until the other worker's thread has ended
                    names = []
                    for t in os.listdir(f"/proc/{srv.proc.pid}/task"):
                        try:
                            with open(f"/proc/{srv.proc.pid}/task/{t}/comm") as f:
                                names.append(f.read().strip())
                        except FileNotFoundError:
                            pass
                    if sum(n.startswith("xdpq-worker") for n in names) == 1:
                        break
                    time.sleep(0.05)
                else:
                    self.fail("no worker stopped in the drain")
                rc, out, _ = xdpqctl(srv, "status", json_out=True)
                self.assertEqual(rc, 0, out)
                st = json.loads(out)
                self.assertEqual(st["unanswered_workers"], [], out)
                self.assertEqual(len(st["workers"]), 2, out)
                self.assertIsNone(srv.proc.poll(), "the drain did not wait for the download")

    def test_config_file_status_stats_conns_metrics(self):
        port = free_udp_port()
        mport = free_udp_port()
        sock = os.path.join(self.tmp, "cfg.sock")
        cfg = os.path.join(self.tmp, "xdpqd.toml")
        with open(cfg, "w") as f:
            f.write(f'[server]\nlisten = ["127.0.0.1:{port}"]\nworkers = 1\n'
                    f'control_socket = "{sock}"\nmetrics = "127.0.0.1:{mport}"\n'
                    f'[quic]\nmax_streams = 64\n')
        with Server("--config", cfg, listen=[], port=port, workers=0) as srv:
            srv.control_socket = sock
            rc, out, _ = xdpqctl(srv, "status")
            self.assertEqual(rc, 0, out)
            self.assertRegex(out, r"dataplane:\s+socket")
            rc, out, _ = xdpqctl(srv, "status", json_out=True)
            st = json.loads(out)
            self.assertEqual(st["dataplane"], "socket")
            self.assertEqual(len(st["workers"]), 1)
            before = json.loads(xdpqctl(srv, "stats", json_out=True)[1])["total"]
            # A slow download keeps a connection alive while we look at it.
            dl = threading.Thread(target=lambda: gtlsclient(
                srv, [f"/bytes/{32 << 20}"], "-r", "0.02", quiet=True, timeout=120))
            dl.start()
            conns = []
            for _ in range(50):
                conns = json.loads(xdpqctl(srv, "conns", json_out=True)[1])["connections"]
                if any(c["proto"] == "h3" and c["bytes_out"] > 0 for c in conns):
                    break
                time.sleep(0.1)
            h3 = [c for c in conns if c["proto"] == "h3"]
            self.assertTrue(h3, "conns showed no HTTP/3 connection during a download")
            self.assertTrue(h3[0]["peer"].startswith("127.0.0.1:"))
            self.assertGreater(h3[0]["rtt_us"], 0)
            rc, text, _ = xdpqctl(srv, "conns")
            self.assertIn("h3", text)
            subprocess.run(["curl", "-sk", "--http2", "-o", "/dev/null",
                            f"https://127.0.0.1:{port}/healthz"], check=True, timeout=10)
            dl.join()
            after = json.loads(xdpqctl(srv, "stats", json_out=True)[1])["total"]
            self.assertGreater(after["requests"], before["requests"])
            self.assertGreater(after["tx_bytes"], before["tx_bytes"] + (32 << 20))
            self.assertEqual(after["tcp_requests"], before["tcp_requests"] + 1)
            rc, text, _ = xdpqctl(srv, "stats")
            self.assertRegex(text, r"handshakes_completed\s+[1-9]")
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                             timeout=5).read().decode()
            self.assertRegex(metrics, r'xdpq_requests_total\{worker="0"\} [1-9]')
            self.assertIn('xdpq_request_duration_seconds_bucket{proto="h3",le="+Inf"}', metrics)
            self.assertRegex(metrics, r"xdpq_quic_handshake_duration_seconds_count\{\} [1-9]")

    def test_a_reload_names_what_it_did_not_apply(self):
        # Regression: a reload applies the certificate, the log level and
        # the proxy routes; any other change in the file was kept at its
        # running value without a word (a few named ones got a vague line
        # in the log only), so "systemctl reload" looked like it took it.
        port = free_udp_port()
        sock = os.path.join(self.tmp, "reload.sock")
        cfg = os.path.join(self.tmp, "reload.toml")

        def write(streams, idle, level, comment=""):
            with open(cfg, "w") as f:
                f.write(f'{comment}[server]\nlisten = ["127.0.0.1:{port}"]\nworkers = 1\n'
                        f'control_socket = "{sock}"\nlog_level = "{level}"\n'
                        f'[quic]\nmax_streams = {streams}\nidle_timeout_ms = {idle}\n')
        write(64, 30000, "info")
        with Server("--config", cfg, listen=[], port=port, workers=0) as srv:
            srv.control_socket = sock
            rc, out, _ = xdpqctl(srv, "reload")
            self.assertEqual(rc, 0, out)
            self.assertNotIn("kept the running value", out)
            # Lines moved (a comment) and an applied key changed: nothing kept.
            write(64, 30000, "warn", comment="# moved down a line\n")
            rc, out, _ = xdpqctl(srv, "reload")
            self.assertEqual(rc, 0, out)
            self.assertNotIn("kept the running value", out)
            write(32, 20000, "debug")
            rc, out, _ = xdpqctl(srv, "reload")
            self.assertEqual(rc, 0, out)
            self.assertIn("kept the running value of quic.max_streams, quic.idle_timeout_ms "
                          "(xdpqctl upgrade, or a restart, applies them)", out)
            self.assertNotIn("log_level", out)  # applied
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
        self.assertIn("changed in the file but not applied: quic.max_streams, "
                      "quic.idle_timeout_ms", srv.output())

    def test_a_reload_names_what_the_command_line_overrides(self):
        # Regression: a key the command line also gives was neither applied
        # nor named (the log level), or named as applied by an upgrade,
        # which keeps the same command line (max_streams).
        port = free_udp_port()
        sock = os.path.join(self.tmp, "override.sock")
        cfg = os.path.join(self.tmp, "override.toml")

        def write(streams, level):
            with open(cfg, "w") as f:
                f.write(f'[server]\nlisten = ["127.0.0.1:{port}"]\nworkers = 1\n'
                        f'control_socket = "{sock}"\nlog_level = "{level}"\n'
                        f'[quic]\nmax_streams = {streams}\nidle_timeout_ms = 30000\n')
        write(64, "info")
        with Server("--config", cfg, "--log-level", "info", "--max-streams=50", listen=[],
                    port=port, workers=0) as srv:
            srv.control_socket = sock
            write(32, "debug")
            rc, out, _ = xdpqctl(srv, "reload")
            self.assertEqual(rc, 0, out)
            self.assertIn("not applied: server.log_level, quic.max_streams (the command "
                          "line's flags override the file)", out)
            self.assertNotIn("kept the running value", out)
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
        self.assertIn("overridden by the command line: server.log_level, quic.max_streams",
                      srv.output())
        self.assertNotIn("debug:", srv.output())  # the level stayed info

    def test_a_reload_that_removes_the_certificate_says_it_kept_it(self):
        # Regression: with tls.cert and tls.key gone from the file, a reload
        # reloaded the running pair and answered "certificate reloaded" as
        # if the file had asked for it.
        port = free_udp_port()
        sock = os.path.join(self.tmp, "cert-removed.sock")
        cfg = os.path.join(self.tmp, "cert-removed.toml")
        key, cert, _ = make_cert(self.tmp, "removed.test")

        def write(with_cert):
            with open(cfg, "w") as f:
                f.write(f'[server]\nlisten = ["127.0.0.1:{port}"]\nworkers = 1\n'
                        f'control_socket = "{sock}"\n')
                if with_cert:
                    f.write(f'[tls]\ncert = "{cert}"\nkey = "{key}"\n')
        write(True)
        with Server("--config", cfg, listen=[], port=port, workers=0) as srv:
            srv.control_socket = sock
            write(False)
            rc, out, _ = xdpqctl(srv, "reload")
            self.assertEqual(rc, 0, out)
            self.assertIn("kept the running value of tls.cert, tls.key", out)
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})

    def test_credentials_a_reload_replaced_go_with_their_last_connection(self):
        # Regression: each reload with a certificate kept the QUIC TLS
        # context it replaced (its credentials and its 0-RTT anti-replay
        # store) on every worker for the life of the process, in use or not.
        key, cert, _ = make_cert(self.tmp, "retired.test")
        with Server("--cert", cert, "--key", key, workers=1) as srv:
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
            for _ in range(3):
                rc, out, _ = xdpqctl(srv, "reload")
                self.assertEqual(rc, 0, out)
                self.assertIn("certificate reloaded", out)
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
            deadline = time.time() + 5
            while True:
                gauge = json.loads(xdpqctl(srv, "--json", "stats")[1])["total"][
                    "tls_contexts_retired"]
                if gauge == 0 or time.time() > deadline:
                    break
                time.sleep(0.1)
            self.assertEqual(gauge, 0, "replaced TLS contexts still held")

    def test_a_worker_that_does_not_answer_is_named(self):
        # One worker's thread stopped: status, stats, conns and the metrics
        # page name it (they wait 500 ms for each worker) instead of leaving
        # it out of the totals without a word; the other worker answers.
        # Once the thread runs again, everything is whole.
        mport = free_udp_port()

        def scrape():
            return urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                          timeout=10).read().decode()

        def h3_requests(metrics):  # summed over the workers
            return float(re.search(r'\nxdpq_request_duration_seconds_count\{proto="h3"\} (\S+)\n',
                                   metrics).group(1))
        with Server("--metrics", f"127.0.0.1:{mport}", workers=2) as srv:
            for _ in range(8):  # new connections, spread over both workers
                self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
            before = scrape()
            self.assertIn('worker="1"', before)
            with StoppedThread(thread_named(srv.proc.pid, "xdpq-worker-1")):
                rc, text, _ = xdpqctl(srv, "stats")
                self.assertEqual(rc, 0, text)
                self.assertTrue(text.startswith(
                    "warning: worker 1 did not answer within 500 ms; what follows leaves it out\n"),
                    text[:300])
                st = json.loads(xdpqctl(srv, "stats", json_out=True)[1])
                self.assertEqual(st["unanswered_workers"], [1])
                self.assertEqual([w["id"] for w in st["workers"]], [0])
                status = json.loads(xdpqctl(srv, "status", json_out=True)[1])
                self.assertEqual(status["unanswered_workers"], [1])
                self.assertEqual([w["id"] for w in status["workers"]], [0])
                self.assertRegex(xdpqctl(srv, "status")[1], r"\n +1  no answer within 500 ms\n")
                conns = json.loads(xdpqctl(srv, "conns", json_out=True)[1])
                self.assertEqual(conns["unanswered_workers"], [1])
                metrics = scrape()
                self.assertIn("\nxdpq_workers_unanswered 1\n", metrics)
                self.assertIn('worker="0"', metrics)
                # Regression: its share left the sums, which went down (read
                # as a counter reset); now its last figures stand in.
                self.assertIn('worker="1"', metrics)
                self.assertGreaterEqual(h3_requests(metrics), h3_requests(before))
            st = json.loads(xdpqctl(srv, "stats", json_out=True)[1])
            self.assertEqual(st["unanswered_workers"], [])
            self.assertEqual(sorted(w["id"] for w in st["workers"]), [0, 1])
            self.assertFalse(xdpqctl(srv, "stats")[1].startswith("warning"))
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})

    def test_a_stuck_worker_is_waited_for_once_not_per_request(self):
        # Regression (review): every admin request waited SNAPSHOT_WAIT
        # (500 ms) for a stuck worker, on the thread that also handles the
        # signals and every other admin client. 32 scrapes (the metrics
        # port's limit) queued 16 s of waiting, and xdpqctl gave up after
        # its 10 s. A worker that missed a round and has not turned its
        # loop since is no longer waited for.
        mport = free_udp_port()

        def scrape():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                              timeout=60).status
            except OSError as e:
                return str(e)
        with Server("--metrics", f"127.0.0.1:{mport}", workers=2) as srv:
            with StoppedThread(thread_named(srv.proc.pid, "xdpq-worker-1")):
                with concurrent.futures.ThreadPoolExecutor(32) as pool:
                    scrapes = [pool.submit(scrape) for _ in range(32)]
                    time.sleep(0.5)  # all 32 connected and asking
                    rc, out, err = xdpqctl(srv, "status", json_out=True, timeout=30)
                    self.assertEqual(rc, 0, out + err)
                    self.assertEqual(json.loads(out)["unanswered_workers"], [1])
                    self.assertEqual([s.result() for s in scrapes], [200] * 32)
            # Once it runs again, it is waited for and answers.
            st = json.loads(xdpqctl(srv, "stats", json_out=True)[1])
            self.assertEqual(st["unanswered_workers"], [])

    def test_a_metrics_client_over_the_limit_gets_503(self):
        # Regression: the metrics port refused a client over its limit
        # with the control socket's plain-text line, which a Prometheus
        # scraper reports as a malformed answer, not as a busy server.
        mport = free_udp_port()
        with Server("--metrics", f"127.0.0.1:{mport}"):
            held = [socket.create_connection(("127.0.0.1", mport), timeout=5)
                    for _ in range(32)]  # the limit, each silent
            time.sleep(0.3)
            extra = socket.create_connection(("127.0.0.1", mport), timeout=5)
            answer = extra.recv(4096)
            extra.close()
            for h in held:
                h.close()
            self.assertTrue(answer.startswith(b"HTTP/1.1 503 "), answer)
            head, _, body = answer.partition(b"\r\n\r\n")
            self.assertIn(b"content-length: %d" % len(body), head)
            # Counted, and shown: the admin clients' own counters (once the
            # held clients' places are free again).
            page = b""
            for _ in range(50):
                try:
                    with socket.create_connection(("127.0.0.1", mport), timeout=5) as c:
                        c.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                        page = b""
                        while chunk := c.recv(65536):
                            page += chunk
                except ConnectionError:
                    page = b""
                if page.startswith(b"HTTP/1.1 200 "):
                    break
                time.sleep(0.1)
            self.assertIn(b"\nxdpq_admin_refused_busy_total ", page)
            self.assertRegex(page, rb"\nxdpq_admin_refused_busy_total [1-9]")
            self.assertIn(b"# TYPE xdpq_admin_clients_total counter\n", page)

    def test_capture_is_readable_pcap_with_quic(self):
        with Server() as srv:
            cap = os.path.join(self.tmp, "cap.pcap")
            rc, out, _ = xdpqctl(srv, "capture", "start", cap, "--filter",
                                 f"udp port {srv.port}")
            self.assertEqual(rc, 0, out)
            r = gtlsclient(srv, ["/bytes/5000"])
            self.assertEqual(r.statuses, {0: 200})
            rc, out, _ = xdpqctl(srv, "capture", "stop")
            self.assertIn("packets written", out)
            rc, out, _ = xdpqctl(srv, "capture", "start", cap + "x", "--filter", "tcp and (")
            self.assertEqual(rc, 1)
            self.assertIn("bad filter", out)
            # A count that is not a number was taken as 0: capture until stopped.
            for bad in ("ten", "-1", "5x"):
                rc, out, _ = xdpqctl(srv, "capture", "start", cap + "y", "--count", bad)
                self.assertEqual(rc, 1, out)
                self.assertIn("--count expects a number", out)
            self.assertFalse(os.path.exists(cap + "y"))
            # A relative path is the caller's, not the daemon's working
            # directory (/ under the unit, read-only there).
            rc, out, _ = xdpqctl(srv, "capture", "start", "relative.pcap", cwd=self.tmp)
            self.assertEqual(rc, 0, out)
            xdpqctl(srv, "capture", "stop")
            self.assertTrue(os.path.isfile(os.path.join(self.tmp, "relative.pcap")), out)
        td = subprocess.run(["tcpdump", "-nn", "-r", cap], capture_output=True, text=True)
        self.assertEqual(td.returncode, 0, td.stderr)
        lines = [ln for ln in td.stdout.splitlines() if "UDP" in ln]
        self.assertGreater(len(lines), 4)
        pkts = read_pcap(cap)
        to_srv = [p for p in pkts if p[1] == srv.port]
        from_srv = [p for p in pkts if p[0] == srv.port]
        self.assertTrue(to_srv and from_srv, "both directions must be captured")
        first = to_srv[0][2]
        self.assertEqual(first[0] & 0xF0, 0xC0, "first client packet: a QUIC long header")
        self.assertEqual(first[1:5], b"\x00\x00\x00\x01", "QUIC version 1")
        self.assertGreaterEqual(len(first), 1200, "a padded Initial")

    def test_a_capture_that_fills_its_disk_stops_and_says_so(self):
        # Regression: pcap_dump's write errors were ignored: on a full disk
        # the capture went on counting packets "written", the file cut mid
        # record and unreadable after it.
        with self.small_disk("64k") as mnt, Server() as srv:
            rc, out, _ = xdpqctl(srv, "capture", "start", os.path.join(mnt, "cap.pcap"))
            self.assertEqual(rc, 0, out)
            self.assertEqual(gtlsclient(srv, ["/bytes/300000"]).statuses, {0: 200})
            rc, out, _ = xdpqctl(srv, "capture", "stop")
            self.assertEqual(rc, 0, out)
            self.assertIn("capture had stopped by itself (writing failed: No space left on "
                          "device", out)
            n = int(re.search(r"(\d+) packets written", out).group(1))
            self.assertIn("No space left on device", srv.output())
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
        self.assertLess(n, 100)  # 64 KiB of 1.2 KB packets, not all 300 kB

    @contextlib.contextmanager
    def small_disk(self, size):
        """A tmpfs of size mounted in the test's directory, for as long as
        the block runs."""
        mnt = tempfile.mkdtemp(dir=self.tmp, prefix="small-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", mnt], check=True)

    def test_a_capture_or_key_log_does_not_write_over_another_file(self):
        # Regression: `xdpqctl capture start` (or keylog) named after another
        # private file of the daemon's, the QUIC secrets file say, truncated
        # it or wrote into it.
        precious = os.path.join(self.tmp, "secrets")
        with Server("--secrets", precious):
            pass  # writes the file, in the daemon's own format
        with open(precious) as f:
            before = f.read()
        with Server() as srv:
            rc, out, err = xdpqctl(srv, "capture", "start", precious)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("exists and is not a packet capture; refused", out + err)
            rc, out, err = xdpqctl(srv, "keylog", "start", precious)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("exists and is not a TLS key log; refused", out + err)
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
        with open(precious) as f:
            self.assertEqual(f.read(), before)

    def test_keylog(self):
        keys = os.path.join(self.tmp, "keys.log")
        with Server() as srv:
            self.assertEqual(xdpqctl(srv, "keylog", "start", keys)[0], 0)
            gtlsclient(srv, ["/healthz"])
            subprocess.run(["curl", "-sk", "-o", "/dev/null", srv.url("/healthz")], timeout=10)
            self.assertEqual(xdpqctl(srv, "keylog", "stop")[0], 0)
            gtlsclient(srv, ["/healthz"])  # not logged any more
        text = open(keys).read()
        self.assertEqual(os.stat(keys).st_mode & 0o777, 0o600)
        secrets = re.findall(r"^CLIENT_TRAFFIC_SECRET_0 [0-9a-f]{64} [0-9a-f]+$", text, re.M)
        self.assertEqual(len(secrets), 2, "one QUIC and one TCP handshake logged:\n" + text)

    def test_a_key_log_that_fills_its_disk_stops_and_says_so(self):
        # Regression (review): the key log's write errors were ignored and
        # its size had no bound, while a capture stops at either: one left
        # running under a flood of handshakes could fill the disk the logs
        # share.
        with self.small_disk("8k") as mnt, Server() as srv:
            rc, out, _ = xdpqctl(srv, "keylog", "start", os.path.join(mnt, "keys.log"))
            self.assertEqual(rc, 0, out)
            for _ in range(20):  # a kilobyte or so of secrets each
                self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
            rc, out, _ = xdpqctl(srv, "keylog", "stop")
            self.assertEqual(rc, 0, out)
            self.assertIn("key logging had stopped by itself (writing failed", out)
            self.assertIn("key log to", srv.output())
            rc, out, _ = xdpqctl(srv, "keylog", "stop")
            self.assertIn("key logging was not running", out)
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
            # The limit is the file's, whatever earlier runs appended to it.
            full = os.path.join(self.tmp, "full-keys.log")
            with open(full, "wb") as f:
                f.write(b"CLIENT_RANDOM 00 00\n")  # a key log's, or it is refused as another file
                f.truncate(1 << 30)  # sparse
            os.chmod(full, 0o600)
            rc, out, _ = xdpqctl(srv, "keylog", "start", full)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("already holds 1024 MiB", out)

    def test_sighup_new_certificate_while_download_continues(self):
        key_a, cert_a, fp_a = make_cert(self.tmp, "xdpq-cert-a")
        key_b, cert_b, fp_b = make_cert(self.tmp, "xdpq-cert-b")
        live_key, live_cert = os.path.join(self.tmp, "live.key"), os.path.join(self.tmp,
                                                                             "live.pem")
        shutil.copy(key_a, live_key)
        shutil.copy(cert_a, live_cert)
        size = 48 << 20
        with Server("--cert", live_cert, "--key", live_key) as srv:
            before = json.loads(subprocess.run(
                [H3LOAD, "--json", "-n", "1", srv.url("/healthz")], capture_output=True,
                text=True, timeout=30).stdout)
            self.assertEqual(before["server_cert_sha256"], fp_a)
            result = {}
            dl = threading.Thread(target=lambda: result.update(r=gtlsclient(
                srv, [f"/bytes/{size}"], "-r", "0.02", quiet=True, timeout=120)))
            dl.start()
            time.sleep(0.5)
            shutil.copy(key_b, live_key)
            shutil.copy(cert_b, live_cert)
            srv.proc.send_signal(signal.SIGHUP)
            deadline = time.time() + 10
            while "certificate reloaded" not in srv.output() and time.time() < deadline:
                time.sleep(0.1)
            self.assertIn(fp_b, srv.output())
            after = json.loads(subprocess.run(
                [H3LOAD, "--json", "-n", "1", srv.url("/healthz")], capture_output=True,
                text=True, timeout=30).stdout)
            self.assertEqual(after["server_cert_sha256"], fp_b, "QUIC did not pick up the new cert")
            tcp = subprocess.run(["curl", "-vsk", "-o", "/dev/null", srv.url("/healthz")],
                                 capture_output=True, text=True, timeout=10).stderr
            self.assertIn("CN=xdpq-cert-b", tcp, "TCP did not pick up the new cert")
            dl.join()
            still_running = dl.is_alive()
        self.assertFalse(still_running)
        self.assertEqual(sha256(result["r"].file(str(size))), sha256(pattern(size)),
                         "the download that started before the reload must complete")

    def test_a_failed_reload_changes_nothing(self):
        # Regression: the log level (and the certificate paths) were
        # applied before the certificate was read, so a reload that failed
        # on a missing certificate said "nothing changed" and had changed
        # the log level.
        key, cert, fp = make_cert(self.tmp, "xdpq-cert-a")
        conf = os.path.join(self.tmp, "reload.toml")

        def write(level, cert_path):
            with open(conf, "w") as f:
                f.write(f'[server]\nlog_level = "{level}"\n'
                        f'[tls]\ncert = "{cert_path}"\nkey = "{key}"\n')
        write("info", cert)
        with Server("--config", conf) as srv:
            write("debug", os.path.join(self.tmp, "missing.pem"))
            srv.proc.send_signal(signal.SIGHUP)
            deadline = time.time() + 10
            while "reload failed" not in srv.output() and time.time() < deadline:
                time.sleep(0.1)
            self.assertIn("reload failed, nothing changed", srv.output())
            r = gtlsclient(srv, ["/healthz"])
            self.assertEqual(r.statuses, {0: 200}, r.output[-2000:])
            time.sleep(0.3)
            log = srv.output()
        self.assertNotIn("handshake completed in", log, "the log level changed")

    def test_sigterm_drain_under_afxdp_leaves_nothing_attached(self):
        with Topology() as topo:
            srv = Server("--dataplane", "afxdp", "--interface", topo.srv_if, "--xdp-mode",
                         "native", "--drain-timeout", "3000", host=topo.srv_ip,
                         netns=topo.srv_ns, workers=0).__enter__()
            try:
                size = 24 << 20
                result = {}
                dl = threading.Thread(target=lambda: result.update(r=gtlsclient(
                    srv, [f"/bytes/{size}"], "-r", "0.03", quiet=True, netns=topo.cli_ns,
                    timeout=60)))
                dl.start()
                time.sleep(0.4)
                t0 = time.time()
                srv.proc.send_signal(signal.SIGTERM)
                srv.proc.wait(timeout=15)
                stop_s = time.time() - t0
                dl.join(timeout=30)
            finally:
                srv.__exit__()
            self.assertEqual(srv.proc.returncode, 0)
            self.assertLess(stop_s, 3 + 3, "drain exceeded its timeout")
            self.assertIn("draining", srv.output())
            self.assertIsNone(topo.xdp_attached(), "XDP program left attached after SIGTERM")
            r = result["r"]
            if r.has_file(str(size)) and os.path.getsize(
                    os.path.join(r.download_dir, str(size))) == size:
                self.assertEqual(sha256(r.file(str(size))), sha256(pattern(size)))
            # Otherwise the server closed it cleanly at the drain deadline: the
            # client exited on its own (it would hang until its idle timeout
            # on an unclean stop).

    def test_restart_with_same_secrets_resets_old_connection(self):
        secrets = os.path.join(self.tmp, "reset-secrets")
        port = free_udp_port()
        with Server("--secrets", secrets, port=port) as srv:
            r = gtlsclient(srv, ["/healthz"], "--quic-dump")
        token = re.search(r"stateless_reset_token=0x([0-9a-f]{32})", r.output).group(1)
        dcid = re.search(r"pkt tx pkn=\d+ dcid=0x([0-9a-f]+) type=1RTT", r.output).group(1)
        pkt = bytes([0x41]) + bytes.fromhex(dcid) + os.urandom(40)
        with Server("--secrets", secrets, port=port):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(3)
                s.sendto(pkt, ("127.0.0.1", port))
                reply = s.recv(2048)
        self.assertEqual(reply[-16:].hex(), token, "not a stateless reset for that connection")
        self.assertLess(len(reply), len(pkt))

    def test_control_socket_refuses_others_and_survives_garbage(self):
        with Server() as srv:
            path = srv.control_socket
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
            rc, out, err = xdpqctl(srv, "status", user="nobody")
            self.assertEqual(rc, 2, out + err)  # the file system says no
            os.chmod(path, 0o666)               # even with the file opened up...
            rc, out, err = xdpqctl(srv, "status", user="nobody")
            self.assertEqual(rc, 2, out + err)  # (xdpqctl refuses a server not its user's)
            self.assertIn("not by you", err)
            raw = subprocess.run(
                ["runuser", "-u", "nobody", "--", sys.executable, "-c",
                 "import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                 f"s.connect({path!r}); s.sendall(b'text\\tstatus\\n')\n"
                 "sys.stdout.write(s.recv(4096).decode())\n"],
                capture_output=True, text=True, timeout=15)
            self.assertIn("permission denied", raw.stdout)  # ...the daemon checks the peer's uid
            os.chmod(path, 0o600)
            for junk in (os.urandom(300), b"x" * 20000, b"json\tstatus", b"\n", b"yaml\tstats\n",
                         b"json\t\xff\xfe\n"):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    s.connect(path)
                    try:
                        s.sendall(junk)
                        s.shutdown(socket.SHUT_WR)
                        s.recv(4096)
                    except OSError:
                        pass
            rc, out, _ = xdpqctl(srv, "status")
            self.assertEqual(rc, 0, "the control socket did not survive garbage")
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})
            # Regression (review): the error that names an unknown command
            # passed its bytes on as they were: not JSON when they are not
            # UTF-8. They come back as U+FFFD.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(path)
                s.sendall(b"json\tst\xffat\xc3\xa9\n")
                reply = read_to_end(s)
            self.assertIn("st\ufffdat\u00e9", json.loads(reply.decode("utf-8"))["error"])

    def test_xdpqctl_talks_only_to_its_own_users_server(self):
        # Regression: xdpqctl asked, and believed, whatever listened at the
        # path; in the /tmp fallback another user can put a socket there.
        # (Root's xdpqctl may ask any user's xdpqd: a service's; the tests'
        # own xdpqctl, as root, asks servers all the time.)
        d = tempfile.mkdtemp(prefix="xdpq-impostor-")
        os.chmod(d, 0o777)
        path = os.path.join(d, "xdpqd.sock")
        impostor = subprocess.Popen(
            ["runuser", "-u", "nobody", "--", sys.executable, "-c", (
                "import os, socket, sys\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                f"s.bind({path!r}); os.chmod({path!r}, 0o666); s.listen(1)\n"
                "print('ready', flush=True)\n"
                "c, _ = s.accept(); c.settimeout(5)\n"
                "got = b''\n"
                "try:\n"
                "    c.sendall(b'workers 99 (all fine)\\n')\n"
                "    got = c.recv(4096)\n"
                "except OSError:\n"
                "    pass\n"
                "print('asked' if got else 'not asked', flush=True)\n")],
            stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(impostor.stdout.readline().strip(), "ready")
            rc, out, err = xdpqctl(path, "status", user="daemon")
            self.assertEqual(rc, 2, out + err)
            self.assertNotIn("workers 99", out)
            self.assertIn("not by you", err)
            self.assertEqual(impostor.communicate(timeout=10)[0].strip(), "not asked")
        finally:
            impostor.kill()
            shutil.rmtree(d, ignore_errors=True)

    def test_access_log_on_every_protocol_escaped_and_reopened(self):
        log = os.path.join(self.tmp, "access.log")
        line = re.compile(r'^127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] '
                          r'"(\S+) (\S+) (HTTP/[0-9.]+)" (\d+) (\d+) "([^"]*)" "([^"]*)" '
                          r'\d+\.\d{6}$')

        def lines(path, n):
            deadline = time.time() + 5  # written out on the worker's heartbeat
            while time.time() < deadline:
                with open(path) as f:
                    got = f.read().splitlines()
                if len(got) >= n:
                    return [line.match(x) for x in got]
                time.sleep(0.05)
            self.fail(f"{path}: fewer than {n} lines")

        with Server("--access-log", log) as srv:
            self.assertEqual(gtlsclient(srv, ["/bytes/123"]).statuses, {0: 200})
            subprocess.run(["curl", "-sk", "--http2", "-o", "/dev/null", "-e", "http://r/",
                            "-A", 'agent "quoted"', srv.url("/healthz")], check=True)
            # A client that tries to forge lines and fields: escaped.
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            with socket.create_connection((srv.host, srv.port)) as raw, \
                    ctx.wrap_socket(raw) as t:
                # Then, on the same connection, a byte no method starts with:
                # a line of its own, not a second one of the first request.
                t.sendall(b'GET /missing HTTP/1.1\r\nHost: x\r\n'
                          b'User-Agent: a"b\\c\td\xe9\r\n\r\n\x01 / HTTP/1.1\r\n\r\n')
                while t.recv(4096):
                    pass
            # An upload cut off mid-body: logged when the connection ends,
            # with status 0 (nothing was sent).
            with socket.create_connection((srv.host, srv.port)) as raw, \
                    ctx.wrap_socket(raw) as t:
                t.sendall(b'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n'
                          + b'x' * 1000)
            got = lines(log, 5)
            self.assertTrue(all(got), open(log).read())
            fields = sorted((m.group(3), m.group(1), m.group(2), m.group(4), m.group(5), m.group(6),
                             m.group(7)) for m in got)
            self.assertEqual(fields[0], ("HTTP/1.1", "-", "-", "400", fields[0][4], "-", "-"))
            self.assertEqual(fields[1], ("HTTP/1.1", "GET", "/missing", "404", fields[1][4], "-",
                                         "a\\x22b\\x5cc\\x09d\\xe9"))
            self.assertEqual(fields[2], ("HTTP/1.1", "POST", "/echo", "0", "0", "-", "-"))
            self.assertEqual(fields[3], ("HTTP/2", "GET", "/healthz", "200", fields[3][4],
                                         "http://r/", "agent \\x22quoted\\x22"))
            self.assertEqual(fields[4][:5], ("HTTP/3", "GET", "/bytes/123", "200", "123"))
            def rotate(sig, moved_to, path):
                """logrotate: the file moved, a signal, a fresh file."""
                os.rename(log, moved_to)
                srv.proc.send_signal(sig)
                deadline = time.time() + 5
                while not os.path.exists(log) and time.time() < deadline:
                    time.sleep(0.05)
                self.assertEqual(gtlsclient(srv, [path]).statuses, {0: 200})
                self.assertEqual(lines(log, 1)[0].group(2), path)

            rotate(signal.SIGHUP, log + ".1", "/bytes/7")
            self.assertEqual(len(open(log + ".1").read().splitlines()), 5)
            # logrotate's own signal, SIGUSR1: the log only, no reload
            # (which would apply whatever the file says by then). It used to
            # stop the server (the signal's default action).
            reloads = srv.output().count("reload")
            rotate(signal.SIGUSR1, log + ".2", "/bytes/8")
            self.assertEqual(len(open(log + ".2").read().splitlines()), 1)
            self.assertIn("SIGUSR1: access log reopened", srv.output())
            self.assertEqual(srv.output().count("reload"), reloads, srv.output()[-2000:])

    def test_sd_notify_ready_watchdog_stopping(self):
        path = os.path.join(self.tmp, "notify.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as n:
            n.bind(path)
            n.settimeout(5)
            env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
            with Server(extra_env=env) as srv:
                got = set()
                deadline = time.time() + 5
                while {"READY=1", "WATCHDOG=1"} - got and time.time() < deadline:
                    got.add(n.recv(256).decode())
                self.assertIn("READY=1", got)
                self.assertIn("WATCHDOG=1", got)
                # A reload says when it began: RELOADING=1 with
                # MONOTONIC_USEC (systemd 253 and later want both in one
                # message), then READY=1.
                before = time.monotonic()
                srv.proc.send_signal(signal.SIGHUP)
                msg = reloading(n)
                fields = dict(line.split("=", 1) for line in msg.split("\n"))
                self.assertIn("MONOTONIC_USEC", fields, msg)
                at = int(fields["MONOTONIC_USEC"]) / 1e6
                self.assertTrue(before <= at <= time.monotonic(), (before, at))
                while n.recv(256).decode() != "READY=1":
                    pass
                srv.proc.send_signal(signal.SIGTERM)
                deadline = time.time() + 5
                while "STOPPING=1" not in got and time.time() < deadline:
                    got.add(n.recv(256).decode())
                self.assertIn("STOPPING=1", got)


    def test_a_reload_waiting_on_dns_keeps_the_watchdog_fed(self):
        # Regression: a reload resolved upstream names on the control
        # thread, which also feeds systemd's watchdog; a resolver that does
        # not answer held it longer than WatchdogSec, and systemd killed
        # the server for a reload that would have failed harmlessly. The
        # resolver here outwaits the reload's 30 s limit (60 s: glibc caps
        # a query's timeout at 30 s), so the reload gives up on it, the
        # server goes on serving, and it stops cleanly with the lookup
        # still running.
        with silent_resolver(self.tmp) as (ns, write, n, env):
            with Server("--config", write.path, netns=ns, extra_env=env) as srv:
                reload_to_an_unresolvable_name(srv, write, n)
                pings = 0
                while True:  # until the reload is over
                    msg = n.recv(256).decode()
                    if msg == "READY=1":
                        break
                    pings += msg == "WATCHDOG=1"
                self.assertGreaterEqual(pings, 25, "watchdog pings stopped while the reload waited")
                self.assertIn("reload failed, nothing changed", srv.output())
                self.assertIn("took longer than 30 s", srv.output())
                # Regression: each reload meanwhile left one more thread
                # waiting on the resolver. The next one is refused at
                # once while the first check still runs.
                srv.proc.send_signal(signal.SIGHUP)
                while n.recv(256).decode() != "READY=1":
                    pass
                self.assertIn("the previous reload's check of the configuration is still "
                              "running", srv.output())
                # The old configuration still serves (502: nothing at port 9).
                r = subprocess.run(["ip", "netns", "exec", ns, "curl", "-sk", "-o",
                                    "/dev/null", "-w", "%{http_code}", srv.url("/app/x")],
                                   capture_output=True, text=True, timeout=10)
                self.assertEqual(r.stdout, "502", r.stderr)
                stats = srv.stop()  # the lookup still waits on its thread
                self.assertEqual(srv.proc.returncode, 0, srv.output()[-2000:])
                self.assertIn("tcp_requests", stats)

    def test_a_stop_during_a_reload_does_not_wait_for_it(self):
        # Regression: SIGTERM during a reload that waited on a resolver was
        # read only once the reload gave up, up to 30 s later: systemd's
        # TimeoutStopSec (30 s) could kill the server before its drain
        # began. The reload is abandoned now and the drain begins.
        with silent_resolver(self.tmp) as (ns, write, n, env):
            with Server("--config", write.path, netns=ns, extra_env=env) as srv:
                reload_to_an_unresolvable_name(srv, write, n)
                srv.proc.send_signal(signal.SIGTERM)
                while n.recv(256).decode() != "STOPPING=1":
                    pass
                self.assertEqual(srv.proc.wait(timeout=20), 0, srv.output()[-2000:])
                log = srv.output()
        self.assertIn("reload failed, nothing changed: abandoned: the server was asked to stop",
                      log)
        self.assertNotIn("took longer than 30 s", log)
        self.assertIn("draining", log)

    def test_a_stop_during_an_upgrade_does_not_wait_for_it(self):
        # Regression (review): a binary upgrade waited up to 30 s for the
        # new process to be ready, on the control thread, without looking
        # at a SIGTERM that came meanwhile. The upgrade is abandoned now
        # (the new process stopped) and the drain begins.
        with silent_resolver(self.tmp) as (ns, write, n, env):
            with Server("--config", write.path, netns=ns, extra_env=env) as srv:
                while n.recv(256).decode() != "READY=1":
                    pass
                write("http://app.example:8080")  # the new process resolves it as it starts
                srv.proc.send_signal(signal.SIGUSR2)
                give_up = time.time() + 10
                while "upgrade: started" not in srv.output() and time.time() < give_up:
                    time.sleep(0.05)
                time.sleep(0.5)  # into the wait for its verdict
                srv.proc.send_signal(signal.SIGTERM)
                self.assertEqual(srv.proc.wait(timeout=20), 0, srv.output()[-2000:])
                log = srv.output()
        self.assertIn("upgrade failed, still serving: abandoned: the server was asked to stop",
                      log)
        self.assertIn("draining", log)


def reload_to_an_unresolvable_name(srv, write, notify):
    """Once srv is ready: a route to a name the resolver never answers, and
    SIGHUP; returns when the reload has begun (RELOADING=1)."""
    while notify.recv(256).decode() != "READY=1":
        pass
    write("http://app.example:8080")  # resolved by the reload
    srv.proc.send_signal(signal.SIGHUP)
    reloading(notify)


def reloading(notify):
    """Reads notify messages until a reload's RELOADING=1; returns it."""
    while True:
        msg = notify.recv(256).decode()
        if msg.split("\n")[0] == "RELOADING=1":
            return msg


@contextlib.contextmanager
def silent_resolver(tmp):
    """A network namespace whose resolver takes every query and answers
    none; yields (namespace, write, notify, env): write(url) writes a
    config file (write.path) with one proxy route to url, notify is a bound
    NOTIFY_SOCKET and env the environment that names it (with a 1 s
    watchdog)."""
    ns = f"xdpq-dns-{os.getpid()}"
    etc = f"/etc/netns/{ns}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    dns = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "resolv.conf"), "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:30 attempts:2\n")
        dns = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c",
             "import socket\n"
             "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
             "s.bind(('127.0.0.1', 53)); print('ready', flush=True)\n"
             "while True: s.recv(4096)\n"], stdout=subprocess.PIPE, text=True)
        assert dns.stdout.readline().strip() == "ready"
        cfg = os.path.join(tmp, "dns.toml")

        def write(url):
            with open(cfg, "w") as f:
                f.write(f'[[proxy]]\nprefix = "/app"\nupstreams = ["{url}"]\n')
        write.path = cfg
        write("http://127.0.0.1:9")
        path = os.path.join(tmp, "notify-dns.sock")
        if os.path.exists(path):
            os.unlink(path)  # an earlier test's
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as n:
            n.bind(path)
            n.settimeout(30)
            yield ns, write, n, {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}
    finally:
        if dns:
            dns.kill()
            dns.wait()
        subprocess.run(["ip", "netns", "del", ns])
        shutil.rmtree(etc, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
