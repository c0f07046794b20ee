#!/usr/bin/env bash
# Run THERE, from scripts/gpu/cuda.sh (stage `graphs`, after the bundle is unpacked): the engine's decode through
# CUDA graphs against eager (MEGACTX_GRAPHS=0) at the serving level. Two `serve --device cuda` runs on the default
# model with f32 KV, 4 concurrent greedy completions of 24 tokens each; the texts must be byte-identical.
# Writes serve<g>.log and resp<g>.<i> under $1; exits 1 when a response differs or fails.
set -u
out=${1:?output dir}
m=$(ls -d build-cuda/models/* | head -1)
status=0
for g in 1 0; do
    MEGACTX_GRAPHS=$g build-cuda/megactx serve --model "$m" --served-model-name m --device cuda --kv-cache-dtype f32 \
        --port 839$g >"$out/serve$g.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 60); do curl -sf localhost:839$g/health >/dev/null && break; sleep 1; done
    reqs=()
    for i in 1 2 3 4; do
        curl -s localhost:839$g/v1/completions -H 'Content-Type: application/json' \
            -d "{\"model\":\"m\",\"prompt\":[$i,$((i + 1)),$((i + 2)),$((i + 3)),5,6,7,8],\"max_tokens\":24,\"temperature\":0}" |
            python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["choices"][0]["text"].encode().hex() if "choices" in d else "ERROR " + json.dumps(d))' \
                >"$out/resp$g.$i" &
        reqs+=($!)
    done
    wait "${reqs[@]}"
    curl -s localhost:839$g/metrics | grep -E '^megactx_decode_graph' >"$out/metrics$g.txt"
    kill -TERM $pid
    wait $pid
    echo "serve MEGACTX_GRAPHS=$g: exit $?; $(tr '\n' ' ' <"$out/metrics$g.txt")"
done
for i in 1 2 3 4; do
    if grep -q ERROR "$out/resp1.$i" || ! cmp -s "$out/resp1.$i" "$out/resp0.$i"; then
        echo "request $i: graphs and eager DIFFER: $(head -c 80 "$out/resp1.$i") | $(head -c 80 "$out/resp0.$i")"
        status=1
    else
        echo "request $i: graphs = eager ($(wc -c <"$out/resp1.$i") hex chars)"
    fi
done
exit $status
