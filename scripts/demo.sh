#!/usr/bin/env bash
# Sets up megactx on a fresh Debian 12 machine and runs the main job on the embedded default model:
# a deterministic random tiny GLM-DSA model (IndexShare + MoE + MTP) that the build generates.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMEGACTX_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target megactx default_model
echo "== megactx generate (embedded tiny model, greedy) =="
./build/megactx generate --tokens 11,22,33,44,55,66,77,88 --max-new-tokens 24 --ignore-eos
echo "== megactx logits, one pass vs token-by-token =="
./build/megactx logits --tokens 11,22,33,44,55,66,77,88 --out build/demo_logits.npy
./build/megactx logits --tokens 11,22,33,44,55,66,77,88 --out build/demo_logits_chunk1.npy --chunk 1
cmp build/demo_logits.npy build/demo_logits_chunk1.npy && echo "identical logits"
