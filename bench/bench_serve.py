#!/usr/bin/env python3
"""bench_serve.py: the run mode of bench/bench_serve.mjs for machines without Node (the GPU host).

Same workload and the same JSON fields (levels[].output_tok_s, ttft_ms, itl_ms, server_cpu_ms_per_token,
output_hashes ...): at each concurrency level C, C clients in a closed loop send streaming /v1/completions
requests (temperature 0, ignore_eos, max_tokens M, logprobs 0 so every token is a chunk; --logprobs -1 asks for
none, so greedy tokens come from the device's argmax) until max(per_stream*C, min_requests) requests finished.
After each level the server's engine counters (/metrics: steps, graph replays, speculative drafts) are recorded. Plain asyncio sockets, HTTP/1.1 chunked SSE parsing; a new
connection per request. With --engine-json (bench_engine's output for the same workload) it prints the server's
overhead per output token at each level.

  python3 bench/bench_serve.py --bin BIN --model DIR --prompts FILE [--levels 1,8,32,64] [--max-tokens 64]
      [--min-requests 16] [--per-stream 1] [--logprobs N] [--server-arg=--flag ...] [--server-cpus 0,1] [--out FILE]
      [--engine-json FILE] [--constraint JSON --constrained-fraction 0.5]
  ... --prompt-tokens L --vocab V [--count N] [--seed S]   (instead of --prompts: N prompts of L token ids drawn
      uniformly from [0, V), seeded, sent as token arrays: long contexts without a text corpus, e.g. the host KV
      tier at 128K-1M)
"""
import argparse, asyncio, json, os, re, subprocess, sys, time, urllib.request


def fnv1a64(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def percentile(v, q):
    if not v:
        return None
    v = sorted(v)
    x = q * (len(v) - 1)
    lo, hi = int(x), min(int(x) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def proc_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stream_completion(host, port, body):
    payload = json.dumps(body).encode()
    r = {"t_send": time.perf_counter(), "chunk_times": [], "text": "", "usage": None}
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (host.encode(), len(payload)) + payload)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"HTTP {status!r}: {await reader.read()}")
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
            chunked = True
    buf = ""

    async def pieces():
        if not chunked:
            while True:
                d = await reader.read(65536)
                if not d:
                    return
                yield d
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                return
            d = await reader.readexactly(size)
            await reader.readline()
            yield d

    async for d in pieces():
        t = time.perf_counter()
        buf += d.decode()
        while "\n\n" in buf:
            ev, buf = buf.split("\n\n", 1)
            if not ev.startswith("data: ") or ev[6:] == "[DONE]":
                continue
            j = json.loads(ev[6:])
            if "error" in j:
                raise RuntimeError("stream error: " + ev)
            if j.get("usage"):
                r["usage"] = j["usage"]
            c = (j.get("choices") or [None])[0]
            if c and (c.get("text") or ((c.get("logprobs") or {}).get("tokens"))):
                r["chunk_times"].append(t)
                r["text"] += c.get("text") or ""
    r["t_end"] = time.perf_counter()
    writer.close()
    return r


def constrained(o, k):
    """Request k carries --constraint: every 1/fraction-th request, spread evenly (half: every other one)."""
    return o.constraint is not None and o.constrained_fraction > 0 and \
        int((k + 1) * o.constrained_fraction) > int(k * o.constrained_fraction)


async def run_level(o, host, port, prompts, C, pid):
    N = max(o.per_stream * C, o.min_requests)
    nxt = [0]
    results = []
    cpu0 = proc_cpu_seconds(pid)
    c0 = time.process_time()
    t0 = time.perf_counter()

    async def worker():
        while nxt[0] < N:
            k = nxt[0]
            nxt[0] += 1
            p = k % len(prompts)
            r = await stream_completion(host, port, body(o, prompts[p], constrained(o, k)))
            r["prompt"] = p
            r["constrained"] = constrained(o, k)
            results.append(r)

    await asyncio.gather(*(worker() for _ in range(C)))
    wall = time.perf_counter() - t0
    server_cpu = proc_cpu_seconds(pid) - cpu0
    ttft, itl, e2e, outputs = [], [], [], {}
    out_tok = prompt_tok = 0
    for r in results:
        u = r["usage"]
        # A constrained request ends where its grammar does (end-of-sequence cannot be ignored there).
        if not u or u["completion_tokens"] > o.max_tokens or (u["completion_tokens"] != o.max_tokens and not r["constrained"]):
            raise RuntimeError(f"expected {o.max_tokens} tokens, got {u}")
        out_tok += u["completion_tokens"]
        prompt_tok += u["prompt_tokens"]
        ct = r["chunk_times"]
        if ct:
            ttft.append(1e3 * (ct[0] - r["t_send"]))
        itl += [1e3 * (b - a) for a, b in zip(ct, ct[1:])]
        e2e.append(1e3 * (r["t_end"] - r["t_send"]))
        outputs[str(r["prompt"])] = fnv1a64(r["text"])
    pct = lambda v: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "mean": sum(v) / len(v) if v else None}
    return {"concurrency": C, "requests": N, "wall_s": wall, "output_tokens": out_tok, "prompt_tokens": prompt_tok,
            "output_tok_s": out_tok / wall, "req_s": N / wall, "ttft_ms": pct(ttft), "itl_ms": pct(itl),
            "e2e_ms": pct(e2e), "server_cpu_s": server_cpu, "server_cpu_ms_per_token": 1e3 * server_cpu / out_tok,
            "client_cpu_s": time.process_time() - c0, "output_hashes": outputs}


