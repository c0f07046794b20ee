#!/usr/bin/env node
// bench_serve: serving throughput and latency of `megactx serve` over HTTP (issue 4), and the server's overhead
// per output token against bench_engine (the same workload through Engine::submit, no HTTP).
//
// Workload (identical in bench_engine): at each concurrency level C, a closed loop of C clients; each sends a
// streaming /v1/completions request (text prompt from the prompts file, max_tokens M, temperature 0,
// ignore_eos), waits for its last byte and sends the next, until N = max(per_stream·C, min_requests) requests
// have finished. One untimed warm-up request first. Per request: TTFT (request sent → first chunk with text),
// inter-token latency (gaps between chunks with text), end-to-end; output tokens from `usage`
// (stream_options.include_usage). Per level: output tokens/s and requests/s over the level's wall time,
// p50/p99 TTFT and ITL (linear interpolation between order statistics), and the CPU time of the server
// process and of this client.
//
//   node bench/bench_serve.mjs --write-prompts FILE [--count 128] [--words 100] [--seed 1]
//   node bench/bench_serve.mjs (--bin BIN --model DIR | --url URL) --prompts FILE [--levels 1,8,32,64]
//        [--max-tokens 64] [--logprobs N] [--min-requests 16] [--per-stream 2] [--server-arg=--flag ...] [--out FILE]
//        [--engine-json FILE]   (bench_engine's JSON: adds the overhead per output token at each level)
//   node bench/bench_serve.mjs ... --prompt-tokens L --vocab V [--count N] [--seed S]
//        (instead of --prompts: N prompts of L token ids drawn uniformly from [0, V), seeded, none sharing a
//        prefix, sent as token arrays: long contexts without a text corpus, e.g. the host KV tier at 128K-1M)
//   node bench/bench_serve.mjs --report SERVER.json --engine-json ENGINE.json [--out FILE]   (no run: compare)
//
// Plain node:http with its own SSE parsing (no npm packages): timestamps are taken when the bytes arrive.
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import { spawn, execSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';

function parseArgs(argv) {
  const o = { levels: [1, 8, 32, 64], maxTokens: 64, minRequests: 16, perStream: 2, serverArgs: [], count: 128,
    words: 100, seed: 1 };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const eq = a.indexOf('=');
    const key = eq > 0 ? a.slice(0, eq) : a;
    const val = () => (eq > 0 ? a.slice(eq + 1) : argv[++i]);
    switch (key) {
      case '--bin': o.bin = val(); break;
      case '--model': o.model = val(); break;
      case '--url': o.url = val(); break;
      case '--prompts': o.prompts = val(); break;
      case '--levels': o.levels = val().split(',').map(Number); break;
      case '--max-tokens': o.maxTokens = Number(val()); break;
      case '--logprobs': o.logprobs = Number(val()); break;
      case '--min-requests': o.minRequests = Number(val()); break;
      case '--per-stream': o.perStream = Number(val()); break;
      case '--server-arg': o.serverArgs.push(val()); break;
      case '--out': o.out = val(); break;
      case '--engine-json': o.engineJson = val(); break;
      case '--report': o.report = val(); break;
      case '--write-prompts': o.writePrompts = val(); break;
      case '--count': o.count = Number(val()); break;
      case '--words': o.words = Number(val()); break;
      case '--seed': o.seed = Number(val()); break;
      case '--prompt-tokens': o.promptTokens = Number(val()); break;
      case '--vocab': o.vocab = Number(val()); break;
      default: throw new Error(`bench_serve: unknown argument ${a}`);
    }
  }
  return o;
}

