#!/usr/bin/python3
"""Where the cycles go, per layer, on both dataplanes: the same xdpqd on
AF_XDP and on kernel UDP sockets, the same h3load load, and `perf record`
sampling both cores system-wide (server pinned to CPU 1, client to CPU 0, as
in bench/run.py). Every sample is attributed to a layer by its DSO and
symbol: the dataplane (xdpq's own packet path), the kernel's AF_XDP code,
the kernel network stack (veth, IP, UDP, sockets), other kernel work
(syscall entry, scheduler, epoll, memory), QUIC (ngtcp2), crypto (GnuTLS,
Nettle), HTTP/3 (nghttp3 and xdpq's HTTP code), the allocator, and the
rest. Reported as CPU microseconds per request on the whole machine (from
/proc/stat over the sampled window), split by layer and by process (server,
client, kernel threads), with datagrams per request each way from xdpqd's
counters.

    bench/breakdown.py --build build/release                 # /bytes/65536 c=10 m=1
    bench/breakdown.py --body 3 -c 100 -m 32 --out /tmp/bd   # any cell
    bench/breakdown.py --body 3 --variants socket,haproxy-h3 # against a peer

The peers (haproxy-h3, nginx-h3: Debian 13's, from the chroot that
bench/peers.sh makes, configured as in bench/run.py) have no debug symbols:
their samples split by shared object and kernel symbol only, their own QUIC
and HTTP/3 code lumped as "peer binary"; OpenSSL counts as crypto; the
chroot's libc has no symbols for malloc's internals, so their allocator time
lands in "other".

Writes OUT/breakdown.md and OUT/breakdown.json. Measures; asserts nothing.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from netns import Topology  # noqa: E402
sys.path.insert(0, HERE)
from run import (BODIES, CHROOT_PEERS, DEFAULT_CHROOT, PEER_BODIES, ChrootPeers,  # noqa: E402
                 make_files)

SERVER_CPU, CLIENT_CPU = "1", "0"

LAYERS = ("dataplane", "kernel AF_XDP", "kernel net stack", "kernel other", "QUIC", "crypto",
          "HTTP/3", "allocator", "peer binary", "other")

KERNEL_NET = re.compile(r"^(veth|udp|__udp|ip_|__ip|ip6|__ip6|inet|__inet|sock_|__sock|sk_|__sk_|"
                        r"skb|__skb|kfree_skb|consume_skb|napi|__napi|net_|__net|netif|__netif|"
                        r"dev_|__dev_|process_backlog|tcp|__tcp|nf_|fib|__fib|neigh|eth_|"
                        r"raw_|csum|__csum|gro|__gro|dst_|__dst|rt_|icmp|___sys_send|"
                        r"___sys_recv|__sys_send|__sys_recv|sendmmsg|recvmmsg|do_recvmmsg|"
                        r"__x64_sys_send|__x64_sys_recv|alloc_skb|__alloc_skb|pskb|validate_xmit|"
                        r"sch_|__qdisc|qdisc|packet_|handle_softirqs|do_softirq|net_rx_action|"
                        r"_copy_from_iter|_copy_to_iter|__skb_datagram_iter|copy_msghdr|"
                        r"copy_iovec|_+sys_recvmsg|_+sys_sendmsg|__check_object_size|"
                        r"sock_def_readable|udp)")
IDLE = re.compile(r"halt|idle|mwait|poll_idle|cpuidle|do_idle")


def layer_of(dso, sym):
    kernel = dso.startswith("[kernel")
    if kernel:
        if re.match(r"^(__)?xsk|^xp_|^xdp|^bpf_xdp|^__xdp|^bpf_prog_", sym):
            return "kernel AF_XDP"
        if KERNEL_NET.match(sym):
            return "kernel net stack"
        return "kernel other"
    base = os.path.basename(dso)
    if base.startswith("libngtcp2_crypto") or re.match(
            r"lib(gnutls|nettle|hogweed|gmp|crypto|ssl)", base):
        return "crypto"
    if base.startswith("libngtcp2"):
        return "QUIC"
    if base.startswith("libnghttp3"):
        return "HTTP/3"
    if base in ("haproxy", "nginx"):
        return "peer binary"  # stripped: its QUIC, HTTP/3 and the rest in one
    if base.startswith("libc.so") or base.startswith("ld-linux"):
        if re.search(r"malloc|free|calloc|realloc|_int_|tcache|arena|sysmalloc", sym):
            return "allocator"
        return "other"
    if "small_alloc" in sym or re.search(r"\bmalloc|\bfree\b", sym):
        return "allocator"
    if "xdpq::dataplane" in sym or "checksum" in sym or "build_headers" in sym:
        return "dataplane"
    if "xdpq::http" in sym:
        return "HTTP/3"
    if "xdpq::quic" in sym:
        return "QUIC"
    return "other"


def machine_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]


def run_one(args, dataplane, out, peers=None):
    with Topology() as topo:
        srv_log = os.path.join(out, f"server-{dataplane}.log")
        if dataplane in CHROOT_PEERS:
            cmd = ["ip", "netns", "exec", topo.srv_ns, *peers.cmd(dataplane, topo.srv_ip)]
        else:
            cmd = ["ip", "netns", "exec", topo.srv_ns, "taskset", "-c", SERVER_CPU,
                   os.path.join(args.build, "xdpqd"), "--listen", f"{topo.srv_ip}:4433",
                   "--workers", "1", "--no-tcp", "--per-source-connections", "0",
                   "--per-source-rate", "0", "--retry-rate", "0"]
            if dataplane == "afxdp":
                cmd += ["--dataplane", "afxdp", "--interface", topo.srv_if, "--xdp-mode",
                        "native"]
            cmd += args.server_args
        with open(srv_log, "w") as log:
            srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.time() + 10
            if dataplane in CHROOT_PEERS:
                time.sleep(1.0)  # neither says when it is ready
            while dataplane not in CHROOT_PEERS and "ready:" not in open(srv_log).read():
                if time.time() > deadline or srv.poll() is not None:
                    raise SystemExit(f"xdpqd did not start:\n{open(srv_log).read()}")
                time.sleep(0.05)
            if srv.poll() is not None:
                raise SystemExit(f"{dataplane} did not start:\n{open(srv_log).read()}")
            url = f"https://{topo.srv_ip}:4433/bytes/{args.body}"
            load = subprocess.Popen(
                ["ip", "netns", "exec", topo.cli_ns, "taskset", "-c", CLIENT_CPU,
                 os.path.join(args.build, "h3load"), "--json", "-D",
                 str(args.seconds * (2 if args.syscalls else 1) + 2),
                 "-c", str(args.c), "-m", str(args.m), url],
                stdout=subprocess.PIPE, text=True)
            time.sleep(1.0)  # warm-up
            data = os.path.join(out, f"perf-{dataplane}.data")
            t0, w0 = machine_ticks(), time.time()
            subprocess.run(["perf", "record", "-q", "-a", "-C", f"{CLIENT_CPU},{SERVER_CPU}",
                            "-F", "999", *(["--call-graph", "dwarf,16384"] if args.call_graph else []), "-o", data, "--",
                            "sleep", str(args.seconds)],
                           capture_output=True, check=True)
            ticks, wall = machine_ticks() - t0, time.time() - w0
            syscalls = count_syscalls(args.seconds) if args.syscalls else {}
            result = json.loads(load.communicate()[0])
            srv.terminate()
            srv.wait(timeout=15)
    stats = {}
    for line in open(srv_log):
        if "stats {" in line:
            stats = json.loads(line[line.index("{"):])
    rps = result.get("req_per_s") or 0
    requests = rps * wall  # the sampled window at the run's mean rate
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
                             "--sort", "comm,dso,sym", "--percent-limit", "0"],
                            capture_output=True, text=True).stdout
    by_layer = {k: 0.0 for k in LAYERS}
    by_comm = {}
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(\S+)\s+\[[.kK]\]\s+(.*)$", line)
        if not m:
            continue
        pct, comm, dso, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
        if comm == "swapper" or (dso.startswith("[kernel") and IDLE.search(sym)):
            continue  # the idle task: /proc/stat does not count it either
        by_layer[layer_of(dso, sym)] += pct
        who = ("server" if comm.startswith(("xdpqd", "xdpq-", "worker", "haproxy", "nginx"))
               else "client" if comm.startswith("h3load") else "kernel threads")
        by_comm[who] = by_comm.get(who, 0.0) + pct
    cpu_us = ticks / os.sysconf("SC_CLK_TCK") * 1e6 / requests if requests else 0.0
    total = sum(by_layer.values()) or 1.0
    by_comm = {k: 100.0 * v / total for k, v in by_comm.items()}
    reqs = stats.get("requests", 0) or 1
    return {
        "dataplane": dataplane,
        "req_per_s": rps,
        "machine_cpu_us_per_req": cpu_us,
        "layers_us_per_req": {k: cpu_us * v / total for k, v in by_layer.items()},
        "process_share_pct": by_comm,
        "datagrams_out_per_req": stats.get("tx_datagrams", 0) / reqs,
        "datagrams_in_per_req": stats.get("rx_datagrams", 0) / reqs,
        "tx_sends_per_req": stats.get("tx_sends", 0) / reqs,
        "server_cpu_events_per_req": {k: v / (rps * args.seconds) if rps else 0.0
                                      for k, v in syscalls.items()},
    }


def count_syscalls(seconds):
    """System calls by name, and context switches, on the server's CPU for
    seconds (perf stat on tracepoints: counting, no sampling). Only the
    server runs there; kernel threads make no system calls."""
    r = subprocess.run(["perf", "stat", "-x", ",", "-C", SERVER_CPU, "-e",
                        "raw_syscalls:sys_enter,context-switches,syscalls:sys_enter_*",
                        "--", "sleep", str(seconds)], capture_output=True, text=True)
    counts = {}
    for line in r.stderr.splitlines():
        f = line.split(",")
        if len(f) < 3 or not f[0].strip().isdigit() or int(f[0]) == 0:
            continue
        name = f[2].replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter",
                                                                  "all system calls")
        counts[name] = int(f[0])
    return counts


def median_run(rs):
    """Field by field median of one dataplane's rounds."""
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    out = {"dataplane": rs[0]["dataplane"]}
    for k, v in rs[0].items():
        if isinstance(v, dict):
            out[k] = {kk: med([r[k].get(kk, 0.0) for r in rs]) for kk in v}
        elif isinstance(v, (int, float)):
            out[k] = med([r[k] for r in rs])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    p.add_argument("--body", default="65536")
    p.add_argument("-c", type=int, default=10)
    p.add_argument("-m", type=int, default=1)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--rounds", type=int, default=3, help="alternating afxdp/socket rounds; medians")
    p.add_argument("--out", default="/tmp/xdpq-breakdown")
    p.add_argument("--call-graph", action="store_true",
                   help="record call chains too (perf record --call-graph dwarf), for perf report -G on "
                        "OUT/perf-*.data; the layer split stays by leaf symbol")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="extra xdpqd flags for both runs (last on the line)")
    p.add_argument("--variants", default="afxdp,socket",
                   help="comma list, run alternately: afxdp and socket (xdpqd's dataplanes), "
                        "haproxy-h3, nginx-h3 (from the chroot bench/peers.sh makes)")
    p.add_argument("--chroot", default=DEFAULT_CHROOT, help="bench/peers.sh's chroot")
    p.add_argument("--syscalls", action="store_true",
                   help="after each perf record window, as long again counting the server CPU's "
                        "system calls by name and its context switches (perf stat)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    variants = args.variants.split(",")
    for v in variants:
        if v not in ("afxdp", "socket") + CHROOT_PEERS:
            p.error(f"unknown variant {v}")
        sizes = [str(BODIES[b]) for b in PEER_BODIES.get(v, BODIES)]
        if args.body not in sizes:
            p.error(f"{v} serves /bytes/N for N in {', '.join(sizes)} only")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    peers = None
    if any(v in CHROOT_PEERS for v in variants):
        work = os.path.join(args.out, "peer-files")
        os.makedirs(work, exist_ok=True)
        peers = ChrootPeers(args.chroot, *make_files(work))
    try:
        rounds = [[run_one(args, d, args.out, peers) for d in variants]
                  for _ in range(args.rounds)]
    finally:
        if peers:
            peers.close()
    runs = [median_run([r[i] for r in rounds]) for i in range(len(variants))]
    cell = f"/bytes/{args.body} c={args.c} m={args.m}"
    lines = [f"# Per-layer CPU breakdown: {cell}", "",
             f"Commit `{commit}`; command: `bench/breakdown.py {' '.join(sys.argv[1:])}`; "
             f"{args.rounds} alternating rounds of {args.seconds:g} s of `perf record -a` on CPUs "
             f"{CLIENT_CPU},{SERVER_CPU} per variant, medians. Machine CPU microseconds per "
             "request (idle excluded), by layer; QUIC, crypto and HTTP/3 include the client's "
             "share (h3load runs the same libraries).", ""]
    # Ratios: afxdp over socket, and each xdpq dataplane over each peer.
    ratios = [(a, b) for a in ("afxdp", "socket") for b in ("socket",) + CHROOT_PEERS
              if a != b and a in variants and b in variants]
    by = dict(zip(variants, runs))
    lines += ["| layer | " + " | ".join(variants + [f"{a}/{b}" for a, b in ratios]) + " |",
              "|---|" + "---:|" * (len(variants) + len(ratios))]

    def value(r, k):
        return r["machine_cpu_us_per_req"] if k == "total" else r["layers_us_per_req"][k]
    for k in LAYERS + ("total",):
        if k == "peer binary" and not any(v in CHROOT_PEERS for v in variants):
            continue
        cols = [f"{value(r, k):.1f}" for r in runs]
        cols += [f"{value(by[a], k) / value(by[b], k):.2f}"
                 if min(value(by[a], k), value(by[b], k)) > 0.05 else "-" for a, b in ratios]
        lines.append(f"| {k} | " + " | ".join(cols) + " |")
    lines += ["", "| | " + " | ".join(variants) + " |", "|---|" + "---:|" * len(variants)]
    for k, label in (("req_per_s", "req/s"), ("datagrams_out_per_req", "datagrams out / req"),
                     ("datagrams_in_per_req", "datagrams in / req"),
                     ("tx_sends_per_req", "TX syscalls or kicks / req")):
        lines.append(f"| {label} | " + " | ".join(
            f"{r[k]:.2f}" if r["dataplane"] not in CHROOT_PEERS or k == "req_per_s" else "-"
            for r in runs) + " |")
    for who in ("server", "client", "kernel threads"):
        lines.append(f"| share of samples: {who} | " + " | ".join(
            f"{r['process_share_pct'].get(who, 0):.1f} %" for r in runs) + " |")
    if args.syscalls:
        names = sorted({k for r in runs for k in r["server_cpu_events_per_req"]},
                       key=lambda k: -max(r["server_cpu_events_per_req"].get(k, 0) for r in runs))
        lines += ["", "Per request on the server's CPU (`--syscalls`: perf stat of "
                  "`raw_syscalls:sys_enter`, `context-switches` and every `syscalls:sys_enter_*`):",
                  "", "| event | " + " | ".join(variants) + " |",
                  "|---|" + "---:|" * len(variants)]
        for k in names:
            vals = [r["server_cpu_events_per_req"].get(k, 0.0) for r in runs]
            if max(vals) < 0.005:
                continue
            lines.append(f"| {k} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "breakdown.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "breakdown.json"), "w") as f:
        json.dump({"commit": commit, "cell": cell, "argv": sys.argv, "medians": runs,
                   "rounds": rounds}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
