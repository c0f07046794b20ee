#!/usr/bin/env bash
# Run HERE (the Debian dev machine): stages the Debian headers the GPU machine lacks (xxhash, pcre2,
# cpp-httplib; see docs in ../shared/docs/gpu.md) into the git-ignored .stage/ folder, to be named in the
# device tool's `carry` and installed there by scripts/gpu/install-staged.sh.
# Known gap (2026-11-29): since the tokenizer joined megactx_core, building there also needs pcre2's pkg-config
# file (staged here, not yet installed by install-staged.sh) and ICU: Debian 12 ships ICU 72, the GPU machine
# ICU 74, so either stage libicu72 + libicu-dev together or make ICU optional in CMake before building there.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .stage && mkdir -p .stage/debs
(cd .stage/debs && apt-get download libxxhash-dev libpcre2-dev libcpp-httplib-dev)
for f in .stage/debs/*.deb; do dpkg -x "$f" .stage/root; done
rm -rf .stage/debs
echo "staged into .stage/root"
