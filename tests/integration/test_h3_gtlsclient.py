#!/usr/bin/python3
"""HTTP/3 against xdpqd --dataplane socket with Debian's gtlsclient.

Every case checks status codes and content by sha256; server-side counters
(from xdpqd's exit stats line) prove resumption, 0-RTT, key update,
migration and Retry actually happened."""

import concurrent.futures
import json
import os
import select
import shutil
import sys
import socket
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (Server, TimedTestCase, gtlsclient, pattern, require_tools,  # noqa: E402
                     sha256, xdpqctl)

TEN_MIB = 10 * 1024 * 1024


class GtlsclientTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()
        cls.docroot = tempfile.mkdtemp(prefix="xdpq-docroot-")
        cls.small = os.urandom(4321)
        with open(os.path.join(cls.docroot, "small.bin"), "wb") as f:
            f.write(cls.small)
        with open(os.path.join(cls.docroot, "index.html"), "w") as f:
            f.write("<h1>test root</h1>\n")

    def assert_all_2xx(self, stats, n):
        """Status check for quiet runs (gtlsclient prints statuses only when
        verbose, and verbose output slows large transfers 100x)."""
        self.assertEqual(stats["responses_2xx"], n, stats)
        for cls in ("3xx", "4xx", "5xx"):
            self.assertEqual(stats["responses_" + cls], 0, stats)

    def wait_for(self, srv, cond, timeout=10):
        """Polls the server's summed counters until cond(them) holds."""
        deadline = time.time() + timeout
        while True:
            rc, out, err = xdpqctl(srv, "stats", json_out=True)
            self.assertEqual(rc, 0, err)
            if cond(json.loads(out)["total"]) or time.time() > deadline:
                return
            time.sleep(0.05)

    def serve(self, *args, **kw):
        return Server("--dataplane", "socket", "--docroot", self.docroot, *args, **kw)

    def test_small_file(self):
        with self.serve() as srv:
            r = gtlsclient(srv, ["/small.bin", "/"])
        self.assertEqual(r.statuses, {0: 200, 1: 200}, r.output[-2000:])
        self.assertEqual(sha256(r.file("small.bin")), sha256(self.small))
        self.assertEqual(r.file("index.html"), b"<h1>test root</h1>\n")

    def test_not_found_and_method(self):
        with self.serve() as srv:
            r = gtlsclient(srv, ["/missing", "/../../etc/passwd"])
        self.assertEqual(r.statuses[0], 404)
        self.assertIn(r.statuses[1], (400, 404))

    def test_ten_mib_body(self):
        with self.serve() as srv:
            r = gtlsclient(srv, [f"/bytes/{TEN_MIB}"], quiet=True)
            stats = srv.stop()
        self.assert_all_2xx(stats, 1)
        self.assertEqual(sha256(r.file(str(TEN_MIB))), sha256(pattern(TEN_MIB)))
        self.assertGreater(stats["tx_gso_batches"], 0, "large responses should use UDP GSO")

    def test_2000_requests_on_one_connection(self):
        with self.serve() as srv:
            r = gtlsclient(srv, ["/bytes/777"], "-n", "2000", download=False)
            stats = srv.stop()
        self.assertEqual(len(r.statuses), 2000, r.output[-2000:])
        self.assertEqual(set(r.statuses.values()), {200})
        self.assertEqual(stats["handshakes_completed"], 1)
        self.assertEqual(stats["requests"], 2000)
        self.assertEqual(stats["responses_2xx"], 2000)

    # With 30 % loss each way half the round trips fail, and retransmission
    # backoff alone can take a handshake past the default 10 s limit or a
    # transfer past a 15 s idle timeout: the tests raise both on purpose,
    # to 150 s: a request gtlsclient loses on its way out waits for probes
    # it arms 15 s, then 30 s, 60 s apart.
    LOSSY = ("--handshake-timeout", "150000", "--idle-timeout", "150000")

    def loss(self, rate):
        size = 1024 * 1024
        with self.serve(*self.LOSSY) as srv:
            r = gtlsclient(srv, [f"/bytes/{size}"], "-r", rate, "-t", rate,
                           "--handshake-timeout=150s", timeout=400, quiet=True,
                           idle_timeout="150s")
            stats = srv.stop()
        self.assert_all_2xx(stats, 1)
        self.assertEqual(sha256(r.file(str(size))), sha256(pattern(size)))

    def test_twenty_lossy_clients_at_once(self):
        # Regression: 20 concurrent clients with 30 % loss each way used to
        # lose one in about half the runs: their handshakes outlived the
        # server's fixed 10 s limit. With the limit raised, all complete.
        # Half the round trips fail, and a long run of failures in a row
        # (rare, but twenty clients give it many chances) backs the probe
        # timeout off past a minute, so both sides wait 150 s here.
        #
        # What the server cannot help: a request the client lost on its own
        # way out. gtlsclient then waits for its own probe timer, which it
        # was seen to arm 15 s after such a loss, then 30 s, 60 s (its qlog:
        # handshake confirmed, smoothed RTT 5 ms, the request unacknowledged
        # and the server never sent a byte of it). Four losses of that
        # request in a row outlast any wait. So each request the server did
        # get (its access log) must be answered whole; a client without its
        # file must be one whose request never arrived, and only one.
        patient = ("--handshake-timeout", "150000", "--idle-timeout", "150000")
        tmp = tempfile.mkdtemp(prefix="xdpq-lossy-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        log = os.path.join(tmp, "access.log")
        with self.serve(*patient, "--access-log", log) as srv:
            with concurrent.futures.ThreadPoolExecutor(20) as pool:
                results = list(pool.map(
                    lambda i: gtlsclient(srv, [f"/bytes/{1000 + i}"], "-r", "0.3", "-t", "0.3",
                                         "--handshake-timeout=150s", timeout=400,
                                         quiet=True, idle_timeout="150s"), range(20)))
            stats = srv.stop()
        with open(log) as f:
            served = [line.split('"')[1].split()[1] for line in f.read().splitlines()]
        self.assertEqual(len(served), len(set(served)), served)
        self.assertEqual(len(served), stats["requests"], (served, stats))
        missing = []
        for i, r in enumerate(results):
            path = f"/bytes/{1000 + i}"
            whole = r.has_file(str(1000 + i)) and r.file(str(1000 + i)) == pattern(1000 + i)
            if not whole:
                # A client without its file: say what it and the server saw.
                self.assertNotIn(path, served,
                                 f"client {i}: exit {r.returncode}, {r.output[-1500:]}; "
                                 f"server: {stats}")
                missing.append(i)
        self.assertLessEqual(len(missing), 1, f"clients whose request never arrived: {missing}")
        if missing:
            print(f"(client {missing[0]} lost its own request until it gave up)", end=" ")
        self.assertEqual(stats["handshakes_completed"], 20, stats)
        self.assertEqual(stats["handshakes_failed"], 0, stats)
        self.assertEqual(stats["conn_errors"], 0, stats)  # no connection the server gave up on
        self.assertEqual(stats["requests"], 20 - len(missing), stats)
        self.assertEqual(stats["responses_2xx"], 20 - len(missing), stats)

    def test_loss_5_percent(self):
        self.loss("0.05")

    def test_loss_30_percent(self):
        self.loss("0.3")

    def test_resumption_and_0rtt(self):
        tmp = tempfile.mkdtemp(prefix="xdpq-0rtt-")
        session = os.path.join(tmp, "session.pem")
        tp = os.path.join(tmp, "tp.txt")
        secrets = os.path.join(tmp, "secrets")
        with self.serve("--secrets", secrets) as srv:
            first = gtlsclient(srv, ["/bytes/100"], f"--session-file={session}",
                               f"--tp-file={tp}")
            self.assertEqual(first.statuses, {0: 200})
            self.assertTrue(os.path.exists(session), "no session ticket received")
            second = gtlsclient(srv, ["/bytes/200"], f"--session-file={session}",
                                f"--tp-file={tp}", "--quic-dump")
            stats = srv.stop()
        self.assertEqual(second.statuses, {0: 200})
        self.assertEqual(second.file("200"), pattern(200))
        self.assertIn("type=0RTT", second.output, "client sent no 0-RTT packets")
        self.assertNotIn("Early data was rejected", second.output)
        self.assertEqual(stats["handshakes_completed"], 2)
        self.assertEqual(stats["sessions_resumed"], 1, "second handshake was not a resumption")
        self.assertEqual(stats["early_data_accepted"], 1, "0-RTT request not accepted")

    def test_unsafe_request_in_0rtt_gets_425(self):
        # 0-RTT data can be replayed (to another node behind a balancer,
        # whose anti-replay store is its own): a POST that arrives in it is answered 425 Too Early
        # (RFC 8470), a GET is served.
        tmp = tempfile.mkdtemp(prefix="xdpq-425-")
        session = os.path.join(tmp, "session.pem")
        tp = os.path.join(tmp, "tp.txt")
        body = os.path.join(tmp, "body")
        with open(body, "wb") as f:
            f.write(b"side effect")
        with self.serve() as srv:
            first = gtlsclient(srv, ["/healthz"], f"--session-file={session}", f"--tp-file={tp}")
            self.assertEqual(first.statuses, {0: 200})
            second = gtlsclient(srv, ["/echo"], f"--session-file={session}", f"--tp-file={tp}",
                                "-d", body, "-m", "POST", "--quic-dump")
            stats = srv.stop()
        self.assertIn("type=0RTT", second.output, "client sent no 0-RTT packets")
        self.assertEqual(second.statuses, {0: 425}, second.output[-2000:])
        self.assertEqual(stats["too_early"], 1, stats)
        self.assertEqual(stats["responses_2xx"], 1, stats)

    def test_a_0rtt_hello_replayed_to_another_worker_is_refused(self):
        # Regression: each worker kept its own anti-replay store, so the
        # first flight of a 0-RTT connection, replayed from other source
        # ports (which the kernel spreads over the workers' sockets), had
        # its early data accepted once more by another worker. The workers
        # share one store now: every replay is refused, on either worker.
        tmp = tempfile.mkdtemp(prefix="xdpq-replay-")
        session = os.path.join(tmp, "session.pem")
        tp = os.path.join(tmp, "tp.txt")
        replays = 16
        with self.serve(workers=2) as srv:
            first = gtlsclient(srv, ["/healthz"], f"--session-file={session}", f"--tp-file={tp}")
            self.assertEqual(first.statuses, {0: 200})
            with UdpRelay((srv.host, srv.port)) as relay:
                second = gtlsclient(relay, ["/bytes/10"], f"--session-file={session}",
                                    f"--tp-file={tp}", "--quic-dump")
            self.assertIn("type=0RTT", second.output, "client sent no 0-RTT packets")
            self.assertEqual(second.file("10"), pattern(10), second.output[-2000:])
            # Once the client's connection is gone (its closing period
            # too), no route leads a replay back to the worker that served it.
            self.wait_for(srv, lambda t: t["quic_connections"] == 0)
            for _ in range(replays):
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    for d in relay.first_flight:
                        s.sendto(d, (srv.host, srv.port))
            self.wait_for(srv, lambda t: t["handshakes_started"] >= 4)
            stats = srv.stop()
        # The first replay a worker gets starts a connection; later ones
        # carry its (client-chosen) connection ID and are routed to it.
        # Sixteen source ports reach both workers (all but 1 in 2^15).
        self.assertEqual(stats["handshakes_started"], 2 + 2, stats)
        self.assertEqual(stats["early_data_accepted"], 1, stats)
        self.assertEqual(stats["early_data_refused"], 2, stats)

    def test_resumption_survives_restart_with_same_secrets(self):
        tmp = tempfile.mkdtemp(prefix="xdpq-restart-")
        session = os.path.join(tmp, "session.pem")
        tp = os.path.join(tmp, "tp.txt")
        secrets = os.path.join(tmp, "secrets")
        with self.serve("--secrets", secrets) as srv:
            gtlsclient(srv, ["/healthz"], f"--session-file={session}", f"--tp-file={tp}")
            port = srv.port
        self.assertEqual(os.stat(secrets).st_mode & 0o777, 0o600)
        with self.serve("--secrets", secrets, port=port) as srv:
            r = gtlsclient(srv, ["/healthz"], f"--session-file={session}", f"--tp-file={tp}")
            stats = srv.stop()
        self.assertEqual(r.statuses, {0: 200})
        self.assertEqual(stats["sessions_resumed"], 1)

    def test_key_update(self):
        size = 4 * 1024 * 1024
        with self.serve() as srv:
            r = gtlsclient(srv, [f"/bytes/{size}"], "--key-update=1ms", quiet=True)
            stats = srv.stop()
        self.assert_all_2xx(stats, 1)
        self.assertEqual(sha256(r.file(str(size))), sha256(pattern(size)))
        self.assertGreater(stats["key_updates"], 0, "no key update happened")

    def test_chacha20_only(self):
        prio = "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+CHACHA20-POLY1305"
        with self.serve() as srv:
            r = gtlsclient(srv, ["/bytes/50000"], f"--ciphers={prio}")
        self.assertEqual(r.statuses, {0: 200}, r.output[-2000:])
        self.assertIn("Negotiated cipher suite is CHACHA20-POLY1305", r.output)
        self.assertEqual(r.file("50000"), pattern(50000))

    def test_client_address_change_during_transfer(self):
        size = 32 * 1024 * 1024
        # Two workers: the new path must still reach the connection's
        # worker (connection-ID steering on the SO_REUSEPORT group).
        with self.serve(workers=2) as srv:
            r = gtlsclient(srv, [f"/bytes/{size}"], "--change-local-addr=20ms",
                           "-r", "0.001", timeout=120, quiet=True)
            stats = srv.stop()
        self.assert_all_2xx(stats, 1)
        self.assertEqual(sha256(r.file(str(size))), sha256(pattern(size)))
        self.assertGreater(stats["path_validations_ok"], 0, "server validated no new path")
        self.assertEqual(stats["stateless_resets_sent"], 0)

    def test_retry_on(self):
        with self.serve("--retry", "on") as srv:
            r = gtlsclient(srv, ["/bytes/1000"])
            stats = srv.stop()
        self.assertEqual(r.statuses, {0: 200})
        self.assertEqual(r.file("1000"), pattern(1000))
        self.assertEqual(stats["retries_sent"], 1)
        self.assertEqual(stats["handshakes_completed"], 1)

    def test_ipv6(self):
        with self.serve(host="::1") as srv:
            r = gtlsclient(srv, ["/small.bin", "/bytes/100000"])
        self.assertEqual(r.statuses, {0: 200, 1: 200}, r.output[-2000:])
        self.assertEqual(sha256(r.file("small.bin")), sha256(self.small))
        self.assertEqual(r.file("100000"), pattern(100000))

    def test_post_echo(self):
        body = os.urandom(200000)
        path = os.path.join(tempfile.mkdtemp(), "upload")
        with open(path, "wb") as f:
            f.write(body)
        with self.serve() as srv:
            r = gtlsclient(srv, ["/echo"], "-m", "POST", "-d", path)
        self.assertEqual(r.statuses, {0: 200})
        self.assertEqual(sha256(r.file("echo")), sha256(body))



class UdpRelay:
    """Relays one client's datagrams to a server from a socket of its own,
    and the answers back; keeps what the client sent before the server's
    first answer (its first flight). Stands in for the server in
    gtlsclient() (host, port, url)."""

    def __init__(self, target):
        self.target = target
        self.host = "127.0.0.1"
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind((self.host, 0))
        self.port = self.front.getsockname()[1]
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.connect(target)
        self.first_flight = []
        self.client = None
        self.answered = False
        self.done = False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def url(self, path):
        return f"https://{self.target[0]}:{self.target[1]}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done = True
        self.thread.join()
        self.front.close()
        self.back.close()

    def run(self):
        self.front.setblocking(False)
        self.back.setblocking(False)
        while not self.done:
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            # Everything the client sent is read before any answer is
            # passed on: the first flight is complete when one arrives.
            while self.front in ready:
                try:
                    data, self.client = self.front.recvfrom(65536)
                except BlockingIOError:
                    break
                if not self.answered:
                    self.first_flight.append(data)
                self.back.send(data)
            while self.back in ready:
                try:
                    data = self.back.recv(65536)
                except (BlockingIOError, ConnectionRefusedError):
                    break
                self.answered = True
                self.front.sendto(data, self.client)

if __name__ == "__main__":
    unittest.main(verbosity=2)
