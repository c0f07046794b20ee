#!/usr/bin/env bash
# Tokenizer encode benchmark: megactx (bench/bench_tokenizer) and @huggingface/tokenizers (Node) on the same
# generated corpus with the real DeepSeek-V3 tokenizer, one after the other in the same run, single thread.
# Prints both results and the speedup, and writes bench/results/tokenizer-<date>.json.
# Usage: scripts/bench-tokenizer.sh [PASSES]   (needs node + npm; builds into ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
passes=${1:-5}
bash tests/tokenizer/setup.sh
command -v node >/dev/null || { echo "bench-tokenizer: node is required"; exit 1; }
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMEGACTX_BENCH=ON >/dev/null
cmake --build build -j2 --target bench_tokenizer >/dev/null
work=build/tokenizer_bench
mkdir -p "$work" bench/results
node tests/tokenizer/gen_corpus.mjs "$work/corpus.jsonl"
model=$(node tests/tokenizer/model_path.mjs)
cpp=$(taskset -c 0 ./build/bench/bench_tokenizer "$model" "$work/corpus.jsonl" "$passes" 2>/dev/null ||
      ./build/bench/bench_tokenizer "$model" "$work/corpus.jsonl" "$passes")
js=$(cd tests/tokenizer && (taskset -c 0 node bench.mjs "../../$work/corpus.jsonl" "$passes" 2>/dev/null ||
      node bench.mjs "../../$work/corpus.jsonl" "$passes"))
echo "megactx:                 $cpp"
echo "@huggingface/tokenizers: $js"
out=bench/results/tokenizer-$(date -u +%Y%m%d).json
CPP="$cpp" JS="$js" OUT="$out" node -e '
const cpp = JSON.parse(process.env.CPP), js = JSON.parse(process.env.JS);
const os = require("os"), cp = require("child_process");
const commit = cp.execSync("git rev-parse --short HEAD").toString().trim();
const r = {date: new Date().toISOString(), commit, cpu: os.cpus()[0].model, threads: 1, megactx: cpp, reference: js,
  speedup_first: cpp.mb_per_s_first / js.mb_per_s_first, speedup_best: cpp.mb_per_s_best / js.mb_per_s_best};
require("fs").writeFileSync(process.env.OUT, JSON.stringify(r, null, 2) + "\n");
console.log(`speedup: ${r.speedup_first.toFixed(1)}x (first pass), ${r.speedup_best.toFixed(1)}x (best pass) -> ${process.env.OUT}`);'
