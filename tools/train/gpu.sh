#!/usr/bin/env bash
# Run THERE (the GPU machine), in the repo root, with build-train/data carried (prepare.py's data.npz and
# pieces.json). A training run outlives one device call (10 minutes), so it runs in the background under setsid,
# writing to /root/train-run, and later calls follow it:
#   tools/train/gpu.sh start MINUTES FOLLOW_S [train.py args...] [--then MINUTES2 [args2...]]
#                         start train.py, then follow its log FOLLOW_S s; with --then, a second stage (for example
#                         --indexer-only) resumes from the first stage's checkpoint when it ends, in the same --out
#   tools/train/gpu.sh long MINUTES FOLLOW_S [long_indexer.py args...]
#                         the same for long_indexer.py (the indexers fitted at 64K-1M, from models/glm-demo unless
#                         --model is given); follow, collect and niah work on its run as on train.py's
#   tools/train/gpu.sh follow FOLLOW_S      print new log lines until training exits or FOLLOW_S pass; then, when
#                                           train.py wrote a newer export/ (every checkpoint), copy its bf16 weights
#                                           in 15 MiB parts, config and log into $OUT, so a run whose machine is lost
#                                           can be resumed from here (--resume model.safetensors)
#   tools/train/gpu.sh collect [fp32]       copy the log and the bf16 model directory into $OUT; with fp32, the
#                                           fp32 checkpoint in 15 MiB parts instead of the bf16 weights
#   tools/train/gpu.sh niah GRID...         the run's model as a model directory (its weights and config, the
#                                           shipped tokenizer, haystack and greedy generation config), then
#                                           megactx eval niah --device cuda on each GRID = LENGTHS:DEPTHS:SAMPLES
#                                           (seed 0), JSON into $OUT; needs scripts/gpu/bundle.sh's .stage carried
#   tools/train/gpu.sh facts [--in-distribution] GRID...
#                                           the same with megactx eval facts, GRID = LENGTHS:DEPTHS:SAMPLES:ABSENT
#                                           (the held-out split, or with --in-distribution the training one)
# TRAIN_RUN=DIR puts the run in DIR instead of /root/train-run, so that two runs can share the GPU (the IndexShare
# ablation pair: `start` each with FOLLOW_S 0, then follow and niah each with its TRAIN_RUN).
# The machine is given back 30 s after a call ends, so the follow calls must come back to back: prepare anything
# local (bundles, data) before `start`, never between two calls.
set -uo pipefail
cd "$(dirname "$0")/../.."
run=${TRAIN_RUN:-/root/train-run}
cmd=${1:?start, follow or collect}
shift

follow() {
    local until=$(( $(date +%s) + $1 )) seen=0
    [ -f "$run/seen" ] && seen=$(cat "$run/seen")
    while :; do
        local n
        n=$(wc -l < "$run/stdout.log" 2>/dev/null || echo 0)
        if [ "$n" -gt "$seen" ]; then
            sed -n "$((seen + 1)),${n}p" "$run/stdout.log" | cut -c1-600
            seen=$n
            echo "$seen" > "$run/seen"
        fi
        if ! kill -0 "$(cat "$run/pid")" 2>/dev/null; then echo "== train.py has exited"; return 0; fi
        [ "$(date +%s)" -ge "$until" ] && { echo "== still running"; return 0; }
        sleep 5
    done
}

case "$cmd" in
start)
    minutes=$1 follow_s=$2
    shift 2
    rm -rf "$run" && mkdir -p "$run"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__)'
    first=() second=()
    while [ $# -gt 0 ] && [ "$1" != --then ]; do first+=("$1"); shift; done
    [ $# -gt 0 ] && { shift; second=("$@"); }
    # The stages run detached (setsid) so that they outlive this call.
    {
        echo "cd $(printf %q "$PWD")"
        echo "python3 tools/train/train.py --data build-train/data --out $run --minutes $minutes ${first[*]@Q} || exit"
        [ ${#second[@]} -gt 0 ] &&
            echo "python3 tools/train/train.py --data build-train/data --out $run --resume $run/ckpt.safetensors --minutes ${second[*]@Q}"
    } > "$run/stages.sh"
    setsid nohup bash "$run/stages.sh" > "$run/stdout.log" 2>&1 < /dev/null &
    echo $! > "$run/pid"
    follow "$follow_s"
    ;;
long)
    minutes=$1 follow_s=$2
    shift 2
    rm -rf "$run" && mkdir -p "$run"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "cd $(printf %q "$PWD") && python3 tools/train/long_indexer.py --data build-train/data --model models/glm-demo --out $run --minutes $minutes ${*@Q}" > "$run/stages.sh"
    setsid nohup bash "$run/stages.sh" > "$run/stdout.log" 2>&1 < /dev/null &
    echo $! > "$run/pid"
    follow "$follow_s"
    ;;
follow)
    follow "$1"
    m=$run/export/model.safetensors
    if [ -n "${OUT:-}" ] && [ -f "$m" ] && [ "$m" -nt "$run/collected" ]; then
        split -b 15M -d "$m" "$OUT/model.safetensors.part"
        cp "$run/export/config.json" "$run/stdout.log" "$OUT/" 2>/dev/null
        touch -r "$m" "$run/collected"
        echo "== brought back the export of $(date -u -r "$m" +%T) (cat model.safetensors.part* > model.safetensors)"
    fi
    ;;
collect)
    : "${OUT:?}"
    cp "$run/stdout.log" "$OUT/train-stdout.log"
    cp "$run/export/config.json" "$run/export/generation_config.json" "$OUT/" 2>/dev/null
    # The device tool returns at most 8 files of 16 MiB, 64 MiB in all: the bf16 weights (the shipped model)
    # fit in one call as 15 MiB parts, the fp32 checkpoint (for resuming) in another.
    if [ "${1:-}" = fp32 ]; then
        split -b 15M -d "$run/ckpt.safetensors" "$OUT/ckpt.safetensors.part"
    else
        split -b 15M -d "$run/export/model.safetensors" "$OUT/model.safetensors.part"
    fi
    ls -la "$OUT"
    ;;
niah | facts)
    : "${OUT:?}"
    tar -C .stage -xJf .stage/gpu.tar.xz && mkdir -p build-cuda && cp -r .stage/gpu/build-cuda/. build-cuda/
    export LD_LIBRARY_PATH="$PWD/.stage/gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    m=$run/model
    mkdir -p "$m"
    cp "$run/export/config.json" "$run/export/model.safetensors" "$m/"
    cp models/glm-demo/{tokenizer.json,tokenizer_config.json,haystack.txt,generation_config.json} "$m/"
    split=() name=$cmd
    [ "$cmd" = facts ] && [ "${1:-}" = --in-distribution ] && { split=(--in-distribution); name=facts-train; shift; }
    for g in "$@"; do
        IFS=: read -r lengths depths samples absent <<< "$g"
        extra=("${split[@]}")
        [ "$cmd" = facts ] && extra+=(--absent "${absent:-0}")
        build-cuda/megactx eval "$cmd" --model "$m" --device cuda --lengths "$lengths" --depths "$depths" \
            --samples "$samples" --seed 0 --max-num-batched-tokens 16384 "${extra[@]}" \
            --out "$OUT/$name-$(basename "$run")-${lengths//,/-}.json" 2>&1 | tail -4
    done
    ;;
*)
    echo "usage: gpu.sh start MINUTES FOLLOW_S [args] [--then MINUTES2 args2] | long MINUTES FOLLOW_S [args] | follow FOLLOW_S | collect [fp32] | niah GRID... | facts [--in-distribution] GRID..." >&2
    exit 2
    ;;
esac
