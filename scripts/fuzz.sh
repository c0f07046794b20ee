#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for N seconds (default 60) from the seed
# corpora in tests/fuzz/corpus/. New inputs go to build-fuzz/corpus/ (the seeds are not modified); a crash
# leaves its input in build-fuzz/ and makes this script exit non-zero.
#   scripts/fuzz.sh [seconds]
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGACTX_FUZZ=ON \
    -DMEGACTX_TESTS=ON -DMEGACTX_BENCH=OFF > /dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_targets

status=0
for target in safetensors config tool_parser tokenizer api_request grammar; do
    work="$build/corpus/$target"
    mkdir -p "$work"
    echo "== fuzz_$target for ${seconds}s"
    (cd "$build" && "./tests/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 "$work" "$root/tests/fuzz/corpus/$target") || status=1
done
exit "$status"
