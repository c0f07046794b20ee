#!/usr/bin/env bash
# Run ON THE GPU MACHINE from a lab folder holding test_cuda_ops, test_cuda_model, megactx and lib/ (the Debian
# shared libraries the GPU host lacks), inside the repository copy: the CUDA backend's tests, then the CLI on a
# fixture with each KV format (logits against transformers' reference), then compute-sanitizer on a few cases.
# Full logs go to $OUT; stdout gets a summary.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib
export MEGACTX_FIXTURE_DIR=${MEGACTX_FIXTURE_DIR:-$(cd ../../tests/fixtures && pwd)}
export MEGACTX_CUDA_SYNC=1  # each op waits for its kernels, so a fault names its op
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
summary() { grep -E '^\[  (PASSED|FAILED) |tests ran|Failure|error:' "$1" | head -n 30; }
timeout 80 ./test_cuda_ops > "$out/test_cuda_ops.log" 2>&1; echo "test_cuda_ops rc=$?"; summary "$out/test_cuda_ops.log"
timeout 90 ./test_cuda_model > "$out/test_cuda_model.log" 2>&1; echo "test_cuda_model rc=$?"; summary "$out/test_cuda_model.log"
fx=$MEGACTX_FIXTURE_DIR/freq_offset_f32
for kv in f32 bf16 fp8; do
    ./megactx logits --device cuda --kv-cache-dtype "$kv" --model "$fx" --tokens-file "$fx/tokens.json" \
        --chunk 7 --out "$out/logits_$kv.npy" > "$out/cli_$kv.log" 2>&1
    echo "cli kv $kv rc=$?: $(tail -n 2 "$out/cli_$kv.log" | tr '\n' ' ')"
    python3 -c "import numpy as np; a=np.load('$out/logits_$kv.npy'); r=np.load('$fx/ref_logits.npy'); print('  max|logits-ref|/max|ref| = %.2e' % (abs(a-r).max()/abs(r).max()))"
done
cs=/usr/local/cuda/bin/compute-sanitizer
timeout 20 $cs --tool memcheck --print-limit 5 ./test_cuda_model \
    --gtest_filter='*explicit_fp8_fp8_chunk7*:*pattern_bf16_bf16_chunk0*' > "$out/sanitizer_model.log" 2>&1
echo "sanitizer model rc=$?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/sanitizer_model.log" | tr '\n' ' ')"
timeout 20 $cs --tool memcheck --print-limit 5 ./test_cuda_ops \
    --gtest_filter='*FusedCacheWrites*:*MlpAndMoe*:*AbsorbAndExpand*:*Norms*' > "$out/sanitizer_ops.log" 2>&1
echo "sanitizer ops rc=$?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/sanitizer_ops.log" | tr '\n' ' ')"
