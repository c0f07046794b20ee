#!/usr/bin/env bash
# Run THERE (the GPU machine), in the repo root, after scripts/gpu/bundle.sh ran here and `.stage` was carried:
# unpacks the bundle, then runs the cuda-labelled tests and the CUDA benchmarks in one call, writing logs and
# JSON to gpu-out/ (packed into $OUT/gpu-results.tar.gz: the device tool returns only a few files per call) and
# a short summary last.
#   scripts/gpu/cuda.sh [tests] [sanitize] [bench] [model] [v32] [tp] [cli] [nodes] [graphs] [serve] [invariant] [tier]
#                       [spec] [specbench] [tierprofile] [structured] [tierload]
#   (default: tests bench); TESTS="a b" narrows tests
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
# NCCL (libnccl.so.2, linked by the CUDA binaries): the toolkit's, else the one PyTorch's wheels bring.
if ! ls /usr/local/cuda/lib64/libnccl.so.2 >/dev/null 2>&1; then
    nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_dir"
    echo "NCCL: ${nccl_dir:-not found}"
fi
# The random tiny model the tests run on (bundle.sh leaves it out): generated as the build does.
[ -f build-cuda/models/tiny/config.json ] ||
    build-cuda/megactx gen-model --preset tiny --seed 0 --out build-cuda/models/tiny >/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit, $(date -u +%FT%TZ)" | tee -a "$out/gpu.txt"
