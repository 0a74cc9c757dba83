#!/usr/bin/python3
"""xdpq soak: hours of good load mixed with every hostile client we know,
on both dataplanes, watching the server's memory, descriptors and
connections. The pass line: RSS flat (its slope over the second half of each
run under --max-slope MiB/min) and no good client ever failing.

    bench/soak.py                         # 30 minutes, socket then AF_XDP
    bench/soak.py --duration 120          # the CI version (2 minutes)
    bench/soak.py --dataplane socket --duration 3600

Topology as in bench/run.py: two network namespaces joined by a veth pair
(AF_XDP in native mode on the server side); the good clients and the hostile
ones run in the client namespace. Writes OUT/soak.json (samples, counters,
errors, verdicts) and OUT/soak.md. Exit status 0 when every run passed.

Hostile clients, all at once, all the time:
  - junk Initials (random 1200-byte datagrams), ~1000/s
  - the rejected-Initial replay of the use-after-free (same DCID twice)
  - short-header packets for random CIDs (stateless reset bait)
  - HTTP/2 clients hoarding request bodies on 50 never-ending streams
  - slowloris TCP connections (a header byte every 2 s)
  - TCP connections opened and dropped without a byte
  - metrics-port clients sending half a request line
Good clients: h3load (HTTP/3) and curl (HTTP/2), continuously, every
response checked.
"""

import argparse
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from netns import Topology, sh  # noqa: E402

PORT = 4433
METRICS_PORT = 9464


def in_ns(ns, *cmd):
    return ["ip", "netns", "exec", ns, *cmd]


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def slope_per_min(points):
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 3:
        return 0.0
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den * 60


# --- hostile clients (each a Python program run in the client namespace) ------

UDP_HOSTILE = r"""
import os, socket, struct, sys, time
host, port, end = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[4], 0))
def bad_initial(dcid):
    p = bytes([0xC3]) + struct.pack("!I", 1) + bytes([8]) + dcid + bytes([8]) + os.urandom(8)
    p += b"\x00\x4f\xff"
    return p + os.urandom(1200 - len(p))
n = 0
while time.time() < end:
    for _ in range(20):
        s.sendto(os.urandom(1200), (host, port))                      # junk
        d = os.urandom(8)
        s.sendto(bad_initial(d), (host, port))                        # the UAF replay
        s.sendto(bad_initial(d), (host, port))
        s.sendto(b"\x41" + os.urandom(18) + os.urandom(40), (host, port))  # reset bait
        n += 4
    time.sleep(0.02)
print(n)
"""

TCP_HOSTILE = r"""
import os, socket, ssl, sys, threading, time
host, port, mport, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), time.time() + float(sys.argv[4])
src = (sys.argv[5], 0)
import h2.config, h2.connection
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
def hoarder():
    while time.time() < end:
        try:
            c2 = ssl.create_default_context(); c2.check_hostname = False
            c2.verify_mode = ssl.CERT_NONE; c2.set_alpn_protocols(["h2"])
            s = c2.wrap_socket(socket.create_connection((host, port), timeout=5, source_address=src))
            c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            c.initiate_connection()
            for sid in range(1, 101, 2):
                c.send_headers(sid, [(":method", "POST"), (":scheme", "https"),
                                     (":authority", "x"), (":path", "/echo")])
            s.sendall(c.data_to_send())
            s.settimeout(0.2)
            stop = time.time() + 8
            live = set(range(1, 101, 2))
            while time.time() < stop and time.time() < end and live:
                try:
                    for ev in c.receive_data(s.recv(65536)):
                        if hasattr(ev, "stream_id") and type(ev).__name__ == "StreamReset":
                            live.discard(ev.stream_id)
                except (socket.timeout, ssl.SSLWantReadError):
                    pass
                for sid in list(live):
                    n = min(c.local_flow_control_window(sid), 16384)
                    if n > 0:
                        try:
                            c.send_data(sid, b"z" * n)
                        except Exception:
                            live.discard(sid)
                s.sendall(c.data_to_send())
            s.close()
        except Exception:
            time.sleep(0.5)
def slowloris():
    while time.time() < end:
        try:
            s = ctx.wrap_socket(socket.create_connection((host, port), timeout=5, source_address=src))
            s.sendall(b"GET / HTTP/1.1\r\n")
            while time.time() < end:
                s.sendall(b"X")
                time.sleep(2)
        except Exception:
            time.sleep(0.5)
def churn():
    while time.time() < end:
        try:
            socket.create_connection((host, port), timeout=2, source_address=src).close()
        except Exception:
            pass
        time.sleep(0.05)
def admin():
    while time.time() < end:
        try:
            s = socket.create_connection((host, mport), timeout=5, source_address=src)
            s.sendall(b"GET /metr")
            s.settimeout(10)
            s.recv(100)
        except Exception:
            time.sleep(0.5)
ts = [threading.Thread(target=f, daemon=True) for f in
      [hoarder, hoarder] + [slowloris] * 10 + [churn] + [admin] * 5]
for t in ts: t.start()
while time.time() < end: time.sleep(0.5)
"""


