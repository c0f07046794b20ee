#!/usr/bin/env bash
# Installs the Debian packages megactx builds and tests with (design.md §10). Idempotent: packages that
# are already present are skipped, so a second run does no network work.
set -euo pipefail

packages=(
    build-essential cmake git pkg-config
    libgtest-dev libgmock-dev libbenchmark-dev
    nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libicu-dev libxxhash-dev libcpp-httplib-dev
    clang libclang-rt-dev libomp-dev
    libgloo-dev  # collectives between ranks in other processes (--nnodes)
    iproute2     # ctest multinode_netns: two nodes as two network namespaces
    python3 curl
    python3-numpy  # tools/train/prepare.py (ctest train_prepare)
)

# Node.js + npm run the reference implementations the tests compare against (tokenizers, jinja, openai).
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present"
    exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
