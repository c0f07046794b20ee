#!/usr/bin/env bash
# MaskBench through `megactx grammar maskbench`: the JSON Schema front end and the token masks on the 11,306 schemas
# (with valid and invalid instances) of maskbench/data in guidance-ai/jsonschemabench
# (https://github.com/guidance-ai/jsonschemabench; the schemas come from public sources: JSON Schema Store, GitHub,
# Kubernetes, Snowplow, WashingtonPost, NousResearch json-mode-eval, Gorilla BFCL, ...). The data is not part of
# this repository (138 MB, no licence file) and is not redistributed: give a checkout or a git mirror of
# jsonschemabench.
#
#   bench/maskbench.sh JSONSCHEMABENCH [megactx grammar maskbench flags...]
#
# JSONSCHEMABENCH: a checkout (its maskbench/data is used as is) or a git repository, bare or not, whose HEAD's
# maskbench/data is extracted into $MASKBENCH_DATA (default build/maskbench-data; blobs missing from a partial
# mirror are skipped and listed). The tokenizer is DeepSeek-V3's, as the tokenizer tests use
# (tests/tokenizer/setup.sh installs it; MASKBENCH_MODEL names another tokenizer.json directory); MEGACTX (default
# build/megactx) is the binary. The run is niced and on one core (schemas one after another in a worker process);
# extra flags go to the subcommand, e.g. --limit 200, --shard 0/4, --json OUT, --per-schema OUT.jsonl, --timeout-ms
# 10000 (the default). A full run takes about 6 minutes on the 2-core dev box with the other core idle.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
src=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
megactx=${MEGACTX:-$here/build/megactx}
data=${MASKBENCH_DATA:-$here/build/maskbench-data}

if [ -d "$src/maskbench/data" ]; then
    data=$src/maskbench/data
elif [ ! -f "$data/.complete" ]; then
    mkdir -p "$data"
    tree=$(mktemp)
    trap 'rm -f "$tree"' EXIT
    git -C "$src" ls-tree -r HEAD maskbench/data > "$tree"
    # One `git cat-file --batch` for every blob: an archive would stop at the first blob a partial mirror lacks.
    awk '$2 == "blob" && !seen[$3]++ { print $3 }' "$tree" |
        git -C "$src" cat-file --batch |
        /usr/bin/python3 -c '
import os, sys
names = {}
for line in open(sys.argv[1], encoding="utf-8").read().splitlines():
    meta, path = line.split("\t", 1)
    names.setdefault(meta.split()[2], []).append(os.path.basename(path))
out, inp = sys.argv[2], sys.stdin.buffer
while True:
    header = inp.readline()
    if not header:
        break
    parts = header.split()
    if parts[1] == b"missing":
        print("maskbench.sh: missing from the mirror:", *names[parts[0].decode()], file=sys.stderr)
        continue
    body = inp.read(int(parts[2]))
    inp.read(1)
    for name in names[parts[0].decode()]:
        with open(os.path.join(out, name), "wb") as f:
            f.write(body)
' "$tree" "$data"
    touch "$data/.complete"
fi
echo "maskbench.sh: $(ls "$data" | grep -c '\.json$') schemas in $data" >&2

model=${MASKBENCH_MODEL:-}
if [ -z "$model" ]; then
    bash "$here/tests/tokenizer/setup.sh" >&2
    model=$(node "$here/tests/tokenizer/model_path.mjs")
fi
exec nice "$megactx" grammar maskbench --data "$data" --model "$model" "$@"
