#!/usr/bin/python3
"""Hostile clients against a real xdpqd (issue 10): each case is an attack
that broke or exhausted an earlier build. The server must survive it with
its memory bounded, count it, and keep serving a well-behaved client."""

import os
import socket
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server, TimedTestCase, gtlsclient, pattern, require_tools  # noqa: E402


def bad_length_initial(dcid):
    """A 1200-byte QUIC v1 Initial whose Length field runs past the datagram:
    ngtcp2 rejects it before it records the client's DCID."""
    scid = os.urandom(8)
    p = bytes([0xC3]) + struct.pack("!I", 1) + bytes([len(dcid)]) + dcid
    p += bytes([len(scid)]) + scid + b"\x00" + b"\x4f\xff"
    return p + os.urandom(1200 - len(p))


class HostileQuicTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()

    def test_dangling_cid_replay(self):
        # Pre-authentication use-after-free: the second copy of each Initial
        # was routed to the connection the first one created and freed.
        with Server("--dataplane", "socket") as srv:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(1000):
                    dcid = os.urandom(8)
                    pkt = bad_length_initial(dcid)
                    s.sendto(pkt, (srv.host, srv.port))
                    if i % 50 == 0:
                        time.sleep(0.003)
                    s.sendto(pkt, (srv.host, srv.port))
            r = gtlsclient(srv, ["/bytes/4321"])
            stats = srv.stop()
        self.assertEqual(r.statuses, {0: 200}, r.output[-2000:])
        self.assertEqual(r.file("4321"), pattern(4321))
        self.assertEqual(srv.proc.returncode, 0, srv.output()[-3000:])
        # A copy that arrives in the same receive batch as the first reaches
        # the retired connection (alive until the end of the pass) and is
        # dropped as "closing"; a later copy starts a new, again rejected,
        # handshake. Nothing else may happen to them (ASan checks the rest).
        self.assertGreaterEqual(stats["handshakes_started"] + stats["drop_closing"], 2000, stats)
        self.assertEqual(stats["handshakes_failed"], stats["handshakes_started"] - 1, stats)
        self.assertEqual(stats["quic_connections"], 0, stats)


if __name__ == "__main__":
    unittest.main(verbosity=2)
