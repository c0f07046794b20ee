// A model whose vocabulary is larger than its tokenizer's (padding rows; gen-model's small preset maps only
// 516 of 4096 ids): generated ids the tokenizer lacks give no text, as in Hugging Face's decode(), and must not
// stop the engine. The tiny model is served with a copy of its tokenizer.json cut down to the 256 byte tokens
// and the added tokens, so ids 256..479 have no text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, raw, MODEL } from './harness.mjs';

let server;
let dir;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'megactx-vocab-gap-'));
  for (const f of fs.readdirSync(MODEL)) {
    if (f !== 'tokenizer.json') fs.symlinkSync(path.resolve(MODEL, f), path.join(dir, f));
  }
  const tok = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8'));
  tok.model.vocab = Object.fromEntries(Object.entries(tok.model.vocab).filter(([, id]) => id < 256));
  tok.model.merges = [];
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));
  server = await startServer(['--max-model-len', '512'], dir);
});

after(async () => {
  if (server) assert.equal(await server.stop(), 0);
  fs.rmSync(dir, { recursive: true, force: true });
});

const body = (extra) => JSON.stringify({ model: 'tiny', prompt: [1, 2, 3, 4, 5], max_tokens: 48, temperature: 0,
  ignore_eos: true, ...extra });

test('ids the tokenizer lacks give no text and do not stop the engine', async () => {
  const r = await raw(server.base, '/v1/completions', { body: body({ logprobs: 0 }) });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].finish_reason, 'length');
  assert.equal(r.json.usage.completion_tokens, 48);
  const tokens = r.json.choices[0].logprobs.tokens;
  assert.equal(tokens.length, 48);
  assert.ok(tokens.includes(''), 'the greedy output contains an id the tokenizer lacks');

  const s = await raw(server.base, '/v1/completions', { body: body({ stream: true }) });
  assert.equal(s.status, 200);
  const events = s.text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  assert.ok(chunks.every((c) => !c.error), s.text);
  assert.equal(chunks.map((c) => c.choices[0].text).join(''), r.json.choices[0].text);
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');

  const h = await raw(server.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
});
