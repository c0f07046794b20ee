#!/usr/bin/env bash
# The training data's premise, without torch (ctest train_prepare): tools/train/prepare.py on a small corpus (the
# haystack as train, held-out and haystack text) with the shipped tokenizer. It fails unless every task kind, facts
# included, tokenizes back to the same ids, every facts sample's layout has megactx's prompt length, one a length
# is megactx's `eval facts` prompt token for token, and no held-out frame or key of `eval facts` reaches the data.
# Exit 77 (ctest SKIP) only when /usr/bin/python3 has no numpy.
# Usage: prepare_check.sh MEGACTX_BIN WORK_DIR
set -euo pipefail
megactx=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
py=/usr/bin/python3
if ! "$py" -c "import numpy" 2>/dev/null; then
    echo "SKIP: $py has no numpy (apt-get install python3-numpy)"
    exit 77
fi
rm -rf "$work" && mkdir -p "$work/corpus"
for split in train heldout haystack; do cp "$root/tools/train/haystack.txt" "$work/corpus/$split.txt"; done
"$py" "$root/tools/train/prepare.py" --corpus "$work/corpus" --tokenizer "$root/models/glm-demo" --out "$work/data" \
    --megactx "$megactx" --facts-per-length 105 --check 24
