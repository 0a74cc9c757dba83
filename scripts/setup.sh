#!/usr/bin/env bash
# Installs every Debian package xdpq needs to build, run and test.
# Idempotent: packages already present (at the required version) are
# skipped, so a second run is quick.
#
# The QUIC stack comes from Debian's own bookworm-backports suite: ngtcp2
# 1.11 and nghttp3 1.8 (the versions Debian 13 ships; bookworm itself has
# only the 2022 pre-1.0 ngtcp2 0.12 / nghttp3 0.8), and libbpf 1.4.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build ccache pkg-config git
  # TLS, HTTP/2, HTTP/1.1, config
  libgnutls28-dev nettle-dev libssl-dev libnghttp2-dev libhttp-parser-dev libtomlplusplus-dev
  # XDP and capture
  libxdp-dev libpcap-dev clang llvm libclang-rt-14-dev
  # tests
  libgtest-dev libgmock-dev nghttp2-client python3-h2 python3-scapy python3-websockets nftables
  iproute2 openssl
  curl python3 procps ethtool iputils-ping tcpdump util-linux
  # packaging (man pages, the .deb)
  help2man dpkg-dev adduser
  # benchmarks
  libbenchmark-dev nginx-light python3-matplotlib
)
# From bookworm-backports, with the minimum version each must have.
BACKPORTS=(
  "libngtcp2-dev 1.11" "libngtcp2-crypto-gnutls-dev 1.11" "libnghttp3-dev 1.8"
  "ngtcp2-client 1.11" "ngtcp2-server 1.11" "libbpf-dev 1:1.4"
)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

installed_version() { # prints nothing (and succeeds) when not installed
  { dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null || true; } |
    sed -n 's/^install ok installed //p'
}

missing=()
for p in "${PACKAGES[@]}"; do
  [[ -n "$(installed_version "$p")" ]] || missing+=("$p")
done
missing_bpo=()
for entry in "${BACKPORTS[@]}"; do
  read -r p min <<<"$entry"
  v=$(installed_version "$p")
  if [[ -z "$v" ]] || dpkg --compare-versions "$v" lt "$min"; then missing_bpo+=("$p"); fi
done

if ((${#missing[@]} + ${#missing_bpo[@]} == 0)); then
  echo "setup: all packages present" >&2
  exit 0
fi

if ((${#missing_bpo[@]})); then
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [[ "$codename" == bookworm ]] &&
     ! grep -rqsE --include='*.list' --include='*.sources' '^[^#]*bookworm-backports' \
       /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "setup: adding Debian's bookworm-backports suite" >&2
    $SUDO tee /etc/apt/sources.list.d/debian-backports.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
fi

echo "setup: installing ${missing[*]} ${missing_bpo[*]}" >&2
$SUDO apt-get update -qq
if ((${#missing[@]})); then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ((${#missing_bpo[@]})); then
  target=()
  if [[ "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" == bookworm ]]; then
    target=(-t bookworm-backports)
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${target[@]}" "${missing_bpo[@]}" >/dev/null
fi
for entry in "${BACKPORTS[@]}"; do
  read -r p min <<<"$entry"
  v=$(installed_version "$p")
  if [[ -z "$v" ]] || dpkg --compare-versions "$v" lt "$min"; then
    echo "setup: $p is ${v:-missing}, xdpq needs >= $min (bookworm-backports)" >&2
    exit 1
  fi
done
