#!/usr/bin/python3
"""The Debian package (scripts/package.sh): dpkg -i installs the programs,
the unit, the commented configuration and the man pages and creates the xdpq
system user; the installed xdpqd passes --check-config on the installed
configuration and, run as the xdpq user with exactly the capabilities the
installed unit grants, serves HTTP/3 on both dataplanes (the installed h3load
fetches); dpkg --purge removes all of it."""

import json
import os
import pwd
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import TimedTestCase, free_udp_port, require_tools  # noqa
from netns import Topology, require_root  # noqa

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ["/usr/sbin/xdpqd", "/usr/sbin/xdpqctl", "/usr/bin/h3load",
         "/usr/lib/systemd/system/xdpqd.service", "/etc/xdpq/xdpq.toml",
         "/usr/share/man/man8/xdpqd.8.gz", "/usr/share/man/man8/xdpqctl.8.gz",
         "/usr/share/man/man1/h3load.1.gz"]


def run(*cmd, check=True, timeout=120, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}")
    return r


def installed():
    return run("dpkg-query", "-W", "-f=${Status}", "xdpq", check=False).stdout.startswith(
        "install ok")


class PackageTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()
        require_root()
        out = run("bash", os.path.join(ROOT, "scripts/package.sh"), timeout=1500).stdout
        cls.deb = out.strip().splitlines()[-1]
        if not cls.deb.startswith("/"):
            cls.deb = os.path.join(ROOT, cls.deb)
        if installed():
            run("dpkg", "--purge", "xdpq")

    def tearDown(self):
        if installed():
            subprocess.run(["pkill", "-TERM", "-x", "xdpqd", "-U", "xdpq"], check=False)
        if installed():
            run("dpkg", "--purge", "xdpq", check=False)
        super().tearDown()

    def unit_caps(self):
        with open("/usr/lib/systemd/system/xdpqd.service") as f:
            unit = f.read()
        self.assertRegex(unit, r"(?m)^User=xdpq$")
        self.assertRegex(unit, r"(?m)^ExecStart=/usr/sbin/xdpqd --config /etc/xdpq/xdpq.toml$")
        caps = re.search(r"(?m)^AmbientCapabilities=(.*)$", unit).group(1).split()
        bounding = re.search(r"(?m)^CapabilityBoundingSet=(.*)$", unit).group(1).split()
        self.assertEqual(sorted(caps), sorted(bounding))
        self.assertNotIn("CAP_SYS_ADMIN", caps)
        return ",".join("+" + c[len("CAP_"):].lower() for c in caps)

    def as_service_user(self, caps, args, ns=None):
        """The installed xdpqd as the unit runs it: user xdpq, its capabilities."""
        cmd = ["setpriv", "--reuid", "xdpq", "--regid", "xdpq", "--init-groups", "--inh-caps",
               caps, "--ambient-caps", caps, "--bounding-set", "-all," + caps,
               "/usr/sbin/xdpqd", "--config", "/etc/xdpq/xdpq.toml", *args]
        if ns:
            cmd = ["ip", "netns", "exec", ns, *cmd]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        lines = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if " ready: " in line:
                return proc, lines
        proc.kill()
        raise AssertionError("installed xdpqd did not start:\n" + "".join(lines))

    def stop(self, proc):
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0, out[-2000:])
        return json.loads(re.search(r"stats (\{.*\})", out).group(1))

    def h3load(self, url, ns=None, n=50):
        cmd = ["/usr/bin/h3load", "-n", str(n), "-c", "2", "--json", url]
        if ns:
            cmd = ["ip", "netns", "exec", ns, *cmd]
        return json.loads(run(*cmd, timeout=60).stdout)

    def test_install_run_remove(self):
        info = run("dpkg-deb", "--field", self.deb, "Package", "Depends").stdout
        self.assertIn("Package: xdpq", info)
        self.assertIn("adduser", info)
        run("dpkg", "-i", self.deb)
        for f in FILES:
            self.assertTrue(os.path.isfile(f), f + " not installed")
        with open("/var/lib/dpkg/info/xdpq.conffiles") as f:
            self.assertIn("/etc/xdpq/xdpq.toml", f.read().split())
        user = pwd.getpwnam("xdpq")
        self.assertLess(user.pw_uid, 1000, "xdpq is not a system user")
        self.assertTrue(user.pw_shell.endswith("nologin"))
        st = os.stat("/var/lib/xdpq")
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (user.pw_uid, 0o700))
        for prog in ("xdpqd", "xdpqctl", "h3load"):
            path = "/usr/bin/h3load" if prog == "h3load" else "/usr/sbin/" + prog
            self.assertRegex(run(path, "--version").stdout, rf"^{prog} \d+\.\d+\.\d+")
        # The installed configuration documents every key and is valid.
        with open("/etc/xdpq/xdpq.toml") as f:
            conf = f.read()
        self.assertIn('secrets = "/var/lib/xdpq/secrets"', conf)
        # No benchmark routes on a deployed server.
        self.assertRegex(conf, r"(?m)^test_routes = false ")
        r = run("/usr/sbin/xdpqd", "--config", "/etc/xdpq/xdpq.toml", "--check-config")
        self.assertIn("configuration OK", r.stdout)
        self.assertFalse(os.path.exists("/var/lib/xdpq/secrets"))
        caps = self.unit_caps()
        # RuntimeDirectory= of the unit, as systemd would create it.
        os.makedirs("/run/xdpq", exist_ok=True)
        os.chown("/run/xdpq", user.pw_uid, user.pw_gid)
        os.chmod("/run/xdpq", 0o700)

        # Socket dataplane on loopback; xdpqctl finds the socket in /run/xdpq.
        port = free_udp_port()
        proc, _ = self.as_service_user(caps, ["--listen", f"127.0.0.1:{port}"])
        status = run("/usr/sbin/xdpqctl", "status").stdout
        self.assertIn(f"127.0.0.1:{port}", status)
        res = self.h3load(f"https://127.0.0.1:{port}/")
        self.assertEqual(res["requests"]["succeeded"], 50, res)
        stats = self.stop(proc)
        self.assertEqual(stats["responses_2xx"], 50)
        st = os.stat("/var/lib/xdpq/secrets")
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (user.pw_uid, 0o600))

        # AF_XDP in a namespace pair, with only the unit's capabilities.
        with Topology() as topo:
            proc, _ = self.as_service_user(
                caps, ["--dataplane", "afxdp", "--interface", topo.srv_if, "--xdp-mode",
                       "native", "--listen", f"{topo.srv_ip}:4433"], ns=topo.srv_ns)
            res = self.h3load(f"https://{topo.srv_ip}:4433/", ns=topo.cli_ns)
            self.assertEqual(res["requests"]["succeeded"], 50, res)
            stats = self.stop(proc)
            self.assertGreater(stats["xdp_redirected"], 0, stats)

        run("dpkg", "--purge", "xdpq")
        self.assertFalse(installed())
        for f in FILES + ["/var/lib/xdpq"]:
            self.assertFalse(os.path.exists(f), f + " left behind")
        self.assertRaises(KeyError, pwd.getpwnam, "xdpq")


if __name__ == "__main__":
    unittest.main()
