#!/usr/bin/python3
"""The profile behind README.md: one proxy variant in the proxy cell's setting
(bench/run.py's topology, upstream and server command), h3load at c/m, and,
after 1.5 s of warm-up, S seconds of `perf record -g` (MODE=record), `perf
trace -s` (MODE=trace) or nothing (MODE=none: the CPU figure alone) on the
server's processes. Prints req/s, the upstream's requests and new connections
in the window and the server's CPU per upstream request in it.
    MODE=record profile_proxy.py BUILD VARIANT C M SECONDS OUTDIR
With CELL=file the same for the static file cell: the server answers /b3
itself (no proxy, no upstream) and the request count is estimated from
h3load's rate.
Run as root from a checkout's root, under the build lock."""
import os
import subprocess
import sys
import time
import types

ROOT = os.getcwd()
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import run as R  # noqa: E402
from netns import Topology  # noqa: E402

build, variant, c, m, secs, out = sys.argv[1:7]
secs = float(secs)
mode = os.environ.get("MODE", "record")
proxied = os.environ.get("CELL", "proxy") == "proxy"
os.makedirs(out, exist_ok=True)
args = types.SimpleNamespace(build=build, compare=None, out=out, chroot=R.DEFAULT_CHROOT,
                             seconds=secs, rounds=1, smoke=False, variants=None, cells=None,
                             preset="proxy")
b = R.Bench(args)
with Topology() as topo:
    b.upstream = R.Upstream(b.work, topo.srv_ns) if proxied else None
    try:
        proc, log = b.start_server(variant, topo, proxy=proxied)
        pids = R.descendants(proc.pid)
        client = subprocess.Popen(
            ["ip", "netns", "exec", topo.cli_ns, "taskset", "-c", R.CLIENT_CPU, b.h3load,
             "--json", "-D", str(secs + 2), "--warm-up-time", "0.5", "-c", c, "-m", m,
             f"https://{topo.srv_ip}:4433/b3"], stdout=subprocess.PIPE, text=True)
        time.sleep(1.5)
        u0 = b.upstream.counters() if proxied else None
        s0 = sum(R.proc_cpu(p) for p in pids)
        target = ["-p", ",".join(map(str, pids)), "--", "sleep", str(secs)]
        if mode == "record":
            # PERF_CG="--call-graph dwarf,16384" unwinds through the libraries.
            graph = os.environ.get("PERF_CG", "-g").split()
            subprocess.run(["perf", "record", *graph, "-o", os.path.join(out, "perf.data"),
                            *target], capture_output=True)
        elif mode == "trace":
            r = subprocess.run(["perf", "trace", "-s", *target], capture_output=True, text=True)
            with open(os.path.join(out, "trace.txt"), "w") as f:
                f.write(r.stdout + r.stderr)
        else:
            time.sleep(secs)
        s1 = sum(R.proc_cpu(p) for p in pids)
        u1 = b.upstream.counters() if proxied else None
        res = R.parse_h3load(client.communicate()[0])
        b.stop_server(proc, log, variant)
        hz = os.sysconf("SC_CLK_TCK")
        if proxied:
            n = u1["requests"] - u0["requests"] - 1
            print(f"{variant}: {res['req_per_s']:.0f} req/s; in the window: upstream requests "
                  f"{n}, new upstream connections {u1['accepts'] - u0['accepts'] - 1}, server "
                  f"CPU {(s1 - s0) / hz / n * 1e6:.1f} us per upstream request")
        else:
            n = int(res["req_per_s"] * secs)
            print(f"{variant}: {res['req_per_s']:.0f} req/s; server CPU "
                  f"{(s1 - s0) / hz / n * 1e6:.1f} us per request (about {n} in the window)")
    finally:
        if b.upstream:
            b.upstream.close()
