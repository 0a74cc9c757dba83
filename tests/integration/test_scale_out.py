#!/usr/bin/python3
"""Scale-out with QUIC-LB: two xdpqd nodes, one on kernel sockets
and one on AF_XDP, share a service address behind a router that routes QUIC
by the server ID in the connection ID (netns.BalancerTopology) and
everything else by an ECMP hash of the 4-tuple. A client that migrates to a
port the hash sends to the other node stays on its node; with the QUIC-LB
rules removed the other node gets its packets and resets the connection,
which the client accepts because the nodes share their keys; a session
ticket, 0-RTT and a NEW_TOKEN token from one node are honoured by the
other."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (Server, TimedTestCase, gtlsclient, make_cert, pattern,  # noqa: E402
                     require_tools, sha256)
from netns import BalancerTopology  # noqa: E402

SIZE = 16 * 1024 * 1024


def write_secrets(path):
    """One secrets file for every node, as an operator would copy it."""
    keys = {"reset_key": 32, "token_key": 32, "ticket_key": 64, "quic_lb_key": 16}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        for name, n in keys.items():
            f.write(f"{name}={os.urandom(n).hex()}\n")


class ScaleOut(TimedTestCase):
    def setUp(self):
        require_tools()
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="xdpq-lb-")
        self.key, self.cert, _ = make_cert(self.tmp, "xdpq-lb")
        self.secrets = os.path.join(self.tmp, "secrets")
        write_secrets(self.secrets)

    def node(self, topo, k):
        args = ["--cert", self.cert, "--key", self.key, "--secrets", self.secrets,
                "--quic-lb-server-id", f"{k:02x}", "--quic-lb-mode", "plaintext"]
        if k == 2:
            args += ["--dataplane", "afxdp", "--interface", topo.node_if[k], "--xdp-mode",
                     "native"]
        return Server(*args, host=topo.vip, netns=topo.ns[f"n{k}"], workers=0 if k == 2 else 1)

    def migrate(self, topo, n1, n, after="5ms"):
        # Early in the download, so that most of it flows on the new path.
        return gtlsclient(n1, [f"/bytes/{n}"], f"--change-local-addr={after}", quiet=True,
                          timeout=120, netns=topo.cli_ns)

    def test_migrating_client_stays_on_its_node(self):
        with BalancerTopology() as topo:
            ports = topo.ports_by_node()
            # The client's kernel may pick only a port the hash sends to n1
            # and one it sends to n2: whichever it starts on, its migration
            # moves to a port the hash sends to the other node.
            topo.restrict_client_ports(list(ports.values()))
            with self.node(topo, 1) as n1, self.node(topo, 2) as n2:
                self.assertIn("QUIC-LB: config 0, server ID 01", n1.output())
                runs = [self.migrate(topo, n1, SIZE + i) for i in range(3)]
                # Plain ECMP: the migrated path reaches the other node,
                # which does not know the connection and resets it.
                topo.route_by_server_id(False)
                broken = self.migrate(topo, n1, SIZE + 9, after="1ms")
                s1, s2 = n1.stop(), n2.stop()
        logs = "\n".join(r.output[-1500:] for r in runs) + n1.output()[-1500:] + \
            n2.output()[-1500:]
        for i, r in enumerate(runs):
            self.assertEqual(sha256(r.file(str(SIZE + i))), sha256(pattern(SIZE + i)), logs)
        self.assertEqual(s1["handshakes_completed"] + s2["handshakes_completed"], 4, (s1, s2))
        self.assertGreaterEqual(s1["path_validations_ok"] + s2["path_validations_ok"], 3,
                                (s1, s2))
        self.assertFalse(broken.has_file(str(SIZE + 9)) and
                         sha256(broken.file(str(SIZE + 9))) == sha256(pattern(SIZE + 9)),
                         "the download survived plain ECMP: the test proves nothing")
        self.assertGreaterEqual(s1["stateless_resets_sent"] + s2["stateless_resets_sent"], 1,
                                (s1, s2))
        # The reset carried the owner's token (shared reset key): ngtcp2
        # took it as one (draining) instead of waiting out its idle timeout.
        self.assertIn("ERR_DRAINING", broken.output, broken.output[-2000:])

    def test_session_and_token_from_one_node_work_on_the_other(self):
        sess, tp, token = (os.path.join(self.tmp, f) for f in ("s.pem", "tp", "token"))
        files = [f"--session-file={sess}", f"--tp-file={tp}", f"--token-file={token}"]
        with BalancerTopology() as topo:
            ports = topo.ports_by_node()
            with self.node(topo, 1) as n1, self.node(topo, 2) as n2:
                topo.restrict_client_ports([ports[1]])
                first = gtlsclient(n1, ["/bytes/10"], *files, netns=topo.cli_ns)
                topo.restrict_client_ports([ports[2]])
                second = gtlsclient(n1, ["/bytes/20"], *files, "--quic-dump",
                                    netns=topo.cli_ns)
                s1, s2 = n1.stop(), n2.stop()
        self.assertEqual(first.file("10"), pattern(10), first.output[-2000:])
        self.assertEqual(second.file("20"), pattern(20), second.output[-2000:])
        self.assertEqual(s1["handshakes_completed"], 1, s1)
        self.assertEqual(s2["handshakes_completed"], 1, s2)
        self.assertEqual(s2["sessions_resumed"], 1, "n2 did not resume n1's session")
        self.assertEqual(s2["early_data_accepted"], 1, s2)
        self.assertIn("type=0RTT", second.output)
        self.assertEqual(s2["new_tokens_accepted"], 1, "n2 did not honour n1's NEW_TOKEN token")


if __name__ == "__main__":
    unittest.main()
