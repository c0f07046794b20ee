// Clients that die under load: killed mid-upload, before a non-streamed answer, and mid-stream, while other
// requests run beside them. Afterwards every KV block is back, nothing is left running, and the requests that
// finished gave the tokens they give alone.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, raw, metricsOf, waitMetrics, API_KEY } from './harness.mjs';

let server;
before(async () => { server = await startServer(['--max-num-seqs', '16', '--max-num-batched-tokens', '256']); });
after(async () => { assert.equal(await server.stop(), 0); });

const headers = { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);

async function complete(prompt, maxTokens) {
  const r = await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true }) });
  assert.equal(r.status, 200, r.text);
  return r.json.choices[0].text;
}

// A non-streamed request whose client gives up after `ms`.
async function abandon(prompt, ms) {
  const ac = new AbortController();
  const p = fetch(server.base + '/v1/completions', {
    method: 'POST', headers, signal: ac.signal,
    body: JSON.stringify({ prompt, max_tokens: 5000, ignore_eos: true }),
  }).then(() => 'answered', () => 'aborted');
  await sleep(ms);
  ac.abort();
  return p;
}

// A streamed request whose client leaves after `n` chunks.
async function leaveStream(prompt, n) {
  const res = await fetch(server.base + '/v1/chat/completions', {
    method: 'POST', headers,
    body: JSON.stringify({ messages: [{ role: 'user', content: prompt }], max_tokens: 5000, ignore_eos: true, stream: true }),
  });
  const reader = res.body.getReader();
  for (let i = 0; i < n; i++) await reader.read();
  await reader.cancel();
}

// A client that dies halfway through sending its body.
function dieMidUpload() {
  return new Promise((resolve) => {
    const url = new URL(server.base);
    const body = JSON.stringify({ prompt: 'never finished '.repeat(50), max_tokens: 10 });
    const sock = net.connect(Number(url.port), url.hostname, () => {
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ${API_KEY}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, body.length / 2)}`);
      setTimeout(() => { sock.destroy(); resolve(); }, 20);
    });
    sock.on('error', resolve);
  });
}

test('clients killed mid-request and mid-stream under load give back every KV block and change nothing else', async () => {
  const prompts = Array.from({ length: 6 }, (_, i) => `Request number ${i} asks for a story about ${'lighthouses '.repeat(i + 3)}`);
  const alone = [];
  for (const p of prompts) alone.push(await complete(p, 24));
  const base = await waitMetrics(server.base, (m) => m.megactx_requests_running === 0);

  for (let round = 0; round < 3; round++) {
    const jobs = prompts.map((p) => complete(p, 24));
    for (let i = 0; i < 5; i++) jobs.push(abandon(`abandoned ${round} ${i} `.repeat(20), 30 + Math.floor(rand() * 200)));
    for (let i = 0; i < 5; i++) jobs.push(leaveStream(`left ${round} ${i}`, 1 + Math.floor(rand() * 8)));
    for (let i = 0; i < 3; i++) jobs.push(dieMidUpload());
    const results = await Promise.all(jobs);
    for (let i = 0; i < prompts.length; i++) assert.equal(results[i], alone[i], `round ${round}: request ${i} changed under faults`);
  }

  const m = await waitMetrics(server.base, (x) => x.megactx_requests_running === 0 && x.megactx_requests_waiting === 0 &&
    x.megactx_kv_blocks_used === base.megactx_kv_blocks_used);
  assert.equal(m.megactx_requests_running, 0);
  assert.equal(m.megactx_requests_waiting, 0);
  assert.equal(m.megactx_kv_blocks_used, base.megactx_kv_blocks_used, 'every KV block came back');
  assert.ok(m.megactx_requests_aborted_total >= (base.megactx_requests_aborted_total ?? 0) + 15 * 0.8,
    `aborted: ${m.megactx_requests_aborted_total}`);
  // Nothing else changed: the engine is alive and the same requests still give the same tokens.
  assert.equal(m.megactx_engine_alive, 1);
  for (let i = 0; i < prompts.length; i++) assert.equal(await complete(prompts[i], 24), alone[i]);
  assert.equal((await raw(server.base, '/health', { method: 'GET' })).status, 200);
  const g = (await metricsOf(server.base)).megactx_generation_tokens_total;
  await sleep(300);
  assert.equal((await metricsOf(server.base)).megactx_generation_tokens_total, g, 'no abandoned request still generates');
});
