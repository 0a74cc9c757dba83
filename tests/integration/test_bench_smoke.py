#!/usr/bin/python3
"""The benchmark harness must not rot: run one short cell of bench/run.py and
check that the report is produced and well-formed. Never asserts a speed."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import XDPQD, TimedTestCase, require_tools  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BenchSmokeTest(TimedTestCase):
    def test_smoke_report(self):
        require_tools()
        build = os.path.dirname(XDPQD)
        self.assertTrue(os.access(os.path.join(build, "h3load"), os.X_OK), "h3load not built")
        out = tempfile.mkdtemp(prefix="xdpq-bench-smoke-")
        r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "run.py"), "--smoke",
                            "--build", build, "--out", out], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        meta = res["meta"]
        self.assertEqual(len(meta["git_commit"]), 40)
        self.assertIn("xdpq-afxdp", meta["server_commands"])
        variants = {run["variant"] for run in res["runs"]}
        self.assertEqual(variants, {"xdpq-afxdp", "xdpq-socket"})
        for run in res["runs"]:
            for key in ("command", "req_per_s", "succeeded", "p50_us", "p99_us",
                        "server_cpu_s", "machine_cpu_s", "server_stats"):
                self.assertIn(key, run)
            self.assertGreater(run["succeeded"], 0, "the benchmark served nothing")
            self.assertEqual(run["errors"], 0)
        with open(os.path.join(out, "report.md")) as f:
            md = f.read()
        self.assertIn("| proto | cell | variant | req/s", md)
        self.assertIn("xdpq-afxdp vs xdpq-socket", md)
        self.assertIn("| cell | A vs B | req/s ratio (median) |", md)
        for png in ("throughput.png", "cpu_per_request.png"):
            with open(os.path.join(out, png), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
