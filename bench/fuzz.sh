#!/usr/bin/env bash
# Runs xdpq's fuzz harnesses for as long as asked (libFuzzer, clang, ASan +
# UBSan), on the committed corpora; new inputs and crashes go to scratch
# directories that are printed. A crash becomes a unit test and its input
# a corpus file (tests/fuzz/corpus/NAME/).
#   bench/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]     # default: 600, all
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
bash scripts/setup.sh
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(packet endpoint h1 h2 h3 config)
  [[ -x build/fuzz/tests/fuzz/fuzz_xdp ]] && harnesses+=(xdp)
fi
status=0
for h in "${harnesses[@]}"; do
  tests/fuzz/run_fuzzer.sh "build/fuzz/tests/fuzz/fuzz_$h" "tests/fuzz/corpus/$h" "$seconds" ||
    status=1
done
exit $status
