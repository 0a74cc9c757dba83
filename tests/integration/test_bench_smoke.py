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

    def test_proxy_cell(self):
        """One short proxy cell on both dataplanes (the chroot's nginx and
        HAProxy are not needed, nor run): the requests went through xdpqd's
        proxy to the upstream and came back with status 200."""
        require_tools()
        build = os.path.dirname(XDPQD)
        out = tempfile.mkdtemp(prefix="xdpq-bench-proxy-")
        r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "run.py"), "--smoke",
                            "--cells", "proxy", "--build", build, "--out", out],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        runs = res["runs"]
        self.assertEqual({run["variant"] for run in runs}, {"xdpq-afxdp", "xdpq-socket"})
        self.assertIn("/usr/sbin/nginx", res["meta"]["upstream"]["command"])
        for run in runs:
            name = run["variant"]
            self.assertTrue(run["proxy"], name)
            self.assertIn("--proxy /=http://127.0.0.1:", res["meta"]["server_commands"][
                name + " proxy"])
            self.assertGreater(run["succeeded"], 0, f"{name}: nothing came back")
            self.assertEqual(run["errors"], 0, name)
            self.assertEqual(run["status"]["2xx"], run["succeeded"], name)
            self.assertEqual(run["status"]["5xx"], 0, name)
            # The answers came from the upstream, not xdpqd's own document
            # root: it counted at least every request the client completed,
            # and xdpqd counted the upstream's responses.
            self.assertGreaterEqual(run["upstream_requests"], run["succeeded"], name)
            self.assertGreaterEqual(run["server_stats"].get("upstream0_responses", 0),
                                    run["succeeded"], name)
            self.assertIsNotNone(run["server_cpu_us_per_req"], name)
        with open(os.path.join(out, "report.md")) as f:
            self.assertIn("3B c=2 m=4 proxy", f.read())


if __name__ == "__main__":
    unittest.main(verbosity=2)
