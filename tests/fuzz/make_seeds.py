#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/NAME/).
Seeds are small, valid inputs of each format, so the fuzzers start deep.
The endpoint seeds come from a capture of a real gtlsclient exchange
(tests/fuzz/client_datagrams.pcap: tcpdump on loopback while gtlsclient
fetched two URLs from xdpqd --retry off), the rest are
built here. Run it after changing a harness's input format."""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def put(name, seed_name, data):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, seed_name), "wb") as f:
        f.write(data)


def chunk(data, sel=None):
    """[selector] two-byte length, bytes: the harnesses' framing."""
    head = b"" if sel is None else bytes([sel])
    return head + struct.pack("!H", len(data)) + data


# --- frames: packet and xdp ---------------------------------------------------

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def frame(payload, v6=False, vlan=False, sport=40000, dport=4433, frag=0, tos=0):
    eth = bytes.fromhex("020000000001020000000002")
    if vlan:
        eth += b"\x81\x00" + struct.pack("!H", 42)
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    if v6:
        src = bytes.fromhex("fd000000000000000000000000000002")
        dst = bytes.fromhex("fd000000000000000000000000000001")
        ip = struct.pack("!IHBB", 0x60000000 | (tos << 20), len(udp), 17, 64) + src + dst
        return eth + b"\x86\xdd" + ip + udp
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(udp), 1, frag, 64, 17, 0,
                      bytes([10, 0, 0, 2]), bytes([10, 0, 0, 1]))
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return eth + b"\x08\x00" + hdr + udp


short = b"\x41" + bytes(range(1, 19)) + b"\x55" * 40
initial = b"\xc3\x00\x00\x00\x01\x08" + bytes(8) + b"\x08" + bytes(8) + b"\x00\x44\xb0"
initial += b"\x00" * (1200 - len(initial))
frames = {
    "v4_short": frame(short), "v6_vlan_short": frame(short, v6=True, vlan=True),
    "v4_initial": frame(initial), "v4_fragment": frame(short, frag=0x2000),
    "v4_ecn": frame(short, tos=2), "v4_reflection": frame(short, sport=11211),
    "v4_tiny": frame(b"\x40" * 5),
}
for n, f in frames.items():
    put("packet", n, f)
    put("xdp", n, f)

# --- endpoint: real client datagrams -----------------------------------------

pcap = os.path.join(HERE, "client_datagrams.pcap")
if os.path.exists(pcap):
    from scapy.all import UDP, rdpcap  # Debian's python3-scapy
    sent = [bytes(p[UDP].payload) for p in rdpcap(pcap) if UDP in p and p[UDP].dport != p[UDP].sport
            and p[UDP].sport != 34433]
    put("endpoint", "client_exchange", b"".join(chunk(d, 0x80 if i % 3 == 2 else 1)
                                                for i, d in enumerate(sent)))
    put("endpoint", "first_initial", chunk(sent[0], 0))
# The captured exchange again, to the harness's QUIC-LB endpoint (selector
# bit 0x40), from the committed seed when the capture is not at hand.
exchange = os.path.join(OUT, "endpoint", "client_exchange")
if os.path.exists(exchange):
    with open(exchange, "rb") as f:
        data, pos, out = f.read(), 0, b""
    while pos + 3 <= len(data):
        sel, n = data[pos], struct.unpack("!H", data[pos + 1:pos + 3])[0]
        out += chunk(data[pos + 3:pos + 3 + n], sel | 0x40)
        pos += 3 + n
    put("endpoint", "quic_lb_exchange", out)

# Short headers with CIDs of the QUIC-LB endpoint's shape (config 1, 10
# bytes: first octet 0x29), and of the unroutable one (0xf1, worker bytes of
# both generations): decrypt, owner and generation paths.
put("endpoint", "cid_shapes", chunk(b"\x41\x29" + bytes(range(9)) + bytes(40), 0x42) +
    chunk(b"\x41\xf1\x01" + bytes(16) + bytes(40), 2) +
    chunk(b"\x41\xf1\x81" + bytes(16) + bytes(40), 3))
put("endpoint", "junk_mix", chunk(short, 2) + chunk(initial, 3) + chunk(b"\xc0\x1a\x2a\x3a\x4a" +
                                                                          b"\x08" * 30 + bytes(1200), 4))

# --- HTTP/1.1 -------------------------------------------------------------------

h1 = {
    "get": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    "pipelined": b"GET /bytes/10 HTTP/1.1\r\nHost: x\r\n\r\nHEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
    "post_chunked": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n0\r\n\r\n",
    "post_length": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    "range": b"GET /index.html HTTP/1.1\r\nHost: x\r\nRange: bytes=1-5\r\n"
             b"If-None-Match: \"x\"\r\nConnection: close\r\n\r\n",
    "expect_continue": b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                       b"Content-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "expect_other": b"POST /echo HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"
                    b"xPUT /echo HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n",
    # Host shapes (an IPv6 literal, userinfo) and a version past HTTP/1.
    "host_shapes": b"GET / HTTP/1.1\r\nHost: [::1]:8443\r\n\r\nGET / HTTP/1.1\r\nHost: u@a\r\n\r\n"
                   b"GET / HTTP/2.0\r\n\r\n",
    # Chunked framing with an extension and trailers, then one a loose
    # parser would take (no CRLF after the data); a bare CR in a head.
    "chunk_framing": b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3;e=\"a b\"\r\nabc\r\n0\r\nx-t: 1\r\n\r\n"
                     b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"2\r\nabXY0\r\n\r\n",
    "bare_cr": b"GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",
    # Whitespace before a colon, trailing a value, a tab in the target.
    "field_whitespace": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2  \r\n\r\nab"
                        b"GET / HTTP/1.1\r\nHost : y\r\n\r\nGET /a\tb HTTP/1.1\r\nHost: x\r\n\r\n",
}
for n, d in h1.items():
    put("h1", n, chunk(d[:20]) + chunk(d[20:]))