class Soak:
    def __init__(self, args):
        self.args = args
        self.xdpqd = os.path.join(args.build, "xdpqd")
        self.h3load = os.path.join(args.build, "h3load")
        self.xdpqctl = os.path.join(args.build, "xdpqctl")
        self.work = tempfile.mkdtemp(prefix="xdpq-soak-")
        self.results = []

    def run_one(self, dataplane, seconds):
        with Topology() as topo:
            # The hostile clients come from an address of their own: the
            # per-source caps are meant to hold them, not the good clients.
            hostile_ip = topo.cli_ip.rsplit(".", 1)[0] + ".3"
            sh("ip", "-n", topo.cli_ns, "addr", "add", f"{hostile_ip}/24", "dev", topo.cli_if)
            ctl = os.path.join(self.work, f"{dataplane}.sock")
            cmd = [self.xdpqd, "--listen", f"{topo.srv_ip}:{PORT}", "--control-socket", ctl,
                   "--metrics", f"{topo.srv_ip}:{METRICS_PORT}", "--drain-timeout", "2000",
                   "--tcp-header-timeout", "5000", "--max-body-per-connection", str(4 << 20),
                   "--max-request-body", str(4 << 20), "--max-body-per-worker", str(32 << 20)]
            if dataplane == "afxdp":
                cmd += ["--dataplane", "afxdp", "--interface", topo.srv_if, "--xdp-mode", "native"]
            else:
                cmd += ["--dataplane", "socket", "--workers", "1"]
            log = open(os.path.join(self.work, f"{dataplane}.log"), "w")
            srv = subprocess.Popen(in_ns(topo.srv_ns, *cmd), stdout=log, stderr=subprocess.STDOUT)
            deadline = time.time() + 10
            while "ready:" not in open(log.name).read():
                if srv.poll() is not None or time.time() > deadline:
                    raise RuntimeError("xdpqd did not start: " + open(log.name).read()[-2000:])
                time.sleep(0.1)
            pid = self.server_pid(srv.pid)
            end = time.time() + seconds
            errors = []
            good = {"h3": 0, "h2": 0}
            stop = threading.Event()

            def h3_loop():
                url = f"https://{topo.srv_ip}:{PORT}/bytes/20000"
                while not stop.is_set():
                    r = subprocess.run(in_ns(topo.cli_ns, self.h3load, "--json", "-D", "3", "-c",
                                             "4", "-m", "2", url), capture_output=True, text=True)
                    try:
                        j = json.loads(r.stdout.strip().splitlines()[-1])
                        req = j["requests"]
                        good["h3"] += req["succeeded"]
                        bad = req["failed"] + req["errored"] + j["connect_failures"]
                        if bad:
                            errors.append(f"h3load: {bad} failed at {time.time() - t0:.0f}s")
                    except (ValueError, IndexError, KeyError):
                        errors.append(f"h3load: no result ({r.stderr[-200:]})")

            def h2_loop():
                url = f"https://{topo.srv_ip}:{PORT}/bytes/5000"
                while not stop.is_set():
                    r = subprocess.run(in_ns(topo.cli_ns, "curl", "-sk", "--http2", "-o",
                                             "/dev/null", "-w", "%{http_code} %{size_download}",
                                             "--max-time", "10", url), capture_output=True,
                                       text=True)
                    if r.stdout == "200 5000":
                        good["h2"] += 1
                    else:
                        errors.append(f"curl: '{r.stdout}' at {time.time() - t0:.0f}s")
                    time.sleep(0.1)

            t0 = time.time()
            hostile = [
                subprocess.Popen(in_ns(topo.cli_ns, "/usr/bin/python3", "-c", UDP_HOSTILE,
                                       topo.srv_ip, str(PORT), str(seconds), hostile_ip),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL),
                subprocess.Popen(in_ns(topo.cli_ns, "/usr/bin/python3", "-c", TCP_HOSTILE,
                                       topo.srv_ip, str(PORT), str(METRICS_PORT), str(seconds),
                                       hostile_ip),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            ]
            loops = [threading.Thread(target=f, daemon=True) for f in (h3_loop, h2_loop)]
            for t in loops:
                t.start()
            samples = []
            while time.time() < end:
                time.sleep(min(self.args.interval, max(0, end - time.time())))
                if srv.poll() is not None:
                    errors.append(f"xdpqd exited with {srv.returncode}")
                    break
                gauges = self.gauges(ctl)
                samples.append({"t": round(time.time() - t0, 1), "rss_kib": rss_kib(pid),
                                "fds": fd_count(pid), **gauges})
                print(f"  {dataplane:6s} t={samples[-1]['t']:6.0f}s rss={samples[-1]['rss_kib']}KiB "
                      f"fds={samples[-1]['fds']} quic={gauges.get('quic_connections')} "
                      f"tcp={gauges.get('tcp_connections')} "
                      f"body={gauges.get('body_bytes_held')} ok h3={good['h3']} h2={good['h2']}",
                      flush=True)
            stop.set()
            for t in loops:
                t.join(timeout=30)
            for p in hostile:
                p.wait(timeout=60)
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(timeout=15)
            except subprocess.TimeoutExpired:
                srv.kill()
                errors.append("xdpqd did not stop within 15 s of SIGTERM")
            log.close()
            out = open(log.name).read()
            m = re.search(r"stats (\{.*\})", out)
            counters = json.loads(m.group(1)) if m else {}
        second_half = [(s["t"], s["rss_kib"] / 1024) for s in samples if s["t"] >= seconds / 2]
        slope = slope_per_min(second_half)
        fd_slope = slope_per_min([(s["t"], s["fds"]) for s in samples if s["t"] >= seconds / 2])
        # Peak RSS of the second half over that of the first: RSS swings by a
        # few MiB as malloc trims, so on a short run a fitted slope is mostly
        # that noise, while a leak moves the peak.
        first_peak = max((s["rss_kib"] for s in samples if s["t"] < seconds / 2), default=0)
        second_peak = max((s["rss_kib"] for s in samples if s["t"] >= seconds / 2), default=0)
        peak_growth = (second_peak - first_peak) / 1024
        verdict = (not errors and slope <= self.args.max_slope and good["h3"] > 0 and
                   good["h2"] > 0 and srv.returncode == 0)
        res = {"dataplane": dataplane, "seconds": seconds, "samples": samples, "errors": errors,
               "good": good, "rss_slope_mib_per_min": slope, "fd_slope_per_min": fd_slope,
               "rss_peak_growth_mib": peak_growth,
               "rss_start_kib": samples[0]["rss_kib"] if samples else 0,
               "rss_max_kib": max((s["rss_kib"] for s in samples), default=0),
               "exit_status": srv.returncode, "counters": counters, "pass": verdict}
        self.results.append(res)
        return res

    def server_pid(self, pid):
        """ip netns exec execs in place; the pid is xdpqd's."""
        return pid

    def gauges(self, ctl):
        try:
            r = subprocess.run([self.xdpqctl, "--socket", ctl, "--json", "stats"],
                               capture_output=True, text=True, timeout=5)
            total = json.loads(r.stdout)["total"]
            return {k: total.get(k) for k in ("quic_connections", "tcp_connections",
                                              "body_bytes_held", "handshakes_started",
                                              "drop_source_rate", "retries_sent",
                                              "tcp_body_budget_refusals", "tcp_timeouts_headers")}
        except (subprocess.TimeoutExpired, ValueError, KeyError) as e:
            return {"error": str(e)}

    def report(self):
        out = self.args.out
        os.makedirs(out, exist_ok=True)
        meta = {"git_commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                                             capture_output=True, text=True).stdout.strip(),
                "command": " ".join(sys.argv), "max_slope_mib_per_min": self.args.max_slope,
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(os.path.join(out, "soak.json"), "w") as f:
            json.dump({"meta": meta, "runs": self.results}, f, indent=1)
        md = [f"# xdpq soak ({meta['date']})", "",
              f"Commit `{meta['git_commit'][:12]}`; command `{meta['command']}`.", "",
              "| dataplane | seconds | good HTTP/3 | good HTTP/2 | errors | RSS start | RSS max | "
              "RSS slope, 2nd half | fd slope | verdict |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in self.results:
            md.append(f"| {r['dataplane']} | {r['seconds']} | {r['good']['h3']} | "
                      f"{r['good']['h2']} | {len(r['errors'])} | {r['rss_start_kib'] // 1024} MiB | "
                      f"{r['rss_max_kib'] // 1024} MiB | {r['rss_slope_mib_per_min']:+.2f} MiB/min | "
                      f"{r['fd_slope_per_min']:+.1f}/min | {'pass' if r['pass'] else 'FAIL'} |")
        for r in self.results:
            for e in r["errors"][:20]:
                md.append(f"- {r['dataplane']}: {e}")
        with open(os.path.join(out, "soak.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        print("\n".join(md))
        return all(r["pass"] for r in self.results)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=1800, help="seconds in all (split over "
                   "the dataplanes)")
    p.add_argument("--dataplane", choices=("socket", "afxdp", "both"), default="both")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--max-slope", type=float, default=1.0,
                   help="pass line: RSS growth in the second half, MiB per minute")
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "soak-latest"))
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/soak.py needs root (network namespaces, XDP)")
    s = Soak(a)
    planes = ("socket", "afxdp") if a.dataplane == "both" else (a.dataplane,)
    for d in planes:
        print(f"soak: {d} for {a.duration / len(planes):.0f} s", flush=True)
        s.run_one(d, a.duration / len(planes))
    sys.exit(0 if s.report() else 1)


if __name__ == "__main__":
    main()
