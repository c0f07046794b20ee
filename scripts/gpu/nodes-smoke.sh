#!/usr/bin/env bash
# Run THERE (called by scripts/gpu/cuda.sh nodes): ranks in several processes and pipeline stages on the CUDA
# backend, on one GPU (issue 53). Two processes share GPU 0 (CUDA allows it; NCCL would refuse two ranks on one
# device, so ranks in one process meet through host memory, --tp-transport thread):
#   - `logits --pp 2` as one process (two stages, threads) against one process without stages, and the same with
#     --batch-invariant, where the micro-batches must not change a bit;
#   - `logits --pp 2` as two processes (a stage each, the hidden states over gloo) against one process with two
#     stages, and `--tp 2` as two processes (collectives over gloo) against two ranks in threads: bit for bit;
#   - greedy `generate --pp 2` on two processes, and with MTP speculation on two stages in one process, against
#     one process's plain tokens.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=build-cuda/megactx
model=build-cuda/models/tiny
work=$(mktemp -d)
fail=0
port=29800
toks="--tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7,9 --chunk 5 --device cuda --kv-cache-dtype f32"
two_nodes() {  # the same command as node 1 and node 0; node 0's stdout in $work/out
    port=$((port + 1))
    local a="--nnodes 2 --dist-init-addr 127.0.0.1:$port --dist-timeout 60"
    "$bin" "$@" $a --node-rank 1 >/dev/null 2>"$work/n1.err" &
    local f=$!
    "$bin" "$@" $a --node-rank 0 >"$work/out" 2>"$work/n0.err" || { echo "FAIL: node 0 of: $*"; tail -3 "$work/n0.err"; fail=1; }
    wait $f || { echo "FAIL: node 1 of: $*"; tail -3 "$work/n1.err"; fail=1; }
}
same() {  # bit for bit
    if cmp -s "$work/$1" "$work/$2"; then echo "ok: $3: bit for bit"; else echo "FAIL: $3 differ"; fail=1; fi
}
close() {  # max |a - b| / max |a|
    python3 -c "
import numpy as np, sys
a, b = np.load('$work/$1'), np.load('$work/$2')
d = float(np.abs(a - b).max() / np.abs(a).max())
print('$3: max |diff| / max |logit| = %.2e' % d)
sys.exit(0 if d < 1e-4 else 1)" || fail=1
}
"$bin" logits --model "$model" $toks --out "$work/one.npy" 2>/dev/null || fail=1
"$bin" logits --model "$model" $toks --pp 2 --tp-transport thread --out "$work/pp2.npy" 2>/dev/null || fail=1
close one.npy pp2.npy "one process, PP 2 (threads) against no stages"
"$bin" logits --model "$model" $toks --batch-invariant --out "$work/one-bi.npy" 2>/dev/null || fail=1
"$bin" logits --model "$model" $toks --batch-invariant --pp 2 --tp-transport thread --out "$work/pp2-bi.npy" \
    2>/dev/null || fail=1
same one-bi.npy pp2-bi.npy "--batch-invariant: PP 2 (threads) against no stages"
two_nodes logits --model "$model" $toks --pp 2 --tp-transport thread --out "$work/nodes-pp2.npy"
same pp2.npy nodes-pp2.npy "PP 2 as two processes against two stages in one process"
"$bin" logits --model "$model" $toks --tp 2 --tp-transport thread --out "$work/tp2.npy" 2>/dev/null || fail=1
two_nodes logits --model "$model" $toks --tp 2 --out "$work/nodes-tp2.npy"
same tp2.npy nodes-tp2.npy "TP 2 as two processes (gloo) against two ranks in threads"
gen="generate --model $model --tokens 1,2,3,4,5,6,7,8 --max-new-tokens 24 --ignore-eos --device cuda --kv-cache-dtype f32"
"$bin" $gen >"$work/gen-one" 2>/dev/null || fail=1
two_nodes $gen --pp 2 --tp-transport thread
if cmp -s "$work/out" "$work/gen-one"; then echo "ok: generate --pp 2 on two processes = one process"; else
    echo "FAIL: generate --pp 2 on two processes: [$(cat "$work/out")] against [$(cat "$work/gen-one")]"; fail=1; fi
# MTP speculation over two stages in one process on the GPU (the MTP layer on stage 1): the plain tokens
"$bin" $gen --pp 2 --tp-transport thread --speculative-tokens 2 >"$work/gen-spec" 2>"$work/spec.err" || fail=1
if cmp -s "$work/gen-spec" "$work/gen-one"; then echo "ok: generate --pp 2 --speculative-tokens 2 = plain ($(grep -o 'MTP drafts.*' "$work/spec.err" | head -1))"; else
    echo "FAIL: generate --pp 2 --speculative-tokens 2: [$(cat "$work/gen-spec")] against [$(cat "$work/gen-one")]"; fail=1; fi
rm -rf "$work"
echo "nodes-smoke: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
