#!/usr/bin/env bash
# Builds the Debian package xdpq_VERSION_ARCH.deb: xdpqd and xdpqctl in
# /usr/sbin, h3load in /usr/bin, the systemd unit (the xdpq user with
# capabilities, not root), a commented /etc/xdpq/xdpq.toml (a conffile), a man
# page per program, the README; postinst creates the xdpq system user.
#   scripts/package.sh            # prints the path of the .deb
#   dpkg -i build/package/xdpq_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."

# 0.2.0~gitN.HASH from a git checkout: each commit's package is newer than
# the last (dpkg compares N as a number; a shallow clone counts fewer, so
# build packages from a full one), older than the 0.2.0 release (~), and
# says which commit it is. Where git cannot say (a source tarball, or a
# checkout git refuses as another user's), the version is not guessed:
# XDPQ_VERSION_SUFFIX names it ("" for the release itself).
if [[ -n "${XDPQ_VERSION_SUFFIX+set}" ]]; then
  suffix="$XDPQ_VERSION_SUFFIX"
elif n=$(git rev-list --count HEAD) && h=$(git rev-parse --short=8 HEAD); then
  suffix="~git$n.$h"
else
  echo "package: git cannot name this commit (see above); set XDPQ_VERSION_SUFFIX," \
       "e.g. XDPQ_VERSION_SUFFIX='~local1', or '' to build the release version" >&2
  exit 1
fi
bash scripts/setup.sh >&2
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
cmake --preset package -DXDPQ_VERSION_SUFFIX="$suffix" >/dev/null
cmake --build --preset package >&2
rm -f build/package/xdpq_*.deb
(cd build/package && cpack -G DEB >&2)
deb=$(ls build/package/xdpq_*.deb)
dpkg-deb --info "$deb" >&2
echo "$deb"
