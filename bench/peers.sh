#!/usr/bin/env bash
# The HTTP/3 peers users pick, nginx 1.26 (`http3 on`) and HAProxy 3.0 (its
# own QUIC), come from Debian 13: Debian 12 has neither HTTP/3 build. This
# makes a Debian 13 (trixie) chroot holding them, with curl (HTTP/3 over
# OpenSSL 3.5's QUIC) as an independent client, once; later calls reuse it.
#   bench/peers.sh [DIR]      # default /var/lib/xdpq-bench/trixie (or $XDPQ_TRIXIE)
# Prints DIR on success. bench/run.py runs the peers with
# `ip netns exec NS chroot DIR nginx|haproxy ...` (variants nginx-h3, haproxy-h3).
# Needs root. Downloads about 40 MB from the Debian archive ($DEBIAN_MIRROR).
set -euo pipefail

DIR="${1:-${XDPQ_TRIXIE:-/var/lib/xdpq-bench/trixie}}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
MARKER="$DIR/.xdpq-bench-complete"
PARTIAL="$DIR.partial"

die() { echo "bench/peers.sh: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (debootstrap, chroot)"

if [[ -f $MARKER ]]; then
  echo "$DIR"
  exit 0
fi
# A directory without the marker is not ours or was left half made by a
# run that this script did not finish: refuse rather than delete it.
if [[ -e $DIR ]] && [[ -n $(ls -A "$DIR" 2>/dev/null) ]]; then
  die "$DIR exists but has no $(basename "$MARKER"): not a chroot this script finished; remove it (rm -rf $DIR) and run again"
fi

if ! command -v debootstrap >/dev/null; then
  echo "installing debootstrap" >&2
  # A background apt may hold the dpkg lock: wait for it, not fail.
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
    --no-install-recommends debootstrap >&2 ||
    die "apt-get install debootstrap failed (try apt-get update first)"
fi

# Partial work lives beside DIR; only a finished tree is renamed into place.
if [[ -e $PARTIAL ]]; then
  umount -R "$PARTIAL/proc" 2>/dev/null || true
  rm -rf --one-file-system "$PARTIAL"
fi
mkdir -p "$(dirname "$DIR")"
LOG="$(dirname "$DIR")/debootstrap-$(basename "$DIR").log"
echo "debootstrap trixie into $PARTIAL (log: $LOG)" >&2
if ! debootstrap --variant=minbase --include=nginx,haproxy,curl,ca-certificates \
    trixie "$PARTIAL" "$MIRROR" >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  [[ -f $PARTIAL/debootstrap/debootstrap.log ]] && tail -n 30 "$PARTIAL/debootstrap/debootstrap.log" >&2
  die "debootstrap failed (full log: $LOG); partial tree left in $PARTIAL"
fi

# Check that the peers can do HTTP/3 before calling the chroot complete.
check() { chroot "$PARTIAL" "$@"; }
NGINX_V=$(check nginx -V 2>&1) || die "nginx does not run in the chroot: $NGINX_V"
grep -q -- --with-http_v3_module <<<"$NGINX_V" || die "the chroot's nginx lacks http_v3: $NGINX_V"
HAPROXY_V=$(check haproxy -vv 2>&1) || die "haproxy does not run in the chroot: $HAPROXY_V"
grep -q "USE_QUIC=1" <<<"$HAPROXY_V" || grep -q "+QUIC" <<<"$HAPROXY_V" ||
  die "the chroot's haproxy lacks QUIC"
CURL_V=$(check curl -V 2>&1) || die "curl does not run in the chroot: $CURL_V"
grep -q HTTP3 <<<"$CURL_V" || die "the chroot's curl lacks HTTP/3: $CURL_V"

# The packages' services never run here; bench/run.py starts the daemons
# itself with its own configurations.
rm -f "$PARTIAL"/etc/nginx/sites-enabled/default
mkdir -p "$PARTIAL/xdpq-bench"

{
  echo "made $(date -u +%FT%TZ) by bench/peers.sh from $MIRROR"
  head -n1 <<<"$NGINX_V"
  head -n1 <<<"$HAPROXY_V"
  head -n1 <<<"$CURL_V"
} >"$PARTIAL/.xdpq-bench-complete.tmp"
mv "$PARTIAL/.xdpq-bench-complete.tmp" "$PARTIAL/.xdpq-bench-complete"
[[ -d $DIR ]] && rmdir "$DIR"
mv "$PARTIAL" "$DIR"
cat "$MARKER" >&2
echo "$DIR"
