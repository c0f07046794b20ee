#!/usr/bin/env bash
# Installs the pinned npm packages the server tests use (node_modules is git-ignored).
set -euo pipefail
cd "$(dirname "$0")"
if [ -d node_modules/openai ] && [ -d node_modules/ajv ] && [ -d node_modules/json-schema-test-suite ]; then exit 0; fi
npm ci --no-audit --no-fund --loglevel=error
