#!/usr/bin/env bash
# Run THERE (the GPU machine, as root): installs the staged headers into /usr/local/include and points the
# development .so names at the runtime libraries the machine already has.
set -euo pipefail
cd "$(dirname "$0")/../.."
cp -r .stage/root/usr/include/. /usr/local/include/
for lib in xxhash pcre2-8; do
    real=$(ls /usr/lib/x86_64-linux-gnu/lib${lib}.so.* 2>/dev/null | head -1)
    [ -n "$real" ] && ln -sf "$real" /usr/local/lib/lib${lib}.so
done
ldconfig
