"""Shared helpers for xdpq's integration tests.

Starts a real xdpqd on loopback (a free port picked by the kernel), drives
real peers (Debian's gtlsclient) against it, and reads the counters xdpqd
prints as one JSON line when it stops. Uses only the standard library, so
it runs under Debian's /usr/bin/python3.
"""

import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

XDPQD = os.environ.get("XDPQD", "")
GTLSCLIENT = shutil.which("gtlsclient") or "/usr/bin/gtlsclient"
# The load generator built beside xdpqd.
H3LOAD = os.path.join(os.path.dirname(XDPQD or "/"), "h3load")


def require_tools():
    """Missing tools fail the test: these suites never skip silently."""
    if not XDPQD or not os.access(XDPQD, os.X_OK):
        raise AssertionError("XDPQD must point at the xdpqd binary (ctest sets it)")
    if not os.access(GTLSCLIENT, os.X_OK):
        raise AssertionError("gtlsclient is missing: run scripts/setup.sh (package ngtcp2-client)")


def read_to_end(s):
    """Everything the socket s sends until it closes."""
    got = bytearray()
    while True:
        b = s.recv(1 << 20)
        if not b:
            return bytes(got)
        got += b


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def pattern(n):
    """The body of /bytes/N: byte i is 'a' + i % 26."""
    period = bytes(range(97, 97 + 26))
    return (period * (n // 26 + 1))[:n]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def free_udp_port(family=socket.AF_INET):
    """A port free for UDP and for TCP alike (xdpqd serves both on it): a
    port the kernel hands out for UDP may be some TCP connection's local
    port, and then xdpqd's TCP listener would find it in use. Taken below
    the ephemeral range (32768 and up), so that no client's connection
    can be given it between now and the moment it is bound (an upgrade
    under load binds its ports seconds later)."""
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    for _ in range(200):
        with socket.socket(family, socket.SOCK_DGRAM) as u:
            port = random.randrange(20000, 32768)
            try:
                u.bind((host, port))
            except OSError:
                continue
            with socket.socket(family, socket.SOCK_STREAM) as t:
                try:
                    t.bind((host, port))
                except OSError:
                    continue
                return port
    raise AssertionError("no port free for both UDP and TCP")


class Server:
    """An xdpqd process; use as a context manager. stop() returns its stats."""

    def __init__(self, *args, host="127.0.0.1", port=None, workers=1, extra_env=None, netns=None,
                 listen=None):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.host = host
        self.port = port or (4433 if netns else free_udp_port(family))
        if listen is None:  # [] : none on the command line (a config file's)
            listen = [f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"]
        self.args = [XDPQD]
        for a in listen:
            self.args += ["--listen", a]
        if workers:
            self.args += ["--workers", str(workers)]
        self.args += list(args)
        if "--drain-timeout" not in args and "--config" not in args:
            # SIGTERM drains; a peer that vanished under loss leaves a stream
            # "in flight" until the drain timeout. Keep it short in tests
            # (test_control covers the drain itself).
            self.args += ["--drain-timeout", "2000"]
        if "--control-socket" not in args and "--config" not in args:
            # A socket of its own, so tests never collide on the default path.
            self.control_socket = tempfile.mktemp(prefix="xdpqd-", suffix=".sock")
            self.args += ["--control-socket", self.control_socket]
        else:
            self.control_socket = None
        if netns:
            self.args = ["ip", "netns", "exec", netns] + self.args
        self.log_path = tempfile.mktemp(prefix="xdpqd-", suffix=".log")
        self.proc = None
        self.stats = None
        self.env = dict(os.environ, **(extra_env or {}))

    def __enter__(self):
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"xdpqd exited with {self.proc.returncode}:\n{self.output()}")
            if "ready:" in self.output():
                return self
            time.sleep(0.05)
        raise AssertionError("xdpqd did not become ready:\n" + self.output())

    def __exit__(self, *exc):
        try:
            self.stop()
        finally:
            self.log.close()

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("xdpqd did not stop within 10 s of SIGTERM")
        if self.stats is None:
            m = re.search(r"stats (\{.*\})", self.output())
            self.stats = json.loads(m.group(1)) if m else {}
        return self.stats

    def url(self, path):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}{path}"


class TimedTestCase(unittest.TestCase):
    """Prints each test's duration, so slow cases are visible in CI logs."""

    def setUp(self):
        self._t0 = time.monotonic()

    def tearDown(self):
        print(f"[{time.monotonic() - self._t0:.1f}s]", end=" ", flush=True)


class ClientResult:
    def __init__(self, proc, download_dir):
        self.returncode = proc.returncode
        self.output = proc.stdout
        self.download_dir = download_dir
        self.statuses = statuses(proc.stdout)

    def file(self, name):
        with open(os.path.join(self.download_dir, name), "rb") as f:
            return f.read()

    def has_file(self, name):
        return os.path.exists(os.path.join(self.download_dir, name))


def xdpqctl(server_or_path, *args, json_out=False, user=None, timeout=15, cwd=None):
    """Runs xdpqctl against a server's control socket (in directory cwd);
    returns (rc, stdout, stderr)."""
    path = server_or_path if isinstance(server_or_path, str) else server_or_path.control_socket
    ctl = os.path.join(os.path.dirname(os.path.abspath(XDPQD)), "xdpqctl")
    cmd = [ctl, "--socket", os.path.abspath(path)] + (["--json"] if json_out else []) + list(args)
    if user:
        cmd = ["runuser", "-u", user, "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def make_cert(d, cn):
    """A self-signed P-256 certificate for cn in directory d: (key, cert,
    SHA-256 fingerprint)."""
    key, cert = os.path.join(d, f"{cn}.key"), os.path.join(d, f"{cn}.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert, "-days",
                    "2", "-subj", f"/CN={cn}"], check=True, capture_output=True)
    fp = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-fingerprint", "-sha256"],
                        check=True, capture_output=True, text=True).stdout.strip().split("=")[1]
    return key, cert, fp


