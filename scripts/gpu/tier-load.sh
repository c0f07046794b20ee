#!/usr/bin/env bash
# Run THERE (called by scripts/gpu/cuda.sh tierload): the host KV tier's throughput against concurrency where the
# GPU alone must queue (issue 50). glm52-shape (4 layers, IndexShare FSSS, FP8 weights and cache) served over HTTP
# (bench/bench_serve.py with synthetic prompts of L token ids), at each context L: the GPU alone with a device KV
# budget that holds a couple of sequences, against the same device budget with a host tier beside it; closed-loop
# levels of C clients, one request each (so a level prefills C sequences of L), TIERLOAD_TOKENS greedy tokens
# each. Output tokens/s, TPOT (inter-token latency) p50 / p99 and TTFT per level, and the tier's throughput against
# the GPU's.
#   scripts/gpu/tier-load.sh OUTDIR
# TIERLOAD_CASES: "L:DEVICE_KV:HOST_KV ..." (default 131072:1GiB:8GiB; 1M: 1048576:8GiB:60GiB; the server logs what
# each holds); TIERLOAD_LEVELS (default 1,2,4,8); TIERLOAD_TOKENS (default 1024: with 64 new tokens after 128K of
# prompt the run is prefill, docs/benchmarks.md); BIN, TIERLOAD_MODEL, TIERLOAD_DEVICE and TIERLOAD_KV run it
# elsewhere (the dev box checks it with the tiny model on the CPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1
bin=${BIN:-build-cuda/megactx}
model=${TIERLOAD_MODEL:-/tmp/glm52-4e}
[ -f "$model/config.json" ] || "$bin" gen-model --preset glm52-shape --layers 4 --dtype fp8 --index-pattern FSSS \
    --out "$model" >/dev/null
vocab=$(python3 -c "import json; print(json.load(open('$model/config.json'))['vocab_size'])")
levels=${TIERLOAD_LEVELS:-1,2,4,8}
for cfg in ${TIERLOAD_CASES:-131072:1GiB:8GiB}; do
    IFS=: read -r L dev host <<<"$cfg"
    for mode in gpu tier; do
        args=("--server-arg=--device=${TIERLOAD_DEVICE:-cuda}" "--server-arg=--kv-cache-dtype=${TIERLOAD_KV:-fp8}" "--server-arg=--max-model-len=$L"
            "--server-arg=--kv-cache-memory=$dev" --server-arg=--max-num-seqs=16 --server-arg=--no-prefix-caching)
        [ "$mode" = tier ] && args+=("--server-arg=--kv-offload-memory=$host")
        echo "== L $L, $mode (device KV $dev$([ "$mode" = tier ] && echo ", host KV $host"))"
        python3 bench/bench_serve.py --bin "$bin" --model "$model" --prompt-tokens $((L - 128)) --vocab "$vocab" \
            --count 16 --levels "$levels" --max-tokens "${TIERLOAD_TOKENS:-1024}" --min-requests 0 --per-stream 1 \
            --logprobs -1 "${args[@]}" --out "$out/tierload-$L-$mode.json" 2>&1 | tail -"$(( $(tr ',' '\n' <<<"$levels" | wc -l) + 1 ))"
    done
done
python3 - "$out" <<'PY'
import glob, json, os, re, sys
out = sys.argv[1]
runs = {}
for f in glob.glob(os.path.join(out, "tierload-*-*.json")):
    L, mode = re.search(r"tierload-(\d+)-(\w+)\.json", f).groups()
    runs[(int(L), mode)] = json.load(open(f))
print("L        C   GPU tok/s  tier tok/s  tier/GPU  TPOT p50/p99 ms GPU   tier          TTFT p50 s GPU / tier")
for L in sorted({k[0] for k in runs}):
    g, t = runs.get((L, "gpu")), runs.get((L, "tier"))
    if not g or not t:
        continue
    for lg, lt in zip(g["levels"], t["levels"]):
        print(f"{L:<8} {lg['concurrency']:<3} {lg['output_tok_s']:9.1f} {lt['output_tok_s']:11.1f} "
              f"{lt['output_tok_s'] / lg['output_tok_s']:8.2f}  {lg['itl_ms']['p50']:6.2f}/{lg['itl_ms']['p99']:<7.2f} "
              f"{lt['itl_ms']['p50']:6.2f}/{lt['itl_ms']['p99']:<7.2f} {lg['ttft_ms']['p50'] / 1e3:8.2f} / "
              f"{lt['ttft_ms']['p50'] / 1e3:.2f}")
PY
