"""A real HTTP/1.1 application for the proxy tests, on Python's standard
http.server: it tells what it received, echoes bodies, answers chunked or
close-delimited, closes mid-body, hangs, and sends hop-by-hop fields. Its
/health answers the status in `health` (counted apart from requests), and
with `gate` set every other request waits until the gate opens."""

import hashlib
import http.server
import json
import socket
import socketserver
import threading
import time
import urllib.parse


def pattern(n):
    period = bytes(range(97, 97 + 26))
    return (period * (n // 26 + 1))[:n]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        """The request body, Content-Length or chunked. /slow... paths read
        it slowly; every path records when its first byte arrived."""
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
        delay = float(q.get("delay", "0"))
        piece = int(q.get("piece", "65536"))
        out = []
        got = 0

        def take(n):
            nonlocal got
            while n > 0:
                part = self.rfile.read1(min(n, piece))
                if not part:
                    raise ConnectionError("body cut short")
                if got == 0:
                    self.server.first_body_byte.set()
                got += len(part)
                out.append(part)
                n -= len(part)
                if delay:
                    time.sleep(delay)

        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            self.server.chunked_requests += 1
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                take(size)
                self.rfile.readline()  # the chunk's CRLF
        else:
            take(int(self.headers.get("content-length", "0")))
        return b"".join(out)

    def reply(self, status, body, extra=()):
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.send_header("x-upstream", self.server.name)
        for k, v in extra:
            self.send_header(k, v)
        # Head and body in one write, as nginx sends a small response (the
        # proxy then has the whole response in one read).
        if self.request_version != "HTTP/0.9":
            self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(body)
        self.flush_headers()

    def do_HEAD(self):
        self.do_GET()

    def do_POST(self):
        self.do_GET()

    def do_PUT(self):
        self.do_GET()

    def do_GET(self):
        if self.path.endswith("/early"):
            # Answers after a few body bytes, as an application refusing an
            # upload does, and closes.
            self.rfile.read1(10)
            self.send_response(413)
            self.send_header("content-length", "0")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            return
        if urllib.parse.urlparse(self.path).path.endswith("/early-big"):
            # A whole answer of n bytes after a few body bytes, the rest of
            # the upload unread; then a lingering close (the upload drained
            # until the proxy closes, so that no reset cuts the answer).
            q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
            n = int(q.get("n", "1000000"))
            self.rfile.read1(10)
            self.send_response(200)
            self.send_header("content-length", str(n))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(pattern(n))
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(30)
            try:
                while self.connection.recv(65536):
                    pass
            except OSError:
                pass
            self.close_connection = True
            return
        if urllib.parse.urlparse(self.path).path.endswith("/close-after"):
            # Reads the body, waits, answers as if it kept the connection
            # (no "connection: close"), and closes it: answer and FIN leave
            # in one segment (corked), so both are there when the proxy
            # reads the answer.
            q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
            self.body()
            time.sleep(float(q.get("s", "0")))
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.close_connection = True
            return
        if self.path.endswith("/head-first"):
            # Its head (a body of 10 promised) before it reads any of the
            # request, then nothing until the proxy gives up on it.
            self.send_response(200)
            self.send_header("content-length", "10")
            self.end_headers()
            self.wfile.flush()
            self.rfile.read()
            self.close_connection = True
            return
        if urllib.parse.urlparse(self.path).path.endswith("/answer-reset"):
            # A large answer before it reads the request's body, written
            # until the proxy stops taking it (its client reads nothing),
            # then an abortive close (RST).
            q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
            n = int(q.get("n", "4000000"))
            self.send_response(200)
            self.send_header("content-length", str(n))
            self.end_headers()
            self.connection.settimeout(1.0)
            try:
                self.wfile.write(pattern(n))
            except OSError:
                pass
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            return
        body = self.body()
        url = urllib.parse.urlparse(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        n = int(q.get("n", "1000"))
        p = url.path
        if p == "/health":
            self.server.health_checks += 1
            self.reply(self.server.health, b"health")
            return
        self.server.requests.append((self.command, self.path))
        if self.server.gate is not None:
            self.server.gate.wait(30)
        if p.endswith("/sum"):
            # The body's length and digest, not the body: for big uploads.
            info = {"body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest(),
                    "framing": "chunked" if "transfer-encoding" in self.headers else "length"}
            self.reply(200, json.dumps(info).encode(), [("content-type", "application/json")])
        elif p.endswith("/info"):
            info = {"method": self.command, "path": self.path,
                    "request_version": self.request_version,
                    "headers": [[k.lower(), v] for k, v in self.headers.items()],
                    "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
            self.reply(200, json.dumps(info).encode(), [("content-type", "application/json")])
        elif p.endswith("/echo"):
            self.reply(200, body)
        elif p.endswith("/chunked"):
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.send_header("x-upstream", self.server.name)
            self.end_headers()
            data = pattern(n)
            for i in range(0, len(data), 7000):
                part = data[i:i + 7000]
                self.wfile.write(b"%x\r\n" % len(part) + part + b"\r\n")
            self.wfile.write(b"0\r\nx-trailer: dropped\r\n\r\n")
        elif p.endswith("/chunked-cut") or p.endswith("/chunked-stall"):
            # Chunks for a tenth of n, then (cut) an abortive close (RST)
            # before the last chunk: a crashed application's unfinished
            # answer; or (stall) silence with the connection open for s
            # seconds, then the end: an application stuck mid-answer.
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            part = pattern(n // 10)
            self.wfile.write(b"%x\r\n" % len(part) + part + b"\r\n")
            self.wfile.flush()
            if p.endswith("/chunked-stall"):
                time.sleep(float(q.get("s", "20")))
                self.wfile.write(b"0\r\n\r\n")
                return
            time.sleep(0.2)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
        elif p.endswith("/close"):
            self.send_response(200)
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(pattern(n))
            self.close_connection = True
        elif p.endswith("/truncate"):
            self.send_response(200)
            self.send_header("content-length", str(n))
            self.end_headers()
            self.wfile.write(pattern(n // 10))
            self.wfile.flush()
            time.sleep(0.2)
            # An abortive close: RST, as a crashed application would.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
        elif p.endswith("/stall"):
            # A tenth of the body, then silence (the connection open) for
            # s seconds, then a close: an application stuck mid-response.
            self.send_response(200)
            self.send_header("content-length", str(n))
            self.end_headers()
            self.wfile.write(pattern(n // 10))
            self.wfile.flush()
            time.sleep(float(q.get("s", "20")))
            self.close_connection = True
        elif p.endswith("/slow"):
            time.sleep(float(q.get("s", "1")))
            self.reply(200, f"{self.server.name} slow".encode())
        elif p.endswith("/hang"):
            time.sleep(float(q.get("s", "20")))
            self.close_connection = True
        elif p.endswith("/big"):
            self.send_response(200)
            self.send_header("content-length", str(n))
            self.end_headers()
            chunk = pattern(65 * 1024 * 26 // 26)
            sent = 0
            try:
                while sent < n:
                    part = chunk[:min(len(chunk), n - sent)]
                    self.wfile.write(part)
                    sent += len(part)
            except OSError:
                pass
            self.close_connection = True
        elif p.endswith("/hop"):
            self.reply(200, b"hop", [("connection", "x-custom, keep-alive"), ("x-custom", "1"),
                                     ("keep-alive", "timeout=5"), ("proxy-thing", "p"),
                                     ("upgrade", "h2c"), ("x-kept", "yes"), ("server", "app")])
        elif p.endswith("/interim"):
            self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n")
            self.reply(200, b"after-interim")
        elif p.endswith("/badhead"):
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nbad header line\r\n\r\nhello")
            self.close_connection = True
        elif p.endswith("/overlong"):
            # Five bytes announced, then a second "response" in the same
            # write, on a connection kept open: it must not answer the
            # proxy's next request.
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
                             b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nsmuggle")
        elif p.endswith("/overlong-split"):
            # The same, but the head comes first and the body later, with
            # the extra "response" right behind it: a read that asks for
            # exactly the body's length ends where the answer does.
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
            self.wfile.flush()
            time.sleep(0.3)
            self.wfile.write(b"helloHTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nsmuggle")
        elif p.endswith("/hugehead"):
            self.wfile.write(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 100000 + b"\r\n\r\n")
            self.close_connection = True
        elif p.endswith("/badchunk"):
            self.wfile.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
            self.close_connection = True
        else:
            self.reply(200, f"{self.server.name} {self.command} {self.path}".encode())


class App(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # bursts of connects must not overflow the backlog

    def handle_error(self, request, client_address):
        pass  # clients (the proxy) going away mid-response are part of the tests

    health = 200
    health_checks = 0
    gate = None  # a threading.Event: requests wait for it

    def __init__(self, name, address=("127.0.0.1", 0), family=socket.AF_INET):
        self.address_family = family
        self.name = name
        self.requests = []
        self.first_body_byte = threading.Event()  # set when any body byte arrives
        self.chunked_requests = 0
        super().__init__(address, Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class UnixApp(App):
    address_family = socket.AF_UNIX

    def __init__(self, name, path):
        self.path = path
        self.name = name
        self.requests = []
        self.first_body_byte = threading.Event()
        self.chunked_requests = 0
        socketserver.TCPServer.__init__(self, path, Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)

    @property
    def url(self):
        return f"unix:{self.path}"
