#!/usr/bin/python3
"""Condenses a bench/run.py results directory into the README's key tables:
one row per cell, the median req/s of each variant and the verdict of the
per-round ratios; then the median server CPU and machine CPU per request of
each variant, with xdpq's over each peer's (see report.md for every number);
and for the proxy cells, xdpq over nginx and HAProxy as reverse proxies.
    bench/summary.py bench/results/DIR
"""

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import cell_name, paired_ratios  # noqa: E402


def main():
    d = sys.argv[1]
    res = json.load(open(os.path.join(d, "results.json")))
    runs, meta = res["runs"], res["meta"]
    # The variants' columns, those this run has only.
    cols = [v for v in ("xdpq-afxdp", "xdpq-socket", "gtlsserver", "caddy", "haproxy-h3",
                        "nginx-h3", "xdpq-h2", "nginx-h2")
            if any(r["variant"] == v for r in runs)]
    cells = []
    for r in runs:
        if (cell_name(r), r["proto"]) not in cells:
            cells.append((cell_name(r), r["proto"]))
    verdicts = {}
    for cell, a, b, med, lo, hi, verdict, _ in paired_ratios(runs):
        proto = "h2" if a.endswith("-h2") else ("udp" if cell.startswith("UDP") else "h3")
        verdicts.setdefault((cell, proto), []).append(f"{a.replace('xdpq-', '')}/{b.replace('xdpq-', '')} "
                                             f"{med:.2f} ({verdict.replace('xdpq-', '')})")
    print(f"Commit `{meta['git_commit'][:12]}`, {meta['date'][:10]}, kernel "
          f"{meta['machine']['kernel']}, {meta['machine']['cpus']} vCPUs "
          f"({meta['machine']['cpu_model']}); `{meta['command']}`; "
          f"{meta['rounds']} alternating rounds of {meta['seconds_per_run']:g} s, medians.\n")
    print("| proto | cell | " + " | ".join(cols) + " | ratios (median A/B, verdict) |")
    print("|---|---|" + "---:|" * len(cols) + "---|")
    for cell, proto in cells:
        row = []
        for v in cols:
            xs = [r["req_per_s"] for r in runs if cell_name(r) == cell and r["variant"] == v
                  and r["proto"] == proto and r.get("req_per_s")]
            row.append(f"{statistics.median(xs):,.0f}" if xs else "")
        print(f"| {proto} | {cell} | " + " | ".join(row) + " | " +
              "; ".join(verdicts.get((cell, proto), [])) + " |")

    def median(key, cell, proto, v):
        xs = [r[key] for r in runs if cell_name(r) == cell
              and r["variant"] == v and r["proto"] == proto and r.get(key)]
        return statistics.median(xs) if xs else None

    # xdpq's CPU per request over each peer's, from the medians: the
    # server's own and the whole machine's (on veth the sender's core runs
    # the receive work, so the machine figure is the fairer cost).
    pairs = [("xdpq-afxdp", "xdpq-socket"), ("xdpq-socket", "gtlsserver"),
             ("xdpq-afxdp", "gtlsserver"), ("xdpq-socket", "caddy"),
             ("xdpq-afxdp", "haproxy-h3"), ("xdpq-socket", "haproxy-h3"),
             ("xdpq-afxdp", "nginx-h3"), ("xdpq-socket", "nginx-h3"), ("xdpq-h2", "nginx-h2")]
    for key, what in (("server_cpu_us_per_req", "Server"),
                      ("machine_cpu_us_per_req", "Machine")):
        print(f"\n{what} CPU per request (µs), medians; ratios of the medians "
              "(below 1: xdpq spends less).\n")
        print("| proto | cell | " + " | ".join(cols) + f" | {what.lower()} CPU ratios |")
        print("|---|---|" + "---:|" * len(cols) + "---|")
        for cell, proto in cells:
            row = [median(key, cell, proto, v) for v in cols]
            ratios = []
            for a, b in pairs:
                x, y = median(key, cell, proto, a), median(key, cell, proto, b)
                if x and y:
                    ratios.append(f"{a.replace('xdpq-', '')}/{b.replace('xdpq-', '')} "
                                  f"{x / y:.2f}")
            print(f"| {proto} | {cell} | " + " | ".join("" if x is None else f"{x:,.1f}"
                                                     for x in row)
                  + " | " + "; ".join(ratios) + " |")
    proxy_tables(runs, cells, median)


