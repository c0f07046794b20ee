#!/usr/bin/env bash
# Builds and runs the sparse MLA phase lab (sparse_mla_phases.cu) against the current src/backend/cuda/sparse_mla.cu.
# Needs nvcc and an sm_90a GPU; writes its build into .stage/lab (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p .stage/lab
python3 bench/cuda/lab/sparse_mla_stamps.py src/backend/cuda/sparse_mla.cu .stage/lab/sparse_mla_stamped.cu
cp bench/cuda/lab/sparse_mla_phases.cu .stage/lab/
nvcc -O3 -std=c++20 --generate-code=arch=compute_90a,code=sm_90a -Isrc .stage/lab/sparse_mla_phases.cu \
    -o .stage/lab/sparse_mla_phases
[ "${BUILD_ONLY:-0}" = 1 ] || .stage/lab/sparse_mla_phases
