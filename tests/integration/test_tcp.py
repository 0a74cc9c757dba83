#!/usr/bin/python3
"""The TCP side: HTTP/2 and HTTP/1.1 over TLS against curl, nghttp and
h2load; same bytes as over HTTP/3; Alt-Svc; HEAD, Range, chunked POST."""

import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (Server, TimedTestCase, cpu_seconds, free_udp_port, gtlsclient,  # noqa: E402
                     pattern, read_to_end, require_tools, sha256)


def curl(srv, path, *args, http="--http2", timeout=60):
    out = tempfile.mktemp()
    cmd = ["curl", "-sk", http, "-o", out, "-D", "-", *args, srv.url(path)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    head = r.stdout.decode(errors="replace")
    body = open(out, "rb").read() if os.path.exists(out) else b""
    status = int(head.split()[1]) if head.startswith("HTTP") else 0
    headers = {}
    for line in head.splitlines()[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers, body


class TcpTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()
        cls.docroot = tempfile.mkdtemp(prefix="xdpq-tcp-root-")
        cls.file = os.urandom(123457)
        with open(os.path.join(cls.docroot, "f.bin"), "wb") as f:
            f.write(cls.file)

    def serve(self, *args, **kw):
        return Server("--docroot", self.docroot, *args, **kw)

    def test_same_bytes_on_every_protocol(self):
        with self.serve() as srv:
            h3 = gtlsclient(srv, ["/f.bin", "/bytes/200000"])
            for http in ("--http2", "--http1.1"):
                st, hdr, body = curl(srv, "/f.bin", http=http)
                self.assertEqual(st, 200, http)
                self.assertEqual(sha256(body), sha256(h3.file("f.bin")))
                self.assertEqual(hdr["alt-svc"], f'h3=":{srv.port}"; ma=86400')
                st, hdr, body = curl(srv, "/bytes/200000", http=http)
                self.assertEqual(sha256(body), sha256(h3.file("200000")))
                self.assertEqual(sha256(body), sha256(pattern(200000)))
        self.assertEqual(sha256(h3.file("f.bin")), sha256(self.file))

    def test_a_deleted_file_is_let_go(self):
        # Regression: a large file's cache entry kept its descriptor, and the
        # deleted file's disk space, until its path was asked for again.
        path = os.path.join(self.docroot, "deleted-later.bin")
        with open(path, "wb") as f:
            f.write(self.file)
        with self.serve() as srv:
            st, _, body = curl(srv, "/deleted-later.bin")
            self.assertEqual((st, body), (200, self.file))
            fd_dir = f"/proc/{srv.proc.pid}/fd"

            def held():
                n = 0
                for fd in os.listdir(fd_dir):
                    try:
                        n += os.readlink(os.path.join(fd_dir, fd)).startswith(path)
                    except OSError:
                        pass  # closed meanwhile
                return n

            self.assertEqual(held(), 1)
            os.unlink(path)
            deadline = time.time() + 5
            while held() and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(held(), 0, "the deleted file is still open")
            self.assertEqual(curl(srv, "/f.bin")[0], 200)

    def test_nghttp(self):
        with self.serve() as srv:
            r = subprocess.run(["nghttp", "-v", srv.url("/bytes/5000")], capture_output=True,
                               text=True, timeout=30)
        self.assertIn(":status: 200", r.stdout)
        self.assertIn("alt-svc: h3=", r.stdout)
        self.assertIn("recv DATA frame", r.stdout)

    def test_head_and_range(self):
        with self.serve() as srv:
            for http in ("--http2", "--http1.1"):
                st, hdr, body = curl(srv, "/f.bin", "-I", http=http)
                self.assertEqual(st, 200)
                self.assertEqual(int(hdr["content-length"]), len(self.file))
                self.assertNotIn(self.file[:64], body)  # curl -I saves headers only
                st, hdr, body = curl(srv, "/f.bin", "-r", "100-199", http=http)
                self.assertEqual(st, 206)
                self.assertEqual(body, self.file[100:200])
                self.assertEqual(hdr["content-range"], f"bytes 100-199/{len(self.file)}")

    def test_authority_that_is_not_a_host(self):
        # curl sends Host as HTTP/2's :authority; nghttp2 lets userinfo
        # through (it resets a '/' itself), and nothing here is named so.
        with self.serve() as srv:
            st, _, body = curl(srv, "/f.bin", "-H", "Host: u@a")
            self.assertEqual(st, 400)
            self.assertNotIn(self.file[:64], body)
            st, _, body = curl(srv, "/f.bin", "-H", "Host: a:443")
            self.assertEqual((st, body), (200, self.file))

    def test_absolute_form_targets(self):
        # RFC 9112 3.2.2: a server must accept "GET https://host/path"; its
        # authority is the target's, the Host field is ignored. It got 400
        # (the path did not start with '/') where HTTP/2 and HTTP/3 got 200.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
        with self.serve() as srv:
            for target, status in ((b"https://a/f.bin", b"200"), (b"HTTP://a:443/f.bin", b"200"),
                                   (b"https://a", b"404"), (b"https://u@a/f.bin", b"400"),
                                   (b"https:///f.bin", b"400")):
                with socket.create_connection((srv.host, srv.port), timeout=10) as raw:
                    s = ctx.wrap_socket(raw)
                    s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: other\r\n"
                              b"Connection: close\r\n\r\n")
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
                self.assertTrue(data.startswith(b"HTTP/1.1 " + status), (target, data[:200]))
                if status == b"200":
                    self.assertTrue(data.endswith(self.file), target)

    def test_a_body_nobody_reads_is_not_held(self):
        # Only /echo reads a request's body. Sent to a file, the body was
        # held until it ended, so with the worker's body budget spent by
        # another upload the request was refused (HTTP/1.1 503, HTTP/2
        # REFUSED_STREAM, HTTP/3 H3_REQUEST_REJECTED). Now it is answered
        # as a file is (HTTP/2 and HTTP/3 at its head), and the body is
        # dropped as it arrives.
        limit = 65536
        small = os.path.join(tempfile.mkdtemp(prefix="xdpq-nobody-"), "small")
        with open(small, "wb") as f:
            f.write(b"s" * 60000)
        with self.serve("--max-request-body", str(limit), "--max-body-per-connection", str(limit),
                        "--max-body-per-worker", str(limit)) as srv:
            # One upload to /echo holds the worker's whole budget.
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["http/1.1"])
            holder = ctx.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)))
            holder.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n" +
                           b"h" * 65000)
            time.sleep(0.3)
            for http in ("--http1.1", "--http2"):
                st, _, _ = curl(srv, "/f.bin", "--data-binary", f"@{small}", http=http)
                self.assertEqual(st, 405, http)
            h3 = gtlsclient(srv, ["/f.bin"], "-d", small, "-m", "POST")
            self.assertEqual(h3.statuses.get(0), 405, h3.output[-2000:])
            holder.close()

    def test_post_echo_chunked(self):
        data = os.urandom(300000)
        path = tempfile.mktemp()
        with open(path, "wb") as f:
            f.write(data)
        with self.serve() as srv:
            for http in ("--http2", "--http1.1"):
                st, _, body = curl(srv, "/echo", "-X", "POST", "-H", "Transfer-Encoding: chunked",
                                   "--data-binary", f"@{path}", http=http)
                self.assertEqual(st, 200, http)
                self.assertEqual(sha256(body), sha256(data), http)

    def test_keepalive_and_pipelining_http1(self):
        import socket
        import ssl
        with self.serve() as srv:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["http/1.1"])
            with socket.create_connection((srv.host, srv.port), timeout=10) as raw:
                with ctx.wrap_socket(raw) as s:
                    reqs = b"".join(b"GET /bytes/%d HTTP/1.1\r\nHost: x\r\n\r\n" % n
                                    for n in (10, 20, 30))
                    s.sendall(reqs + b"HEAD /bytes/40 HTTP/1.1\r\nHost: x\r\n\r\n")
                    buf = b""
                    while buf.count(b"HTTP/1.1 200") < 4 or not buf.endswith(b"\r\n\r\n"):
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
        self.assertEqual(buf.count(b"HTTP/1.1 200 OK"), 4)
        i10, i20, i30 = (buf.index(pattern(n) + b"HTTP/1.1") for n in (10, 20, 30))
        self.assertLess(i10, i20)
        self.assertLess(i20, i30)
        self.assertIn(b"content-length: 40\r\n", buf)  # HEAD: length, no body

    def test_a_long_pipeline_is_answered_whole(self):
        # Regression: a connection's step stops after 8 rounds of 32
        # requests; with the socket read empty and the output written,
        # nothing woke it again, and requests 257 on waited unanswered for
        # the idle timeout, which then dropped them.
        n = 1000
        req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        with self.serve() as srv:
            with self.tls_http1(srv) as s:
                s.sendall(req * n)
                buf = b""
                try:
                    while buf.count(b"HTTP/1.1 200") < n:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                except socket.timeout:
                    pass
        self.assertEqual(buf.count(b"HTTP/1.1 200 OK"), n)

    def test_trailers_are_not_request_headers(self):
        # Regression: a chunked body's trailer fields (HTTP/1.1) and a
        # trailing HEADERS frame (HTTP/2) were merged into the request's
        # headers before it was answered: /echo answered with the
        # trailer's content-type (RFC 9110 6.5.1: they must not be).
        import h2.config
        import h2.connection
        import h2.events
        with self.serve() as srv:
            with self.tls_http1(srv) as s:
                s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                          b"1\r\na\r\n0\r\nContent-Type: evil/x\r\nX-Late: y\r\n\r\n")
                buf = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
            self.assertTrue(buf.startswith(b"HTTP/1.1 200"), buf)
            self.assertNotIn(b"evil", buf)
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2"])
            with ctx.wrap_socket(socket.create_connection((srv.host, srv.port), timeout=10)) as t:
                conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
                conn.initiate_connection()
                conn.send_headers(1, [(":method", "POST"), (":path", "/echo"),
                                      (":scheme", "https"), (":authority", "x")])
                conn.send_data(1, b"a")
                conn.send_headers(1, [("content-type", "evil/x")], end_stream=True)
                t.sendall(conn.data_to_send())
                headers, body, done = {}, b"", False
                while not done:
                    data = t.recv(65536)
                    if not data:
                        break
                    for ev in conn.receive_data(data):
                        if isinstance(ev, h2.events.ResponseReceived):
                            headers = dict(ev.headers)
                        elif isinstance(ev, h2.events.DataReceived):
                            body += ev.data
                        elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                            done = True
                    t.sendall(conn.data_to_send())
            self.assertEqual(headers.get(b":status"), b"200", headers)
            self.assertNotEqual(headers.get(b"content-type"), b"evil/x", headers)
            self.assertEqual(body, b"a")

    def test_a_pipeline_then_a_half_close_is_answered_whole(self):
        # Regression: the FIN read with requests still buffered in the
        # session closed the connection once the responses so far were
        # written: requests 65 to 100 were dropped.
        n = 100
        req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        port = free_udp_port()
        with self.serve("--h2c-listen", f"127.0.0.1:{port}"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(req * n)
                s.shutdown(socket.SHUT_WR)
                buf = read_to_end(s)
        self.assertEqual(buf.count(b"HTTP/1.1 200 OK"), n)

    def test_rapid_reset_is_limited_while_a_drain_waits_for_its_ping(self):
        # Regression: nghttp2 stops limiting the client's RST_STREAMs once a
        # GOAWAY is submitted, and the drain's first GOAWAY (the notice) is
        # one; new streams are still taken until the final GOAWAY, which
        # waits for the client's PING ACK. A client that withheld it could
        # open and reset streams without limit for the whole drain.
        def frame(ftype, flags, stream, payload=b""):
            return (struct.pack("!I", len(payload))[1:] + bytes([ftype, flags]) +
                    struct.pack("!I", stream) + payload)

        def frame_types(data):
            types, i = set(), 0
            while i + 9 <= len(data):
                types.add(data[i + 3])
                i += 9 + int.from_bytes(data[i:i + 3], "big")
            return types

        # GET https / with :authority x (HPACK: three static indexes, a literal).
        get = bytes([0x82, 0x87, 0x84, 0x01, 0x01]) + b"x"
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        with self.serve("--drain-timeout", "20000") as srv:
            with ctx.wrap_socket(socket.create_connection((srv.host, srv.port), timeout=10)) as s:
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
                s.sendall(frame(1, 5, 1, get))
                # SETTINGS, its ACK and the answer's HEADERS: before the drain.
                before = b""
                while 1 not in frame_types(before):
                    before += s.recv(65536)
                srv.proc.send_signal(signal.SIGTERM)
                # The notice (GOAWAY, no error) and its PING; the ACK never goes.
                seen, deadline = b"", time.monotonic() + 10
                while 7 not in frame_types(seen) and time.monotonic() < deadline:
                    seen += s.recv(65536)
                self.assertIn(7, frame_types(seen), "no GOAWAY notice after SIGTERM")
                sid, sent = 3, 0
                try:
                    for _ in range(2000):
                        s.sendall(frame(1, 5, sid, get) + frame(3, 0, sid, struct.pack("!I", 8)))
                        sid += 2
                        sent += 1
                except (ConnectionError, ssl.SSLError, OSError):
                    pass
                # The server closes after its GOAWAY: read to that close
                # (a slow server may still be parsing the pairs for a while).
                s.settimeout(2)
                data = b""
                until = time.time() + 15
                try:
                    while len(data) < (64 << 20) and time.time() < until:
                        chunk = s.recv(1 << 20)
                        if not chunk:
                            break
                        data += chunk
                except (socket.timeout, ConnectionError, ssl.SSLError, OSError):
                    pass
                codes = []
                i = 0
                while i + 9 <= len(data):  # every GOAWAY's error code
                    length = int.from_bytes(data[i:i + 3], "big")
                    if data[i + 3] == 7 and i + 17 <= len(data):
                        codes.append(int.from_bytes(data[i + 13:i + 17], "big"))
                    i += 9 + length
            stats = srv.stop()
        self.assertIn(0xb, codes, f"{sent} open-and-reset pairs, GOAWAY codes {codes}")
        self.assertGreaterEqual(stats["tcp_protocol_error_closes"], 1, stats)

    def test_a_client_that_closes_ends_the_drains_wait_for_its_ping(self):
        # Regression: a drain's HTTP/2 connection stays busy until the
        # client acknowledges the shutdown PING; one that closed its side
        # instead, which can acknowledge nothing, held the drain until its
        # deadline (20 s here).
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        with self.serve("--drain-timeout", "20000") as srv:
            s = ctx.wrap_socket(socket.create_connection((srv.host, srv.port), timeout=10))
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + bytes([4, 0]) + bytes(4))
            s.recv(65536)  # the server's SETTINGS
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # the notice and its PING come; no ACK goes
            s.shutdown(socket.SHUT_WR)  # a FIN; what came stays unread (no reset)
            t0 = time.monotonic()
            self.assertEqual(srv.proc.wait(timeout=15), 0)
            self.assertLess(time.monotonic() - t0, 10, "the drain waited for a PING ACK")
            s.close()

    def tls_http1(self, srv):
        import socket
        import ssl
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
        raw = socket.create_connection((srv.host, srv.port), timeout=10)
        return ctx.wrap_socket(raw)

    @staticmethod
    def read_until(s, marker):
        buf = b""
        while marker not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf

    def test_http1_expect_100_continue(self):
        # A client that expects 100-continue sends its body only after the
        # interim 100 (curl waits a second for it otherwise): the 100 comes
        # before any byte of the body, after the response to an earlier
        # pipelined request; a body over the limit is refused at once,
        # without a 100; other expectations get 417; HTTP/1.0 ignores it.
        body = os.urandom(200000)
        with self.serve() as srv:
            with self.tls_http1(srv) as s:
                s.sendall(b"GET /bytes/5 HTTP/1.1\r\nHost: x\r\n\r\n"
                          b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body))
                got = self.read_until(s, b"HTTP/1.1 100 Continue\r\n\r\n")
                self.assertTrue(got.startswith(b"HTTP/1.1 200 OK"), got[:200])
                self.assertTrue(got.endswith(pattern(5) + b"HTTP/1.1 100 Continue\r\n\r\n"),
                                got[-200:])
                s.sendall(body)
                resp = self.read_until(s, body)
                self.assertTrue(resp.startswith(b"HTTP/1.1 200 OK"), resp[:200])
                self.assertTrue(resp.endswith(body))
            with self.tls_http1(srv) as s:
                s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                          b"Content-Length: %d\r\n\r\n" % (64 << 20))
                resp = self.read_until(s, b"\r\n\r\n")
                self.assertTrue(resp.startswith(b"HTTP/1.1 413 "), resp[:200])
            with self.tls_http1(srv) as s:
                s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n"
                          b"Content-Length: 1\r\n\r\nx")
                resp = self.read_until(s, b"\r\n\r\n")
                self.assertTrue(resp.startswith(b"HTTP/1.1 417 Expectation Failed"), resp[:200])
            with self.tls_http1(srv) as s:
                s.sendall(b"POST /echo HTTP/1.0\r\nHost: x\r\nExpect: 100-continue\r\n"
                          b"Content-Length: 3\r\n\r\nabc")
                resp = self.read_until(s, b"\r\n\r\nabc")
                self.assertTrue(resp.startswith(b"HTTP/1.1 200 OK"), resp[:200])
                self.assertNotIn(b"100 Continue", resp)
            stats = srv.stop()
        self.assertEqual(stats["tcp_continues_sent"], 1, stats)
        self.assertEqual(stats["tcp_expectation_failures"], 1, stats)
        self.assertEqual(stats["tcp_body_limit_rejects"], 1, stats)

    def test_a_drain_refuses_new_clients_at_once(self):
        # Regression: a drain only stopped accepting. The listening sockets
        # stayed open, so the kernel went on completing handshakes into
        # their backlog: a new client sent its ClientHello and waited, for
        # the whole drain, for a reset. Nobody takes them over in a drain
        # (an upgrade hands them on instead): they close, and a new client
        # is refused at once.
        with self.serve("--drain-timeout", "20000") as srv:
            busy = self.tls_http1(srv)  # a download the drain waits for
            busy.sendall(b"GET /bytes/60000000 HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertIn(b"200 OK", busy.recv(4096))
            srv.proc.send_signal(signal.SIGTERM)
            refused = False
            for _ in range(40):
                try:
                    socket.create_connection((srv.host, srv.port), timeout=2).close()
                except ConnectionRefusedError:
                    refused = True
                    break
                time.sleep(0.05)
            self.assertTrue(refused, "still accepting connections during the drain")
            self.assertIsNone(srv.proc.poll(), "the drain did not wait for the download")
            got = 0
            busy.settimeout(10)
            while True:
                chunk = busy.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
            busy.close()
            self.assertGreater(got, 50_000_000, "the download was cut")
            self.assertEqual(srv.proc.wait(timeout=20), 0)

    def test_h2load_small_bodies(self):
        with self.serve() as srv:
            r = subprocess.run(["h2load", "-n", "20000", "-c", "100", "-m", "32",
                                srv.url("/bytes/3")], capture_output=True, text=True,
                               timeout=120)
            stats = srv.stop()
        self.assertIn("20000 succeeded, 0 failed, 0 errored", r.stdout, r.stdout)
        self.assertIn("status codes: 20000 2xx", r.stdout)
        self.assertEqual(stats["tcp_requests"], 20000)

    def test_cleartext_listener_is_off_by_default(self):
        port = free_udp_port()
        with self.serve("--h2c-listen", f"127.0.0.1:{port}") as srv:
            r = subprocess.run(["curl", "-s", "--http2-prior-knowledge",
                                f"http://127.0.0.1:{port}/healthz"], capture_output=True,
                               timeout=10)
            self.assertEqual(r.stdout, b"ok\n")
            r = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/bytes/7"],
                               capture_output=True, timeout=10)
            self.assertEqual(r.stdout, pattern(7))
        with self.serve() as srv:
            self.assertNotIn("cleartext", srv.output())

    def test_input_after_a_closing_request_loses_no_response(self):
        # Regression: the server closed its socket as soon as the last
        # response was written to it. With input it had not read (what a
        # client sent after "Connection: close", or the rest of an upload
        # it refused), the kernel then sent a reset and threw away what it
        # had not sent yet: the end of the response, which the client saw
        # as a truncated body. And the bytes after that request were parsed
        # as another request and answered with a 400 (RFC 9112 9.6: no
        # request after a "close" is processed). Now the server sends its
        # close_notify and FIN after the response and reads and drops what
        # still comes until the client closes.
        n = 4_000_000
        with self.serve() as srv:
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
            raw.connect((srv.host, srv.port))
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["http/1.1"])
            s = ctx.wrap_socket(raw)
            s.sendall(b"GET /bytes/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % n +
                      b"X" * 100_000)
            s.settimeout(10)
            got = bytearray()
            drained = False
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if len(got) > n // 2 and not drained:
                    # A drain now waits for the rest (and its linger) too.
                    srv.proc.send_signal(signal.SIGTERM)
                    drained = True
                if drained:
                    s.sendall(b"X")  # still sending: a closed socket would answer with a reset
                time.sleep(0.002)  # a slow reader: the response is still queued at the end
            s.close()
            self.assertEqual(srv.proc.wait(timeout=20), 0)
            stats = srv.stop()
        head, _, body = bytes(got).partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head[:100])
        self.assertEqual(len(body), n, "the response was cut (or more followed it)")
        self.assertEqual(body, pattern(n))
        self.assertEqual(stats["tcp_responses_4xx"], 0, stats)

    def test_no_request_after_one_that_asked_to_close_is_served(self):
        # RFC 9112 9.6: after a request with "Connection: close" the server
        # processes no further request on the connection, whatever framing
        # the first had (here a body, after which the parser would go on).
        with self.serve() as srv:
            s = self.tls_http1(srv)
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                      b"Connection: close\r\n\r\nhi"
                      b"GET /bytes/7 HTTP/1.1\r\nHost: x\r\n\r\n")
            got = read_to_end(s)
            s.close()
            stats = srv.stop()
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
        self.assertTrue(got.endswith(b"\r\n\r\nhi"), got)
        self.assertEqual(got.count(b"HTTP/1.1 "), 1, got)
        self.assertEqual(stats["tcp_requests"], 1, stats)

    def test_a_head_refused_in_its_head_gets_no_body_and_counts(self):
        # Regression: a HEAD refused while its head was being parsed (two
        # Content-Length fields: http-parser's own error) got the 400's
        # body after the head, and the request was not counted.
        with self.serve() as srv:
            s = self.tls_http1(srv)
            s.sendall(b"HEAD / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                      b"Content-Length: 1\r\n\r\n")
            got = read_to_end(s)
            s.close()
            stats = srv.stop()
        head, sep, rest = got.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 400 "), got)
        self.assertEqual((sep, rest), (b"\r\n\r\n", b""), got)
        self.assertEqual(stats["tcp_requests"], 1, stats)
        self.assertEqual(stats["tcp_bad_requests"], 1, stats)
        # A method that only begins like HEAD (http-parser guesses HEAD from
        # the "H") is no HEAD: its answer has a body.
        with self.serve() as srv:
            s = self.tls_http1(srv)
            s.sendall(b"HELP / HTTP/1.1\r\nHost: a\r\n\r\n")
            got = read_to_end(s)
            s.close()
            s = self.tls_http1(srv)
            s.sendall(b"H\n")  # a bare LF after the first byte: the framing check's refusal
            got2 = read_to_end(s)
            s.close()
            # A HEAD whose target holds a control byte (the parser's own
            # error, before the target reached us) is still a HEAD.
            s = self.tls_http1(srv)
            s.sendall(b"HEAD /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n")
            got3 = read_to_end(s)
            s.close()
        for g in (got, got2):
            self.assertTrue(g.startswith(b"HTTP/1.1 400 "), g)
            self.assertNotEqual(g.partition(b"\r\n\r\n")[2], b"", g)
        self.assertTrue(got3.startswith(b"HTTP/1.1 400 "), got3)
        self.assertEqual(got3.partition(b"\r\n\r\n")[2], b"", got3)

    def test_a_client_that_leaves_mid_request_is_let_go_at_once(self):
        # Regression: a client that half-closed with a request short of its
        # end (its head, or its body) was held until the header or write
        # deadline, counted as a timeout, and a drain waited for it. The
        # request can never be whole: the connection ends at once, after
        # the answers to the requests before it.
        port = free_udp_port()
        with self.serve("--h2c-listen", f"127.0.0.1:{port}", "--tcp-header-timeout", "30000") as srv:
            for partial in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
                            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab"):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"GET /bytes/3 HTTP/1.1\r\nHost: x\r\n\r\n" + partial)
                    s.shutdown(socket.SHUT_WR)
                    got = read_to_end(s)  # the socket's timeout (10 s) is under the deadlines
                self.assertEqual(got.count(b"HTTP/1.1 "), 1, got)
                self.assertTrue(got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"abc"), got)
            stats = srv.stop()
        self.assertEqual(stats["tcp_timeouts_headers"], 0, stats)
        self.assertEqual(stats["tcp_timeouts_write"], 0, stats)

    def test_a_partial_h2c_preface_costs_no_cpu(self):
        # Regression: the cleartext port peeked at the first bytes and
        # waited while they were a part of "PRI " (the HTTP/2 preface): the
        # bytes stayed readable, so the loop woke again at once. One client
        # sending "PR" and stopping kept a core busy until the handshake
        # deadline, and could reconnect to do it again.
        port = free_udp_port()
        with self.serve("--h2c-listen", f"127.0.0.1:{port}") as srv:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"PR")
                time.sleep(0.2)
                before = cpu_seconds(srv.proc.pid)
                time.sleep(2)
                spent = cpu_seconds(srv.proc.pid) - before
                self.assertLess(spent, 0.5, f"{spent:.2f} s of CPU in 2 s for two bytes")
                # The rest of the preface, slowly: served as HTTP/2.
                s.sendall(b"I * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                s.sendall(bytes.fromhex("000000040000000000"))  # SETTINGS
                data = s.recv(65536)
                self.assertEqual(data[3], 4, data[:16])  # the server's SETTINGS
            for first in (b"P", b"G"):  # and HTTP/1.1 after a pause
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(first)
                    time.sleep(0.1)
                    s.sendall(b"OST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                              b"Connection: close\r\n\r\nhi" if first == b"P" else
                              b"ET /bytes/5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    got = read_to_end(s)
                    self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
                    self.assertTrue(got.endswith(b"hi" if first == b"P" else pattern(5)), got)

    def test_plaintext_to_tls_port(self):
        with self.serve() as srv:
            r = subprocess.run(["curl", "-s", "-D", "-", "-o", "/dev/null",
                                f"http://{srv.host}:{srv.port}/"], capture_output=True,
                               timeout=10)
            ok = gtlsclient(srv, ["/healthz"])
            stats = srv.stop()
        self.assertIn(b"400", r.stdout)
        self.assertEqual(stats["tcp_plaintext_on_tls"], 1)
        self.assertEqual(ok.statuses, {0: 200})

    def test_no_tcp(self):
        with self.serve("--no-tcp") as srv:
            st, _, _ = curl(srv, "/healthz")
            self.assertEqual(st, 0)
            self.assertEqual(gtlsclient(srv, ["/healthz"]).statuses, {0: 200})


if __name__ == "__main__":
    unittest.main(verbosity=2)
