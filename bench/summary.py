#!/usr/bin/python3
"""Condenses a bench/run.py results directory into the README's key tables:
one row per cell, the median req/s of each variant and the verdict of the
per-round ratios; then the median server CPU and machine CPU per request of
each variant, with xdpq's over each peer's (see report.md for every number).
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

if __name__ == "__main__":
    main()
