#!/usr/bin/python3
"""Bad input against a running xdpqd: garbage datagrams, truncated QUIC
headers, Initials in short datagrams, unknown versions, oversized packets.
Each is dropped or answered per RFC 9000, counted, and the server keeps
serving well-behaved clients throughout."""

import json
import os
import socket
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (Server, TimedTestCase, gtlsclient, pattern, require_tools,  # noqa: E402
                     xdpqctl)
from netns import Topology, sh  # noqa: E402


UNROUTED_BUCKETS = ("handshakes_started", "retries_sent", "version_negotiations",
                    "stateless_resets_sent", "drop_unparsable", "drop_small_initial",
                    "drop_unknown_packet", "drop_bad_token", "drop_conn_limit",
                    "drop_amplification", "drop_reset_rate", "drop_tx_full",
                    "drop_other_worker", "drop_source_limit", "drop_source_rate",
                    "refused_source_rate",
                    "drop_reflection")


def long_header(version, dcid=b"\x11" * 8, scid=b"\x22" * 8, first=0xC3):
    return bytes([first]) + struct.pack("!I", version) + bytes([len(dcid)]) + dcid + \
        bytes([len(scid)]) + scid


class BadInputTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()

    def send(self, srv, payloads, expect_reply=False):
        """Sends each payload from one socket; returns replies received."""
        fam = socket.AF_INET6 if ":" in srv.host else socket.AF_INET
        replies = []
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            # A reply expected: up to 3 s for the first (a slow machine),
            # then a short while for any more.
            s.settimeout(3 if expect_reply else 0.05)
            for p in payloads:
                s.sendto(p, (srv.host, srv.port))
            try:
                while True:
                    replies.append(s.recv(65535))
                    s.settimeout(0.3 if expect_reply else 0.05)
            except socket.timeout:
                pass
        return replies

    def test_broadcast_datagrams_are_dropped_and_counted(self):
        # Regression: a wildcard listen on the socket dataplane took
        # datagrams sent to the link's broadcast address as any other: a
        # connection was started with the broadcast address as its own, and
        # every reply to it failed. Now they are dropped before QUIC sees
        # them (rx_not_unicast); unicast clients are served as before.
        with Topology() as topo:
            with Server("--dataplane", "socket", host=topo.srv_ip, port=4433,
                        netns=topo.srv_ns, listen=["0.0.0.0:4433"]) as srv:
                code = ("import socket\n"
                        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                        "s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n"
                        "s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, "
                        f"b'{topo.cli_if}')\n"
                        f"p = {long_header(1)!r} + bytes(1200)\n"
                        "for i in range(5): s.sendto(p, ('255.255.255.255', 4433))\n")
                sh("/usr/bin/python3", "-c", code, ns=topo.cli_ns)
                until = time.time() + 10
                while True:
                    mid = json.loads(xdpqctl(srv, "--json", "stats")[1])["total"]
                    if mid["rx_not_unicast"] >= 5 or time.time() > until:
                        break
                    time.sleep(0.1)
                r = gtlsclient(srv, ["/bytes/1000"], netns=topo.cli_ns)
        self.assertEqual(mid["rx_not_unicast"], 5, mid)
        self.assertEqual(mid["datagrams_in"], 0, mid)
        self.assertEqual(r.file("1000"), pattern(1000), r.output[-2000:])

    def test_garbage_is_dropped_and_counted_server_survives(self):
        with Server("--dataplane", "socket") as srv:
            junk = [b"", b"\x00", b"\xff" * 7, os.urandom(1), os.urandom(100),
                    os.urandom(1500), b"\x40" + os.urandom(10),
                    b"\xc0" + b"\x00\x00\x00\x01" + b"\x30",  # DCID length 48 > 20
                    long_header(1)[:9]]                         # truncated header
            junk += [os.urandom(n) for n in range(1, 64)]
            self.send(srv, junk)
            r = gtlsclient(srv, ["/bytes/5000"])
            stats = srv.stop()
        self.assertEqual(r.statuses, {0: 200})
        self.assertEqual(r.file("5000"), pattern(5000))
        self.assertEqual(stats["handshakes_completed"], 1)
        # Every datagram is accounted for exactly once.
        unrouted = sum(stats[k] for k in UNROUTED_BUCKETS)
        self.assertEqual(stats["datagrams_routed"] + unrouted, stats["datagrams_in"], stats)
        # All junk went to drops or stateless answers (the client's first
        # Initial is the one handshake started).
        self.assertEqual(unrouted - stats["handshakes_started"], len(junk), stats)

    def test_small_initial_is_dropped(self):
        with Server("--dataplane", "socket") as srv:
            pkt = long_header(1) + b"\x00" + b"\x44\x00" + os.urandom(600)  # 600-odd bytes
            replies = self.send(srv, [pkt, pkt[:1199 - len(pkt)] if len(pkt) > 1199 else pkt],
                                expect_reply=True)
            stats = srv.stop()
        self.assertEqual(replies, [])
        self.assertGreaterEqual(stats["drop_small_initial"], 1)
        self.assertEqual(stats["handshakes_started"], 0)

    def test_unknown_version_gets_version_negotiation(self):
        with Server("--dataplane", "socket") as srv:
            pkt = long_header(0x1A2B3C4D, dcid=b"\xaa" * 8, scid=b"\xbb" * 5)
            pkt += b"\x00" * (1200 - len(pkt))
            replies = self.send(srv, [pkt], expect_reply=True)
            small = self.send(srv, [pkt[:500]], expect_reply=True)
            stats = srv.stop()
        self.assertEqual(len(replies), 1)
        vn = replies[0]
        self.assertTrue(vn[0] & 0x80)
        self.assertEqual(vn[1:5], b"\x00\x00\x00\x00")           # Version Negotiation
        self.assertEqual(vn[5], 5)                                 # DCID = client's SCID
        self.assertEqual(vn[6:11], b"\xbb" * 5)
        versions = [struct.unpack("!I", vn[i:i + 4])[0] for i in range(20, len(vn), 4)]
        self.assertIn(1, versions)
        self.assertEqual(small, [], "no VN for a datagram under 1200 bytes")
        self.assertEqual(stats["version_negotiations"], 1)

    def test_unknown_short_header_gets_stateless_reset(self):
        with Server("--dataplane", "socket") as srv:
            pkt = b"\x40" + os.urandom(18) + os.urandom(40)
            replies = self.send(srv, [pkt], expect_reply=True)
            stats = srv.stop()
        self.assertEqual(len(replies), 1)
        self.assertLess(len(replies[0]), len(pkt))
        self.assertEqual(replies[0][0] & 0xC0, 0x40)
        self.assertEqual(stats["stateless_resets_sent"], 1)

    def test_reflection_source_ports_are_dropped(self):
        # Regression: the socket dataplane answered datagrams from
        # amplifier ports (the XDP program already dropped them): a Version
        # Negotiation to a spoofed memcached or SSDP source is a reflection.
        with Server("--dataplane", "socket") as srv:
            pkt = long_header(0x1A2B3C4D, dcid=b"\xaa" * 8, scid=b"\xbb" * 5)
            pkt += b"\x00" * (1200 - len(pkt))
            replies = []
            for sport in (11211, 1900, 123):
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind((srv.host, sport))
                    s.settimeout(0.3)
                    s.sendto(pkt, (srv.host, srv.port))
                    try:
                        replies.append(s.recv(65535))
                    except socket.timeout:
                        pass
            ok = self.send(srv, [pkt], expect_reply=True)  # an ephemeral port is answered
            stats = srv.stop()
        self.assertEqual(replies, [])
        self.assertEqual(stats["drop_reflection"], 3, stats)
        self.assertEqual(len(ok), 1)

    def test_retry_token_forgery_is_rejected(self):
        with Server("--dataplane", "socket", "--retry", "on") as srv:
            # An Initial carrying a token with the Retry magic but bad contents.
            token = b"\xb6" + os.urandom(60)
            pkt = long_header(1, dcid=os.urandom(8)) + bytes([0x40, len(token)]) + token
            pkt += b"\x44\x80" + os.urandom(1200)
            self.send(srv, [pkt], expect_reply=True)
            r = gtlsclient(srv, ["/healthz"])
            stats = srv.stop()
        self.assertEqual(r.statuses, {0: 200})
        self.assertEqual(stats["handshakes_completed"], 1)
        self.assertGreaterEqual(stats["drop_bad_token"] + stats["drop_unknown_packet"]
                                + stats["drop_unparsable"], 1)

    def test_flood_of_initials_does_not_starve_clients(self):
        with Server("--dataplane", "socket", "--retry", "auto", "--retry-threshold", "10") as srv:
            pkts = []
            for _ in range(300):
                p = long_header(1, dcid=os.urandom(8), scid=os.urandom(8)) + b"\x00\x44\xb0"
                pkts.append(p + os.urandom(1200 - len(p)))
            self.send(srv, pkts)
            r = gtlsclient(srv, ["/bytes/1234"])
            stats = srv.stop()
        self.assertEqual(r.statuses, {0: 200})
        self.assertEqual(r.file("1234"), pattern(1234))
        # Junk Initials fail to decrypt: each is torn down at once, no state
        # kept; those arriving in one burst beyond the per-source cap are not
        # even accepted.
        self.assertEqual(stats["handshakes_completed"], 1)
        self.assertGreaterEqual(stats["handshakes_failed"] + stats["drop_source_limit"] +
                                stats["drop_source_rate"] + stats["retries_sent"], 300, stats)
        # (the well-behaved client's own connection may or may not be retired yet)
        self.assertGreaterEqual(stats["conns_closed"], stats["handshakes_started"] - 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
