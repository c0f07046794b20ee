// Every bad request gets an OpenAI-style error with the right status, and the server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, raw } from './harness.mjs';

let server;
before(async () => { server = await startServer(['--max-model-len', '256', '--max-body-bytes', '100000']); });
after(async () => { assert.equal(await server.stop(), 0); });

function expectError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json && r.json.error, 'OpenAI error body: ' + r.text);
  assert.equal(typeof r.json.error.message, 'string');
  assert.ok(r.json.error.message.length > 0);
  assert.equal(typeof r.json.error.type, 'string');
  if (param !== undefined) assert.equal(r.json.error.param, param);
}

const chat = (body) => raw(server.base, '/v1/chat/completions', { body: typeof body === 'string' ? body : JSON.stringify(body) });
const comp = (body) => raw(server.base, '/v1/completions', { body: typeof body === 'string' ? body : JSON.stringify(body) });
const msgs = [{ role: 'user', content: 'hi' }];

test('malformed JSON', async () => { expectError(await chat('{"messages": [}'), 400); });
test('body not an object', async () => { expectError(await chat('[1,2]'), 400); });
test('missing messages / prompt', async () => {
  expectError(await chat({ model: 'tiny' }), 400, 'messages');
  expectError(await comp({ model: 'tiny' }), 400, 'prompt');
});
test('empty messages', async () => { expectError(await chat({ messages: [] }), 400, 'messages'); });
test('unknown role', async () => { expectError(await chat({ messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages'); });
test('wrong types', async () => {
  expectError(await chat({ messages: 'hi' }), 400, 'messages');
  expectError(await chat({ messages: msgs, temperature: 'hot' }), 400, 'temperature');
  expectError(await chat({ messages: msgs, max_tokens: 'many' }), 400, 'max_tokens');
  expectError(await chat({ messages: msgs, stream: 'yes' }), 400, 'stream');
  expectError(await chat({ messages: msgs, stop: 5 }), 400, 'stop');
  expectError(await comp({ prompt: { text: 'x' } }), 400, 'prompt');
  expectError(await comp({ prompt: [1, 'a'] }), 400, 'prompt');
});
test('out-of-range values', async () => {
  expectError(await chat({ messages: msgs, max_tokens: -1 }), 400, 'max_tokens');
  expectError(await chat({ messages: msgs, max_tokens: 0 }), 400, 'max_tokens');
  expectError(await chat({ messages: msgs, max_tokens: 1e12 }), 400, 'max_tokens');
  expectError(await chat({ messages: msgs, temperature: -1 }), 400, 'temperature');
  expectError(await chat({ messages: msgs, top_p: 0 }), 400, 'top_p');
  expectError(await chat({ messages: msgs, n: 2 }), 400, 'n');
  expectError(await comp({ prompt: [1, 999999] }), 400, 'prompt');
  expectError(await chat({ messages: msgs, reasoning_effort: 'extreme' }), 400, 'reasoning_effort');
});
test('prompt + max_tokens beyond --max-model-len', async () => {
  expectError(await comp({ prompt: Array(200).fill(5), max_tokens: 100 }), 400, 'max_tokens');
  expectError(await comp({ prompt: Array(300).fill(5) }), 400, 'prompt');
});
test('invalid UTF-8', async () => {
  const res = await fetch(server.base + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer test-key' },
    body: Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]),
  });
  const j = await res.json();
  assert.equal(res.status, 400);
  assert.ok(j.error.message.length > 0);
});
test('unknown model', async () => { expectError(await chat({ model: 'gpt-9', messages: msgs }), 404, 'model'); });
test('oversized body', async () => {
  const r = await chat({ messages: [{ role: 'user', content: 'x'.repeat(200000) }] });
  assert.equal(r.status, 413);
  assert.ok(r.json.error);
});
test('bad or missing API key', async () => {
  const r = await raw(server.base, '/v1/chat/completions', { body: JSON.stringify({ messages: msgs }), headers: { authorization: 'Bearer wrong' } });
  expectError(r, 401);
  const m = await raw(server.base, '/v1/models', { method: 'GET', headers: { authorization: '' } });
  expectError(m, 401);
});
test('unknown endpoint', async () => { expectError(await raw(server.base, '/v1/nothing', { body: '{}' }), 404); });
test('unknown fields are ignored', async () => {
  const r = await chat({ messages: msgs, max_tokens: 2, frobnicate: true, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(r.status, 200, r.text);
});
test('after all of that the server still serves', async () => {
  const r = await comp({ prompt: 'still alive', max_tokens: 3, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.completion_tokens, 3);
  const h = await raw(server.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
});