# --- HTTP/2 (after the harness's own preface and SETTINGS) ---------------------

import h2.config  # noqa: E402  (Debian's python3-h2)
import h2.connection  # noqa: E402

for n, reqs in {"get": [("GET", "/healthz", None)],
                "post": [("POST", "/echo", b"body bytes")],
                "many": [("GET", f"/bytes/{i}", None) for i in range(1, 8)]}.items():
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    c.data_to_send()  # preface + SETTINGS: the harness sends its own
    sid = 1
    for method, path, body in reqs:
        c.send_headers(sid, [(":method", method), (":scheme", "https"), (":authority", "x"),
                             (":path", path)], end_stream=body is None)
        if body is not None:
            c.send_data(sid, body, end_stream=True)
        sid += 2
    c.ping(b"12345678")
    c.increment_flow_control_window(65535)
    put("h2", n, chunk(c.data_to_send()))

# --- HTTP/3 ------------------------------------------------------------------------

def varint(v):
    if v < 64:
        return bytes([v])
    if v < 16384:
        return struct.pack("!H", 0x4000 | v)
    return struct.pack("!I", 0x80000000 | v)


def h3frame(t, payload):
    return varint(t) + varint(len(payload)) + payload


control = b"\x00" + h3frame(0x04, varint(0x06) + varint(16384) + varint(0x01) + varint(0))
qpack_enc, qpack_dec = b"\x02", b"\x03"
get_root = h3frame(0x01, b"\x00\x00\xd1\xd7\xc1\x50\x09localhost")
post_echo = h3frame(0x01, b"\x00\x00\xd4\xd7\x51\x05/echo\x50\x09localhost") + \
    h3frame(0x00, b"hello")
# selectors: 0 control, 1 encoder, 2 decoder, 3.. request streams; 0x08 FIN
base = chunk(control, 0) + chunk(qpack_enc, 1) + chunk(qpack_dec, 2)
put("h3", "get", base + chunk(get_root, 0x08 | 3))
put("h3", "post", base + chunk(post_echo, 0x08 | 4))
put("h3", "two", base + chunk(get_root, 0x08 | 3) + chunk(post_echo[:7], 4) +
    chunk(post_echo[7:], 0x08 | 4))
# A header section that announces a long Huffman-coded value and stops.
put("h3", "long_value", base + chunk(b"\x01\x80\x01\x11\x70\x00\x00\x50\xff\xe9\xfa\x03", 3))

# --- config --------------------------------------------------------------------------

put("config", "full", b"""[server]
listen = ["127.0.0.1:4433", "[::1]:4433"]
workers = 2
log_level = "info"
drain_timeout_ms = 1000
per_source_rate = 100
[dataplane]
mode = "socket"
[http]
max_header_size = 8192
max_request_body = 1048576
max_body_per_connection = 2097152
serve_dotfiles = false
[quic]
retry = "auto"
retry_threshold = 10
[tcp]
enabled = true
h2c_listen = ["127.0.0.1:8080"]
""")
put("config", "quic_lb", b"""[tls]
secrets = "/var/lib/xdpq/secrets"
[quic_lb]
server_id = "0a0b"
config_id = 3
nonce_length = 12
mode = "plaintext"
""")
put("config", "proxy", b"""[proxy_defaults]
timeout_ms = 30000
client_timeout_ms = 60000
trusted = ["10.0.0.0/8"]

[[proxy]]
prefix = "/api/"
upstreams = ["http://127.0.0.1:8000", "http://[::1]:8001", "unix:/run/app.sock"]
balancing = "least-outstanding"
""")
put("config", "bad_type", b"[server]\nworkers = \"two\"\n")
put("config", "unknown", b"[nope]\nx = 1\n")

# --- upstream_response: [HEAD?] then reads of [two-byte length, bytes] ---------

def upstream(name, head_request, *reads, tunnel=False):
    put("upstream_response", name, bytes([(1 if head_request else 0) | (2 if tunnel else 0)]) +
        b"".join(chunk(r) for r in reads))


upstream("length", False, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello")
upstream("chunked", False, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
         b"lo\r\n0\r\nx-trailer: t\r\n\r\n")
upstream("close_delimited", False, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", b"def")
upstream("interim", False, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
         b"Link: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
upstream("head", True, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
upstream("tunnel", False, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
         b"Connection: Upgrade\r\n\r\n\x81\x02hi", b"\x88\x00", tunnel=True)
upstream("tunnel_refused", False, b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno",
         tunnel=True)
upstream("switch_unasked", False, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
         b"Connection: upgrade\r\n\r\nraw")
upstream("bad_chunk", False, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
upstream("trailers", False, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
         b"3\r\nabc\r\n0\r\nT-1: a\r\nT-2: b\r\nT-3: c\r\n\r\n")
upstream("overlong", False, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
         b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle")
upstream("truncated", False, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
upstream("huge_head", False, b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
upstream("two_lengths", False, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
upstream("field_whitespace", False, b"HTTP/1.1 302 Found\r\nLocation : /x  \r\n"
         b"Content-Length: 0\r\n\r\n")
upstream("name_with_space", False, b"HTTP/1.1 200 OK\r\nX A: b\r\nContent-Length: 0\r\n\r\n")
upstream("loose_chunk", False, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"3;e=1\r\nabcXY0\r\n\r\n")

print("seeds written to", OUT, file=sys.stderr)
