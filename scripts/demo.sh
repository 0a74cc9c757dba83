#!/usr/bin/env bash
# The main job: builds xdpqd, starts it on its embedded default
# configuration (self-signed certificate, embedded page, kernel UDP
# dataplane) and fetches pages from it over HTTP/3 with gtlsclient,
# printing what came back.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release >/dev/null
XDPQD=build/release/xdpqd
XDPQCTL=build/release/xdpqctl

PORT="${PORT:-4433}"
LOG="$(mktemp -t xdpqd-demo.XXXXXX.log)"
OUT="$(mktemp -d -t xdpq-demo.XXXXXX)"
CTL="$OUT/xdpqd.sock"
echo "== starting xdpqd on 127.0.0.1:$PORT (log: $LOG)"
"$XDPQD" --listen "127.0.0.1:$PORT" --listen "[::1]:$PORT" --control-socket "$CTL" >"$LOG" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  grep -q "ready:" "$LOG" && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
sed 's/^/   server| /' "$LOG"

fetch() { # fetch HOST PATH...
  local host=$1; shift
  local urls=()
  for p in "$@"; do urls+=("https://$host:$PORT$p"); done
  local h=${host#[}; h=${h%]}
  gtlsclient --no-quic-dump --exit-on-all-streams-close --download "$OUT" "$h" "$PORT" \
    "${urls[@]}" 2>&1 | grep -E '^http: stream 0x[0-9a-f]+ \[(:status|content-type|content-length)' \
    | sed 's/^/   client| /'
}

echo
echo "== GET / and /healthz over HTTP/3 (IPv4)"
fetch 127.0.0.1 / /healthz
echo "-- body of /:"
sed 's/^/   | /' "$OUT/index.html"
echo "-- body of /healthz: $(cat "$OUT/healthz")"

echo
echo "== GET /bytes/1048576 over HTTP/3 (IPv6)"
fetch "[::1]" /bytes/1048576
echo "-- received $(stat -c %s "$OUT/1048576") bytes, sha256 $(sha256sum "$OUT/1048576" | cut -c1-16)..."

echo
echo "== GET /healthz over HTTP/2 on TCP (same address and port; note alt-svc)"
curl -sk --http2 -D - -o /dev/null "https://127.0.0.1:$PORT/healthz" | sed 's/^/   client| /'

echo
echo "== xdpqctl status"
"$XDPQCTL" --socket "$CTL" status | sed 's/^/   | /'

echo
echo "== stopping xdpqd (SIGTERM: graceful drain)"
kill -TERM $PID
wait $PID || true
trap - EXIT
grep -E "stats " "$LOG" | sed 's/.*stats /   counters: /' | cut -c1-400
rm -rf "$OUT"
echo "== demo done"
