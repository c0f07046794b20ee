#!/usr/bin/env bash
# Tokenizer training benchmark: `megactx train-tokenizer` on 20 MB of English text (the Jargon File, then the
# Linux kernel's reStructuredText documentation, without its translations, in path order) to an 8192-token
# vocabulary, single thread, pinned to core 0. Writes bench/results/bpe-train-<date>.json.
# Usage: scripts/bench-bpe-train.sh [RUNS]   (needs the Debian packages jargon-text and linux-doc-6.1)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
docs=/usr/share/doc/linux-doc-6.1/Documentation
jargon=/usr/share/doc/jargon-text/jargon.txt.gz
[[ -d $docs && -f $jargon ]] || { echo "bench-bpe-train: apt-get install jargon-text linux-doc-6.1"; exit 1; }
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target megactx >/dev/null
work=build/bpe_train_bench
mkdir -p "$work" bench/results
corpus=$work/en20.txt
# head closes the pipe after 20 MB: zcat's SIGPIPE is expected there.
(zcat "$jargon"; cd "$docs" && find . -name '*.rst.gz' -not -path './translations/*' | sort | xargs zcat) 2>/dev/null |
    head -c 20000000 >"$corpus" || true
times=()
for ((i = 0; i < runs; ++i)); do
    start=$EPOCHREALTIME
    taskset -c 0 ./build/megactx train-tokenizer --text-file "$corpus" --vocab-size 8192 --out "$work/tok" 2>"$work/log.txt"
    times+=("$start:$EPOCHREALTIME")
    tail -1 "$work/log.txt"
done
out=bench/results/bpe-train-$(date -u +%Y-%m-%d).json
TIMES="${times[*]}" CORPUS="$corpus" LOG="$work/log.txt" OUT="$out" /usr/bin/python3 - <<'PY'
import hashlib, json, os, subprocess, datetime
times = [round(float(b) - float(a), 3) for a, b in (t.split(":") for t in os.environ["TIMES"].split())]
data = open(os.environ["CORPUS"], "rb").read()
log = open(os.environ["LOG"]).read().splitlines()
r = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
     "commit": subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip(),
     "cpu": next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
     "threads": 1, "corpus_bytes": len(data), "corpus_sha1": hashlib.sha1(data).hexdigest(), "vocab_size": 8192,
     "wall_s": times, "best_wall_s": min(times), "log": log}
open(os.environ["OUT"], "w").write(json.dumps(r, indent=2) + "\n")
print(f"best {min(times):.2f} s of {len(times)} -> {os.environ['OUT']}")
PY