def token_prompt(o, seed):
    """A synthetic prompt's token ids, made when it is sent (a million a prompt would not all fit in memory)."""
    import random
    r = random.Random(seed)
    return [r.randrange(o.vocab) for _ in range(o.prompt_tokens)]


def body(o, prompt, constrain=False):
    if isinstance(prompt, dict):
        prompt = token_prompt(o, prompt["seed"])
    b = {"model": "bench", "prompt": prompt, "max_tokens": o.max_tokens, "temperature": 0, "ignore_eos": True,
         "stream": True, "stream_options": {"include_usage": True}}
    if constrain:
        b.update(o.constraint)
        del b["ignore_eos"]
    if o.logprobs >= 0:
        b["logprobs"] = o.logprobs
    return b


def engine_counters(host, port):
    """The server's megactx_* counters without labels (steps, graph replays, speculative drafts ...)."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"(megactx_[a-z_]+) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="synthetic prompts of this many token ids")
    ap.add_argument("--vocab", type=int, default=0, help="with --prompt-tokens: ids drawn from [0, V)")
    ap.add_argument("--count", type=int, default=16, help="with --prompt-tokens: this many prompts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--per-stream", type=int, default=1)
    ap.add_argument("--logprobs", type=int, default=0, help="logprobs per token; -1: none")
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--server-cpus", default=None, help="taskset the server to these cores")
    ap.add_argument("--constraint", type=json.loads, default=None,
                    help='request fields that constrain the output, e.g. \'{"structured_outputs": {"regex": "[a-z ]+"}}\'')
    ap.add_argument("--constrained-fraction", type=float, default=0.0,
                    help="share of the requests that carry --constraint (0.5: every other one)")
    ap.add_argument("--out")
    ap.add_argument("--engine-json")
    o = ap.parse_args()
    if bool(o.prompts) == bool(o.prompt_tokens):
        ap.error("give --prompts FILE or --prompt-tokens L (with --vocab V)")
    if o.prompt_tokens and o.vocab <= 0:
        ap.error("--prompt-tokens needs --vocab V")
    prompts = ([{"seed": o.seed * 1000003 + i} for i in range(o.count)] if o.prompt_tokens
               else json.load(open(o.prompts))["prompts"])
    cmd = [o.bin, "serve", "--model", o.model, "--port", "0", "--served-model-name", "bench"] + o.server_arg
    if o.server_cpus:
        cmd = ["taskset", "-c", o.server_cpus] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log, url = "", None
    while True:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("server exited:\n" + log)
        log += line
        m = re.search(r"listening on http://([^:]+):(\d+)", log)
        if m:
            url = (m.group(1), int(m.group(2)))
        if url and "ready in" in log:
            break
    asyncio.get_running_loop().run_in_executor(None, proc.stderr.read)  # keep draining the log
    out = {"bench": "bench_serve.py", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": os.environ.get("MEGACTX_COMMIT", ""), "server_command": " ".join(cmd),
           "server_startup_log": log,
           "server_cpus": o.server_cpus, "client_cpus": sorted(os.sched_getaffinity(0)),
           "workload": {"max_tokens": o.max_tokens, "logprobs": o.logprobs, "min_requests": o.min_requests,
                        "per_stream": o.per_stream, "n_prompts": len(prompts),
                        "prompt_tokens": o.prompt_tokens or None, "vocab": o.vocab or None, "constraint": o.constraint,
                        "constrained_fraction": o.constrained_fraction}, "levels": []}
    try:
        await stream_completion(*url, body(o, prompts[0]))  # warm-up
        for C in map(int, o.levels.split(",")):
            before = engine_counters(*url)
            lv = await run_level(o, *url, prompts, C, proc.pid)
            after = engine_counters(*url)
            lv["engine_counters"] = {k: after[k] - before.get(k, 0.0) for k in after}
            print(f"bench_serve.py: C={C} {lv['output_tok_s']:.1f} tok/s", file=sys.stderr)
            out["levels"].append(lv)
    finally:
        proc.terminate()
        proc.wait()
    if o.engine_json:
        eng = {l["concurrency"]: l for l in json.load(open(o.engine_json))["levels"]}
        out["overhead"] = []
        print("    C  server tok/s  engine tok/s  overhead/token  outputs equal")
        for s in out["levels"]:
            e = eng.get(s["concurrency"])
            if not e:
                continue
            ovh = e["output_tok_s"] / s["output_tok_s"] - 1
            same = sum(e["output_hashes"].get(p) == h for p, h in s["output_hashes"].items())
            out["overhead"].append({"concurrency": s["concurrency"], "overhead_per_token": ovh, "outputs_equal": same,
                                    "outputs_compared": len(s["output_hashes"])})
            print(f"{s['concurrency']:5d} {s['output_tok_s']:13.1f} {e['output_tok_s']:13.1f} {100 * ovh:14.1f}%"
                  f"  {same}/{len(s['output_hashes'])}")
    if o.out:
        with open(o.out, "w") as f:
            json.dump(out, f, indent=2)


asyncio.run(main())
