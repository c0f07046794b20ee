#!/usr/bin/env bash
# Builds the wgmma chain lab (wgmma_chain.cu) into .stage/lab (git-ignored); run .stage/lab/wgmma_chain on an sm_90a GPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p .stage/lab
"${NVCC:-/usr/local/cuda/bin/nvcc}" -O3 -std=c++17 --generate-code=arch=compute_90a,code=sm_90a \
    bench/cuda/lab/wgmma_chain.cu -o .stage/lab/wgmma_chain
