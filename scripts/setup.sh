#!/usr/bin/env bash
# Installs every Debian package xdpq needs to build, run and test.
# Idempotent: packages already present are skipped, so a second run is quick.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build ccache pkg-config git
  # QUIC / HTTP/3 / TLS
  libngtcp2-dev libngtcp2-crypto-gnutls-dev libnghttp3-dev libgnutls28-dev
  libssl-dev libnghttp2-dev libhttp-parser-dev libtoml11-dev
  # XDP (later issues) and capture
  libbpf-dev libxdp-dev libpcap-dev clang llvm
  # tests
  libgtest-dev libgmock-dev ngtcp2-client ngtcp2-server nghttp2-client python3-h2
  iproute2 openssl
  curl python3 procps ethtool iputils-ping tcpdump util-linux
  # benchmarks
  libbenchmark-dev nginx-light python3-matplotlib
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present" >&2
fi
