#!/usr/bin/env bash
# Run THERE (called by scripts/gpu/cuda.sh serve): the issue-4 serving-overhead measurement on a machine with
# spare cores. The engine (bench_engine) and the server (megactx serve) each get cores 0-1 alone; the HTTP
# client (bench/bench_serve.py) runs on the other cores, so its CPU no longer competes with the server's (on the
# 2-core dev box it did: docs/benchmarks.md). Same workload and settings as scripts/bench-serve.sh (small preset,
# 45-word prompts, 64 tokens, logprobs 0), engine and server alternating at each level for ROUNDS rounds.
#   scripts/gpu/serve-overhead.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
rounds=${ROUNDS:-3}
levels=${LEVELS:-1,8,32,64}
bin=build-cuda/megactx
model=/tmp/megactx-small
[ -f "$model/config.json" ] || "$bin" gen-model --preset small --seed 0 --out "$model" >/dev/null
prompts=.stage/gpu/prompts.json
engine_args=(--max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 1024 --kv-cache-memory 256MiB)
server_args=()
for a in "${engine_args[@]}" --no-prefix-caching; do server_args+=("--server-arg=$a"); done
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/serve-cpu.txt"
for r in $(seq 1 "$rounds"); do
    for c in ${levels//,/ }; do
        taskset -c 0,1 build-cuda/bench/bench_engine --model "$model" --prompts "$prompts" --max-tokens 64 \
            --min-requests 16 --per-stream 1 --logprobs 0 --levels "$c" "${engine_args[@]}" --prefix-caching off \
            --out "$out/engine-$r-$c.json" >/dev/null
        taskset -c 2-15 python3 bench/bench_serve.py --bin "$bin" --model "$model" --prompts "$prompts" \
            --server-cpus 0,1 --max-tokens 64 --min-requests 16 --per-stream 1 --levels "$c" "${server_args[@]}" \
            --engine-json "$out/engine-$r-$c.json" --out "$out/server-$r-$c.json" | tail -1
    done
done
python3 - "$out" "$rounds" "$levels" <<'PY'
import json, statistics, sys
out, rounds, levels = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")]
rows = []
print("    C  engine tok/s (rounds)        server tok/s (rounds)        overhead/token median (rounds)")
for c in levels:
    e = [json.load(open(f"{out}/engine-{r}-{c}.json"))["levels"][0] for r in range(1, rounds + 1)]
    s = [json.load(open(f"{out}/server-{r}-{c}.json"))["levels"][0] for r in range(1, rounds + 1)]
    ovh = [a["output_tok_s"] / b["output_tok_s"] - 1 for a, b in zip(e, s)]
    rows.append({"concurrency": c, "engine_tok_s": [x["output_tok_s"] for x in e],
                 "server_tok_s": [x["output_tok_s"] for x in s], "overhead_per_round": ovh,
                 "overhead_median": statistics.median(ovh),
                 "server_ttft_ms_p50": [x["ttft_ms"]["p50"] for x in s], "server_itl_ms_p50": [x["itl_ms"]["p50"] for x in s],
                 "server_itl_ms_p99": [x["itl_ms"]["p99"] for x in s],
                 "engine_ttft_ms_p50": [x["ttft_ms"]["p50"] for x in e], "engine_itl_ms_p50": [x["itl_ms"]["p50"] for x in e]})
    f = lambda v: " ".join(f"{x:.0f}" for x in v)
    print(f"{c:5d}  {f(rows[-1]['engine_tok_s']):28s} {f(rows[-1]['server_tok_s']):28s} "
          f"{100 * statistics.median(ovh):.1f}% ({' '.join(f'{100 * x:.1f}' for x in ovh)})")
json.dump({"levels": rows, "cpu": open(f"{out}/serve-cpu.txt").read()}, open(f"{out}/serve-overhead.json", "w"), indent=2)
PY
