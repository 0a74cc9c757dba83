#!/usr/bin/env bash
# Runs every xdpq test on a fresh Debian 12 machine: installs the packages,
# then builds and runs the whole suite twice: the dev build (warnings as
# errors), and the ASan+UBSan build (memory errors, leaks and undefined
# behaviour fail the run; the integration suites drive the sanitized xdpqd);
# both replay the fuzz corpora. Before them, each libFuzzer harness (clang,
# ASan + UBSan) fuzzes for FUZZ_SECONDS (default 20).
#   scripts/test.sh                 # everything
#   SKIP_SANITIZERS=1 SKIP_FUZZ=1 scripts/test.sh -L unit   # quick: dev build, unit only
# Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"

# The release build (the demo's and the benchmarks') must build warning-free
# too; it runs first so the test summary is the last thing printed.
echo "== release: build"
cmake --preset release -DXDPQ_WERROR=ON >/dev/null
cmake --build --preset release
# The Debian package's build (Release, prefix /usr); integration.package
# installs what scripts/package.sh makes of it.
echo "== package: build"
cmake --preset package -DXDPQ_WERROR=ON >/dev/null
cmake --build --preset package

if [[ "${SKIP_FUZZ:-0}" != 1 ]]; then
  echo "== fuzz: build (clang, libFuzzer) and ${FUZZ_SECONDS:-20} s per harness"
  cmake --preset fuzz -DXDPQ_FUZZ_SECONDS="${FUZZ_SECONDS:-20}" >/dev/null
  cmake --build --preset fuzz
  ctest --preset fuzz
fi

presets=(dev)
[[ "${SKIP_SANITIZERS:-0}" == 1 ]] || presets+=(asan-ubsan)
for p in "${presets[@]}"; do
  echo "== $p: configure and build"
  cmake --preset "$p" -DXDPQ_WERROR=ON >/dev/null
  cmake --build --preset "$p"
  echo "== $p: tests"
  ctest --preset "$p" "$@"
done

