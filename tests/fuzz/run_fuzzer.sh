#!/usr/bin/env bash
# Runs one libFuzzer harness for SECONDS on the committed corpus (read
# only: new inputs go to a scratch directory). A crash leaves its input in
# the scratch directory, which is printed; turn it into a unit test.
#   run_fuzzer.sh BINARY CORPUS_DIR SECONDS
set -euo pipefail
bin=$(realpath "$1") corpus=$(realpath "$2") seconds=$3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/xdpq-fuzz-$(basename "$bin").XXXXXX")
echo "fuzzing $(basename "$bin") for ${seconds}s (new inputs and crashes in $scratch)"
cd "$scratch"
exec "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 -print_final_stats=1 \
  "$scratch" "$corpus"
