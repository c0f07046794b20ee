#!/usr/bin/env bash
# Run THERE: builds bench_cpu and runs the issue-2 CPU benchmark pinned to 2 cores (a quiet machine gives
# stable numbers). Args are passed to bench_cpu. Results go to $OUT (or ./bench-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench-out}
mkdir -p "$out"
bash scripts/gpu/install-staged.sh
cmake -S . -B build-gpu-cpu -DCMAKE_BUILD_TYPE=Release -DMEGACTX_TESTS=OFF >/dev/null
cmake --build build-gpu-cpu -j16 --target bench_cpu >/dev/null
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$out/cpu.txt"
taskset -c 0,1 ./build-gpu-cpu/bench/bench_cpu --threads 2 "$@" 2>&1 | tee "$out/bench.log"
