#!/usr/bin/python3
"""Zero-downtime binary upgrade: `xdpqctl upgrade` (or SIGUSR2)
starts the binary at xdpqd's path with the configuration as it is now and
hands it the sockets; h3load and h2load running through it finish with no
failed request, the old process finishes its own connections (the new one
hands it their QUIC packets) while the new one takes every new connection,
a configuration change (a new listen address) takes effect, and a new
process that cannot start leaves the old one serving and says why."""

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (H3LOAD, XDPQD, Server, TimedTestCase, free_udp_port, gtlsclient,  # noqa: E402
                     pattern, require_tools)
from netns import Topology  # noqa: E402
from upstream_app import App  # noqa: E402

XDPQCTL = os.path.join(os.path.dirname(XDPQD or "/"), "xdpqctl")


def ctl(sock, *args, timeout=60):
    return subprocess.run([XDPQCTL, "--socket", sock, *args], capture_output=True, text=True,
                          timeout=timeout)


def write_config(path, port, h2c_ports, sock, secrets, extra="", sections=""):
    h2c = ", ".join(f'"127.0.0.1:{p}"' for p in h2c_ports)
    with open(path, "w") as f:
        f.write(f"""[server]
listen = ["127.0.0.1:{port}"]
workers = 2
control_socket = "{sock}"
drain_timeout_ms = 30000
{extra}
[tls]
secrets = "{secrets}"
[tcp]
h2c_listen = [{h2c}]
{sections}
""")


def metrics(port):
    """The metrics page on 127.0.0.1:port, as one scrape reads it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return data


def eventfds(pid):
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[eventfd]"
        except FileNotFoundError:
            pass
    return n


def running(pid):
    """Neither gone nor a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone (ESRCH: while being read)
        return False


def all_stats(log):
    return [json.loads(m) for m in re.findall(r"stats (\{.*\})", log)]


def meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/meminfo")


