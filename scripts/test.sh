#!/usr/bin/env bash
# Runs every xdpq test on a fresh Debian 12 machine: installs the packages,
# builds the dev preset (warnings as errors) and runs the whole suite.
#   scripts/test.sh            # everything
#   scripts/test.sh -L unit    # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
cmake --preset dev -DXDPQ_WERROR=ON >/dev/null
cmake --build --preset dev
ctest --preset dev --output-on-failure "$@"
