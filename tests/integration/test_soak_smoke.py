#!/usr/bin/python3
"""The 2-minute version of bench/soak.py: good HTTP/3 and HTTP/2
clients alongside every hostile client we know, on both dataplanes, a
minute each. Passes when no good request failed, xdpqd exited cleanly, the
body bytes it held stayed within its budget, its descriptors stayed
bounded, and its peak RSS in the second half of each run stayed within
16 MiB of the first half's.
Under sanitizers RSS says little (the quarantine fills as it runs): there
the leak check at exit (LeakSanitizer) stands in for the slope."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import XDPQD, TimedTestCase, require_tools  # noqa: E402
from netns import require_root  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SoakSmokeTest(TimedTestCase):
    def test_two_minutes_of_good_and_hostile_clients(self):
        require_tools()
        require_root()
        build = os.path.dirname(XDPQD)
        out = tempfile.mkdtemp(prefix="xdpq-soak-smoke-")
        sanitized = "ASAN_OPTIONS" in os.environ
        # The fitted slope over 30 s of samples is mostly malloc's trimming
        # noise (+-5 MiB); the peak of the second half against the first's
        # is what a leak moves. The 30-minute soak judges the slope.
        slope = "1000"
        r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "soak.py"),
                            "--duration", "120", "--build", build, "--out", out,
                            "--max-slope", slope], capture_output=True, text=True, timeout=400)
        with open(os.path.join(out, "soak.json")) as f:
            res = json.load(f)
        self.assertEqual([run["dataplane"] for run in res["runs"]], ["socket", "afxdp"])
        for run in res["runs"]:
            self.assertEqual(run["errors"], [], run["dataplane"])
            self.assertGreater(run["good"]["h3"], 0)
            self.assertGreater(run["good"]["h2"], 0)
            self.assertEqual(run["exit_status"], 0)
            if not sanitized:
                # The first third is the warm-up from a cold start (the
                # allocator's caches and the workers' pools fill up to what
                # the load needs); a leak goes on growing after it, so the
                # last third's peak is held against the middle third's.
                rss = [x["rss_kib"] for x in run["samples"]]
                third = len(rss) // 3
                growth = (max(rss[2 * third:]) - max(rss[third:2 * third])) / 1024
                self.assertLessEqual(growth, 16, (run["dataplane"], rss))
            held = [x.get("body_bytes_held") or 0 for x in run["samples"]]
            self.assertLessEqual(max(held), 32 << 20, run["dataplane"])  # the soak's budget
            self.assertLess(max(x["fds"] for x in run["samples"]), 500, run["dataplane"])
            # The hostile clients were there, and were held off.
            c = run["counters"]
            self.assertGreater(c["handshakes_failed"] + c["drop_source_rate"] +
                               c["retries_sent"], 1000, c)
            self.assertGreater(c["tcp_body_budget_refusals"] + c["tcp_timeouts_headers"], 0, c)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-2000:])


if __name__ == "__main__":
    unittest.main(verbosity=2)
