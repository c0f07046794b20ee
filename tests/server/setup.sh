#!/usr/bin/env bash
# Installs the pinned npm packages the server tests use (node_modules is git-ignored): the openai client, ajv, the
# JSON-Schema-Test-Suite and xgrammar's WASM build (the token-mask comparison).
set -euo pipefail
cd "$(dirname "$0")"
if [ -d node_modules/openai ] && [ -d node_modules/ajv ] && [ -d node_modules/json-schema-test-suite ] &&
    [ -d node_modules/@mlc-ai/web-xgrammar ]; then exit 0; fi
npm ci --no-audit --no-fund --loglevel=error
