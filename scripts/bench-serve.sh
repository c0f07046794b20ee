#!/usr/bin/env bash
# Serving benchmark (issue 4): `megactx serve` over HTTP (bench/bench_serve.mjs) against the same workload
# through Engine::submit in-process (bench/bench_engine.cpp), on the CPU with the small preset, at 1, 8, 32 and
# 64 concurrent streams. Prints both tables and the server's overhead per output token, and writes
# bench/results/serve-<date>.json (the engine's JSON is embedded in it).
#
# The two programs alternate level by level (engine then server at each level in odd rounds, server then engine
# in even ones), ROUNDS times; at each level the round with the highest throughput of each is reported (the
# machine is shared: best-of-rounds is the run least disturbed by other work, and alternating at each level
# gives both sides the same background). The overhead is reported both from those best rounds and as the median
# over rounds of each round's back-to-back pair (engine tok/s / server tok/s − 1), the more robust of the two.
# Every run's JSON is kept under build/serve_bench/.
#
# Usage: scripts/bench-serve.sh            env: ROUNDS (2), LEVELS (1,8,32,64), MAX_TOKENS (64), WORDS (45),
#        MIN_REQUESTS (16), PER_STREAM (1), LOGPROBS (0; "none" to not ask), THREADS (2), OMP_WAIT_POLICY (passive), OUT (bench/results/serve-<date>.json)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null || { echo "bench-serve: node is required"; exit 1; }
rounds=${ROUNDS:-2}
levels=${LEVELS:-1,8,32,64}
max_tokens=${MAX_TOKENS:-64}
words=${WORDS:-45}
min_requests=${MIN_REQUESTS:-16}
per_stream=${PER_STREAM:-1}
logprobs=${LOGPROBS:-0}
export OMP_NUM_THREADS=${THREADS:-2}
# Passive: an OpenMP thread that waits at a barrier sleeps instead of spinning. On this 2-core machine, shared
# with other work, spinning made every step stall whenever another thread (the server's HTTP threads, the
# client) took a core from one of the two OpenMP threads: 3-4x slower and most of the server's "overhead"
# (docs/benchmarks.md). Set OMP_WAIT_POLICY=active (or unset it in the environment with '') to measure that.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY-passive}
[ -n "$OMP_WAIT_POLICY" ] || unset OMP_WAIT_POLICY
out=${OUT:-bench/results/serve-$(date -u +%Y-%m-%d).json}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMEGACTX_TESTS=OFF -DMEGACTX_BENCH=ON >/dev/null
cmake --build build -j2 --target megactx bench_engine >/dev/null
work=build/serve_bench
model=build/bench_models/small-seed0   # the same cache bench_cpu uses (gen-model writes tokenizer.json too)
mkdir -p "$work" bench/results
if [ ! -f "$model/config.json" ] || [ ! -f "$model/tokenizer.json" ]; then
    ./build/megactx gen-model --preset small --seed 0 --out "$model"
fi
node bench/bench_serve.mjs --write-prompts "$work/prompts.json" --count 128 --words "$words" --seed 1

# Identical engine settings in both. Prefix caching is off in both: the prompts share no prefix, but the
# levels reuse them, so with it on later levels would skip prefill depending on what the cache still holds.
engine_args=(--max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 1024 --kv-cache-memory 256MiB)
common=(--max-tokens "$max_tokens" --min-requests "$min_requests" --per-stream "$per_stream"
        --prompts "$work/prompts.json")
# logprobs: the small preset's generated tokenizer maps only 516 of its 4096 ids to text, so most tokens of
# the random model add no text and, without logprobs, no chunk; asking for logprobs (0 alternatives) gives
# every token its chunk, as a real tokenizer would (see docs/benchmarks.md).
if [ "$logprobs" != none ]; then common+=(--logprobs "$logprobs"); fi
server_args=()
for a in "${engine_args[@]}" --no-prefix-caching; do server_args+=("--server-arg=$a"); done

echo "bench-serve: OMP_NUM_THREADS=$OMP_NUM_THREADS OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-(unset)}, $rounds round(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
run_engine() {
    ./build/bench/bench_engine --model "$model" "${common[@]}" --levels "$1" "${engine_args[@]}" --prefix-caching off \
        --out "$work/engine-$2-$1.json" >/dev/null
}
run_server() {
    node bench/bench_serve.mjs --bin build/megactx --model "$model" "${common[@]}" --levels "$1" "${server_args[@]}" \
        --out "$work/server-$2-$1.json" >/dev/null
}
for r in $(seq 1 "$rounds"); do
    for c in ${levels//,/ }; do
        if [ $((r % 2)) -eq 1 ]; then run_engine "$c" "$r"; run_server "$c" "$r"; else run_server "$c" "$r"; run_engine "$c" "$r"; fi
    done
done

# Best round per level for each side, then the comparison (bench_serve.mjs prints the tables and overhead).
node -e '
const fs = require("fs");
const [work, rounds, levels] = [process.argv[1], Number(process.argv[2]), process.argv[3].split(",").map(Number)];
for (const side of ["engine", "server"]) {
  const runs = levels.map((c) => Array.from({ length: rounds }, (_, i) => JSON.parse(fs.readFileSync(`${work}/${side}-${i + 1}-${c}.json`))));
  const best = structuredClone(runs[0][0]);
  best.levels = runs.map((rs) => {
    const k = rs.reduce((b, r, i) => (r.levels[0].output_tok_s > rs[b].levels[0].output_tok_s ? i : b), 0);
    return { ...rs[k].levels[0], round: k + 1, output_tok_s_all_rounds: rs.map((r) => r.levels[0].output_tok_s),
      loadavg_at_start: rs[k].loadavg_start };
  });
  if (side === "server") {  // paired: in each round the engine and server runs were back to back at that level
    best.levels.forEach((l, k) => {
      const ratios = runs[k].map((r, i) => {
        const e = JSON.parse(fs.readFileSync(`${work}/engine-${i + 1}-${levels[k]}.json`)).levels[0];
        return { tok_s: e.output_tok_s / r.levels[0].output_tok_s - 1,
                 cpu: r.levels[0].server_cpu_ms_per_token / e.cpu_ms_per_token - 1,
                 client_cpu_vs_engine_time: (r.levels[0].client_cpu_s / r.levels[0].output_tokens) * e.output_tok_s };
      });
      const med = (v) => { const s = [...v].sort((a, b) => a - b), n = s.length; return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2; };
      l.paired_overhead = { per_round: ratios.map((x) => x.tok_s), median: med(ratios.map((x) => x.tok_s)),
        cpu_per_round: ratios.map((x) => x.cpu), cpu_median: med(ratios.map((x) => x.cpu)),
        client_cpu_vs_engine_time_median: med(ratios.map((x) => x.client_cpu_vs_engine_time)) };
    });
  }
  best.rounds = rounds;
  best.selection = "per level, the round with the highest output tokens/s";
  fs.writeFileSync(`${work}/${side}-best.json`, JSON.stringify(best, null, 2) + "\n");
}' "$work" "$rounds" "$levels"
node bench/bench_serve.mjs --report "$work/server-best.json" --engine-json "$work/engine-best.json" --out "$out"
