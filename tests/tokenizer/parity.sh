#!/usr/bin/env bash
# The tokenizer parity test (ctest tokenizer_parity): generates the corpus, encodes it with
# @huggingface/tokenizers, then checks `megactx tokenize --jsonl` byte for byte and the library (ids, decode,
# round trip, streaming) through tokenizer_parity_check. Exit 77 (ctest SKIP) only when node is missing.
# Usage: parity.sh MEGACTX_BIN PARITY_CHECK_BIN WORK_DIR
set -euo pipefail
megactx=$1 check=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node not found; the tokenizer parity test needs Node.js (20+) and npm"
    exit 77
fi
bash "$here/setup.sh"
mkdir -p "$work"
node "$here/gen_corpus.mjs" "$work/corpus.jsonl"
# The reference output depends only on the corpus and the pinned packages: reuse it when both are unchanged.
stamp=$(cat "$work/corpus.jsonl" "$here/package-lock.json" "$here/reference.mjs" | md5sum | cut -d' ' -f1)
if [ "$(cat "$work/ref/stamp" 2>/dev/null)" != "$stamp" ]; then
    node "$here/reference.mjs" "$work/corpus.jsonl" "$work/ref"
    echo "$stamp" > "$work/ref/stamp"
fi
model=$(node "$here/model_path.mjs")
status=0
for mode in special nospecial; do
    flag=""
    [ "$mode" = nospecial ] && flag="--no-special"
    "$megactx" tokenize --model "$model" --jsonl "$work/corpus.jsonl" $flag > "$work/cli_$mode.jsonl"
    if cmp -s "$work/cli_$mode.jsonl" "$work/ref/ids_$mode.jsonl"; then
        echo "megactx tokenize --jsonl ($mode): identical to @huggingface/tokenizers"
    else
        echo "megactx tokenize --jsonl ($mode): DIFFERS from @huggingface/tokenizers; first differing lines:"
        diff <(cat -n "$work/cli_$mode.jsonl") <(cat -n "$work/ref/ids_$mode.jsonl") | head -6 | cut -c1-300
        status=1
    fi
done
"$check" "$model" "$work/corpus.jsonl" "$work/ref" || status=1
exit $status
