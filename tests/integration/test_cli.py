#!/usr/bin/python3
"""xdpqd's command line: --help documents every flag; bad flags, unreadable
files and ports in use exit with status 2 and a reason on stderr."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (XDPQD, Server, TimedTestCase, free_udp_port, gtlsclient,  # noqa
                     require_tools, write_afxdp_config)


def write_secrets(path):
    """A valid, private secrets file (no QUIC-LB key) at path."""
    with open(path, "w") as f:
        f.write(f"reset_key={'11' * 32}\ntoken_key={'22' * 32}\nticket_key={'33' * 64}\n")
    os.chmod(path, 0o600)


def run(*args, timeout=10):
    return subprocess.run([XDPQD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


class CliTest(TimedTestCase):
    @classmethod
    def setUpClass(cls):
        require_tools()

    def test_help_lists_every_flag(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--listen", "--dataplane", "--workers", "--cpus", "--cert", "--key",
                     "--docroot", "--secrets", "--retry", "--log-level", "--check-config",
                     "--version", "--max-header-size", "--idle-timeout"):
            self.assertIn(flag, r.stdout)

    def test_version(self):
        r = run("--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, r"^xdpqd \d+\.\d+\.\d+")

    def assert_usage_error(self, args, needle):
        r = run(*args)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(needle, r.stderr)

    def test_bad_flags_exit_2(self):
        self.assert_usage_error(["--bogus"], "unknown option")
        self.assert_usage_error(["--listen", "1.2.3.4"], "--listen")
        self.assert_usage_error(["--listen", "[::1]:99999"], "--listen")
        self.assert_usage_error(["--retry", "maybe"], "--retry")
        self.assert_usage_error(["--workers", "zero"], "--workers")
        self.assert_usage_error(["--cpus", "3-1"], "--cpus")
        self.assert_usage_error(["--dataplane", "dpdk"], "--dataplane")
        self.assert_usage_error(["--cert", "/etc/hostname"], "--cert and --key")

    def test_unreadable_files_exit_2(self):
        self.assert_usage_error(["--cert", "/nonexistent.pem", "--key", "/nonexistent.key"],
                                "/nonexistent.pem")
        self.assert_usage_error(["--docroot", "/nonexistent-root"], "--docroot")
        bad = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)
        bad.write("not a certificate\n")
        bad.close()
        self.assert_usage_error(["--cert", bad.name, "--key", bad.name], "--cert/--key")
        secrets = tempfile.NamedTemporaryFile("w", delete=False)
        secrets.write("reset_key=zz\n")
        secrets.close()
        os.chmod(secrets.name, 0o600)
        self.assert_usage_error(["--secrets", secrets.name], "--secrets")
        os.chmod(secrets.name, 0o644)
        self.assert_usage_error(["--secrets", secrets.name], "chmod 600")

    def test_port_in_use_exits_2(self):
        port = free_udp_port()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", port))
            self.assert_usage_error(["--listen", f"127.0.0.1:{port}"], "in use")
        # Another xdpqd on the port (SO_REUSEPORT would share silently).
        with Server("--dataplane", "socket") as srv:
            self.assert_usage_error(["--listen", f"127.0.0.1:{srv.port}"], "in use")

    def test_a_control_socket_path_that_is_a_file_is_left_alone(self):
        # A typo pointing control_socket at a file deleted the file.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "secrets")
            with open(path, "w") as f:
                f.write("precious\n")
            self.assert_usage_error(["--listen", f"127.0.0.1:{free_udp_port()}", "--no-tcp",
                                     "--control-socket", path], "is not a socket")
            with open(path) as f:
                self.assertEqual(f.read(), "precious\n")

    def test_check_config(self):
        r = run("--check-config", "--listen", "127.0.0.1:1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configuration OK", r.stdout)

    def test_check_config_refuses_a_certificate_tls_over_tcp_would(self):
        # Regression: --check-config checked the certificate with GnuTLS
        # (QUIC) only. OpenSSL (TLS over TCP) also holds it to its security
        # level, which a 1024-bit RSA key fails: the check said OK and the
        # start (ExecStartPre, then the restart loop) failed.
        d = tempfile.mkdtemp(prefix="xdpq-weak-")
        key, cert = os.path.join(d, "k.pem"), os.path.join(d, "c.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:1024", "-nodes", "-keyout",
                        key, "-out", cert, "-days", "2", "-subj", "/CN=weak"], check=True,
                       capture_output=True)
        r = run("--check-config", "--listen", "127.0.0.1:1", "--cert", cert, "--key", key)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--cert/--key (TCP TLS)", r.stderr)
        # Without TLS over TCP, QUIC alone takes it.
        r = run("--check-config", "--listen", "127.0.0.1:1", "--cert", cert, "--key", key,
                "--no-tcp")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_check_config_looks_at_the_afxdp_interface(self):
        # Regression: --check-config passed an AF_XDP setup whose interface
        # does not exist, and a name no interface can have; the start (or
        # the reload's upgrade) then failed. (The queues: test_afxdp, which
        # makes an interface.)
        d = tempfile.mkdtemp(prefix="xdpq-check-")
        conf = os.path.join(d, "xdpq.toml")
        for interface, needle in (
                ("xq-nosuch0", f"{conf}:5: dataplane.interface: interface xq-nosuch0: "
                               "No such device"),
                ("x" * 16, "longer than an interface name can be")):
            write_afxdp_config(conf, interface, "0")
            r = run("--config", conf, "--check-config")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(needle, r.stderr)

    def test_a_file_setting_that_fails_at_start_names_its_line(self):
        # Regression: errors found after the options were parsed (a file
        # that cannot be read, a docroot that is no directory) named the
        # flag only, not the configuration file's key and line.
        d = tempfile.mkdtemp(prefix="xdpq-check-")
        conf = os.path.join(d, "xdpq.toml")
        missing = os.path.join(d, "missing.pem")

        def refused(text, expected, *flags):
            """conf holding text, run with flags (a check by default): exit 2, naming expected."""
            with open(conf, "w") as f:
                f.write(text)
            r = run("--config", conf, *(flags or ("--check-config",)))
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(expected, r.stderr)

        refused(f'[server]\nlisten = ["127.0.0.1:1"]\n\n[tls]\ncert = "{missing}"\n'
                f'key = "{missing}"\n\n[http]\ndocroot = "{conf}"\n',
                f"{conf}:5: tls.cert: --cert {missing}: cannot read")
        refused(f'[server]\nlisten = ["127.0.0.1:1"]\n\n[http]\ndocroot = "{conf}"\n',
                f"{conf}:5: http.docroot: --docroot: ")
        # A QUIC port in use (found at the start, not by the check).
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
            taken.bind(("127.0.0.1", 0))
            with open(conf, "w") as f:
                f.write(f'[server]\nlisten = ["127.0.0.1:{taken.getsockname()[1]}"]\n')
            r = run("--config", conf, "--no-tcp")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(f"{conf}:2: server.listen: ", r.stderr)
        self.assertIn("in use", r.stderr)
        # Regression (review): the QUIC-LB key's absence, the control
        # socket's path and the metrics address named their flag only.
        secrets = os.path.join(d, "secrets")
        write_secrets(secrets)
        refused(f'[server]\nlisten = ["127.0.0.1:1"]\n\n[tls]\nsecrets = "{secrets}"\n\n'
                f'[quic_lb]\nserver_id = "0a0b"\nmode = "encrypted"\n',
                f"{conf}:9: quic_lb.mode: --quic-lb-mode encrypted: ")
        under_a_file = (f'[server]\nlisten = ["127.0.0.1:1"]\n'
                        f'control_socket = "{secrets}/x.sock"\n')
        refused(under_a_file, f"{conf}:3: server.control_socket: --control-socket ")
        refused(under_a_file, f"{conf}:3: server.control_socket: --control-socket ",
                "--no-tcp", "--listen", f"127.0.0.1:{free_udp_port()}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            refused(f'[server]\nlisten = ["127.0.0.1:{free_udp_port()}"]\n'
                    f'control_socket = "{d}/ctl.sock"\n'
                    f'metrics = "127.0.0.1:{taken.getsockname()[1]}"\n',
                    f"{conf}:4: server.metrics: --metrics ", "--no-tcp")

    def test_check_config_writes_nothing(self):
        # Run as root on a service's config, --check-config must not leave a
        # root-owned secrets file the service user then cannot read.
        d = tempfile.mkdtemp(prefix="xdpq-check-")
        path = os.path.join(d, "secrets")
        r = run("--check-config", "--listen", "127.0.0.1:1", "--secrets", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(path), "--check-config created the secrets file")
        r = run("--check-config", "--listen", "127.0.0.1:1", "--secrets",
                os.path.join(d, "missing-dir", "secrets"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("missing-dir", r.stderr)
        os.rmdir(d)

    def test_a_root_check_takes_the_service_users_secrets_file(self):
        # Regression: after the service (its own user) made its secrets
        # file, an operator's --check-config as root before a reload said
        # "owned by uid N, not by us" and exited 2.
        d = tempfile.mkdtemp(prefix="xdpq-check-")
        path = os.path.join(d, "secrets")
        write_secrets(path)
        os.chown(path, 65534, 65534)
        r = run("--check-config", "--listen", "127.0.0.1:1", "--secrets", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("configuration OK", r.stdout)
        self.assertIn("owned by uid 65534: only a daemon running as that user", r.stderr)
        # Still private, whoever owns it.
        os.chmod(path, 0o640)
        r = run("--check-config", "--listen", "127.0.0.1:1", "--secrets", path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("chmod 600", r.stderr)
        # Serving, root still refuses a file someone else could have written.
        os.chmod(path, 0o600)
        r = run("--listen", f"127.0.0.1:{free_udp_port()}", "--no-tcp", "--secrets", path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("owned by uid 65534", r.stderr)
        os.unlink(path)
        os.rmdir(d)

    def test_a_secrets_file_that_cannot_be_written_whole_is_not_left(self):
        # Regression: a failed write (a full disk) left an empty secrets
        # file behind, and every later start refused it ("missing a key").
        d = tempfile.mkdtemp(prefix="xdpq-full-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", d], check=True)
        try:
            with open(os.path.join(d, "filler"), "wb") as f:
                try:
                    f.write(b"x" * 65536)
                    f.flush()
                except OSError:
                    pass
            path = os.path.join(d, "secrets")
            r = run("--listen", f"127.0.0.1:{free_udp_port()}", "--no-tcp", "--secrets", path)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("write failed", r.stderr)
            self.assertEqual(sorted(os.listdir(d)), ["filler"])
        finally:
            subprocess.run(["umount", d], check=True)
            os.rmdir(d)

    def test_a_secrets_path_that_links_to_nothing_is_refused(self):
        # Regression (review of the change that writes the file whole): a
        # symbolic link to a missing file at the secrets path made the
        # daemon take the name for another process's and try again,
        # without end, until its stack overflowed.
        d = tempfile.mkdtemp(prefix="xdpq-link-")
        path = os.path.join(d, "secrets")
        os.symlink(os.path.join(d, "not-there"), path)
        r = run("--listen", f"127.0.0.1:{free_udp_port()}", "--no-tcp", "--secrets", path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a symbolic link to a file that does not exist", r.stderr)
        self.assertEqual(sorted(os.listdir(d)), ["secrets"])
        os.unlink(path)
        os.rmdir(d)

    def test_bad_config_file_exits_2_naming_file_and_line(self):
        d = tempfile.mkdtemp(prefix="xdpq-config-")
        path = os.path.join(d, "xdpq.toml")
        cases = [
            ("[server]\nlisten = [\"127.0.0.1:1\"]\nlisen = 3\n",
             ":3: server.lisen: unknown key; [server] takes listen, workers, cpus,"),
            ("[quic]\n\nmax_streams = \"many\"\n",
             ":3: quic.max_streams: expected an integer, got a string"),
            ("[server\nlisten = 1\n", ":1:"),
            ("a" + ".a" * 200000 + " = 1\n", ":1: syntax error"),
        ]
        for text, needle in cases:
            with open(path, "w") as f:
                f.write(text)
            for args in (["--check-config", path], ["--config", path]):
                r = run(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(path + needle, r.stderr)
        os.remove(path)
        os.rmdir(d)

    def test_a_config_that_is_no_regular_file_is_refused(self):
        # Regression: the file was read whole before its size was looked
        # at, so --config /dev/zero ate memory until killed, and a FIFO
        # hung --check-config (and a reload) for good.
        d = tempfile.mkdtemp(prefix="xdpq-config-")
        fifo = os.path.join(d, "fifo.toml")
        os.mkfifo(fifo)
        for path in ("/dev/zero", fifo):
            r = run("--check-config", path, timeout=20)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(path + ": not a regular file", r.stderr)
        big = os.path.join(d, "big.toml")
        with open(big, "w") as f:
            f.write("# " + "x" * (1 << 20) + "\n")
        r = run("--check-config", big)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("larger than 1 MiB", r.stderr)
        for p in (fifo, big):
            os.remove(p)
        os.rmdir(d)

    def test_check_config_checks_the_control_socket(self):
        # Regression: --check-config passed a control socket the daemon
        # could not make (a path too long for a Unix socket, a regular file
        # there, a file where its directory should be), and the start failed.
        d = tempfile.mkdtemp(prefix="xdpq-ctlpath-")
        regular = os.path.join(d, "not-a-socket")
        with open(regular, "w") as f:
            f.write("keep me\n")
        cases = [(os.path.join(d, "x" * 120 + ".sock"), "path too long"),
                 (regular, "exists and is not a socket"),
                 (os.path.join(regular, "ctl.sock"), "is not a directory")]
        for path, why in cases:
            r = run("--check-config", "--control-socket", path)
            self.assertEqual(r.returncode, 2, path + ": " + r.stdout + r.stderr)
            self.assertIn(why, r.stderr)
        with open(regular) as f:
            self.assertEqual(f.read(), "keep me\n")
        r = run("--check-config", "--control-socket", os.path.join(d, "new", "ctl.sock"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "new")), "a check made the directory")
        os.remove(regular)
        os.rmdir(d)

    def test_an_access_log_that_is_no_regular_file_is_refused_at_start(self):
        # Regression: --check-config refused an access log that is not a
        # regular file, but a start opened it anyway, blocking: a FIFO
        # without a reader (a log shipper that went away) hung the start
        # before READY, and the same path on a reload hung the control
        # thread (signals, xdpqctl, the watchdog).
        d = tempfile.mkdtemp(prefix="xdpq-fifo-")
        fifo = os.path.join(d, "access.fifo")
        os.mkfifo(fifo)
        try:
            r = run("--listen", f"127.0.0.1:{free_udp_port()}", "--access-log", fifo, timeout=15)
        except subprocess.TimeoutExpired:
            self.fail("the start hung opening a FIFO without a reader")
        finally:
            os.remove(fifo)
            os.rmdir(d)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("access.fifo", r.stderr)

    def test_xdpqctl_fails_when_the_daemon_closes_without_an_answer(self):
        # Regression: xdpqctl printed nothing and exited 0 when the daemon
        # closed the connection without answering (its deadline for the
        # client already past): "systemctl reload" reported a reload that
        # never ran.
        d = tempfile.mkdtemp(prefix="xdpq-ctl-")
        path = os.path.join(d, "ctl.sock")
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(path)
        lst.listen(1)

        def mute():
            c, _ = lst.accept()
            c.recv(4096)
            c.close()
        t = threading.Thread(target=mute, daemon=True)
        t.start()
        ctl = os.path.join(os.path.dirname(XDPQD), "xdpqctl")
        r = subprocess.run([ctl, "--socket", path, "status"], capture_output=True, text=True,
                           timeout=20)
        t.join(10)
        lst.close()
        os.remove(path)
        os.rmdir(d)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("without an answer", r.stderr)

    def test_xdpqctl_gives_up_on_a_daemon_that_takes_no_connection(self):
        # Regression: with the daemon's backlog full (a hung or stopped
        # control thread), xdpqctl's connect() waited for good, and with it
        # "systemctl reload".
        d = tempfile.mkdtemp(prefix="xdpq-ctl-")
        path = os.path.join(d, "ctl.sock")
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(path)
        lst.listen(0)  # never accepted: one waiting connection fills it
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.connect(path)
        ctl = os.path.join(os.path.dirname(XDPQD), "xdpqctl")
        try:
            r = subprocess.run([ctl, "--socket", path, "status"], capture_output=True,
                               text=True, timeout=60)
        except subprocess.TimeoutExpired:
            r = None
        filler.close()
        lst.close()
        os.remove(path)
        os.rmdir(d)
        self.assertIsNotNone(r, "xdpqctl still waiting after 60 s")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("did not take the connection", r.stderr)

    def test_self_signed_fingerprint_logged_and_sigint_clean(self):
        with Server("--dataplane", "socket") as srv:
            self.assertRegex(srv.output(), r"self-signed certificate, SHA-256 fingerprint "
                                           r"([0-9A-F]{2}:){31}[0-9A-F]{2}")
            r = gtlsclient(srv, ["/healthz"])
            self.assertEqual(r.statuses, {0: 200})
            srv.stop(signal.SIGINT)
            self.assertEqual(srv.proc.returncode, 0)

    def test_echo_mode_echoes_datagrams(self):
        with Server("--echo", "--no-tcp") as srv:
            self.assertIn("UDP echo mode", srv.output())
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(3)
                for payload in (b"x" * 64, os.urandom(1200)):
                    s.sendto(payload, (srv.host, srv.port))
                    self.assertEqual(s.recv(2048), payload)

    def test_echo_mode_leaves_no_split_datagram_waiting(self):
        # Regression (review): one read of the socket (32 messages) can
        # hold 2,048 datagrams when each message is a GRO batch of 64; a
        # wakeup handed out 1,024 and the rest waited, the socket's queue
        # empty, until some later datagram woke the worker: a client
        # uploading in large batches stalled on its retransmission timer.
        segment, count, batches = 1000, 64, 32
        # The server asks for a 4 MiB receive buffer (SO_RCVBUF, capped by
        # rmem_max): all 32 batches must fit in it while it is stopped.
        with open("/proc/sys/net/core/rmem_max") as f:
            rmem_max = int(f.read())
        if rmem_max < 4 << 20:
            with open("/proc/sys/net/core/rmem_max", "w") as f:
                f.write(str(4 << 20))
            self.addCleanup(lambda: open("/proc/sys/net/core/rmem_max", "w").write(str(rmem_max)))
        with Server("--echo", "--no-tcp") as srv:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: every echo
                s.setsockopt(socket.IPPROTO_UDP, 103, segment)  # UDP_SEGMENT
                s.connect((srv.host, srv.port))
                srv.proc.send_signal(signal.SIGSTOP)  # the batches wait in its socket
                try:
                    for i in range(batches):
                        s.send(bytes([i]) * (segment * count))
                finally:
                    srv.proc.send_signal(signal.SIGCONT)
                s.settimeout(3)
                got = 0
                try:
                    while got < batches * count:
                        got += len(s.recv(65536)) // segment
                except socket.timeout:
                    pass
        self.assertEqual(got, batches * count)

    def test_given_certificate_is_used(self):
        d = tempfile.mkdtemp()
        key, cert = os.path.join(d, "k.pem"), os.path.join(d, "c.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "2", "-subj", "/CN=xdpq-test-cert"], check=True,
                       capture_output=True)
        fp = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-fingerprint",
                             "-sha256"], check=True, capture_output=True, text=True)
        expected = fp.stdout.strip().split("=", 1)[1]
        with Server("--dataplane", "socket", "--cert", cert, "--key", key) as srv:
            self.assertIn(expected, srv.output())
            r = gtlsclient(srv, ["/healthz"])
            self.assertEqual(r.statuses, {0: 200})


if __name__ == "__main__":
    unittest.main(verbosity=2)
