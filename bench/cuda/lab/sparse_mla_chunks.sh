#!/usr/bin/env bash
# Builds the per-chunk stamp lab (sparse_mla_chunks.cu) against the current src/backend/cuda/sparse_mla.cu, here or
# on the GPU machine (nvcc only; the binary needs an sm_90a GPU): .stage/lab/sparse_mla_chunks (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p .stage/lab
python3 bench/cuda/lab/sparse_mla_chunks.py src/backend/cuda/sparse_mla.cu .stage/lab/sparse_mla_chunks_stamped.cu
cp bench/cuda/lab/sparse_mla_chunks.cu .stage/lab/
"${NVCC:-/usr/local/cuda/bin/nvcc}" -O3 -std=c++20 --expt-relaxed-constexpr \
    --generate-code=arch=compute_90a,code=sm_90a -Isrc .stage/lab/sparse_mla_chunks.cu -o .stage/lab/sparse_mla_chunks