def statuses(output):
    """Maps request index (stream id / 4) to the :status gtlsclient saw."""
    found = {}
    for m in re.finditer(r"http: stream 0x([0-9a-f]+) \[:status: (\d+)\]", output):
        found[int(m.group(1), 16) // 4] = int(m.group(2))
    return found


def gtlsclient(server, paths, *flags, timeout=60, download=True, quiet=False, netns=None,
               idle_timeout="15s"):
    """Runs gtlsclient against server for paths; returns a ClientResult.

    gtlsclient exits 0 even when requests fail, so callers assert on the
    downloaded files and on the log (stderr, merged into output)."""
    ddir = tempfile.mkdtemp(prefix="gtls-")
    cmd = [GTLSCLIENT, "--exit-on-all-streams-close", f"--timeout={idle_timeout}"]
    if quiet:
        cmd.append("-q")
    elif "--quic-dump" in flags:
        flags = tuple(f for f in flags if f != "--quic-dump")
    else:
        cmd.append("--no-quic-dump")
    if download:
        cmd += ["--download", ddir]
    cmd += list(flags)
    cmd += [server.host, str(server.port)] + [server.url(p) for p in paths]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          text=True, errors="replace")
    return ClientResult(proc, ddir)


def pcap_frames(path):
    """The captured bytes of each record of a little-endian pcap file
    (tcpdump's and xdpq's), in capture order."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\xd4\xc3\xb2\xa1", "not a little-endian pcap file"
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack("<I", data[off + 8:off + 12])[0]
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def read_pcap(path, protos=(17,)):
    """(src_port, dst_port, payload, protocol) of each Ethernet/IPv4 record
    whose IP protocol is in protos (17: UDP, 6: TCP), in capture order."""
    out = []
    for rec in pcap_frames(path):
        if len(rec) < 42 or rec[12:14] != b"\x08\x00" or rec[23] not in protos:
            continue
        ihl = (rec[14] & 0xF) * 4
        total = struct.unpack("!H", rec[16:18])[0]
        l4 = rec[14 + ihl:14 + total]
        sport, dport = struct.unpack("!HH", l4[:4])
        header = (l4[12] >> 4) * 4 if rec[23] == 6 else 8
        out.append((sport, dport, l4[header:], rec[23]))
    return out


def udp_queued(port):
    """Bytes waiting in the receive queues of the IPv4 UDP sockets bound to
    port (/proc/net/udp)."""
    total = 0
    with open("/proc/net/udp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port:
                total += int(fields[4].split(":")[1], 16)
    return total


def check_burst_of_handshakes(tc, srv, n=16, netns=None):
    """n clients open a connection each while srv is stopped (SIGSTOP), so
    that it finds all their Initials waiting when it runs again and reads
    them in one pass. Each costs a key exchange and a signature: the first
    clients' replies must leave while the rest are still being worked on,
    not all together after the last one (which kept every client idle for
    the whole burst). Read from the server's own capture, in the order it
    read Initials and sent datagrams. Stops srv; returns its stats."""
    tmp = tempfile.mkdtemp(prefix="xdpq-burst-")
    cap = os.path.join(tmp, "burst.pcap")
    rc, out, err = xdpqctl(srv, "capture", "start", cap, "--filter", f"udp port {srv.port}")
    assert rc == 0, out + err
    cmd = [H3LOAD, "--json", "-n", str(n), "-c", str(n), "--new-connection-per-request",
           srv.url("/healthz")]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    srv.proc.send_signal(signal.SIGSTOP)
    try:
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Every client's first Initial sent; its first retransmission is
        # about a second away. On kernel sockets they are seen waiting:
        # the queue (in-kernel sizes, over 1,200 bytes a datagram) has
        # room for all n and stopped growing for 0.1 s. What AF_XDP's
        # rings hold is not seen.
        until = time.time() + (0.9 if netns is None else 0.5)
        last, still_since = -1, time.time()
        while time.time() < until:
            if netns is not None:
                time.sleep(0.02)
                continue
            queued = udp_queued(srv.port)
            if queued != last:
                last, still_since = queued, time.time()
            elif queued >= n * 1200 and time.time() - still_since >= 0.1:
                break
            time.sleep(0.02)
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    _, err = client.communicate(timeout=60)
    rc, o2, e2 = xdpqctl(srv, "capture", "stop")
    assert rc == 0, o2 + e2
    order, clients = "", set()
    packets = read_pcap(cap)
    shutil.rmtree(tmp)
    for sport, _dport, _payload, _proto in packets:
        if sport == srv.port:
            order += "r"
        elif sport not in clients:
            clients.add(sport)
            order += "I"  # a client's first datagram: its Initial
    order = order[:order.rfind("I") + 1]  # "I": a client's Initial read, "r": a datagram sent
    stats = srv.stop()
    tc.assertEqual(client.returncode, 0, err[-2000:])
    tc.assertGreaterEqual(stats["handshakes_completed"], n, stats)
    tc.assertEqual(order.count("I"), n, order)
    tc.assertIn("r", order, f"no reply before the last Initial was read: {order}")
    tc.assertGreater(stats["output_flushed_mid_pass"], 0, stats)
    return stats


def write_afxdp_config(path, interface, queues):
    """A configuration file for AF_XDP on interface and queues (the
    interface on line 5, the queues on line 6)."""
    with open(path, "w") as f:
        f.write(f'[server]\nlisten = ["127.0.0.1:4433"]\n'
                f'[dataplane]\nmode = "afxdp"\ninterface = "{interface}"\n'
                f'queues = "{queues}"\n')