// Deterministic prompts: English words (those the generated tokenizer was trained on, so mostly whole-word
// tokens) drawn with a seeded PRNG; each prompt starts with its own index so no two share a prefix.
const WORDS = ('the model reads prompt one token at a time and writes answer same way short piece of text often ' +
  'whole common word such as sometimes part longer for rare single byte tokenizer learns which pieces to keep by ' +
  'counting pairs symbols that appear most in its training merging them again until vocabulary is full when user ' +
  'asks question assistant thinks about it first then answers can call tool needs information does not have ' +
  'returns response before continues long documents source code conversations with many turns all become context ' +
  'million hold base or several books once there are numbers too quick brown fox jumps over lazy dog while cat ' +
  'sleeps warm sun window what capital france paris how days week seven where rise rises east sets west').split(' ');

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makePrompts(count, words, seed) {
  const rnd = mulberry32(seed);
  const out = [];
  for (let i = 0; i < count; ++i) {
    const w = [`Request ${i}:`];
    for (let k = 0; k < words; ++k) w.push(WORDS[Math.floor(rnd() * WORDS.length)]);
    out.push(w.join(' ') + '.');
  }
  return out;
}

// FNV-1a 64 over the UTF-8 bytes (bench_engine computes the same over its decoded text).
function fnv1a64(s) {
  let h = 0xcbf29ce484222325n;
  for (const b of Buffer.from(s, 'utf8')) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, '0');
}

// Linear interpolation between order statistics (numpy's default); bench_engine uses the same rule.
function percentile(values, q) {
  if (values.length === 0) return null;
  const v = Float64Array.from(values).sort();
  const x = q * (v.length - 1);
  const lo = Math.floor(x), hi = Math.ceil(x);
  return v[lo] + (v[hi] - v[lo]) * (x - lo);
}
const mean = (v) => (v.length ? v.reduce((a, b) => a + b, 0) / v.length : null);

let clockTicks = null;
function procCpuSeconds(pid) {
  // utime + stime of every thread, from /proc/PID/stat (fields 14 and 15, in clock ticks).
  if (clockTicks === null) clockTicks = Number(execSync('getconf CLK_TCK').toString().trim());
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) / clockTicks;
}

async function startServer(o) {
  const args = ['serve', '--model', o.model, '--port', '0', '--served-model-name', 'bench', ...o.serverArgs];
  const proc = spawn(o.bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    let u = null;
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 120000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on (http:\/\/[^ ]+)/);
      if (m) u = m[1];
      if (u && /ready in/.test(log)) {
        clearTimeout(timer);
        resolve(u);
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
  return { proc, url, args, log: () => log };
}

const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

// One streaming completion; resolves with its timings (ms, performance.now()) and usage.
function streamCompletion(url, body) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(body);
    const r = { tSend: performance.now(), chunkTimes: [], text: '', usage: null, finish: null, nEvents: 0 };
    const req = http.request(url + '/v1/completions', {
      method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) },
    }, (res) => {
      if (res.statusCode !== 200) {
        let t = '';
        res.on('data', (d) => { t += d; });
        res.on('end', () => reject(new Error(`HTTP ${res.statusCode}: ${t}`)));
        return;
      }
      res.setEncoding('utf8');
      let buf = '';
      res.on('data', (d) => {
        const t = performance.now();
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!ev.startsWith('data: ')) continue;
          const data = ev.slice(6);
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          ++r.nEvents;
          if (j.error) { reject(new Error('stream error: ' + data)); return; }
          if (j.usage) r.usage = j.usage;
          const c = j.choices && j.choices[0];
          // A chunk carries a token when it has text, or (with logprobs) the token's logprob.
          if (c && (c.text || (c.logprobs && c.logprobs.tokens && c.logprobs.tokens.length))) {
            r.chunkTimes.push(t);
            r.text += c.text || '';
          }
          if (c && c.finish_reason) r.finish = c.finish_reason;
        }
      });
      res.on('end', () => { r.tEnd = performance.now(); resolve(r); });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(payload);
  });
}

