// The HTTP edges a deployment meets: load failures, body limits under every transfer encoding, bodiless POSTs,
// wrong methods, clients that leave before a non-streamed answer, busy ports and bad settings.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { spawn, startServer, raw, runServe, rawHttp, metricsOf, waitMetrics, waitLog, MODEL, API_KEY } from './harness.mjs';

const LIMIT = 100000;
let server;
before(async () => { server = await startServer(['--max-body-bytes', String(LIMIT)]); });
after(async () => { assert.equal(await server.stop(), 0); });

const auth = `Authorization: Bearer ${API_KEY}\r\n`;

function modelCopy(name) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `megactx-${name}-`));
  for (const f of fs.readdirSync(MODEL)) fs.copyFileSync(path.join(MODEL, f), path.join(dir, f));
  return dir;
}

test('a model that fails to load exits 1 at once, every time', async () => {
  const garbage = modelCopy('garbage-config');
  fs.writeFileSync(path.join(garbage, 'config.json'), '{"this is": not json');
  const truncated = modelCopy('truncated');
  const st = path.join(truncated, 'model.safetensors');
  fs.truncateSync(st, Math.floor(fs.statSync(st).size / 2));
  for (const dir of ['/does/not/exist', garbage, truncated]) {
    for (let i = 0; i < 10; i++) {
      const r = await runServe(['--model', dir, '--port', '0'], 5000);
      assert.equal(r.code, 1, r.log);
      // It used to hang forever; a typical exit takes ~25 ms (docs/server.md). The bound leaves room for slow CI.
      assert.ok(r.ms < 5000, `exited after ${r.ms} ms`);
      assert.match(r.log, /megactx: error:/);
    }
  }
});

test('SIGTERM while the model loads exits at once', async () => {
  // A FIFO as config.json: the loader blocks in open() until the signal comes.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'megactx-fifo-'));
  execFileSync('mkfifo', [path.join(dir, 'config.json')]);
  const s = spawn(process.env.MEGACTX_BIN, ['serve', '--model', dir, '--port', '0'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  await new Promise((resolve, reject) => {
    s.stderr.on('data', (d) => { log += d; if (/loading model/.test(log)) resolve(); });
    s.on('exit', (code) => reject(new Error(`exited with ${code} before loading:\n${log}`)));
  });
  const base = log.match(/listening on (http:\/\/[^ ]+)/)[1];
  assert.equal((await fetch(base + '/health')).status, 503);
  const t0 = Date.now();
  const code = await new Promise((resolve) => { s.on('exit', resolve); s.kill('SIGTERM'); });
  assert.equal(code, 0, log);
  assert.ok(Date.now() - t0 < 5000, `exited ${Date.now() - t0} ms after the signal`);
  assert.match(log, /SIGTERM received while loading/);
});

test('a busy port says why, and a bad --kv-cache-memory is reported before listening', async () => {
  const port = new URL(server.base).port;
  const busy = await runServe(['--model', MODEL, '--port', port]);
  assert.equal(busy.code, 1, busy.log);
  assert.match(busy.log, /cannot listen on 127\.0\.0\.1:\d+: Address already in use/);
  const bad = await runServe(['--model', MODEL, '--port', '0', '--kv-cache-memory', '12 parsecs']);
  assert.equal(bad.code, 1, bad.log);
  assert.match(bad.log, /--kv-cache-memory/);
  assert.doesNotMatch(bad.log, /listening/);
});

test('the body limit holds for chunked bodies, before they are buffered', async () => {
  const big = 'x'.repeat(1 << 20);
  const chunks = [`POST /v1/completions HTTP/1.1\r\nHost: t\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`];
  for (let i = 0; i < 5; i++) chunks.push(`${(big.length).toString(16)}\r\n${big}\r\n`);
  chunks.push('0\r\n\r\n');
  const r = await rawHttp(server.base, chunks);
  assert.equal(r.status, 413, r.text.slice(0, 300));
  assert.match(r.text, /request body too large/);
  // Under the limit, chunked works like Content-Length.
  const body = JSON.stringify({ prompt: 'chunked', max_tokens: 2, temperature: 0 });
  const ok = await rawHttp(server.base, [
    `POST /v1/completions HTTP/1.1\r\nHost: t\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n`,
    `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`]);
  assert.equal(ok.status, 200, ok.text);
  // Content-Length over the limit is still a 413; an unknown transfer coding is a 400.
  const cl = await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt: 'y'.repeat(LIMIT) }) });
  assert.equal(cl.status, 413);
  const te = await rawHttp(server.base, [`POST /v1/completions HTTP/1.1\r\nHost: t\r\n${auth}Transfer-Encoding: gzip\r\n\r\n`]);
  assert.equal(te.status, 400, te.text);
  assert.match(te.text, /Transfer-Encoding/);
});

