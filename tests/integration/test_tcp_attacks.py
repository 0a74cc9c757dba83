#!/usr/bin/python3
"""Attacks on the TCP side with real traffic (python3-h2 and raw frames):
rapid reset, CONTINUATION flood, oversized and over-many headers, SETTINGS
and PING floods, a client that never reads, a slow client that never
finishes its headers, the "MadeYouReset" class, plain text to the TLS port.
Each ends in a GOAWAY, a 431 or a close within a bounded time, memory stays
bounded, and a well-behaved client served in parallel keeps getting its
responses."""

import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import h2.config
import h2.connection
import h2.events
import h2.settings

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server, TimedTestCase, require_tools, xdpqctl  # noqa: E402

FAST_TIMEOUTS = ("--tcp-header-timeout", "2000", "--tcp-write-timeout", "2000",
                 "--tcp-handshake-timeout", "2000",
                 # Small body budgets: what the hoarding test may make it hold.
                 "--max-request-body", str(4 << 20), "--max-body-per-connection", str(4 << 20),
                 "--max-body-per-worker", str(6 << 20))


def tls_socket(srv, alpn="h2"):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    raw = socket.create_connection((srv.host, srv.port), timeout=10)
    return ctx.wrap_socket(raw)


def wide_open_h2(srv):
    """A TLS socket and an HTTP/2 client with 16 MiB windows."""
    s = tls_socket(srv)
    c = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16 << 20})
    c.increment_flow_control_window(16 << 20)
    return s, c


def h2_get(s, c, sid, path, chunk, after_read=None):
    """GETs path on stream sid, reading at most chunk bytes at a time and
    calling after_read(bytes so far) after each read: (bytes, ended whole)."""
    c.send_headers(sid, [(":method", "GET"), (":scheme", "https"), (":authority", "x"),
                         (":path", path)], end_stream=True)
    s.sendall(c.data_to_send())
    got, ended = 0, False
    s.settimeout(5)
    while not ended:
        data = s.recv(chunk)
        if not data:
            break
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                got += len(ev.data)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and \
                    ev.stream_id == sid:
                ended = isinstance(ev, h2.events.StreamEnded)
        s.sendall(c.data_to_send())
        if after_read:
            after_read(got)
    return got, ended


def frame(ftype, flags, stream, payload=b""):
    return struct.pack("!I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack("!I", stream) + payload


def hpack_literal(name, value):
    """Literal header field without indexing, new name (RFC 7541 6.2.2)."""
    assert len(name) < 127 and len(value) < 127
    return bytes([0x00, len(name)]) + name + bytes([len(value)]) + value


REQUEST_HPACK = bytes([0x82, 0x87, 0x84]) + hpack_literal(b":authority", b"x")  # GET https /


def read_until_closed(sock, deadline_s):
    """Reads (discarding) until EOF/reset or the deadline; returns (closed, data)."""
    sock.settimeout(0.2)
    data = b""
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return True, data
        if not chunk:
            return True, data
        data += chunk
        if len(data) > (8 << 20):
            data = data[-(1 << 20):]
    return False, data


def goaway_code(data):
    """The error code of the first GOAWAY frame in raw HTTP/2 bytes, or None."""
    i = 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i:i + 3], "big")
        ftype = data[i + 3]
        if ftype == 7 and i + 9 + 8 <= len(data):
            return int.from_bytes(data[i + 9 + 4:i + 9 + 8], "big")
        i += 9 + length
    return None


# How much xdpqd may grow during an attack. A sanitizer build keeps freed
# memory in quarantine and adds shadow memory: its bound is looser (the
# attacks this guards against grew it by a gigabyte).
RSS_BOUND_KB = (128 if "ASAN_OPTIONS" in os.environ else 64) * 1024


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Bystander(threading.Thread):
    """A well-behaved client fetching over HTTP/2 the whole time."""

    def __init__(self, srv):
        super().__init__(daemon=True)
        self.srv = srv
        self.ok = 0
        self.bad = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            r = subprocess.run(["curl", "-sk", "--http2", "-o", "/dev/null", "-w", "%{http_code}",
                                # Served while an attack loads a slow machine:
                                # slow is fine, failing is not.
                                "--max-time", "15", self.srv.url("/bytes/1000")],
                               capture_output=True, text=True)
            if r.stdout == "200":
                self.ok += 1
            else:
                self.bad.append(r.stdout)
            time.sleep(0.05)

    def finish(self, test):
        self.stop.set()
        self.join(timeout=20)
        test.assertGreater(self.ok, 0, "the well-behaved client got nothing")
        test.assertEqual(self.bad, [], "the well-behaved client saw failures")


class AttackTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()

    def setUp(self):
        super().setUp()
        self.srv = Server(*FAST_TIMEOUTS).__enter__()
        self.addCleanup(self.srv.__exit__)
        self.rss0 = rss_kb(self.srv.proc.pid)
        self.bystander = Bystander(self.srv)
        self.bystander.start()
        self.finished = None

    def finish(self):
        """Stops the bystander (asserting it was served), checks memory, stops
        the server and returns its counters."""
        if self.finished is None:
            self.bystander.finish(self)
            grown = rss_kb(self.srv.proc.pid) - self.rss0
            self.assertLess(grown, RSS_BOUND_KB, f"xdpqd grew by {grown} KiB during the attack")
            self.finished = self.srv.stop()
        return self.finished

    def tearDown(self):
        self.finish()
        super().tearDown()

    def h2_client(self):
        s = tls_socket(self.srv)
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                 header_encoding="utf-8"))
        c.initiate_connection()
        s.sendall(c.data_to_send())
        return s, c

    def test_rapid_reset_flood(self):
        s, c = self.h2_client()
        start = time.time()
        sid = 1
        try:
            for _ in range(5000):
                c.send_headers(sid, [(":method", "GET"), (":scheme", "https"),
                                     (":authority", "x"), (":path", "/bytes/100000")])
                c.reset_stream(sid)
                sid += 2
                s.sendall(c.data_to_send())
        except (ConnectionError, ssl.SSLError, OSError, h2.exceptions.ProtocolError):
            pass
        closed, data = read_until_closed(s, 10)
        self.assertTrue(closed or goaway_code(data) is not None, "flood not stopped")
        self.assertLess(time.time() - start, 15)
        self.assertGreater(self.finish()["tcp_goaways_sent"], 0)

    def test_continuation_flood(self):
        s = tls_socket(self.srv)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
        s.sendall(frame(1, 0, 1, REQUEST_HPACK))  # HEADERS without END_HEADERS
        try:
            for i in range(10000):
                s.sendall(frame(9, 0, 1, hpack_literal(b"x-flood", b"%06d" % i)))
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        closed, data = read_until_closed(s, 10)
        self.assertTrue(closed, "CONTINUATION flood not stopped")
        self.assertIsNotNone(goaway_code(data), "expected a GOAWAY before the close")

    def test_oversized_and_over_many_headers_get_431(self):
        s, c = self.h2_client()
        base = [(":method", "GET"), (":scheme", "https"), (":authority", "x"), (":path", "/")]
        c.send_headers(1, base + [("x-big", "a" * 20000)], end_stream=True)
        c.send_headers(3, base + [(f"x-h{i}", "v") for i in range(300)], end_stream=True)
        c.send_headers(5, base, end_stream=True)
        s.sendall(c.data_to_send())
        status = {}
        s.settimeout(5)
        while len(status) < 3:
            data = s.recv(65536)
            if not data:
                break
            for ev in c.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    status[ev.stream_id] = dict(ev.headers)[":status"]
                if isinstance(ev, h2.events.StreamReset):
                    status[ev.stream_id] = "reset"
            s.sendall(c.data_to_send())
        self.assertEqual(status.get(1), "431")
        self.assertEqual(status.get(3), "431")
        self.assertEqual(status.get(5), "200", "the connection must survive a 431")
        # HTTP/1.1 too.
        s1 = tls_socket(self.srv, "http/1.1")
        s1.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        closed, data = read_until_closed(s1, 5)
        self.assertTrue(data.startswith(b"HTTP/1.1 431"), data[:100])

    def flood(self, payload_frame, count):
        s = tls_socket(self.srv)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
        start = time.time()
        try:
            batch = payload_frame * 500
            for _ in range(count // 500):
                s.sendall(batch)  # never reading the ACKs
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        closed, _ = read_until_closed(s, 10)
        self.assertTrue(closed, "flood did not end the connection")
        self.assertLess(time.time() - start, 20)

    def test_settings_flood(self):
        self.flood(frame(4, 0, 0, struct.pack("!HI", 3, 100)), 200000)

    def test_ping_flood(self):
        self.flood(frame(6, 0, 0, b"12345678"), 200000)

    def test_client_that_never_reads(self):
        s, c = self.h2_client()
        for sid in range(1, 40, 2):
            c.send_headers(sid, [(":method", "GET"), (":scheme", "https"), (":authority", "x"),
                                 (":path", "/bytes/67108864")], end_stream=True)
        s.sendall(c.data_to_send())
        start = time.time()
        time.sleep(4)  # never read: the server must not buffer 1.3 GB
        rss = rss_kb(self.srv.proc.pid) - self.rss0
        self.assertLess(rss, RSS_BOUND_KB, f"grew {rss} KiB for a client that never reads")
        closed, _ = read_until_closed(s, 10)
        self.assertTrue(closed)
        self.assertLess(time.time() - start, 20)
        self.assertGreater(self.finish()["tcp_timeouts_write"], 0)

    def test_pings_keep_neither_a_stalled_nor_an_idle_connection(self):
        # Regression: any byte from the client moved the connection's
        # deadlines, so a PING every few seconds kept forever both a
        # connection whose stream waited on a window the client never
        # opened (the write deadline: "a client that never opens its
        # window") and one with nothing open (the idle deadline).
        self.finish()
        with Server("--tcp-write-timeout", "1000", "--tcp-idle-timeout", "1500") as srv:
            def pinging(stalled):
                s = tls_socket(srv)
                c = h2.connection.H2Connection(h2.config.H2Configuration(
                    client_side=True, header_encoding="utf-8"))
                c.initiate_connection()
                if stalled:
                    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
                # Stalled: more than the window; idle: answered whole.
                path = "/bytes/100000" if stalled else "/bytes/10"
                c.send_headers(1, [(":method", "GET"), (":scheme", "https"), (":authority", "x"),
                                   (":path", path)], end_stream=True)
                s.sendall(c.data_to_send())
                start = time.time()
                s.settimeout(0.2)
                while time.time() - start < 8:
                    try:
                        c.ping(b"12345678")
                        s.sendall(c.data_to_send())
                    except (ssl.SSLError, OSError, h2.exceptions.ProtocolError):
                        return time.time() - start  # closed (after a GOAWAY)
                    try:
                        data = s.recv(65536)
                        if not data:
                            return time.time() - start
                        c.receive_data(data)
                    except socket.timeout:
                        pass
                    except (ssl.SSLError, OSError, h2.exceptions.ProtocolError):
                        return time.time() - start
                    time.sleep(0.2)
                return None
            for stalled in (True, False):
                took = pinging(stalled)
                self.assertIsNotNone(took, f"stalled={stalled}: still open after 8 s of PINGs")
            stats = srv.stop()
        self.assertGreaterEqual(stats["tcp_timeouts_write"], 1, stats)
        self.assertGreaterEqual(stats["tcp_timeouts_idle"], 1, stats)

    def test_empty_lines_keep_no_http1_connection_alive(self):
        # Regression: over HTTP/1.1 any byte moved the idle deadline, and
        # the empty lines a client may send between requests (the parser
        # skips them, so no header deadline starts either) kept a
        # connection that made no request open for good: a slot, a
        # descriptor, a TLS session each.
        self.finish()
        with Server("--tcp-idle-timeout", "1000") as srv:
            s = tls_socket(srv, alpn="http/1.1")
            s.sendall(b"GET /bytes/10 HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertIn(b"200 OK", s.recv(65536))
            start = time.time()
            s.settimeout(0.2)
            closed_after = None
            while time.time() - start < 6:
                try:
                    s.sendall(b"\r\n")
                    data = s.recv(65536)
                    if not data:
                        closed_after = time.time() - start
                        break
                except socket.timeout:
                    pass
                except (ssl.SSLError, OSError):
                    closed_after = time.time() - start
                    break
                time.sleep(0.3)
            self.assertIsNotNone(closed_after, "still open after 6 s of empty lines")
            s.close()
            stats = srv.stop()
        self.assertGreaterEqual(stats["tcp_timeouts_idle"], 1, stats)

    def test_one_byte_tls_records_are_read_a_few_at_a_time(self):
        # Regression: a client sending its body in one-byte TLS records had
        # the worker decrypt and parse up to 256 Ki of them in one event,
        # one SSL_read each, before anyone else was served. Reads now stop
        # at 64 records per event (counted); the request is served whole.
        body = os.urandom(3000)
        s = tls_socket(self.srv, alpn="http/1.1")
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        # Corked: the records reach the server together, not as it reads.
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        for i in range(len(body)):
            s.sendall(body[i:i + 1])  # one record each
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        closed, data = read_until_closed(s, 10)
        self.assertTrue(closed)
        self.assertTrue(data.startswith(b"HTTP/1.1 200"), data[:200])
        self.assertTrue(data.endswith(body))
        self.assertGreater(self.finish()["tcp_reads_capped"], 0)

    def test_a_slow_reader_and_a_goodbye_are_not_cut_by_the_write_deadline(self):
        # The other side of counting only requests and responses: a client
        # that reads an answer slowly, after its last frame was produced,
        # is making progress as what was produced reaches it; and a
        # graceful goodbye (GOAWAY, PING, the last GOAWAY) to a connection
        # idle longer than the write timeout gets its round trip.
        self.finish()
        n = 600_000
        with Server("--tcp-write-timeout", "1000", "--tcp-idle-timeout", "20000") as srv:
            s, c = wide_open_h2(srv)
            # About 128 KiB/s: 4 s for the answer.
            got, ended = h2_get(s, c, 1, f"/bytes/{n}", 32 << 10, lambda got: time.sleep(0.25))
            self.assertEqual((got, ended), (n, True))
            # Idle past the write timeout, then a drain: both GOAWAYs come.
            time.sleep(1.5)
            rc, _, err = xdpqctl(srv, "drain")
            self.assertEqual(rc, 0, err)
            # Raw frames from here: python-h2 stops answering PINGs once it
            # has seen a GOAWAY.
            goaways, buf = [], b""
            while True:
                try:
                    data = s.recv(65536)
                except (socket.timeout, ssl.SSLError, OSError):
                    break
                if not data:
                    break
                buf += data
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    length, ftype, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                    payload, buf = buf[9:9 + length], buf[9 + length:]
                    if ftype == 7:
                        goaways.append(int.from_bytes(payload[:4], "big") & 0x7fffffff)
                    elif ftype == 6 and not flags & 1:
                        s.sendall(frame(6, 1, 0, payload))  # the PING's answer
            self.assertEqual(goaways, [2**31 - 1, 1])
            stats = srv.stop()
        self.assertEqual(stats["tcp_timeouts_write"], 0, stats)

    def test_an_idle_connection_gives_back_its_output_buffer(self):
        # Regression: a download grew the connection's output buffer to the
        # output limit and a frame (about 512 KiB allocated), and an idle
        # keep-alive connection held that until it closed: ten thousand
        # such connections, 5 GiB.
        self.finish()
        with Server() as srv:
            s, c = wide_open_h2(srv)
            n, largest = 4 << 20, [0]

            def look(got):
                if got < n // 2:
                    # Slowly at first, so that the server's buffer fills.
                    time.sleep(0.01)
                    conns = json.loads(xdpqctl(srv, "conns", json_out=True)[1])["connections"]
                    largest[0] = max(largest + [x["out_buffer"] for x in conns
                                                if x["proto"] == "h2"])
            got, ended = h2_get(s, c, 1, f"/bytes/{n}", 1 << 20, look)
            self.assertEqual((got, ended), (n, True))
            largest = largest[0]
            self.assertGreater(largest, 128 << 10, "the download never filled the buffer")
            held = None
            for _ in range(50):
                conns = json.loads(xdpqctl(srv, "conns", json_out=True)[1])["connections"]
                h2c = [x for x in conns if x["proto"] == "h2"]
                self.assertEqual(len(h2c), 1, conns)
                self.assertEqual(h2c[0]["state"], "idle", conns)
                held = h2c[0]["out_buffer"]
                if held <= 64 << 10:
                    break
                time.sleep(0.1)
            self.assertLessEqual(held, 64 << 10, "the idle connection kept its download's buffer")
            # And it still serves.
            self.assertEqual(h2_get(s, c, 3, "/bytes/100000", 1 << 20), (100000, True))
            s.close()

    def test_a_small_window_holds_no_file_data(self):
        # Regression: each HTTP/2 stream of a large file read a 64 KiB block
        # and kept it while the client's window let out a byte at a time:
        # 100 such streams held 6.4 MiB per connection. Now the file is read
        # straight into the frame nghttp2 sends, for what the window allows.
        root = tempfile.mkdtemp(prefix="xdpq-h2-window-")
        big = os.urandom(1 << 20)
        with open(os.path.join(root, "big.bin"), "wb") as f:
            f.write(big)
        # A write timeout well past the sample below, however slow the
        # machine: the connection must still be open when it is taken.
        with Server(*FAST_TIMEOUTS, "--tcp-write-timeout", "10000", "--docroot", root) as srv:
            s = tls_socket(srv)
            c = h2.connection.H2Connection(h2.config.H2Configuration(
                client_side=True, header_encoding="utf-8"))
            c.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1})
            c.initiate_connection()
            for sid in range(1, 101, 2):
                c.send_headers(sid, [(":method", "GET"), (":scheme", "https"),
                                     (":authority", "x"), (":path", "/big.bin")],
                               end_stream=True)
            s.sendall(c.data_to_send())
            got = 0
            s.settimeout(0.1)
            end = time.time() + 0.8  # (well within the write timeout)
            while time.time() < end:
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                for ev in c.receive_data(data):
                    if isinstance(ev, h2.events.DataReceived):
                        got += len(ev.data)
                s.sendall(c.data_to_send())
            rc, out, err = xdpqctl(srv, "stats", json_out=True)
            self.assertEqual(rc, 0, err)
            total = json.loads(out)["total"]
            held = total["file_read_bytes_held"]
            self.assertGreaterEqual(total["tcp_connections"], 1, "measured after the close")
            s.close()
        self.assertGreater(got, 0, "the window's bytes were not sent")
        self.assertLess(held, 64 * 1024, f"{held} bytes held for 50 one-byte windows")

    def test_request_body_hoarding(self):
        # Two connections each open 100 POST /echo streams and send body
        # bytes as fast as flow control allows, never ending a stream. The
        # server used to hold it all (RSS +817 MiB) and keep granting window;
        # now bodies are budgeted per connection and worker, and a stream
        # over the budget is refused (RST_STREAM REFUSED_STREAM).
        clients = [self.h2_client() for _ in range(2)]
        live = []
        for s, c in clients:
            ids = list(range(1, 201, 2))
            for sid in ids:
                c.send_headers(sid, [(":method", "POST"), (":scheme", "https"),
                                     (":authority", "x"), (":path", "/echo")])
            s.sendall(c.data_to_send())
            s.setblocking(False)
            live.append(set(ids))
        chunk = b"z" * 16384
        sent = refused = 0
        held = []
        end = time.time() + 4
        next_probe = time.time() + 1
        while time.time() < end:
            if time.time() >= next_probe:
                next_probe += 1
                rc, out, _ = xdpqctl(self.srv, "stats", json_out=True)
                if rc == 0:
                    held.append(json.loads(out)["total"]["body_bytes_held"])
            moved = False
            for (s, c), ids in zip(clients, live):
                try:
                    data = s.recv(65536)
                    for ev in c.receive_data(data):
                        if isinstance(ev, h2.events.StreamReset):
                            ids.discard(ev.stream_id)
                            refused += ev.error_code == 7  # REFUSED_STREAM
                except (ssl.SSLWantReadError, BlockingIOError):
                    pass
                for sid in list(ids):
                    n = min(c.local_flow_control_window(sid), len(chunk))
                    if n > 0:
                        c.send_data(sid, chunk[:n])
                        sent += n
                        moved = True
                try:
                    out = c.data_to_send()
                    if out:
                        s.setblocking(True)
                        s.sendall(out)
                        s.setblocking(False)
                except OSError:
                    pass
            if not moved:
                time.sleep(0.01)
        rss = rss_kb(self.srv.proc.pid) - self.rss0
        for s, _ in clients:
            s.close()
        stats = self.finish()
        self.assertLess(rss, RSS_BOUND_KB, f"grew {rss} KiB while clients hoarded {sent >> 20} MiB")
        self.assertGreater(refused, 0, f"no stream refused after {sent >> 20} MiB")
        self.assertTrue(held, "no stats sample during the attack")
        self.assertLessEqual(max(held), 6 << 20, held)  # the worker's budget
        self.assertGreater(stats["tcp_body_budget_refusals"], 0, stats)

    def test_budget_refusals_are_not_the_clients_fault(self):
        # A stream refused because the worker's body budget is spent (what
        # all clients hold, RST_STREAM REFUSED_STREAM) is no protocol error
        # of the refused client's: 150 of them must not close its
        # connection with GOAWAY ENHANCE_YOUR_CALM as 100 protocol errors
        # do. A client that fills its own connection's part itself is
        # counted, as before.
        post = [(":method", "POST"), (":scheme", "https"), (":authority", "x"),
                (":path", "/echo")]
        limit = ["--max-request-body", "60000", "--max-body-per-connection", "60000",
                 "--max-body-per-worker", "60000"]
        # Default timeouts: the holder must outlive the other's uploads.
        with Server(*limit) as srv:
            def client():
                s = tls_socket(srv)
                c = h2.connection.H2Connection(h2.config.H2Configuration(
                    client_side=True, header_encoding="utf-8"))
                c.initiate_connection()
                s.sendall(c.data_to_send())
                return {"s": s, "c": c, "refused": 0, "terminated": None, "status": None,
                        "sid": 1}

            def drain(k, seconds, until=lambda: False):
                k["s"].settimeout(0.2)
                end = time.time() + seconds
                while time.time() < end and not until():
                    try:
                        data = k["s"].recv(65536)
                    except (socket.timeout, ssl.SSLWantReadError):
                        continue
                    if not data:
                        break
                    for ev in k["c"].receive_data(data):
                        if isinstance(ev, h2.events.StreamReset) and ev.error_code == 7:
                            k["refused"] += 1
                        elif isinstance(ev, h2.events.ConnectionTerminated):
                            k["terminated"] = ev.error_code
                        elif isinstance(ev, h2.events.ResponseReceived):
                            k["status"] = dict(ev.headers).get(":status")
                    k["s"].sendall(k["c"].data_to_send())

            def refused_uploads(k, n):
                for _ in range(n // 50):
                    if k["terminated"] is not None:
                        break
                    for _ in range(50):
                        k["c"].send_headers(k["sid"], post)
                        k["c"].send_data(k["sid"], b"x")
                        k["sid"] += 2
                    k["s"].sendall(k["c"].data_to_send())
                    drain(k, 1)

            holder = client()
            holder["c"].send_headers(1, post)
            for _ in range(4):  # the worker's whole budget, held
                holder["c"].send_data(1, b"h" * 15000)
            holder["sid"] = 3
            holder["s"].sendall(holder["c"].data_to_send())
            drain(holder, 0.5)
            other = client()
            refused_uploads(other, 150)
            self.assertIsNone(other["terminated"], f"GOAWAY after {other['refused']} refused")
            other["c"].send_headers(other["sid"], [(":method", "GET"), (":scheme", "https"),
                                                   (":authority", "x"), (":path", "/healthz")],
                                    end_stream=True)
            other["s"].sendall(other["c"].data_to_send())
            drain(other, 5, lambda: other["status"] is not None)
            # The holder's own connection is full: its refusals are its own.
            refused_uploads(holder, 150)
            drain(holder, 2, lambda: holder["terminated"] is not None)
            for k in (holder, other):
                k["s"].close()
            stats = srv.stop()
        self.assertEqual(other["refused"], 150)
        self.assertEqual(other["status"], "200")
        self.assertEqual(holder["terminated"], 11)  # ENHANCE_YOUR_CALM
        self.assertEqual(stats["tcp_protocol_error_closes"], 1, stats)
        self.assertGreaterEqual(stats["tcp_body_budget_refusals"], 250, stats)
        self.finish()

    def test_slow_client_never_finishing_headers(self):
        s = tls_socket(self.srv, "http/1.1")
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        start = time.time()
        closed = False
        try:
            for i in range(40):
                s.sendall(b"X-Slow-%d: y\r\n" % i)
                time.sleep(0.25)
        except (ConnectionError, ssl.SSLError, OSError):
            closed = True
        if not closed:
            closed, _ = read_until_closed(s, 5)
        self.assertTrue(closed)
        self.assertLess(time.time() - start, 8)
        self.assertGreater(self.finish()["tcp_timeouts_headers"], 0)

    def test_made_you_reset(self):
        # A malformed request (no :path) is a stream error: the server must
        # reset the stream. The client makes the server do the resetting,
        # stream after stream, without sending a single RST_STREAM itself.
        s = tls_socket(self.srv)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
        no_path = bytes([0x82, 0x87]) + hpack_literal(b":authority", b"x")
        out = b""
        for i in range(400):
            out += frame(1, 0x4 | 0x1, 1 + 2 * i, no_path)  # HEADERS, END_HEADERS|END_STREAM
        try:
            s.sendall(out)
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        closed, data = read_until_closed(s, 10)
        self.assertEqual(goaway_code(data), 0xB, "expected GOAWAY ENHANCE_YOUR_CALM")
        self.assertTrue(closed)
        self.assertGreater(self.finish()["tcp_protocol_error_closes"], 0)

    def test_plaintext_to_tls_port(self):
        raw = socket.create_connection((self.srv.host, self.srv.port), timeout=5)
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        closed, data = read_until_closed(raw, 5)
        self.assertTrue(closed)
        self.assertTrue(data.startswith(b"HTTP/1.1 400"))

    def test_malformed_http1_requests_get_400_and_the_server_lives(self):
        # Regression: a request http-parser rejects (here: a header line
        # without a colon, a bad method, a bad chunk size) made the session
        # pause a parser in its error state, which asserts in Debian's
        # http-parser: one request aborted the whole daemon.
        for bad in (b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
                    b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"zz\r\nhello\r\n"):
            s = tls_socket(self.srv, alpn="http/1.1")
            s.sendall(bad)
            closed, data = read_until_closed(s, 5)
            self.assertTrue(closed, bad)
            self.assertTrue(data.startswith(b"HTTP/1.1 400"), (bad, data[:100]))
            self.assertIsNone(self.srv.proc.poll(), "xdpqd died:\n" + self.srv.output()[-2000:])
        self.assertEqual(self.finish()["tcp_bad_requests"], 3)


    def test_transfer_encoding_other_than_one_chunked_is_refused(self):
        # Only one field saying "chunked" frames a body: two fields, a list
        # or another coding could be read otherwise by another hop (request
        # smuggling), and a coding other than chunked is not decoded here.
        # Each is refused and the connection ends before the "body" can be
        # taken for a request.
        smuggled = b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for te, status in ((b"Transfer-Encoding: gzip, chunked\r\n", b"501"),
                           (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                            b"400"),
                           (b"Transfer-Encoding: identity\r\n", b"400"),
                           (b"Transfer-Encoding: chunked, identity\r\n", b"400")):
            s = tls_socket(self.srv, alpn="http/1.1")
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + te + b"\r\n" + smuggled)
            closed, data = read_until_closed(s, 5)
            self.assertTrue(closed, te)
            self.assertTrue(data.startswith(b"HTTP/1.1 " + status), (te, data[:100]))
            self.assertEqual(data.count(b"HTTP/1.1 "), 1, (te, data))
        # HTTP/1.0 has no Transfer-Encoding: 400, and the connection ends.
        s = tls_socket(self.srv, alpn="http/1.1")
        s.sendall(b"POST /echo HTTP/1.0\r\nConnection: keep-alive\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + smuggled)
        closed, data = read_until_closed(s, 5)
        self.assertTrue(closed)
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data[:100])
        self.assertEqual(data.count(b"HTTP/1.1 "), 1, data)
        self.assertEqual(self.finish()["tcp_bad_requests"], 4)  # the 501 is not one

    def test_loose_http1_framing_gets_400(self):
        # Debian's http-parser is built without its strict checks: it takes
        # any two bytes after chunk data for the CRLF, any byte after a CR
        # for the LF of a head line, a LF inside a chunk extension. A hop
        # in front that reads them as RFC 9112 says sees other messages
        # (request smuggling). xdpq answers 400 and reads nothing further.
        chunked = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        # And a folded field line (obs-fold), which the parser joined to the
        # field without the space: "Transfer-Encoding:" + " chunked" framed
        # a body that a hop keeping the fold does not see.
        for bad in (chunked + b"5\r\nhelloXY0\r\n\r\n" + smuggled,
                    chunked + b"2\r\nxx\n40\r\n\r\n" + smuggled,
                    chunked + b"2;a\nb\r\nxx\r\n0\r\n\r\n" + smuggled,
                    b"GET / HTTP/1.1\r\nHost: x\rX-Other: 1\r\n\r\n" + smuggled,
                    b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
                    b"5\r\nhello\r\n0\r\n\r\n" + smuggled):
            s = tls_socket(self.srv, alpn="http/1.1")
            s.sendall(bad)
            closed, data = read_until_closed(s, 5)
            self.assertTrue(closed, bad)
            self.assertTrue(data.startswith(b"HTTP/1.1 400"), (bad, data[:200]))
            self.assertEqual(data.count(b"HTTP/1.1 "), 1, (bad, data))
        # Well framed, with an extension and a trailer: served, and the next
        # request on the connection too.
        s = tls_socket(self.srv, alpn="http/1.1")
        s.sendall(chunked + b"5;n=\"a b\"\r\nhello\r\n0\r\nx-t: 1\r\n\r\n" +
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        closed, data = read_until_closed(s, 5)
        self.assertEqual(data.count(b"HTTP/1.1 200"), 2, data)
        self.assertIn(b"\r\n\r\nhello", data)
        self.assertEqual(self.finish()["tcp_bad_requests"], 5)

    def test_whitespace_in_field_names_and_control_bytes_in_the_target_get_400(self):
        # Debian's http-parser takes "Host : b" (a space before the colon)
        # as a field named "host ", and a tab or form feed inside the
        # target. A hop behind (a proxied upstream) or in front may read
        # them otherwise: a second Host, a forged X-Forwarded-For, another
        # request line (RFC 9112 3, 5.1). Refused with 400.
        smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for bad in (b"GET / HTTP/1.1\r\nHost: x\r\nHost : y\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For\t: 6.6.6.6\r\n\r\n",
                    b"GET /a\tHTTP/1.0 HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"GET /a\x0cb HTTP/1.1\r\nHost: x\r\n\r\n"):
            s = tls_socket(self.srv, alpn="http/1.1")
            s.sendall(bad + smuggled)
            closed, data = read_until_closed(s, 5)
            self.assertTrue(closed, bad)
            self.assertTrue(data.startswith(b"HTTP/1.1 400"), (bad, data[:200]))
            self.assertEqual(data.count(b"HTTP/1.1 "), 1, (bad, data))
        # Whitespace after a value is not part of it: a length so written
        # frames the body.
        s = tls_socket(self.srv, alpn="http/1.1")
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5  \r\n"
                  b"Connection: close\r\n\r\nhello")
        closed, data = read_until_closed(s, 5)
        self.assertTrue(data.startswith(b"HTTP/1.1 200"), data[:200])
        self.assertTrue(data.endswith(b"\r\n\r\nhello"), data[-100:])
        self.assertEqual(self.finish()["tcp_bad_requests"], 4)

    def test_an_error_answer_to_head_has_no_body(self):
        s = tls_socket(self.srv, alpn="http/1.1")
        s.sendall(b"HEAD / HTTP/1.1\r\nHost: a/b\r\n\r\n")
        closed, data = read_until_closed(s, 5)
        self.assertTrue(closed)
        head, _, rest = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 400"), data[:100])
        self.assertIn(b"content-length: ", head.lower())
        self.assertEqual(rest, b"")
        # A request after a HEAD that fails before its own head is parsed
        # (a bad first byte) gets its 400 with the body it announces.
        s = tls_socket(self.srv, alpn="http/1.1")
        s.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n\x01GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        closed, data = read_until_closed(s, 5)
        self.assertTrue(closed)
        second = data[data.index(b"HTTP/1.1 400"):]
        self.assertTrue(second.endswith(b"\r\n\r\n400 Bad Request\n"), data)
        # HTTP/2: a DATA frame after a HEAD's 431 is a protocol error to
        # the client, which then sees no answer at all.
        r = subprocess.run(["curl", "-sk", "--http2", "-I", "-o", "/dev/null", "-w", "%{http_code}",
                            "-H", "X-Big: " + "a" * 20000, self.srv.url("/")],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual((r.returncode, r.stdout), (0, "431"), r.stderr)
        self.finish()

if __name__ == "__main__":
    unittest.main(verbosity=2)