# The line the proxy cells are read against: xdpq's server CPU per request
# at most this fraction of the peer's, at a request rate at least the peer's.
PROXY_CPU_LINE = 0.7


def proxy_tables(runs, cells, median):
    """The proxy cells (bench/run.py --cells proxy): xdpq on each dataplane
    over each peer, on the medians; then how many upstream connections each
    proxy opened, which tells a proxy that reuses them from one that does
    not."""
    pcells = [(c, p) for c, p in cells if c.endswith(" proxy")]
    if not pcells:
        return
    print(f"\nProxy cells: xdpq over each peer, ratios of the medians (server CPU per "
          f"request, machine CPU per request, requests/s). \"meets\": server CPU at most "
          f"{PROXY_CPU_LINE}x the peer's at a request rate at least the peer's.\n")
    print("| cell | xdpq vs peer | server CPU/req | machine CPU/req | req/s | "
          f"server CPU <= {PROXY_CPU_LINE}x at >= 1x rate |")
    print("|---|---|---:|---:|---:|---|")
    for cell, proto in pcells:
        for a in ("xdpq-afxdp", "xdpq-socket"):
            for b in ("nginx-h3", "haproxy-h3"):
                v = {}
                for key in ("server_cpu_us_per_req", "machine_cpu_us_per_req", "req_per_s"):
                    x, y = median(key, cell, proto, a), median(key, cell, proto, b)
                    v[key] = x / y if x and y else None
                if all(x is None for x in v.values()):
                    ra = [r for r in runs if cell_name(r) == cell and r["variant"] == a]
                    if ra and median("req_per_s", cell, proto, b) and not any(
                            r.get("succeeded") for r in ra):
                        # Nothing came back: say so rather than leave a gap.
                        errs = statistics.median(r["errors"] if isinstance(r["errors"], int)
                                                 else 0 for r in ra)
                        print(f"| {cell} | {a.replace('xdpq-', '')} vs {b} | - | - | 0 | "
                              f"misses: no request succeeded (median {errs:,.0f} "
                              "errors a run) |")
                    continue
                srv, mach, rate = (v["server_cpu_us_per_req"], v["machine_cpu_us_per_req"],
                                   v["req_per_s"])
                meets = ("-" if srv is None or rate is None else
                         "meets" if srv <= PROXY_CPU_LINE and rate >= 1 else "misses")
                f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
                print(f"| {cell} | {a.replace('xdpq-', '')} vs {b} | {f(srv)} | {f(mach)} | "
                      f"{f(rate)} | {meets} |")
    print("\nUpstream connections the proxy opened per 1000 requests the upstream counted "
          "(medians; warm-up included, so a proxy that reuses its connections is near 0), "
          "the upstream's own CPU per request (µs), which machine CPU includes and "
          "server CPU does not, and the proxy's peak resident memory (MiB, its processes "
          "summed).\n")
    cols = [v for v in ("xdpq-afxdp", "xdpq-socket", "haproxy-h3", "nginx-h3")
            if any(r["variant"] == v and r.get("proxy") for r in runs)]
    print("| cell | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for cell, proto in pcells:
        row = []
        for v in cols:
            xs = [1000 * r["upstream_accepts"] / r["upstream_requests"] for r in runs
                  if cell_name(r) == cell and r["variant"] == v and r.get("upstream_requests")
                  and r.get("upstream_accepts") is not None]
            up = median("upstream_cpu_us_per_req", cell, proto, v)
            none = [r["upstream_accepts"] for r in runs if cell_name(r) == cell
                    and r["variant"] == v and r.get("upstream_requests") == 0]
            rss = median("server_peak_rss_mib", cell, proto, v)
            rss = f", {rss:,.0f} MiB" if rss else ""
            if xs and up:
                row.append(f"{statistics.median(xs):,.1f} conns, {up:.1f} µs{rss}")
            elif none:  # connections opened, not one request sent on them
                row.append(f"no requests, {statistics.median(none):,.0f} conns")
            else:
                row.append("")
        print(f"| {cell} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