// A synthetic prompt's token ids, made when it is sent (a million ids a prompt would not all fit in memory at once).
function tokenPrompt(o, p) {
  const rand = mulberry32(p.seed);
  const ids = new Array(p.tokens);
  for (let i = 0; i < p.tokens; ++i) ids[i] = Math.floor(rand() * o.vocab);
  return ids;
}

function requestBody(o, prompt) {
  if (typeof prompt === 'object' && !Array.isArray(prompt)) prompt = tokenPrompt(o, prompt);
  const b = { model: 'bench', prompt, max_tokens: o.maxTokens, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true } };
  if (o.logprobs !== undefined) b.logprobs = o.logprobs;
  return b;
}

async function runLevel(o, url, prompts, C, serverPid) {
  const N = Math.max(o.perStream * C, o.minRequests);
  let next = 0;
  const results = [];
  const cpu0 = serverPid ? procCpuSeconds(serverPid) : null;
  const client0 = process.cpuUsage();
  const t0 = performance.now();
  async function worker() {
    while (next < N) {
      const k = next++;
      const p = k % prompts.length;
      const r = await streamCompletion(url, requestBody(o, prompts[p]));
      r.prompt = p;
      results.push(r);
    }
  }
  await Promise.all(Array.from({ length: C }, worker));
  const wall = (performance.now() - t0) / 1e3;
  const clientCpu = process.cpuUsage(client0);
  const serverCpu = serverPid ? procCpuSeconds(serverPid) - cpu0 : null;

  const ttft = [], itl = [], e2e = [], outputs = {};
  let outTokens = 0, promptTokens = 0, chunks = 0, differing = 0;
  for (const r of results) {
    if (!r.usage) throw new Error('no usage chunk in a stream');
    if (r.usage.completion_tokens !== o.maxTokens) throw new Error(`expected ${o.maxTokens} tokens, got ${r.usage.completion_tokens}`);
    outTokens += r.usage.completion_tokens;
    promptTokens += r.usage.prompt_tokens;
    chunks += r.chunkTimes.length;
    if (r.chunkTimes.length) ttft.push(r.chunkTimes[0] - r.tSend);
    for (let i = 1; i < r.chunkTimes.length; ++i) itl.push(r.chunkTimes[i] - r.chunkTimes[i - 1]);
    e2e.push(r.tEnd - r.tSend);
    const h = fnv1a64(r.text);
    if (outputs[r.prompt] !== undefined && outputs[r.prompt] !== h) ++differing;  // same prompt, other text
    outputs[r.prompt] = h;
  }
  return {
    concurrency: C, requests: N, wall_s: wall, output_tokens: outTokens, prompt_tokens: promptTokens,
    output_tok_s: outTokens / wall, req_s: N / wall,
    ttft_ms: { p50: percentile(ttft, 0.5), p99: percentile(ttft, 0.99), mean: mean(ttft) },
    itl_ms: { p50: percentile(itl, 0.5), p99: percentile(itl, 0.99), mean: mean(itl), n: itl.length },
    e2e_ms: { p50: percentile(e2e, 0.5), p99: percentile(e2e, 0.99), mean: mean(e2e) },
    text_chunks: chunks, tokens_per_text_chunk: outTokens / chunks,
    server_cpu_s: serverCpu, server_cpu_ms_per_token: serverCpu === null ? null : 1e3 * serverCpu / outTokens,
    client_cpu_s: (clientCpu.user + clientCpu.system) / 1e6,
    output_hashes: outputs, repeated_prompts_with_different_output: differing,
    loadavg: os.loadavg(),
  };
}

