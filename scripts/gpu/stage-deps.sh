#!/usr/bin/env bash
# Run HERE (the Debian dev machine): stages the Debian headers the GPU machine lacks (xxhash, pcre2,
# cpp-httplib; see docs in ../shared/docs/gpu.md) into the git-ignored .stage/ folder, to be named in the
# device tool's `carry` and installed there by scripts/gpu/install-staged.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .stage && mkdir -p .stage/debs
(cd .stage/debs && apt-get download libxxhash-dev libpcre2-dev libcpp-httplib-dev)
for f in .stage/debs/*.deb; do dpkg -x "$f" .stage/root; done
rm -rf .stage/debs
echo "staged into .stage/root"