summary=()
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
if has tests; then
    for t in build-cuda/tests/cuda/*; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        # TESTS="test_a test_b" runs only those
        [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $name "* ]] && continue
        # line-buffered so a hang still leaves the log; TEST_TIMEOUT seconds per binary (default 600)
        t0=$SECONDS
        if timeout "${TEST_TIMEOUT:-600}" stdbuf -oL "$t" --gtest_brief=1 >"$out/$name.log" 2>&1; then r=PASS; else r="FAIL (exit $?)"; fi
        summary+=("$name: $r ($(grep -cE '^\[       OK|^\[  FAILED  \] [A-Z]' "$out/$name.log") lines, $((SECONDS - t0)) s)")
        [ "$r" != PASS ] && grep -E "FAILED|Failure|error" "$out/$name.log" | head -20
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
if has v32; then
    # DeepSeek-V3.2's shapes (docs/deepseek-v32.md): the 64-head indexer decode beside the 32-head one, sparse MLA at
    # 64 / 128 heads beside FlashMLA when its driver was carried (bench/peers/build-flashmla.sh, at
    # .stage/peers/flashmla_decode_bench), and dsv32-shape's whole step at 8K / 128K / 1M.
    build-cuda/bench/cuda/bench_indexer --heads 64 --only decode --qps 1,4 --json "$out/bench_indexer-h64.json" \
        >"$out/bench_indexer-h64.log" 2>&1
    summary+=("bench_indexer 64 heads: exit $?")
    build-cuda/bench/cuda/bench_indexer --only decode --qps 1,4 --kernels 2 --json "$out/bench_indexer-h32.json" \
        >"$out/bench_indexer-h32.log" 2>&1
    summary+=("bench_indexer 32 heads: exit $?")
    build-cuda/bench/cuda/bench_sparse_mla --no-sweep --json "$out/bench_sparse_mla.json" >"$out/bench_sparse_mla.log" 2>&1
    summary+=("bench_sparse_mla: exit $?")
    if [ -x .stage/peers/flashmla_decode_bench ]; then
        .stage/peers/flashmla_decode_bench --heads 64,128 --batch 1,16,64,128 --json "$out/flashmla.json" \
            >"$out/flashmla.log" 2>&1
        summary+=("FlashMLA decode: exit $?")
    fi
    [ -f /tmp/dsv32-shape/config.json ] ||
        build-cuda/megactx gen-model --preset dsv32-shape --dtype fp8 --out /tmp/dsv32-shape >/dev/null
    build-cuda/bench/cuda/bench_model --model /tmp/dsv32-shape --contexts "${MODEL_CONTEXTS:-8192,131072,1048575}" \
        --kv fp8 --decode-batch 1,16 --json "$out/bench_model-dsv32.json" >"$out/bench_model-dsv32.log" 2>&1
    summary+=("bench_model dsv32-shape: exit $?")
fi
if has tp; then
    # Tensor / expert parallel (issue 6) on every GPU of this machine: a glm52-shape model with all 256 routed
    # experts (8 per token) and FP8 weights, 4 layers (IndexShare FSSS), decode TPOT and prefill at 8K..1M on one
    # GPU, TP over the GPUs, and TP + EP; CLI generate under --tp equals one GPU; the node plan for GLM-5.2.
    ngpu=$(nvidia-smi -L | wc -l)
    d=/tmp/glm52-256e
    t0=$(date +%s)
    # TP_256E=0 skips the 256-expert model (generating its 38 GB takes ~4 minutes)
    [ "${TP_256E:-1}" = 1 ] && for _ in once; do
    [ -f "$d/config.json" ] || build-cuda/megactx gen-model --preset glm52-shape --layers 4 --dtype fp8 \
        --index-pattern FSSS --experts 256 --experts-per-tok 8 --out "$d" >/dev/null
    echo "tp: model $(du -sh "$d" | cut -f1) generated in $(( $(date +%s) - t0 )) s" | tee "$out/tp.txt"
    for cfg in "1" "$ngpu" "$ngpu --expert-parallel"; do
        tag=tp$(echo "$cfg" | tr -d ' -' | sed 's/expertparallel/ep/')
        build-cuda/bench/cuda/bench_model --model "$d" --tp $cfg --contexts "${TP_CONTEXTS:-8192,131072,1048575}" \
            --kv fp8 --steps "${TP_STEPS:-10}" --json "$out/bench_model_$tag.json" 2>&1 | tee "$out/bench_model_$tag.log"
        summary+=("bench_model $tag: exit ${PIPESTATUS[0]}")
        echo "tp: $tag done at $(( $(date +%s) - t0 )) s" | tee -a "$out/tp.txt"
    done
    done
    m=build-cuda/models/tiny
    [ -d "$m" ] || m=$(ls -d build-cuda/models/* | head -1)
    g1=$(build-cuda/megactx generate --model "$m" --device cuda --kv-cache-dtype f32 --tokens 1,2,3,4,5 --max-new-tokens 16 2>/dev/null)
    g2=$(build-cuda/megactx generate --model "$m" --device cuda --kv-cache-dtype f32 --tokens 1,2,3,4,5 --max-new-tokens 16 --tp "$ngpu" --expert-parallel 2>"$out/cli_tp.err")
    [ -n "$g1" ] && [ "$g1" = "$g2" ] && r=PASS || r="FAIL ($g1 vs $g2)"
    summary+=("cli generate --tp $ngpu = one GPU: $r")
    # One GPU, TP + EP, and TP + EP + LayerSplit on a small glm52-shape (4 experts, quick to generate): decode at
    # batch 1 and 32, prefill.
    d4=/tmp/glm52-4e
    [ -f "$d4/config.json" ] || build-cuda/megactx gen-model --preset glm52-shape --layers 4 --dtype fp8 \
        --index-pattern FSSS --out "$d4" >/dev/null
    for cfg in "1" "$ngpu --expert-parallel" "$ngpu --expert-parallel --layer-split" \
        "$ngpu --expert-parallel --indexer-split"; do
        tag=4e-tp$(echo "$cfg" | tr -d ' -' | sed 's/expertparallel/ep/; s/layersplit/ls/; s/indexersplit/is/')
        build-cuda/bench/cuda/bench_model --model "$d4" --tp $cfg --contexts "${TP_CONTEXTS:-8192,131072,1048575}" \
            --decode-batch 1,32 --kv fp8 --steps "${TP_STEPS:-10}" --json "$out/bench_model_$tag.json" 2>&1 |
            tee "$out/bench_model_$tag.log"
        summary+=("bench_model $tag: exit ${PIPESTATUS[0]}")
    done
    # The host KV tier under TP + EP (and + LayerSplit): every rank with a device tier of 2048 blocks and the rest of
    # the 1M context in its pinned host tier, against all on the device (eager steps: graphs need one device).
    for cfg in "$ngpu --expert-parallel" "$ngpu --expert-parallel --layer-split"; do
        tag=4e-tier-tp$(echo "$cfg" | tr -d ' -' | sed 's/expertparallel/ep/; s/layersplit/ls/')
        build-cuda/bench/cuda/bench_model --model "$d4" --tp $cfg --contexts 1048575 --kv fp8 --decode-batch 1,8 \
            --device-blocks 2048 --steps "${TP_STEPS:-10}" --json "$out/bench_model_$tag.json" 2>&1 |
            tee "$out/bench_model_$tag.log"
        summary+=("bench_model $tag: exit ${PIPESTATUS[0]}")
    done
    # serve under --tp (with and without LayerSplit): capacity line, one completion, clean exit
    for ls in "" --layer-split; do
        log="$out/serve_tp$ls.log"
        build-cuda/megactx serve --model "$d4" --device cuda --tp "$ngpu" --expert-parallel $ls --kv-cache-dtype fp8 \
            --max-model-len 1048576 --port 8391 >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 1 120); do curl -sf localhost:8391/health >/dev/null && break; sleep 1; done
        resp=$(curl -s localhost:8391/v1/completions -H 'Content-Type: application/json' \
            -d '{"model":"glm52-4e","prompt":[1,2,3,4,5,6,7,8],"max_tokens":8,"temperature":0}')
        kill -TERM $pid; wait $pid; rc=$?
        echo "$resp" >>"$log"
        summary+=("serve --tp $ngpu $ls: exit $rc, $(grep -o 'KV cache: [0-9]* blocks of 64 tokens = [0-9]* tokens' "$log"), completion $(echo "$resp" | grep -c '"finish_reason"')")
    done
    for ls in "" --layer-split; do
        build-cuda/megactx plan --config tests/data/glm52_config.json --tensor-parallel-size 8 --expert-parallel $ls \
            --context 1048576 >>"$out/plan.txt" 2>&1
    done
fi
glm52_share() {  # the 4-layer glm52-shape model of the `model` stage (IndexShare FSSS, FP8)
    [ -f /tmp/glm52-share/config.json ] || build-cuda/megactx gen-model --preset glm52-shape --layers 4 --dtype fp8 \
        --index-pattern FSSS --out /tmp/glm52-share >/dev/null
}
if has invariant; then
    # --batch-invariant: its tests, its cost on glm52-shape (bench_model with MEGACTX_BATCH_INVARIANT=1 against the
    # default), and on the demo model speculative (K = 3) against plain text on a 4K document, in both modes.
    build-cuda/tests/cuda/test_cuda_ops --gtest_filter='CudaOpsTest.BatchInvariant*' >"$out/invariant-ops.log" 2>&1
    summary+=("invariant op test: exit $?")
    build-cuda/tests/cuda/test_cuda_model --gtest_filter='CudaBatchInvariant.*:CudaGraphs.*' >"$out/invariant-model.log" 2>&1
    summary+=("invariant + graph model tests: exit $?")
    glm52_share
    for mode in default invariant; do
        inv=0; [ "$mode" = invariant ] && inv=1
        MEGACTX_BATCH_INVARIANT=$inv build-cuda/bench/cuda/bench_model --model /tmp/glm52-share \
            --contexts "${INVARIANT_CONTEXTS:-8192,131072}" --kv fp8 --decode-batch 1,8 --op-split 3 \
            --json "$out/bench_model-$mode.json" >"$out/bench_model-$mode.log" 2>&1
        summary+=("bench_model $mode: exit $?")
    done
    doc=/tmp/niah-4k.txt
    build-cuda/megactx eval niah --lengths 4K --depths 0.5 --seed 7 --write-document "$doc" >/dev/null 2>&1
    for flag in "" --batch-invariant; do
        for k in 0 3; do
            tag=run-k$k${flag:+-invariant}
            build-cuda/megactx run --device cuda -f "$doc" --no-think -n 256 --ignore-eos --speculative-tokens $k $flag \
                >"$out/$tag.txt" 2>"$out/$tag.err"
        done
        cmp -s "$out/run-k0${flag:+-invariant}.txt" "$out/run-k3${flag:+-invariant}.txt" && r=same || r=different
        summary+=("4K document ${flag:-default}: K = 3 text vs plain: $r; $(grep -ho '[0-9.]* tok/s' "$out"/run-k*${flag:+-invariant}.err | tr '\n' ' ')")
    done
fi
if has tier; then
    # Host KV tier (glm52-shape, 1M, device tier of 2048 blocks): the staging rows at 8 (the recorded runs) against
    # the size kv_tier_blocks picks for a decode batch of 8, and the fetch-stall stamps on and off; each case also
    # op by op (--op-split 3: resident against tiered, where the tier's per-step work goes). TIER_CONFIGS="rows8"
    # runs only those.
    glm52_share
    for cfg in "rows8:--staging-rows 8" "rows64:--staging-rows 64" "nostall:--staging-rows 8"; do
        tag=${cfg%%:*}
        [ -n "${TIER_CONFIGS:-}" ] && [[ " $TIER_CONFIGS " != *" $tag "* ]] && continue
        stall=1; [ "$tag" = nostall ] && stall=0
        MEGACTX_TIER_STALL=$stall build-cuda/bench/cuda/bench_model --model /tmp/glm52-share --contexts 1048575 --kv fp8 \
            --device-blocks 2048 --promotions 64 --decode-batch 1,8,32 --vary-tokens --op-split 3 ${cfg#*:} \
            --json "$out/bench_model-tier-$tag.json" >"$out/bench_model-tier-$tag.log" 2>&1
        summary+=("bench_model tier $tag: exit $?")
    done
fi
if has tierprofile; then
    # Where the host tier's per-step time goes inside the graph replay: Nsight Compute's duration of every kernel
    # (graph nodes one by one, serialised) for glm52-shape at 1M, batch 1, resident then tiered (hot set; a stable
    # selection, so nothing is gathered after the first steps). tools/ncu_steps.py splits the CSV into steps.
    glm52_share
    ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout "${TIER_PROFILE_TIMEOUT:-240}" $ncu_bin --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        build-cuda/bench/cuda/bench_model --model /tmp/glm52-share --contexts 1048575 --kv fp8 --device-blocks 2048 \
        --promotions 64 --decode-batch ${TIER_PROFILE_BATCH:-1} --steps 4 --chunk 0 ${TIER_PROFILE_ARGS:-} \
        >"$out/tier-ncu.csv" 2>"$out/tier-ncu.err"
    summary+=("tierprofile (ncu): exit $?, $(grep -c '^"' "$out/tier-ncu.csv") lines")
fi
if has spec; then
    # MTP speculation on the demo model (issue 32): batch 1 through `megactx run` (a 4-token raw prompt, 512 tokens,
    # K = 0, 1, 3, 5, 7; a 4K NIAH document, 256 tokens, K = 0, 3), then batched through `serve` and
    # bench_serve.py (128 tokens a request, no log-probabilities, C = 1, 8, 32 in flight, K = 0 and 3), with the
    # engine's counters from /metrics per level (steps, graph replays: the draft chain's step 0 padded to whole
    # verifications keeps its shape).
    # SPEC_RUNS=0 skips the batch-1 runs; SPEC_LEVELS and SPEC_SERVE_KS set the served levels and K values (the
    # crossover where speculation stops paying: --speculative-disable-by-batch-size).
    doc=/tmp/niah-4k.txt
    build-cuda/megactx eval niah --lengths 4K --depths 0.5 --seed 7 --write-document "$doc" >/dev/null 2>&1
    [ "${SPEC_RUNS:-1}" = 1 ] && for k in 0 1 3 5 7; do
        build-cuda/megactx run --device cuda -p 'The Python documentation describes' --raw -n 512 --ignore-eos \
            --speculative-tokens $k >/dev/null 2>"$out/spec-short-k$k.err"
        summary+=("short prompt, K = $k: $(grep -ho 'decode [0-9.]* tok/s' "$out/spec-short-k$k.err") $(grep -ho 'length [0-9.]*' "$out/spec-short-k$k.err")")
    done
    [ "${SPEC_RUNS:-1}" = 1 ] && for k in 0 3; do
        build-cuda/megactx run --device cuda -f "$doc" --no-think -n 256 --ignore-eos --speculative-tokens $k \
            >/dev/null 2>"$out/spec-4k-k$k.err"
        summary+=("4K document, K = $k: $(grep -ho 'decode [0-9.]* tok/s' "$out/spec-4k-k$k.err") $(grep -ho 'length [0-9.]*' "$out/spec-4k-k$k.err")")
    done
    for k in ${SPEC_SERVE_KS:-0 3}; do
        taskset -c 2-15 python3 bench/bench_serve.py --bin build-cuda/megactx --model models/glm-demo \
            --prompts .stage/gpu/prompts.json --levels "${SPEC_LEVELS:-1,8,32}" --max-tokens 128 --min-requests 16 --per-stream 2 --logprobs -1 \
            --server-cpus 0,1 --server-arg=--device --server-arg=cuda --server-arg=--max-model-len \
            --server-arg=4096 --server-arg=--speculative-tokens --server-arg=$k --out "$out/spec-serve-k$k.json" \
            >"$out/spec-serve-k$k.log" 2>&1
        summary+=("serve K = $k: exit $?, $(grep -ho 'C=[0-9]* [0-9.]* tok/s' "$out/spec-serve-k$k.log" | tr '\n' ' ')")
    done
fi
if has specbench; then
    # MTP speculation at a set acceptance through the engine (bench_spec, issue 49): K = 3 at A = 3.0 and K = 7 at
    # A = 5.47 against plain decoding, with synthetic FP8 weights made in memory: one rank's shard of GLM-5.2 under
    # TP 8 + EP 8 (78 layers + MTP, 8 heads, 32 of the 256 experts; collectives not run) at batch 1 (8K, 128K) and
    # batch 8 / 32 (8K), and glm52-shape's 4 layers with all 256 experts at batch 1 / 8 / 32 (8K) and batch 1 (128K,
    # 1M); dsv32-rank-b1-8k: one rank of DeepSeek-V3.2 under TP 8 + EP 8 (61 layers + MTP, 16 heads, 32 experts).
    # The ranks' shards need an H200 (about 91 / 84 GiB of weights). SPEC_CONFIGS="rank-b1-8k ..." runs only those.
    # On an 80 GB card the shard takes SPEC_RANK_LAYERS (e.g. 52) of the 78 layers.
    spec_pairs=${SPEC_PAIRS:-3:3.0,7:5.47}
    rl=${SPEC_RANK_LAYERS:+--layers $SPEC_RANK_LAYERS}
    for cfg in "rank-b1-8k:$rl --rank-of 8 --expert-parallel --contexts 8192 --batch 1 --tokens 320 --op-split" \
        "rank-b1-128k:$rl --rank-of 8 --expert-parallel --contexts 131072 --batch 1 --tokens 320" \
        "rank-batched:$rl --rank-of 8 --expert-parallel --contexts 8192 --batch 8,32 --tokens 128" \
        "4l256e-batched:--layers 4 --contexts 8192 --batch 1,8,32 --tokens 192" \
        "4l256e-long:--layers 4 --contexts ${SPEC_LONG:-131072,1048000} --batch 1 --tokens 192" \
        "dsv32-rank-b1-8k:--rank-of 8 --expert-parallel --contexts 8192 --batch 1 --tokens 192"; do
        tag=${cfg%%:*}
        [ -n "${SPEC_CONFIGS:-}" ] && [[ " $SPEC_CONFIGS " != *" $tag "* ]] && continue
        config=tests/data/glm52_config.json
        [[ $tag == dsv32-* ]] && config=tests/data/deepseek_v32/config.json  # one DeepSeek-V3.2 rank: ~84 GiB
        build-cuda/bench/bench_spec --synthetic $config ${cfg#*:} --spec "$spec_pairs" \
            --json "$out/bench_spec-$tag.json" >"$out/bench_spec-$tag.log" 2>&1
        summary+=("bench_spec $tag: exit $?")
        grep -E "plain|K [0-9]" "$out/bench_spec-$tag.log" | head -20
    done
fi
if has structured; then
    # Structured outputs in a batch (issue 51): 32 streams through `serve`, all free against half of them constrained
    # to a JSON-like list of strings that never closes, so every request runs its 128 tokens (a regex that could
    # end let the model close the list and stop at 67 tokens, `f7fd142`), and all of them (STRUCTURED_FRACTIONS).
    c='{"structured_outputs": {"regex": "\\[(\"[a-zA-Z0-9 ,.]*\", )*"}}'
    for frac in ${STRUCTURED_FRACTIONS:-0 0.5 1}; do
        taskset -c 2-15 python3 bench/bench_serve.py --bin build-cuda/megactx --model models/glm-demo \
            --prompts .stage/gpu/prompts.json --levels "${STRUCTURED_LEVELS:-32}" --max-tokens 128 --min-requests 64 \
            --per-stream 2 --logprobs -1 --server-cpus 0,1 --server-arg=--device --server-arg=cuda \
            --server-arg=--max-model-len --server-arg=4096 --constraint "$c" --constrained-fraction $frac \
            --out "$out/structured-$frac.json" >"$out/structured-$frac.log" 2>&1
        summary+=("structured, constrained share $frac: exit $?, $(grep -ho 'C=[0-9]* [0-9.]* tok/s' "$out/structured-$frac.log" | tr '\n' ' ')")
    done
fi
if has cli; then
    bash scripts/gpu/cli-smoke.sh 2>&1 | tee "$out/cli.log" | tail -15
    summary+=("cli-smoke: exit ${PIPESTATUS[0]}")
fi
if has nodes; then
    # ranks in several processes and pipeline stages on the CUDA backend, on one GPU (issue 53)
    bash scripts/gpu/nodes-smoke.sh 2>&1 | tee "$out/nodes.log" | tail -12
    summary+=("nodes-smoke: exit ${PIPESTATUS[0]}")
fi
if has tierload; then
    # the host KV tier's throughput against concurrency where the GPU alone queues, over HTTP (issue 50)
    bash scripts/gpu/tier-load.sh "$out" 2>&1 | tee "$out/tierload.log" | tail -16
    summary+=("tier load: exit ${PIPESTATUS[0]}")
fi
if has graphs; then
    bash scripts/gpu/serve-graphs.sh "$out" 2>&1 | tee "$out/graphs.log" | tail -8
    summary+=("serve graphs vs eager: exit ${PIPESTATUS[0]}")
fi
if has serve; then
    bash scripts/gpu/serve-overhead.sh "$out" 2>&1 | tee "$out/serve.log" | tail -20
fi
summary+=("total: $SECONDS s")
echo "== summary =="
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
[ -n "${OUT:-}" ] && tar -C "$out" -czf "$OUT/gpu-results.tar.gz" .