function gitCommit() {
  if (process.env.MEGACTX_COMMIT) return process.env.MEGACTX_COMMIT;
  try { return execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); }
  catch { return ''; }
}
function gitDirty() {
  try { return execSync('git status --porcelain --untracked-files=no', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim() !== ''; }
  catch { return null; }
}

const f1 = (x) => (x === null || x === undefined ? '—' : x.toFixed(1));
const f2 = (x) => (x === null || x === undefined ? '—' : x.toFixed(2));

function printTable(title, levels) {
  console.log(`\n${title}`);
  console.log('    C  requests   tok/s   req/s  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  ITL mean ms');
  for (const l of levels) {
    console.log(`${String(l.concurrency).padStart(5)} ${String(l.requests).padStart(9)} ${f1(l.output_tok_s).padStart(7)} ` +
      `${f2(l.req_s).padStart(7)} ${f1(l.ttft_ms.p50).padStart(12)} ${f1(l.ttft_ms.p99).padStart(12)} ` +
      `${f2(l.itl_ms.p50).padStart(11)} ${f2(l.itl_ms.p99).padStart(11)} ${f2(l.itl_ms.mean).padStart(12)}`);
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  if (o.writePrompts) {
    const prompts = makePrompts(o.count, o.words, o.seed);
    fs.writeFileSync(o.writePrompts, JSON.stringify({ seed: o.seed, words: o.words, prompts }, null, 1) + '\n');
    return;
  }
  let out;
  if (o.report) {
    out = JSON.parse(fs.readFileSync(o.report, 'utf8'));
  } else {
    out = await runAll(o);
  }
  report(o, out);
}

async function runAll(o) {
  if (!o.prompts && !o.promptTokens) {
    throw new Error('bench_serve: --prompts FILE is required (make one with --write-prompts), or --prompt-tokens');
  }
  if (o.promptTokens && !(o.vocab > 0)) throw new Error('bench_serve: --prompt-tokens needs --vocab V');
  if (!o.url && !(o.bin && o.model)) throw new Error('bench_serve: give --bin and --model, or --url');
  const prompts = o.promptTokens
    ? Array.from({ length: o.count }, (_, i) => ({ tokens: o.promptTokens, seed: (o.seed * 1000003 + i) >>> 0 }))
    : JSON.parse(fs.readFileSync(o.prompts, 'utf8')).prompts;

  let server = null;
  let url = o.url;
  if (!url) {
    server = await startServer(o);
    url = server.url;
  }
  const out = {
    bench: 'bench_serve', date: new Date().toISOString(), commit: gitCommit(), dirty: gitDirty(),
    device: { cpu: os.cpus()[0].model, logical_cores: os.cpus().length, mem_gib: os.totalmem() / 2 ** 30 },
    node: process.version, omp_num_threads: process.env.OMP_NUM_THREADS ?? null,
    omp_wait_policy: process.env.OMP_WAIT_POLICY ?? null,
    command: 'node bench/bench_serve.mjs ' + process.argv.slice(2).join(' '),
    server_command: server ? [o.bin, ...server.args].join(' ') : null, url,
    workload: { endpoint: '/v1/completions', stream: true, prompts_file: o.prompts ?? null,
      prompt_tokens: o.promptTokens ?? null, vocab: o.vocab ?? null, n_prompts: prompts.length,
      max_tokens: o.maxTokens, logprobs: o.logprobs ?? null, temperature: 0, ignore_eos: true, min_requests: o.minRequests, per_stream: o.perStream },
    loadavg_start: os.loadavg(), levels: [],
  };
  try {
    // Warm-up (untimed): first-touch of the KV pool, thread pools, connections.
    await streamCompletion(url, requestBody(o, prompts[0]));
    for (const C of o.levels) {
      process.stderr.write(`bench_serve: C=${C} ... `);
      const l = await runLevel(o, url, prompts, C, server ? server.proc.pid : null);
      process.stderr.write(`${l.output_tok_s.toFixed(1)} tok/s, ${l.wall_s.toFixed(1)} s\n`);
      out.levels.push(l);
      if (o.out) fs.writeFileSync(o.out, JSON.stringify(out, null, 2) + '\n');
    }
  } finally {
    if (server) {
      const done = new Promise((r) => server.proc.on('exit', r));
      server.proc.kill('SIGTERM');
      await done;
    }
    agent.destroy();
  }
  out.loadavg_end = os.loadavg();
  return out;
}

function report(o, out) {
  printTable(`server (HTTP, streaming) — commit ${out.commit}${out.dirty ? ' (dirty)' : ''}`, out.levels);

  if (o.engineJson) {
    const eng = JSON.parse(fs.readFileSync(o.engineJson, 'utf8'));
    out.engine = eng;
    printTable('engine direct (Engine::submit, no HTTP)', eng.levels);
    out.overhead = [];
    console.log('\nserver overhead per output token vs engine direct (target: < 5% at 32 streams)');
    console.log('    C  server ms/tok  engine ms/tok  overhead  ITL mean ovh  CPU ms/tok server  engine  outputs equal');
    for (const s of out.levels) {
      const e = eng.levels.find((x) => x.concurrency === s.concurrency);
      if (!e) continue;
      const sMs = 1e3 / s.output_tok_s, eMs = 1e3 / e.output_tok_s;
      let same = 0, compared = 0;
      for (const [p, h] of Object.entries(s.output_hashes)) {
        if (e.output_hashes[p] === undefined) continue;
        ++compared;
        same += e.output_hashes[p] === h;
      }
      const row = {
        concurrency: s.concurrency, server_ms_per_token: sMs, engine_ms_per_token: eMs,
        overhead_per_token: (sMs - eMs) / eMs,
        itl_mean_overhead: (s.itl_ms.mean - e.itl_ms.mean) / e.itl_ms.mean,
        server_cpu_ms_per_token: s.server_cpu_ms_per_token, engine_cpu_ms_per_token: e.cpu_ms_per_token,
        outputs_compared: compared, outputs_equal: same,
      };
      out.overhead.push(row);
      console.log(`${String(s.concurrency).padStart(5)} ${sMs.toFixed(3).padStart(14)} ${eMs.toFixed(3).padStart(14)} ` +
        `${(100 * row.overhead_per_token).toFixed(1).padStart(8)}% ${(100 * row.itl_mean_overhead).toFixed(1).padStart(12)}% ` +
        `${f2(row.server_cpu_ms_per_token).padStart(17)} ${f2(row.engine_cpu_ms_per_token).padStart(7)}  ${same}/${compared}`);
    }
    const paired = out.levels.filter((l) => l.paired_overhead);
    if (paired.length) {
      console.log('\npaired (each round: engine and server back to back at that level), median over rounds');
      console.log('    C  overhead  per round                          server CPU/token vs engine  client CPU / engine time');
      for (const l of paired) {
        const p = l.paired_overhead;
        console.log(`${String(l.concurrency).padStart(5)} ${(100 * p.median).toFixed(1).padStart(8)}%  ` +
          `${p.per_round.map((x) => (100 * x).toFixed(1) + '%').join(' ').padEnd(34)} ${(100 * p.cpu_median).toFixed(1).padStart(26)}%` +
          `  ${(100 * p.client_cpu_vs_engine_time_median).toFixed(1).padStart(23)}%`);
      }
    }
    const at32 = out.overhead.find((r) => r.concurrency === 32);
    const p32 = out.levels.find((l) => l.concurrency === 32 && l.paired_overhead);
    if (at32) {
      const v = p32 ? p32.paired_overhead.median : at32.overhead_per_token;
      out.target_met_at_32 = v < 0.05;
      console.log(`at 32 streams: ${(100 * v).toFixed(1)}%${p32 ? ' (paired median)' : ''} — target (< 5%) ` +
        `${out.target_met_at_32 ? 'MET' : 'NOT met'}`);
    }
  }
  if (o.out) {
    fs.writeFileSync(o.out, JSON.stringify(out, null, 2) + '\n');
    console.log(`\nwrote ${o.out}`);
  }
}

main().catch((e) => { console.error(e.stack || String(e)); process.exit(1); });
