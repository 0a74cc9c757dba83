#!/usr/bin/env bash
# The side-by-side benchmark on a real NIC (see bench/nic.md): xdpqd on
# AF_XDP in zero-copy mode (with and without hybrid TX) against the same
# xdpqd on kernel UDP sockets, h3load driven from a second machine over ssh,
# rounds alternating, medians. Run as root on the server machine:
#
#   bench/nic.sh --interface eth0 --queue 2 --ip 192.0.2.10 --client bench@192.0.2.20
#
# Options: --cpu N (server core, default 2), --rounds N (3), --seconds S (10),
# --build DIR (build/release), --bodies "3 65536 1048576", --loads "10:1 100:32",
# --out DIR (bench/results/nic-DATE). The client needs h3load on its PATH
# (the xdpq package installs it) and a route to --ip. Writes OUT/runs.csv and
# OUT/report.md. It changes the NIC's flow rules and restores them at exit.
set -euo pipefail
cd "$(dirname "$0")/.."

iface="" queue="" ip="" client="" cpu=2 rounds=3 seconds=10 build=build/release
bodies="3 65536 1048576" loads="10:1 100:32" out="bench/results/nic-$(date +%Y-%m-%d)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --interface) iface=$2; shift 2 ;;
    --queue) queue=$2; shift 2 ;;
    --ip) ip=$2; shift 2 ;;
    --client) client=$2; shift 2 ;;
    --cpu) cpu=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --bodies) bodies=$2; shift 2 ;;
    --loads) loads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "nic.sh: unknown option $1 (see the header of bench/nic.sh)" >&2; exit 2 ;;
  esac
done
for v in iface queue ip client; do
  [[ -n "${!v}" ]] || { echo "nic.sh: --${v/iface/interface} is required" >&2; exit 2; }
done
[[ $EUID -eq 0 ]] || { echo "nic.sh: run as root (XDP, AF_XDP, ethtool)" >&2; exit 2; }
ssh -o BatchMode=yes "$client" command -v h3load >/dev/null ||
  { echo "nic.sh: cannot run h3load on $client over ssh" >&2; exit 2; }
mkdir -p "$out"

echo "== $iface: driver $(ethtool -i "$iface" | awk '/^driver/{print $2}'), queues:"
ethtool -l "$iface" | sed -n '/Current/,$p'
# Steer the served UDP port to the queue (ntuple rule); removed at exit.
rule=$(ethtool -N "$iface" flow-type udp4 dst-ip "$ip" dst-port 443 action "$queue" 2>&1 |
  awk '/Added rule with ID/{print $NF}')
[[ -n "$rule" ]] || { echo "nic.sh: the NIC refused an ntuple rule (ethtool -K $iface ntuple on?)" >&2; exit 2; }
trap 'ethtool -N "$iface" delete "$rule" 2>/dev/null || true' EXIT
ethtool -K "$iface" gro off >/dev/null || true

variants=(zerocopy zerocopy-ring socket)
server_cmd() { # sets cmd=(...) for variant $1
  local common=(--listen "$ip:443" --cpus "$cpu" --no-tcp --per-source-connections 0
                --per-source-rate 0 --retry-rate 0)
  local afxdp=(--dataplane afxdp --interface "$iface" --queues "$queue" --zerocopy on)
  case "$1" in
    zerocopy) cmd=("$build/xdpqd" "${afxdp[@]}" --kernel-trains 4 "${common[@]}") ;;
    zerocopy-ring) cmd=("$build/xdpqd" "${afxdp[@]}" --kernel-trains 0 "${common[@]}") ;;
    socket) cmd=("$build/xdpqd" --dataplane socket --workers 1 "${common[@]}") ;;
  esac
}

echo "variant,body,clients,streams,round,req_per_s,server_cpu_us_per_req" > "$out/runs.csv"
for r in $(seq 1 "$rounds"); do
  for body in $bodies; do
    for load in $loads; do
      c=${load%:*} m=${load#*:}
      for v in "${variants[@]}"; do
        log="$out/xdpqd-$v.log"
        server_cmd "$v"
        "${cmd[@]}" >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 50); do grep -q "ready:" "$log" && break; sleep 0.1; done
        if [[ "$v" != socket ]] && ! grep -q "zero-copy" "$log"; then
          echo "nic.sh: $iface queue $queue did not bind zero-copy:" >&2; tail -5 "$log" >&2
          kill "$pid"; exit 1
        fi
        t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
        json=$(ssh "$client" h3load --json -D "$seconds" --warm-up-time 1 -c "$c" -m "$m" \
               "https://$ip:443/bytes/$body")
        t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
        kill -TERM "$pid"; wait "$pid" || true
        rps=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["req_per_s"])' "$json")
        cpu_us=$(python3 -c "import os; print((($t1-$t0)/os.sysconf('SC_CLK_TCK'))*1e6/($rps*($seconds-1)) if $rps else 0)")
        echo "$v,$body,$c,$m,$r,$rps,$cpu_us" | tee -a "$out/runs.csv"
      done
    done
  done
done

python3 - "$out" <<'EOF'
import csv, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/runs.csv")))
cells = {}
for r in rows:
    cells.setdefault((r["body"], r["clients"], r["streams"]), {}).setdefault(r["variant"], []).append(r)
lines = ["| cell | variant | req/s | server CPU us/req |", "|---|---|---:|---:|"]
for (b, c, m), vs in cells.items():
    for v, rs in vs.items():
        rps = statistics.median(float(x["req_per_s"]) for x in rs)
        cpu = statistics.median(float(x["server_cpu_us_per_req"]) for x in rs)
        lines.append(f"| {b} B c={c} m={m} | {v} | {rps:.0f} | {cpu:.1f} |")
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
