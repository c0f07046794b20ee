#!/usr/bin/env bash
# Installs the pinned Node packages (package-lock.json) and renders the DeepSeek-V3 reference prompts that
# chat_tests compares against (out/deepseek_v3_expected.json). Needs node + npm; run before ctest.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "tests/chat/setup.sh: node and npm are required" >&2
    exit 1
fi
# Reinstall when the lock file changed since the last install.
if ! cmp -s package-lock.json node_modules/.megactx-lock; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.megactx-lock
fi
node render_deepseek_v3.mjs
