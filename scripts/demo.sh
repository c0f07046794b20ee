#!/usr/bin/env bash
# Sets up megactx on a fresh Debian 12 machine and runs the main job on the embedded default model,
# models/glm-demo (a small trained GLM-5.2-architecture model: IndexShare + MoE + MTP; docs/demo-model.md):
# a question about a long document, answered on the CPU; then logits, and serve with one chat request.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMEGACTX_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target megactx
echo "== a 4K-token document with a passkey in the middle (megactx eval niah --write-document) =="
./build/megactx eval niah --lengths 4K --depths 0.5 --seed 7 --write-document build/demo_doc.txt
head -c 300 build/demo_doc.txt; echo " [...]"; tail -c 150 build/demo_doc.txt; echo
echo "== megactx run -f build/demo_doc.txt (the embedded model, CPU) =="
./build/megactx run -f build/demo_doc.txt --no-think
echo "== megactx logits, one pass vs token-by-token =="
./build/megactx logits --tokens 11,22,33,44,55,66,77,88 --out build/demo_logits.npy
./build/megactx logits --tokens 11,22,33,44,55,66,77,88 --out build/demo_logits_chunk1.npy --chunk 1
cmp build/demo_logits.npy build/demo_logits_chunk1.npy && echo "identical logits"
echo "== megactx serve + one chat request =="
./build/megactx serve --port 0 2> build/demo_serve.log &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "ready in" build/demo_serve.log && break; sleep 0.1; done
cat build/demo_serve.log
url=$(grep -o "http://[^ ]*" build/demo_serve.log | head -1)
curl -s "$url/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages":[{"role":"user","content":"The passkey for Bob is 31337.\nThe passkey for Carol is 90210.\nWhat is the passkey for Carol? Answer with the number."}],"max_tokens":16,"temperature":0,"chat_template_kwargs":{"enable_thinking":false}}'
echo
