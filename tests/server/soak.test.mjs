// Soak (bounded in time and requests, loopback only): streaming load with malformed requests mixed in.
// Every good request must complete correctly and the server must survive.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, raw, API_KEY } from './harness.mjs';

const SECONDS = Number(process.env.MEGACTX_SOAK_SECONDS ?? 20);
let server;
before(async () => { server = await startServer(['--max-model-len', '1024', '--max-body-bytes', '65536']); });
after(async () => { assert.equal(await server.stop(), 0); });

test(`soak: ${SECONDS}s of streams with malformed requests mixed in`, async () => {
  const client = new OpenAI({ baseURL: server.base + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 120000 });
  const reference = (await client.completions.create({ model: 'tiny', prompt: 'soak', max_tokens: 16, temperature: 0 })).choices[0].text;
  const deadline = Date.now() + SECONDS * 1000;
  let good = 0, bad = 0, failures = [];
  const bodies = ['{', '[]', '{"prompt": 5}', '{"messages": []}', JSON.stringify({ prompt: 'x', max_tokens: -5 }),
    JSON.stringify({ messages: [{ role: 'nobody', content: 'x' }] }), 'x'.repeat(70000), '{"prompt": "\\ud800"}'];
  const streamer = async () => {
    while (Date.now() < deadline) {
      try {
        const s = await client.completions.create({ model: 'tiny', prompt: 'soak', max_tokens: 16, temperature: 0, stream: true });
        let text = '';
        for await (const c of s) text += c.choices[0]?.text ?? '';
        if (text !== reference) failures.push('wrong text: ' + JSON.stringify(text));
        good++;
      } catch (e) { failures.push(String(e)); }
    }
  };
  const vandal = async (k) => {
    let i = k;
    while (Date.now() < deadline) {
      const body = bodies[i++ % bodies.length];
      const path = i % 2 ? '/v1/completions' : '/v1/chat/completions';
      const r = await raw(server.base, path, { body });
      if (r.status < 400 || r.status >= 500 || !r.json?.error) failures.push(`bad request got ${r.status}: ${r.text.slice(0, 200)}`);
      bad++;
      // Also a client that vanishes mid-stream.
      if (i % 5 === 0) {
        const ac = new AbortController();
        try {
          const res = await fetch(server.base + '/v1/completions', { method: 'POST', signal: ac.signal,
            headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
            body: JSON.stringify({ prompt: 'vanish', max_tokens: 200, stream: true }) });
          await res.body.getReader().read();
        } catch { /* aborted */ }
        ac.abort();
      }
    }
  };
  await Promise.all([...Array(16)].map(streamer).concat([...Array(4)].map((_, k) => vandal(k))));
  assert.deepEqual(failures.slice(0, 5), []);
  assert.ok(good > 16, `good requests: ${good}`);
  assert.ok(bad > 10, `bad requests: ${bad}`);
  const h = await raw(server.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
});
