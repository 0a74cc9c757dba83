#!/usr/bin/python3
"""The README's first command, scripts/demo.sh, on this build: the socket
part and the AF_XDP part (namespace pair, XDP program, HTTP/3 through the
AF_XDP rings, TCP and ping to the kernel) both work, and it cleans up."""

import hashlib
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import XDPQD, TimedTestCase, free_udp_port, pattern, require_tools  # noqa
from netns import require_root  # noqa

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def netns_list():
    return subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout


class DemoTest(TimedTestCase):
    def test_demo_shows_both_dataplanes_and_cleans_up(self):
        require_tools()
        require_root()
        env = dict(os.environ, XDPQ_DEMO_BIN=os.path.dirname(XDPQD), PORT=str(free_udp_port()))
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts/demo.sh")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        out = r.stdout
        self.assertEqual(r.returncode, 0, out[-3000:])
        socket_part, _, afxdp_part = out.partition("== AF_XDP:")
        self.assertTrue(afxdp_part, "the demo did not reach its AF_XDP part:\n" + out[-3000:])
        # 1 MiB of the /bytes pattern arrived whole on both dataplanes.
        want = hashlib.sha256(pattern(1 << 20)).hexdigest()[:16]
        for part in (socket_part, afxdp_part):
            self.assertIn(f"received 1048576 bytes, sha256 {want}", part)
        self.assertIn("dataplane:  afxdp on", afxdp_part)
        self.assertEqual(len(re.findall(r"client\| http: stream 0x[04] \[:status: 200\]",
                                        afxdp_part)), 2, afxdp_part)
        self.assertRegex(afxdp_part, r"client\| HTTP/2 200")
        self.assertRegex(afxdp_part, r"2 packets transmitted, 2 received")
        m = re.search(r"xdp_redirected\s+(\d+)", afxdp_part)
        self.assertTrue(m and int(m.group(1)) > 0, afxdp_part)
        m = re.search(r"xdp_pass_not_udp\s+(\d+)", afxdp_part)
        self.assertTrue(m and int(m.group(1)) > 0, "TCP/ICMP did not pass to the kernel")
        self.assertTrue(out.rstrip().endswith("== demo done"), out[-500:])
        self.assertNotIn("xdpq-demo-", netns_list(), "the demo left its namespaces behind")


if __name__ == "__main__":
    unittest.main()