test('a POST without a body or Content-Length gets its 400 at once', async () => {
  const r = await rawHttp(server.base, [`POST /v1/completions HTTP/1.1\r\nHost: t\r\n${auth}\r\n`], { idleMs: 500 });
  assert.equal(r.status, 400, r.text);
  assert.ok(r.ms < 2000, `took ${r.ms} ms`);
  assert.match(r.text, /not valid JSON/);
});

test('a wrong method on a known path is 405 with Allow; an unknown path is 404', async () => {
  const get = await fetch(server.base + '/v1/chat/completions');
  assert.equal(get.status, 405);
  assert.equal(get.headers.get('allow'), 'POST');
  assert.equal((await get.json()).error.code, 405);
  const post = await fetch(server.base + '/v1/models', { method: 'POST', body: '{}' });
  assert.equal(post.status, 405);
  assert.equal(post.headers.get('allow'), 'GET');
  const del = await fetch(server.base + '/health', { method: 'DELETE' });
  assert.equal(del.status, 405);
  const none = await fetch(server.base + '/v1/nothing', { method: 'POST' });
  assert.equal(none.status, 404);
  const m = await metricsOf(server.base);
  assert.ok(m['megactx_http_client_errors_total{status="405"}'] >= 3);
  assert.ok(m['megactx_http_client_errors_total{status="404"}'] >= 1);
});

test('a non-streamed request is cancelled when its client disconnects', async () => {
  const before = await metricsOf(server.base);
  const body = JSON.stringify({ prompt: 'a very long answer', max_tokens: 100000, ignore_eos: true, temperature: 0 });
  const ac = new AbortController();
  const pending = fetch(server.base + '/v1/completions', {
    method: 'POST', signal: ac.signal, body,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
  }).catch((e) => e);
  await waitMetrics(server.base, (m) => m.megactx_requests_running === 1 && m.megactx_generation_tokens_total > before.megactx_generation_tokens_total + 20);
  ac.abort();
  await pending;
  const m = await waitMetrics(server.base, (x) => x.megactx_requests_running === 0);
  assert.equal(m.megactx_requests_running, 0, 'the request left the batch');
  assert.equal(m.megactx_kv_blocks_used, before.megactx_kv_blocks_used, 'its blocks came back');
  assert.equal(m.megactx_requests_aborted_total, (before.megactx_requests_aborted_total ?? 0) + 1);
  // The engine stopped generating for it.
  const g = m.megactx_generation_tokens_total;
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await metricsOf(server.base)).megactx_generation_tokens_total, g);
});

test('token counters move while a request runs, not only when it ends', async () => {
  const before = await metricsOf(server.base);
  const res = await fetch(server.base + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify({ prompt: 'stream me', max_tokens: 3000, ignore_eos: true, temperature: 0, stream: true }),
  });
  const reader = res.body.getReader();
  await reader.read();
  const mid = await waitMetrics(server.base, (m) => m.megactx_generation_tokens_total > before.megactx_generation_tokens_total + 10);
  assert.equal(mid.megactx_requests_running, 1, 'still running');
  assert.ok(mid.megactx_generation_tokens_total > before.megactx_generation_tokens_total + 10);
  assert.ok(mid.megactx_prompt_tokens_total > before.megactx_prompt_tokens_total);
  await reader.cancel();
  await waitMetrics(server.base, (m) => m.megactx_requests_running === 0);
});

test('each request gets one access line with its status and token counts', async () => {
  await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt: 'log me', max_tokens: 2, temperature: 0 }) });
  await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt: 'log me', max_tokens: 'x' }) });
  assert.ok(await waitLog(server, /"POST \/v1\/completions" 200 prompt=\d+ cached=\d+ output=2 finish=length \d+\.\d{3}s$/), server.log());
  assert.ok(await waitLog(server, /"POST \/v1\/completions" 400 \d+\.\d{3}s$/), server.log());
  assert.ok(await waitLog(server, /"GET \/metrics" 200/), server.log());
});

test('a throughput line while busy; --no-access-log keeps the access lines out', async () => {
  const s = await startServer(['--log-interval', '0.2', '--no-access-log']);
  try {
    await raw(s.base, '/v1/completions', { body: JSON.stringify({ prompt: 'busy', max_tokens: 400, ignore_eos: true, temperature: 0 }) });
    assert.ok(await waitLog(s, /megactx serve: prompt [\d.]+ tok\/s, generation [\d.]+ tok\/s, running \d+, waiting \d+, KV [\d.]+% used, prefix-cache hits [\d.]+%, preemptions \d+/), s.log());
    assert.doesNotMatch(s.log(), /"POST \/v1\/completions"/);
  } finally {
    assert.equal(await s.stop(), 0);
  }
});

test('the server still serves after all of that', async () => {
  const r = await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt: 'alive', max_tokens: 3, temperature: 0 }) });
  assert.equal(r.status, 200, r.text);
  assert.equal((await raw(server.base, '/health', { method: 'GET' })).status, 200);
});
