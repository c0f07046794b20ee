#!/usr/bin/env bash
# Run HERE (the Debian dev machine): builds the CUDA build (build-cuda: MEGACTX_CUDA=ON, no -march=native so it
# runs on the GPU host's CPU) and packs what the GPU machine needs into .stage/gpu.tar.xz (git-ignored; name
# `.stage` in the device tool's carry): stripped binaries (megactx, the cuda tests and benchmarks, bench_engine,
# bench_cpu) at their build-cuda paths, and the Debian shared libraries the GPU machine lacks (fmt 9, xxhash,
# pcre2, ICU 72, cpp-httplib, gloo with hiredis, ibverbs and libnl). scripts/gpu/cuda.sh unpacks and runs it there.
# Building here instead of there saves device time (the lease is short; nvcc on 2 cores is not).
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=${JOBS:-2}
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DMEGACTX_CUDA=ON -DMEGACTX_NATIVE=OFF \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >/dev/null
# TARGETS="megactx bench_engine ..." builds only those (default: everything).
if [ -n "${TARGETS:-}" ]; then cmake --build build-cuda -j"$jobs" --target $TARGETS; else cmake --build build-cuda -j"$jobs"; fi
stage=.stage/gpu
rm -rf "$stage" && mkdir -p "$stage/build-cuda" "$stage/lib"
bins=(megactx bench/bench_engine bench/bench_cpu bench/bench_spec)
for f in build-cuda/tests/cuda/* build-cuda/bench/cuda/*; do
    [ -f "$f" ] && [ -x "$f" ] && bins+=("${f#build-cuda/}")
done
# BINS="megactx tests/cuda/* bench/cuda/bench_model" packs only those (paths under build-cuda, globs): the working
# tree (53 MB, the demo model included) and the bundle travel within the device tool's 64 MiB together.
if [ -n "${BINS:-}" ]; then
    bins=()
    read -ra pats <<< "$BINS"
    for pat in "${pats[@]}"; do
        for f in build-cuda/$pat; do [ -f "$f" ] && [ -x "$f" ] && bins+=("${f#build-cuda/}"); done
    done
fi
for b in "${bins[@]}"; do
    [ -f "build-cuda/$b" ] || continue
    mkdir -p "$stage/build-cuda/$(dirname "$b")"
    strip --strip-unneeded -o "$stage/build-cuda/$b" "build-cuda/$b"
done
# models/tiny is not packed (random weights do not compress): cuda.sh regenerates it there, bit for bit (seed 0).
# The serving benchmark's prompts (scripts/gpu/serve-overhead.sh), made by the same generator as bench-serve.sh.
node bench/bench_serve.mjs --write-prompts "$stage/prompts.json" --count 128 --words 45 --seed 1
for l in libfmt.so.9 libxxhash.so.0 libpcre2-8.so.0 libicuuc.so.72 libicudata.so.72 libcpp-httplib.so.0.11 \
    libhiredis.so.0.14 libibverbs.so.1 libnl-route-3.so.200 libnl-3.so.200; do
    cp -L "/lib/x86_64-linux-gnu/$l" "$stage/lib/"
done
cp -L /lib/libgloo.so.0 "$stage/lib/"  # gloo (CPU collectives between processes) and, above, what it links
# One xz thread and a dictionary larger than the binaries: they share most of their CUDA kernels, which then
# compress to almost nothing (half the size of -6's default 8 MiB window).
tar -C .stage -cf - gpu | xz -T1 --lzma2=preset=6,dict=256MiB > .stage/gpu.tar.xz
rm -rf "$stage"
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
bundle=$(stat -c %s .stage/gpu.tar.xz)
echo "bundle: .stage/gpu.tar.xz $(( bundle / 1000000 )) MB (${#bins[@]} binaries); with the tracked files" \
    "$(( (tracked + bundle) / 1048576 )) MiB of the device tool's 64"
