#!/usr/bin/env bash
# Run THERE (the GPU machine), in the repo root, after scripts/gpu/bundle.sh ran here and `.stage` was carried:
# unpacks the bundle, then runs the cuda-labelled tests and the CUDA benchmarks in one call, writing logs and
# JSON to gpu-out/ (packed into $OUT/gpu-results.tar.gz: the device tool returns only a few files per call) and
# a short summary last.
#   scripts/gpu/cuda.sh [tests] [sanitize] [bench] [model] [cli] [serve]   (default: tests bench)
# MEGACTX_COMMIT (the commit the bundle was built from) is recorded by the benchmarks; pass it in the command.
# The binaries have this checkout's absolute paths compiled in (fixtures, default model), so /work/main is made
# to point at the repo root here.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=gpu-out
rm -rf "$out" && mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests bench)
tar -C .stage -xJf .stage/gpu.tar.xz
mkdir -p build-cuda && cp -r .stage/gpu/build-cuda/. build-cuda/
if [ "$(pwd)" != /work/main ]; then mkdir -p /work && ln -sfn "$(pwd)" /work/main; fi
export LD_LIBRARY_PATH="$(pwd)/.stage/gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit, $(date -u +%FT%TZ)" | tee -a "$out/gpu.txt"
summary=()
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
if has tests; then
    for t in build-cuda/tests/cuda/*; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        if "$t" --gtest_brief=1 >"$out/$name.log" 2>&1; then r=PASS; else r=FAIL; fi
        summary+=("$name: $r ($(grep -cE '^\[       OK|^\[  FAILED  \] [A-Z]' "$out/$name.log") lines)")
        [ "$r" = FAIL ] && grep -E "FAILED|Failure|error" "$out/$name.log" | head -20
    done
fi
if has sanitize; then
    # compute-sanitizer memcheck over the op tests (slow: it instruments every access), SANITIZE_FILTER narrows them.
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for t in build-cuda/tests/cuda/*; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        timeout "${SANITIZE_TIMEOUT:-300}" "$san" --tool memcheck --leak-check full --error-exitcode 3 "$t" --gtest_brief=1 \
            --gtest_filter="${SANITIZE_FILTER:-*}" >"$out/memcheck-$name.log" 2>&1
        rc=$?
        summary+=("memcheck $name: exit $rc, $(grep -m1 -E 'ERROR SUMMARY' "$out/memcheck-$name.log")")
    done
fi
if has bench; then
    for b in build-cuda/bench/cuda/*; do
        [ -x "$b" ] || continue
        name=$(basename "$b")
        [ "$name" = bench_model ] && continue  # the `model` stage runs it
        "$b" --json "$out/$name.json" 2>&1 | tee "$out/$name.log" | tail -25
        summary+=("$name: exit ${PIPESTATUS[0]}")
    done
fi
if has model; then
    # Model level (issue 5): glm52-shape with FP8 weights, 4 layers, IndexShare (FSSS: 1 full + 3 shared) next to
    # every layer full, decode TPOT and prefill tok/s at 8K / 128K / 1M contexts (KV filled with random rows).
    for v in FSSS:share F:full; do
        d=/tmp/glm52-${v#*:}
        [ -f "$d/config.json" ] || build-cuda/megactx gen-model --preset glm52-shape --layers 4 --dtype fp8 \
            --index-pattern "${v%%:*}" --out "$d" >/dev/null
    done
    build-cuda/bench/cuda/bench_model --model /tmp/glm52-share --model /tmp/glm52-full \
        --contexts "${MODEL_CONTEXTS:-8192,131072,1048575}" --kv fp8 --json "$out/bench_model.json" 2>&1 |
        tee "$out/bench_model.log"
    summary+=("bench_model: exit ${PIPESTATUS[0]}")
fi
if has cli; then
    bash scripts/gpu/cli-smoke.sh 2>&1 | tee "$out/cli.log" | tail -15
    summary+=("cli-smoke: exit ${PIPESTATUS[0]}")
fi
if has serve; then
    bash scripts/gpu/serve-overhead.sh "$out" 2>&1 | tee "$out/serve.log" | tail -20
fi
echo "== summary =="
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
[ -n "${OUT:-}" ] && tar -C "$out" -czf "$OUT/gpu-results.tar.gz" .
