#!/usr/bin/env bash
# Run THERE (called by scripts/gpu/cuda.sh cli): the CLI on the GPU — `generate --device cuda` against the CPU on
# the embedded tiny model (f32 KV: identical greedy tokens expected; bf16 / fp8 KV printed), `logits --device
# cuda`, and `serve --device cuda`: /health, one streamed and one plain completion over HTTP, SIGTERM → exit 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=build-cuda/megactx
model=build-cuda/models/tiny
fail=0
prompt=1,2,3,4,5,6,7,8,9,10,11,12
cpu=$("$bin" generate --model "$model" --tokens "$prompt" --max-new-tokens 32 --ignore-eos)
for kv in f32 bf16 fp8; do
    gpu=$("$bin" generate --model "$model" --tokens "$prompt" --max-new-tokens 32 --ignore-eos --device cuda \
        --kv-cache-dtype "$kv")
    echo "generate kv $kv: cpu [$cpu] gpu [$gpu]"
    [ "$kv" = f32 ] && [ "$cpu" != "$gpu" ] && { echo "FAIL: f32 KV greedy tokens differ"; fail=1; }
done
"$bin" logits --model "$model" --tokens "$prompt" --device cuda --out /tmp/l.npy || fail=1
"$bin" serve --model "$model" --port 8123 --served-model-name x --device cuda --kv-cache-dtype fp8 --gpu-memory-utilization 0.5 \
    > /tmp/serve.log 2>&1 &
pid=$!
for _ in $(seq 1 60); do grep -q "ready in" /tmp/serve.log && break; sleep 0.5; done
grep -E "device|KV|fit|ready" /tmp/serve.log | head -5
python3 - <<'PY' || fail=1
import json, urllib.request
def post(body):
    req = urllib.request.Request("http://127.0.0.1:8123/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()
print("health", urllib.request.urlopen("http://127.0.0.1:8123/health", timeout=10).status)
r = json.loads(post({"model": "x", "prompt": "hello world", "max_tokens": 16, "temperature": 0}))
print("completion", r["usage"], repr(r["choices"][0]["text"])[:80], r["choices"][0]["finish_reason"])
s = post({"model": "x", "prompt": "hello world", "max_tokens": 16, "temperature": 0, "stream": True})
print("stream events", s.count("data: "), "ends with [DONE]:", s.rstrip().endswith("[DONE]"))
PY
kill -TERM $pid; wait $pid; rc=$?
echo "serve exit on SIGTERM: $rc"
[ $rc -eq 0 ] || fail=1
echo "cli-smoke: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
