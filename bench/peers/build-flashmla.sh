#!/usr/bin/env bash
# Builds build-peers/flashmla_decode_bench (bench/peers/flashmla_decode_bench.cu, the peer row of
# bench_sparse_mla's decode table) against DeepSeek's FlashMLA sm90 sparse FP8 decode kernels, without PyTorch.
# FlashMLA is not part of this repository: pass git directories of deepseek-ai/FlashMLA (measured at 9241ae3) and
# NVIDIA/cutlass (FlashMLA's submodule commit, 147f567):
#   FLASHMLA_GIT=/path/FlashMLA/.git CUTLASS_GIT=/path/cutlass/.git bash bench/peers/build-flashmla.sh
# Run: build-peers/flashmla_decode_bench --heads 64,128 --batch 1,16,64,128 --json out.json (an sm_90 GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
: "${FLASHMLA_GIT:?set FLASHMLA_GIT to a git directory of deepseek-ai/FlashMLA}"
: "${CUTLASS_GIT:?set CUTLASS_GIT to a git directory of NVIDIA/cutlass}"
FLASHMLA_COMMIT=${FLASHMLA_COMMIT:-9241ae3ef9bac614dd25e45e507e089f888280e0}
CUTLASS_COMMIT=${CUTLASS_COMMIT:-147f5673d0c1c3dcf66f78d677fd647e4a020219}
out=build-peers
src=$out/flashmla/csrc
cut=$out/cutlass
mkdir -p "$out/obj"
[ -d "$src" ] || { mkdir -p "$out/flashmla" && git --git-dir="$FLASHMLA_GIT" archive "$FLASHMLA_COMMIT" csrc | tar -x -C "$out/flashmla"; }
[ -d "$cut/include" ] || { mkdir -p "$cut" && git --git-dir="$CUTLASS_GIT" archive "$CUTLASS_COMMIT" include tools/util/include | tar -x -C "$cut"; }
# FlashMLA's setup.py flags for sm_90a.
flags=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -Wno-deprecated-declarations -U__CUDA_NO_HALF_OPERATORS__
    -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__
    --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math --ptxas-options=--register-usage-level=10
    -gencode arch=compute_90a,code=sm_90a -I"$src" -I"$src/kerutils/include" -I"$src/sm90" -I"$cut/include"
    -I"$cut/tools/util/include" -Ibench/cuda)
units=("$src/sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu"
    "$src/sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu"
    "$src/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"
    "$src/smxx/decode/combine/combine.cu" bench/peers/flashmla_decode_bench.cu)
objs=()
for u in "${units[@]}"; do
    o=$out/obj/$(basename "$u" .cu).o
    "$NVCC" "${flags[@]}" -c "$u" -o "$o"
    objs+=("$o")
done
"$NVCC" -gencode arch=compute_90a,code=sm_90a -cudart static -Xcompiler -static-libstdc++,-static-libgcc \
    -o "$out/flashmla_decode_bench" "${objs[@]}"
strip "$out/flashmla_decode_bench"
ls -l "$out/flashmla_decode_bench"
