#!/usr/bin/env bash
# One command for the benchmark report: installs what it needs, builds the
# release preset (xdpqd and h3load), runs the side-by-side harness as root
# and the micro-benchmarks, and writes bench/results/latest/.
#   bench/run.sh            # full matrix and micro-benchmarks (~30 minutes on 2 cores)
#   bench/run.sh --quick    # a small matrix, under 5 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Caddy (Debian's, quic-go) is a benchmark peer only: installed here, not by
# setup.sh, and its packaged service is not left running.
if ! command -v caddy >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends caddy
  systemctl disable --now caddy 2>/dev/null || true
fi
# nginx 1.26 and HAProxy 3.0 with HTTP/3 (peers nginx-h3, haproxy-h3) come
# from a Debian 13 chroot, made once (~40 MB from the Debian archive).
bash bench/peers.sh >/dev/null || echo "no Debian 13 chroot: no nginx-h3 or haproxy-h3 columns" >&2
cmake --preset release >/dev/null
cmake --build --preset release
OUT=bench/results/latest
mkdir -p "$OUT"
/usr/bin/python3 bench/run.py --build build/release --out "$OUT" "$@"
if [[ " $* " != *" --quick "* ]]; then
  build/release/bench_micro --benchmark_out="$OUT/micro.json" --benchmark_out_format=json \
    --benchmark_min_time=0.2 | tee "$OUT/micro.txt"
fi
echo "report: $OUT/report.md"
