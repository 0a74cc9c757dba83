#!/usr/bin/env bash
# The main job: builds xdpqd, starts it on its embedded default
# configuration (self-signed certificate, embedded page, kernel UDP
# dataplane) and fetches pages from it over HTTP/3 with gtlsclient,
# printing what came back.
set -euo pipefail
cd "$(dirname "$0")/.."

# XDPQ_DEMO_BIN: a directory holding already built xdpqd and xdpqctl (the
# test suite runs the demo on its own build this way); otherwise set up the
# machine and build the release preset.
if [ -n "${XDPQ_DEMO_BIN:-}" ]; then
  XDPQD="$XDPQ_DEMO_BIN/xdpqd" XDPQCTL="$XDPQ_DEMO_BIN/xdpqctl"
else
  bash scripts/setup.sh
  cmake --preset release >/dev/null
  cmake --build --preset release >/dev/null
  XDPQD=build/release/xdpqd XDPQCTL=build/release/xdpqctl
fi

PORT="${PORT:-4433}"
LOG="$(mktemp -t xdpqd-demo.XXXXXX.log)"
OUT="$(mktemp -d -t xdpq-demo.XXXXXX)"
CTL="$OUT/xdpqd.sock"
echo "== starting xdpqd on 127.0.0.1:$PORT (log: $LOG)"
"$XDPQD" --listen "127.0.0.1:$PORT" --listen "[::1]:$PORT" --control-socket "$CTL" >"$LOG" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  grep -q "ready:" "$LOG" && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
sed 's/^/   server| /' "$LOG"
grep -q "ready:" "$LOG" || { echo "demo: xdpqd did not say ready within 20 s" >&2; exit 1; }

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

# ---------------------------------------------------------------------------
# Part two: what xdpq is for. Two network namespaces joined by a veth pair
# (a stand-in for a NIC queue and the network behind it); xdpqd attaches its
# XDP program to the server side and serves QUIC from an AF_XDP socket, while
# TCP and ping still go to the kernel.
# ---------------------------------------------------------------------------
echo
if [ "$(id -u)" != 0 ]; then
  echo "== skipping the AF_XDP part: it needs root (network namespaces, XDP, AF_XDP)"
  rm -rf "$OUT"
  echo "== demo done"
  exit 0
fi
SNS="xdpq-demo-srv-$$" CNS="xdpq-demo-cli-$$"
SIF="xqds$$" CIF="xqdc$$"
SIP=10.78.0.1 CIP=10.78.0.2
cleanup_ns() {
  [ -n "${PID:-}" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  ip netns del "$SNS" 2>/dev/null || true
  ip netns del "$CNS" 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup_ns EXIT
echo "== AF_XDP: namespaces $SNS ($SIP) and $CNS ($CIP) joined by veth $SIF <-> $CIF"
ip netns add "$SNS"
ip netns add "$CNS"
ip link add "$SIF" type veth peer name "$CIF"
ip link set "$SIF" netns "$SNS"
ip link set "$CIF" netns "$CNS"
ip -n "$SNS" link set lo up
ip -n "$CNS" link set lo up
ip -n "$SNS" link set "$SIF" address 02:78:00:00:00:01 up
ip -n "$CNS" link set "$CIF" address 02:78:00:00:00:02 up
ip -n "$SNS" addr add "$SIP/24" dev "$SIF"
ip -n "$CNS" addr add "$CIP/24" dev "$CIF"
# AF_XDP must see each datagram as it is on a wire: no GRO on the receiving
# veth, no UDP GSO super-packets from the client's kernel.
ip netns exec "$SNS" ethtool -K "$SIF" gro off >/dev/null
ip netns exec "$CNS" ethtool -K "$CIF" tx-udp-segmentation off >/dev/null
ip netns exec "$CNS" ping -c 1 -W 2 "$SIP" >/dev/null

LOG2="$(mktemp -t xdpqd-demo-afxdp.XXXXXX.log)"
CTL2="$OUT/xdpqd-afxdp.sock"
echo "== starting xdpqd --dataplane afxdp --interface $SIF in $SNS (log: $LOG2)"
ip netns exec "$SNS" "$XDPQD" --dataplane afxdp --interface "$SIF" --xdp-mode native \
  --listen "$SIP:$PORT" --workers 1 --control-socket "$CTL2" >"$LOG2" 2>&1 &
PID=$!
for _ in $(seq 100); do
  grep -q "ready:" "$LOG2" && break
  kill -0 $PID 2>/dev/null || { cat "$LOG2"; exit 1; }
  sleep 0.1
done
grep -q "ready:" "$LOG2" || { cat "$LOG2"; echo "xdpqd did not become ready"; exit 1; }
sed 's/^/   server| /' "$LOG2"

echo
echo "== GET / and /bytes/1048576 over HTTP/3 from $CNS, through the XDP program and the AF_XDP rings"
ip netns exec "$CNS" gtlsclient --no-quic-dump --exit-on-all-streams-close --download "$OUT" \
  "$SIP" "$PORT" "https://$SIP:$PORT/" "https://$SIP:$PORT/bytes/1048576" 2>&1 \
  | grep -E '^http: stream 0x[0-9a-f]+ \[(:status|content-length)' | sed 's/^/   client| /'
echo "-- received $(stat -c %s "$OUT/1048576") bytes, sha256 $(sha256sum "$OUT/1048576" | cut -c1-16)..."

echo
echo "== TCP and ping still reach the kernel (HTTP/2 on the same address and port; ping)"
ip netns exec "$CNS" curl -sk --http2 -D - -o /dev/null "https://$SIP:$PORT/healthz" \
  | grep -Ei '^(HTTP|alt-svc)' | sed 's/^/   client| /'
ip netns exec "$CNS" ping -c 2 -i 0.2 -W 2 "$SIP" | grep -E 'packets transmitted' | sed 's/^/   ping| /'

echo
echo "== xdpqctl status"
"$XDPQCTL" --socket "$CTL2" status | sed 's/^/   | /'
echo
echo "== the XDP program's per-reason counters and the AF_XDP counters (xdpqctl stats)"
"$XDPQCTL" --socket "$CTL2" stats | awk '/^ *(xdp_|afxdp_)/ && $2 != 0' | sed 's/^/   | /'

echo
echo "== stopping xdpqd (SIGTERM): the XDP program is detached, the namespaces removed"
kill -TERM $PID
wait $PID || true
PID=
cleanup_ns
trap - EXIT
echo "== demo done"
