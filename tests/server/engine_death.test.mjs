// If the engine loop dies, requests fail fast with an error and /health turns 503 — never a hang and never a
// 200 with an empty body. The fault comes from the MEGACTX_FAULT_STEP test hook (docs/testing.md).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, raw } from './harness.mjs';

let server;
before(async () => {
  process.env.MEGACTX_FAULT_STEP = '3';
  server = await startServer([]);
  delete process.env.MEGACTX_FAULT_STEP;
});
after(async () => { assert.equal(await server.stop(), 0); });

test('health is 200 while the engine runs, and 503 once it has died', async () => {
  assert.equal((await raw(server.base, '/health', { method: 'GET' })).status, 200);
  const r = await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt: 'die', max_tokens: 20, temperature: 0 }) });
  assert.equal(r.status, 500, r.text);
  assert.match(r.json.error.message, /fault injected/);
  const h = await raw(server.base, '/health', { method: 'GET' });
  assert.equal(h.status, 503);
  assert.equal(h.json.status, 'engine stopped');
  const again = await raw(server.base, '/v1/completions', { body: JSON.stringify({ prompt: 'x', max_tokens: 2 }) });
  assert.equal(again.status, 503, again.text);
  assert.ok(again.json.error.message.length > 0);
  const m = await raw(server.base, '/metrics', { method: 'GET' });
  assert.match(m.text, /megactx_engine_alive 0/);
});