class Upgrade(TimedTestCase):
    def setUp(self):
        require_tools()
        for tool in (H3LOAD, XDPQCTL):
            if not os.access(tool, os.X_OK):
                raise AssertionError(f"{tool} is missing (build the tree)")
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="xdpq-upgrade-")
        self.sock = os.path.join(self.tmp, "ctl.sock")
        self.config = os.path.join(self.tmp, "xdpq.toml")
        self.port = free_udp_port()
        self.h2c = [free_udp_port(), free_udp_port()]
        self.pids = []
        self.procs = []

    def spawn(self, cmd, **kw):
        """A client process, killed at the end of the test whatever happens."""
        p = subprocess.Popen(cmd, **kw)
        self.procs.append(p)
        return p

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        super().tearDown()

    def start(self, sections=""):
        write_config(self.config, self.port, self.h2c[:1], self.sock,
                     os.path.join(self.tmp, "secrets"), sections=sections)
        # No --listen on the command line: the file's addresses rule, and
        # the new process reads them afresh.
        return Server("--config", self.config, host="127.0.0.1", port=self.port, workers=0,
                      listen=[])

    @staticmethod
    def stop_new(pid, srv):
        """Stops the new process (the old one has exited) and waits for its
        stats line, which it writes as it exits into the same log."""
        os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            if len(all_stats(srv.output())) == 2:
                break
            time.sleep(0.05)

    def new_pid(self, out):
        m = re.search(r"upgraded: pid (\d+)", out)
        self.assertIsNotNone(m, out)
        pid = int(m.group(1))
        self.pids.append(pid)
        return pid

    def test_a_second_upgrade_falls_back_to_the_first_new_process(self):
        # gen0 -> gen1 (gen0 exits) -> gen2, which dies: gen1, itself a
        # new process once, takes its sockets back.
        with self.start() as srv:
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            gen1 = self.new_pid(up.stdout)
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
            # A keep-alive connection keeps gen1 draining after the next one.
            keep = self.keep_alive()
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr + srv.output()[-3000:])
            gen2 = self.new_pid(up.stdout)
            os.kill(gen2, signal.SIGKILL)
            status = self.status_once_back(gen1, srv)
            self.assertEqual(status["state"], "running")
            fetch = gtlsclient(srv, ["/bytes/4323"])
            h1 = subprocess.run(["h2load", "-n", "100", "-c", "2",
                                 f"http://127.0.0.1:{self.h2c[0]}/bytes/10"],
                                capture_output=True, text=True, timeout=60).stdout
            keep.close()
            log = srv.output()
        self.assertEqual(fetch.file("4323"), pattern(4323), log[-3000:])
        self.assertIn("100 succeeded, 0 failed", h1)
        self.assertIn(f"the new process (pid {gen2}) exited after taking over", log)

    def test_upgrade_takes_the_new_proxy_routes(self):
        # The new process reads the file afresh: its routes go to the new
        # upstream; the old process finished what it had.
        def route(url):
            return f'[[proxy]]\nprefix = "/app"\nupstreams = ["{url}"]\n'

        def via_h2c(path):
            with socket.create_connection(("127.0.0.1", self.h2c[0])) as c:
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                          .encode())
                data = b""
                while chunk := c.recv(65536):
                    data += chunk
            return data.split(b"\r\n\r\n", 1)[1]

        with App("a") as a, App("b") as b:
            with self.start(sections=route(a.url)) as srv:
                self.assertEqual(via_h2c("/app/x"), b"a GET /app/x")
                write_config(self.config, self.port, self.h2c[:1], self.sock,
                             os.path.join(self.tmp, "secrets"), sections=route(b.url))
                up = ctl(self.sock, "upgrade")
                self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
                self.new_pid(up.stdout)
                self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
                self.assertEqual(via_h2c("/app/y"), b"b GET /app/y")
                h3 = gtlsclient(srv, ["/app/z"])
                self.assertEqual(h3.file("z"), b"b GET /app/z", srv.output()[-3000:])

    def h1_get(self, port, path="/healthz"):
        """An HTTP/1.1 request on a cleartext listener: its response's bytes."""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := c.recv(65536):
                data += chunk
        return data

    def start_on_both(self):
        write_config(self.config, self.port, self.h2c, self.sock,
                     os.path.join(self.tmp, "secrets"))
        return Server("--config", self.config, host="127.0.0.1", port=self.port, workers=0,
                      listen=[])

    def drop_the_second_listener(self):
        write_config(self.config, self.port, self.h2c[:1], self.sock,
                     os.path.join(self.tmp, "secrets"))

    def test_a_listener_the_new_configuration_drops_refuses_clients(self):
        # Regression (review): the old process stopped accepting on every
        # listener at the hand-over but kept them open while it drained, so
        # a client of an address the new configuration dropped waited in a
        # backlog nobody accepted from (until the drain's end), and one that
        # moved from TLS to cleartext would split between the processes.
        with self.start_on_both() as srv:
            self.assertIn(b" 200 ", self.h1_get(self.h2c[1]))
            keep = self.keep_alive()  # the old process drains while it is open
            self.drop_the_second_listener()
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            pid = self.new_pid(up.stdout)
            refused = False
            deadline = time.monotonic() + 3
            while not refused and time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", self.h2c[1]), timeout=1) as c:
                        c.settimeout(1)
                        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                        c.recv(100)
                except ConnectionRefusedError:
                    refused = True
                except (socket.timeout, ConnectionResetError):
                    pass
                if not refused:
                    time.sleep(0.1)
            self.assertTrue(refused, "a client of the dropped address was not refused")
            self.assertIsNone(srv.proc.poll(), "the old process must still be draining")
            self.assertIn(b" 200 ", self.h1_get(self.h2c[0]))  # the new process's
            keep.close()
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
            self.stop_new(pid, srv)

    def test_a_dropped_listener_is_bound_again_when_the_old_process_takes_back(self):
        with self.start_on_both() as srv:
            self.drop_the_second_listener()
            keep = self.upgrade_then_kill_the_new_process(srv)
            for port in self.h2c:
                self.assertIn(b" 200 ", self.h1_get(port), srv.output()[-3000:])
            keep.close()
        self.assertIn("taking the sockets back", srv.output())

    def test_the_new_process_starts_with_the_signals_it_handles_blocked(self):
        # Regression (review): the new process was started with every
        # signal unblocked, so a USR1 (logrotate's) or HUP in the moments
        # before it blocked them itself killed it (their default action)
        # and failed the upgrade. A wrapper in place of the binary records
        # the mask it is started with, then runs the real one.
        binary = os.path.join(self.tmp, "xdpqd")
        real = os.path.join(self.tmp, "xdpqd.real")
        shutil.copy2(XDPQD, binary)
        shutil.copy2(XDPQD, real)
        mask_file = os.path.join(self.tmp, "mask")
        srv = self.start()
        srv.args[0] = binary
        with srv:
            os.unlink(binary)  # the running one is "(deleted)": its path is run
            with open(binary, "w") as f:  # (dash would clear the mask first)
                f.write("#!/usr/bin/python3 -S\nimport os, sys\n"
                        f"open('{mask_file}', 'w').write(open('/proc/self/status').read())\n"
                        f"os.execv('{real}', ['{real}'] + sys.argv[1:])\n")
            os.chmod(binary, 0o755)
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            pid = self.new_pid(up.stdout)
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
            self.stop_new(pid, srv)
        with open(mask_file) as f:
            mask = int(re.search(r"^SigBlk:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2,
                    signal.SIGTERM):
            self.assertTrue(mask & (1 << (sig - 1)), f"{sig.name} not blocked: {mask:#x}")

    def test_a_listener_that_cannot_be_bound_again_does_not_stop_later_upgrades(self):
        # Regression (review): a dropped listener the old process could not
        # bind again at the take-back (someone took the port) stayed in its
        # list with no descriptor, and every later upgrade failed handing
        # it on (sendmsg: EBADF).
        squatter = socket.socket()
        self.addCleanup(squatter.close)
        with self.start_on_both() as srv:
            self.drop_the_second_listener()

            def take_the_port():
                squatter.bind(("127.0.0.1", self.h2c[1]))
                squatter.listen()
            keep = self.upgrade_then_kill_the_new_process(srv, before_kill=take_the_port)
            self.assertIn(b" 200 ", self.h1_get(self.h2c[0]))
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr + srv.output()[-3000:])
            pid = self.new_pid(up.stdout)
            keep.close()
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
            self.stop_new(pid, srv)
        self.assertIn("taken back from a new process that had dropped it", srv.output())

    def test_upgrade_takes_a_new_metrics_address_and_control_socket(self):
        # Regression: the new process adopted the old process's metrics and
        # control listeners whatever its configuration said, so a reload
        # that moved metrics off a public address left them there.
        def tcp_port():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]

        p1, p2 = tcp_port(), tcp_port()
        sock2 = os.path.join(self.tmp, "ctl2.sock")
        secrets = os.path.join(self.tmp, "secrets")
        write_config(self.config, self.port, self.h2c[:1], self.sock, secrets,
                     extra=f'metrics = "127.0.0.1:{p1}"')
        with Server("--config", self.config, host="127.0.0.1", port=self.port, workers=0,
                    listen=[]) as srv:
            self.assertIn(b"xdpq_handshakes_started_total", metrics(p1))
            write_config(self.config, self.port, self.h2c[:1], sock2, secrets,
                         extra=f'metrics = "127.0.0.1:{p2}"')
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            new = self.new_pid(up.stdout)
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
            self.assertIn(b"xdpq_handshakes_started_total", metrics(p2))
            with self.assertRaises(ConnectionRefusedError):
                metrics(p1)
            st = ctl(sock2, "--json", "status")
            self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
            self.assertEqual(json.loads(st.stdout)["pid"], new)
            self.assertFalse(os.path.exists(self.sock), "the old control socket was left")

    def test_only_the_new_process_answers_a_metrics_port_it_took_over(self):
        # Regression: the old process stopped listening on its admin sockets
        # only when the new one took over its control socket. With a new
        # control socket path and the same metrics address, both processes
        # accepted on the one metrics socket for the whole drain, and
        # scrapes alternated between them.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            mport = s.getsockname()[1]

        def scrape():
            data = metrics(mport)
            m = re.search(rb"\nxdpq_process_id (\d+)\n", data)
            self.assertIsNotNone(m, data[-500:])
            return int(m.group(1))

        sock2 = os.path.join(self.tmp, "ctl-moved.sock")
        secrets = os.path.join(self.tmp, "secrets")
        write_config(self.config, self.port, self.h2c[:1], self.sock, secrets,
                     extra=f'metrics = "127.0.0.1:{mport}"')
        with Server("--config", self.config, host="127.0.0.1", port=self.port, workers=0,
                    listen=[]) as srv:
            keep = self.keep_alive()  # the old process drains meanwhile
            try:
                self.assertEqual(scrape(), srv.proc.pid)
                write_config(self.config, self.port, self.h2c[:1], sock2, secrets,
                             extra=f'metrics = "127.0.0.1:{mport}"')
                up = ctl(self.sock, "upgrade")
                self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
                new = self.new_pid(up.stdout)
                pids = {scrape() for _ in range(20)}
                self.assertIsNone(srv.proc.poll(), "the old process stopped draining")
                self.assertEqual(pids, {new})
            finally:
                keep.close()
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])

    def keep_alive(self):
        """An idle HTTP/1.1 keep-alive connection to the serving process: it
        keeps that process draining after it hands over."""
        keep = socket.create_connection(("127.0.0.1", self.h2c[0]))
        keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"200", keep.recv(4096))
        return keep

    def upgrade_then_kill_the_new_process(self, srv, before_kill=None):
        """Upgrades, kills the new process (a binary that crashes under
        traffic) and waits until the old one answers again. Returns the idle
        keep-alive connection that keeps the old process draining."""
        old = srv.proc.pid
        keep = self.keep_alive()
        up = ctl(self.sock, "upgrade")
        self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
        pid = self.new_pid(up.stdout)
        if before_kill:
            before_kill()
        os.kill(pid, signal.SIGKILL)
        status = self.status_once_back(old, srv)
        self.assertEqual(status["state"], "running")
        return keep

    def status_once_back(self, old, srv):
        """The status of the old process once it answers the control
        socket again (it took it back from the killed new one)."""
        for _ in range(100):
            time.sleep(0.1)
            r = ctl(self.sock, "--json", "status", timeout=5)
            if r.returncode == 0 and json.loads(r.stdout)["pid"] == old:
                return json.loads(r.stdout)
        self.fail("the old process did not take over again:\n" + srv.output()[-3000:])

    def assert_all_served(self, h3_out, h2_out, after, log):
        """h3load and h2load through the upgrade: every request succeeded;
        h2load after it: on the old and on the new listener."""
        for name, out in (("h3load", h3_out), ("h2load", h2_out)):
            m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                          r"(\d+) failed, (\d+) errored", out)
            self.assertIsNotNone(m, out)
            total, _, _, ok, failed, errored = map(int, m.groups())
            self.assertEqual((failed, errored), (0, 0), f"{name}:\n{out}\n{log[-3000:]}")
            self.assertEqual(ok, total, f"{name}:\n{out}")
        for p, out in zip(self.h2c, after):
            self.assertIn("200 succeeded, 0 failed", out, f"port {p}:\n{out}")

    def test_upgrade_under_load_with_a_config_change(self):
        self.upgrade_under_load()

    def test_upgrade_under_load_with_encrypted_quic_lb_ids(self):
        # The generation bit is inside the encrypted CID: the new process
        # finds the old process's connections by decrypting.
        self.upgrade_under_load('[quic_lb]\nserver_id = "0a0b"\nmode = "encrypted"\n')

    def upgrade_under_load(self, sections=""):
        with self.start(sections) as srv:
            # Both loads last seconds on any machine and build (a fixed
            # count ended before the upgrade on a fast one): h3load for a
            # duration (it reconnects after the GOAWAY), h2load paced (8
            # clients x 1000/s, ~5 s: it ends before the old process's
            # GOAWAY, which it would not come back from).
            h3 = self.spawn([H3LOAD, "-D", "5", "-c", "8", "-m", "4",
                             f"https://127.0.0.1:{self.port}/bytes/1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            h2 = self.spawn(["h2load", "-n", "40000", "-c", "8", "-m", "4", "--rps", "1000",
                             f"http://127.0.0.1:{self.h2c[0]}/bytes/1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(1.5)
            self.assertIsNone(h3.poll(), "h3load finished before the upgrade: the test proves "
                              "nothing")
            self.assertIsNone(h2.poll(), "h2load finished before the upgrade")
            wake_fds = eventfds(srv.proc.pid)
            # The change: a second cleartext listener (a new listen address
            # took a restart before).
            write_config(self.config, self.port, self.h2c, self.sock,
                         os.path.join(self.tmp, "secrets"), sections=sections)
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr + srv.output()[-3000:])
            pid = self.new_pid(up.stdout)
            # Two generations at a time: a third waits for the first to go.
            again = ctl(self.sock, "upgrade")
            h3_out = h3.communicate(timeout=120)[0]
            h2_out = h2.communicate(timeout=120)[0]
            # New connections after the upgrade: the new process, on the
            # old and on the new address.
            after = [subprocess.run(["h2load", "-n", "200", "-c", "2",
                                     f"http://127.0.0.1:{p}/bytes/10"],
                                    capture_output=True, text=True, timeout=60).stdout
                     for p in self.h2c]
            fetch = gtlsclient(srv, ["/bytes/1234"])
            status = ctl(self.sock, "--json", "status")
            stats_new = json.loads(ctl(self.sock, "--json", "stats").stdout)["total"]
            # The old process exits by itself once its connections are done.
            self.assertEqual(srv.proc.wait(timeout=60), 0, srv.output()[-3000:])
            # ... and the new one lets go of its workers' eventfds and rings.
            for _ in range(100):
                if eventfds(pid) == wake_fds:
                    break
                time.sleep(0.05)
            new_wake_fds = eventfds(pid)
            self.stop_new(pid, srv)
            log = srv.output()
        self.assert_all_served(h3_out, h2_out, after, log)
        self.assertEqual(new_wake_fds, wake_fds, "the new process kept the old one's eventfds")
        self.assertEqual(again.returncode, 1, again.stdout)
        self.assertIn("previous process is still finishing", again.stdout)
        self.assertEqual(fetch.file("1234"), pattern(1234))
        self.assertEqual(json.loads(status.stdout)["pid"], pid)
        old = all_stats(log)[0]
        # The old process served requests and, after the upgrade, its
        # connections' QUIC packets reached it through the new one.
        self.assertGreater(old["requests"], 0, old)
        self.assertGreater(old["tcp_requests"], 0, old)
        self.assertGreater(old["handoff_received"], 0, old)
        self.assertEqual(old["stateless_resets_sent"], 0, old)
        # The new process took every new connection.
        self.assertGreater(stats_new["handshakes_completed"], 0, stats_new)
        self.assertGreater(stats_new["requests"], 0, stats_new)
        self.assertGreaterEqual(stats_new["tcp_accepted"], 4, stats_new)
        self.assertGreater(stats_new["datagrams_handed_off"], 0, stats_new)
        self.assertIn("took over", log)
        if sections:
            self.assertIn("QUIC-LB: config 0, server ID 0a0b", log)

    def test_old_process_takes_the_sockets_back_when_the_new_one_dies(self):
        with self.start() as srv:
            keep = self.upgrade_then_kill_the_new_process(srv)
            fetch = gtlsclient(srv, ["/bytes/4321"])
            h1 = subprocess.run(["h2load", "-n", "100", "-c", "2",
                                 f"http://127.0.0.1:{self.h2c[0]}/bytes/10"],
                                capture_output=True, text=True, timeout=60).stdout
            time.sleep(1)
            self.assertIsNone(srv.proc.poll(), "the old process stopped:\n" + srv.output()[-2000:])
            keep.close()
        self.assertTrue(fetch.has_file("4321"), fetch.output[-2000:] + srv.output()[-3000:])
        self.assertEqual(fetch.file("4321"), pattern(4321))
        self.assertIn("100 succeeded, 0 failed", h1)
        self.assertIn("taking the sockets back", srv.output())

    def test_a_control_socket_path_the_new_process_removed_is_bound_again(self):
        # Regression: a new process that exits through its destructors
        # after it became ready (a worker failed: status 1) removes the
        # control socket's path, which it shares with the old process. The
        # old one took the sockets back but listened on a socket nobody
        # could reach: xdpqctl, and systemctl reload with it, got ENOENT.
        # (The unlink here stands for the new process's own.)
        with self.start() as srv:
            keep = self.upgrade_then_kill_the_new_process(srv, lambda: os.unlink(self.sock))
            self.assertIn("bound afresh", srv.output())
            keep.close()

    def test_stopping_the_service_after_an_upgrade_stops_the_old_process_too(self):
        # systemd stops a service by sending SIGTERM to every process of
        # it: the new one drains and exits 0, and the old one, still
        # draining its own connections, must not take that for a crash
        # and serve on (systemd would wait for it, then kill it).
        with self.start() as srv:
            keep = self.keep_alive()  # keeps the old process draining
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            new = self.new_pid(up.stdout)
            os.kill(srv.proc.pid, signal.SIGTERM)
            os.kill(new, signal.SIGTERM)
            for _ in range(200):
                if not running(new):
                    break
                time.sleep(0.05)
            self.assertFalse(running(new), "the new process did not stop")
            time.sleep(1.5)  # (the old process reaps it and decides)
            self.assertIsNone(srv.proc.poll(), "the old process left its connection unfinished")
            keep.close()
            self.assertEqual(srv.proc.wait(timeout=15), 0, srv.output()[-3000:])
            log = srv.output()
        self.assertNotIn("taking the sockets back", log)
        self.assertIn(f"the new process (pid {new}) stopped", log)

    def test_systemd_follows_the_main_pid(self):
        """What systemd sees (Type=notify, a watchdog; what NotifyAccess=main would take),
        from a notify socket of our own: the running xdpqd says READY and
        pings; the upgrade names the new process MAINPID, from the old
        main process; from then on only the new one pings."""
        path = os.path.join(self.tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.settimeout(0.2)
        got = []  # (sender pid, message, time)

        def collect(until):
            while time.time() < until:
                try:
                    msg, anc, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(12))
                except socket.timeout:
                    continue
                pid = next(struct.unpack("iII", d)[0] for lvl, typ, d in anc
                           if lvl == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS)
                got.append((pid, msg.decode(), time.time()))

        write_config(self.config, self.port, self.h2c[:1], self.sock,
                     os.path.join(self.tmp, "secrets"))
        with Server("--config", self.config, host="127.0.0.1", port=self.port, workers=0,
                    listen=[], extra_env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}) as srv:
            old = srv.proc.pid
            collect(time.time() + 1)
            # An idle keep-alive connection keeps the old process draining.
            keep = self.keep_alive()
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            new = self.new_pid(up.stdout)
            t_up = time.time()
            collect(time.time() + 1.5)
            self.assertIsNone(srv.proc.poll(), "the old process should still be draining")
            keep.close()
            self.assertEqual(srv.proc.wait(timeout=30), 0, srv.output()[-3000:])
            os.kill(new, signal.SIGTERM)
            sock.close()
        from_old = [m for p, m, _ in got if p == old]
        self.assertIn("READY=1", from_old)
        self.assertIn("WATCHDOG=1", from_old)
        self.assertIn(f"MAINPID={new}", from_old)
        # After MAINPID: no ping and no STOPPING from the old process (systemd
        # would refuse the one and stop the service for the other).
        handed = next(t for p, m, t in got if m == f"MAINPID={new}")
        self.assertGreater(handed, t_up - 30)
        late_old = [m for p, m, t in got if p == old and t > handed]
        self.assertNotIn("WATCHDOG=1", late_old, got)
        self.assertNotIn("STOPPING=1", late_old, got)
        self.assertIn("WATCHDOG=1", [m for p, m, t in got if p == new and t > handed], got)

    # --- AF_XDP: the queues change hands, the XDP link changes program ---

    def afxdp_config(self, topo, h2c_ports, extra="", queues="0", workers=0):
        h2c = ", ".join(f'"{topo.srv_ip}:{p}"' for p in h2c_ports)
        with open(self.config, "w") as f:
            f.write(f"""[server]
listen = ["{topo.srv_ip}:4433"]
control_socket = "{self.sock}"
{f"workers = {workers}" if workers else ""}
# h2load does not come back after GOAWAY (sent at half of this): it
# must finish before, even under the sanitizers.
drain_timeout_ms = 60000
[dataplane]
mode = "afxdp"
interface = "{topo.srv_if}"
queues = "{queues}"
xdp_mode = "native"
[tls]
secrets = "{os.path.join(self.tmp, "secrets")}"
[tcp]
h2c_listen = [{h2c}]
{extra}
""")

    def afxdp_server(self, topo, queues="0", workers=0):
        self.afxdp_config(topo, self.h2c[:1], queues=queues, workers=workers)
        return Server("--config", self.config, host=topo.srv_ip, port=4433, workers=0,
                      listen=[], netns=topo.srv_ns)

    @staticmethod
    def prog_id(topo):
        out = subprocess.run(["ip", "-n", topo.srv_ns, "-j", "link", "show", "dev", topo.srv_if],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)[0]["xdp"]["prog"]["id"]

    def redirected(self):
        stats = json.loads(ctl(self.sock, "--json", "stats").stdout)["total"]
        return stats["xdp_redirected"]

    def test_afxdp_upgrade_under_load_with_a_config_change(self):
        # Two queues, a worker each, on both sides: every queue changes
        # hands, and each new worker hands datagrams to either old one.
        with Topology(queues=2) as topo, self.afxdp_server(topo, "0,1") as srv:
            prog_before = self.prog_id(topo)
            cli = ["ip", "netns", "exec", topo.cli_ns]
            h3 = self.spawn(cli + [H3LOAD, "-D", "6", "-c", "8", "-m", "4",
                                   f"https://{topo.srv_ip}:4433/bytes/1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # Paced (8 clients x 1250/s, ~6 s) so that it runs through the
            # upgrade and ends before the GOAWAY, on any build: h2load does
            # not come back after one.
            h2 = self.spawn(cli + ["h2load", "-n", "60000", "-c", "8", "-m", "4", "--rps", "1250",
                                   f"http://{topo.srv_ip}:{self.h2c[0]}/bytes/1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(1.5)
            self.assertIsNone(h3.poll(), "h3load finished before the upgrade")
            self.assertIsNone(h2.poll(), "h2load finished before the upgrade")
            self.afxdp_config(topo, self.h2c, queues="0,1")  # a second cleartext listener
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr + srv.output()[-3000:])
            pid = self.new_pid(up.stdout)
            prog_after = self.prog_id(topo)
            h3_out = h3.communicate(timeout=120)[0]
            h2_out = h2.communicate(timeout=120)[0]
            after = [subprocess.run(cli + ["h2load", "-n", "200", "-c", "2",
                                           f"http://{topo.srv_ip}:{p}/bytes/10"],
                                    capture_output=True, text=True, timeout=60).stdout
                     for p in self.h2c]
            fetch = gtlsclient(srv, ["/bytes/1234"], netns=topo.cli_ns)
            # From the host itself (through the kernel): the new process
            # reads the reserved sockets now.
            local = gtlsclient(srv, ["/bytes/1235"], netns=topo.srv_ns, timeout=20)
            stats_new = json.loads(ctl(self.sock, "--json", "stats").stdout)["total"]
            self.assertEqual(srv.proc.wait(timeout=60), 0, srv.output()[-3000:])
            self.stop_new(pid, srv)
            log = srv.output()
        self.assert_all_served(h3_out, h2_out, after, log)
        self.assertEqual(fetch.file("1234"), pattern(1234))
        self.assertEqual(local.file("1235"), pattern(1235), local.output[-2000:])
        self.assertGreater(stats_new["afxdp_tx_kernel_no_link"], 0, stats_new)
        # The new process's program is on the link and its sockets took
        # the queue; the old one finished its connections, whose packets
        # it got through the new one.
        self.assertNotEqual(prog_before, prog_after)
        self.assertIn("took over dataplane afxdp", log)
        self.assertIn("AF_XDP sockets closed", log)
        self.assertGreater(stats_new["xdp_redirected"], 0, stats_new)
        self.assertGreater(stats_new["handshakes_completed"], 0, stats_new)
        self.assertGreater(stats_new["requests"], 0, stats_new)
        old = all_stats(log)[0]
        self.assertGreater(old["requests"], 0, old)
        self.assertGreater(old["handoff_received"], 0, old)
        self.assertEqual(old["stateless_resets_sent"], 0, old)

    def test_afxdp_upgrade_with_no_hugepage_to_spare(self):
        # Regression: the UMEM is private memory the kernel pins for the
        # AF_XDP socket, and fork() copies pinned pages into the child at
        # once. With the UMEM on huge pages and none spare, fork() failed
        # (ENOMEM) and so did every upgrade. The UMEM is not inherited
        # now (MADV_DONTFORK); the new process maps its own, on ordinary
        # pages if no huge one is left.
        with open("/proc/sys/vm/nr_hugepages") as f:
            saved = f.read().strip()
        try:
            if os.path.exists("/proc/sys/vm/compact_memory"):
                with open("/proc/sys/vm/compact_memory", "w") as f:
                    f.write("1")  # room for huge pages on a busy machine
            # Those others use, and one queue's UMEM (8192 frames of 4 KiB).
            in_use = meminfo("HugePages_Total") - meminfo("HugePages_Free")
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(in_use + 16))
            if meminfo("HugePages_Free") != 16:
                self.skipTest("the kernel found no 16 free huge pages (memory too fragmented)")
            with Topology() as topo, self.afxdp_server(topo) as srv:
                self.assertIn("hugepages", srv.output())
                self.assertEqual(meminfo("HugePages_Free"), 0)
                self.afxdp_config(topo, self.h2c[:1])
                up = ctl(self.sock, "upgrade")
                self.assertEqual(up.returncode, 0, up.stdout + up.stderr + srv.output()[-3000:])
                pid = self.new_pid(up.stdout)
                r = gtlsclient(srv, ["/bytes/4323"], netns=topo.cli_ns)
                self.assertEqual(r.file("4323"), pattern(4323), srv.output()[-3000:])
                self.assertEqual(srv.proc.wait(timeout=60), 0, srv.output()[-3000:])
                self.stop_new(pid, srv)
        finally:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(saved)

    def test_afxdp_failed_upgrade_goes_back_to_af_xdp(self):
        # One worker on two queues (their sockets share a UMEM): going back
        # binds both again.
        conf = dict(queues="0,1", workers=1)
        with Topology(queues=2) as topo, self.afxdp_server(topo, **conf) as srv:
            self.assertIn("queues 0,1 shared UMEM", srv.output())
            pid = srv.proc.pid
            prog = self.prog_id(topo)
            # The new process fails after the old one let go of the queues:
            # its cleartext listener cannot bind (not an address of ours).
            self.afxdp_config(topo, self.h2c[:1], extra='', **conf)
            with open(self.config) as f:
                text = f.read().replace("h2c_listen = [", 'h2c_listen = ["10.99.99.99:80", ')
            with open(self.config, "w") as f:
                f.write(text)
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 1, up.stdout + up.stderr)
            self.assertIn("upgrade failed, still serving", up.stdout)
            self.assertIn("10.99.99.99:80", up.stdout, srv.output())
            self.assertIn("back on AF_XDP", srv.output())
            self.assertEqual(self.prog_id(topo), prog)
            before = self.redirected()
            r = gtlsclient(srv, ["/bytes/4321"], netns=topo.cli_ns)
            self.assertEqual(r.file("4321"), pattern(4321), srv.output()[-3000:])
            self.assertGreater(self.redirected(), before)
            # Fixed: the upgrade goes through; then the new process dies and
            # the old one takes the queues back.
            self.afxdp_config(topo, self.h2c[:1], **conf)
            keep = self.spawn(["ip", "netns", "exec", topo.cli_ns, "python3", "-c",
                                     "import socket,sys,time; s=socket.create_connection("
                                     f"('{topo.srv_ip}', {self.h2c[0]})); "
                                     "s.sendall(b'GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n');"
                                     " s.recv(4096); sys.stdout.write('up\\n'); "
                                     "sys.stdout.flush(); time.sleep(30)"],
                                    stdout=subprocess.PIPE, text=True)
            self.assertEqual(keep.stdout.readline(), "up\n")
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr + srv.output()[-3000:])
            new = self.new_pid(up.stdout)
            self.assertNotEqual(self.prog_id(topo), prog)
            os.kill(new, signal.SIGKILL)
            self.status_once_back(pid, srv)
            self.assertEqual(self.prog_id(topo), prog, srv.output()[-3000:])
            before = self.redirected()
            r = gtlsclient(srv, ["/bytes/4322"], netns=topo.cli_ns)
            self.assertEqual(r.file("4322"), pattern(4322), srv.output()[-3000:])
            self.assertGreater(self.redirected(), before)
            keep.kill()
            keep.wait()
            self.assertIsNone(srv.proc.poll(), srv.output()[-2000:])

    def test_a_new_process_that_cannot_start_leaves_the_old_one_serving(self):
        with self.start() as srv:
            pid = srv.proc.pid
            write_config(self.config, self.port, self.h2c[:1], self.sock,
                         os.path.join(self.tmp, "secrets"), extra="wokers = 3")
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 1, up.stdout + up.stderr)
            self.assertIn("upgrade failed, still serving", up.stdout)
            self.assertIn(f"{self.config}:6: server.wokers: unknown key", up.stdout)
            status = json.loads(ctl(self.sock, "--json", "status").stdout)
            self.assertEqual(status["pid"], pid)
            self.assertEqual(status["state"], "running")
            r = gtlsclient(srv, ["/bytes/777"])
            self.assertEqual(r.file("777"), pattern(777), srv.output()[-2000:])
            # A change of the connection-ID format (QUIC-LB on) is refused:
            # the new process could not route the running connections.
            write_config(self.config, self.port, self.h2c[:1], self.sock,
                         os.path.join(self.tmp, "secrets"),
                         sections='[quic_lb]\nserver_id = "01"\n')
            up = ctl(self.sock, "upgrade")
            self.assertEqual(up.returncode, 1, up.stdout + up.stderr)
            self.assertIn("connection-ID format would change", up.stdout)
            self.assertEqual(json.loads(ctl(self.sock, "--json", "status").stdout)["pid"], pid)
            # Fixed, SIGUSR2 does the same as xdpqctl upgrade.
            write_config(self.config, self.port, self.h2c[:1], self.sock,
                         os.path.join(self.tmp, "secrets"))
            os.kill(pid, signal.SIGUSR2)
            self.assertEqual(srv.proc.wait(timeout=60), 0, srv.output()[-3000:])
            m = re.search(r"upgrade: pid (\d+) \(generation 1", srv.output())
            self.assertIsNotNone(m, srv.output()[-3000:])
            self.pids.append(int(m.group(1)))
            status = json.loads(ctl(self.sock, "--json", "status").stdout)
            self.assertEqual(status["pid"], int(m.group(1)))
            r = gtlsclient(srv, ["/bytes/778"])
            self.assertEqual(r.file("778"), pattern(778))


if __name__ == "__main__":
    unittest.main()
