// OpenAI request fields are honoured or refused by name, never silently ignored; ids are random; the served
// name does not depend on how --model was spelled.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, raw, MODEL } from './harness.mjs';

let server;
before(async () => { server = await startServer(['--max-model-len', '512']); });
after(async () => { assert.equal(await server.stop(), 0); });

const post = (p, body) => raw(server.base, p, { body: JSON.stringify(body) });
const comp = (body) => post('/v1/completions', body);
const chat = (body) => post('/v1/chat/completions', body);
const msgs = [{ role: 'user', content: 'hi' }];
const noThink = { chat_template_kwargs: { enable_thinking: false } };

function expectError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json?.error?.message, r.text);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
}

test('logit_bias steers sampling (greedy and sampled) and is validated', async () => {
  // Token 300 decodes to text in the tiny model's tokenizer; +100 makes it win every step.
  const forced = await comp({ prompt: [1, 2, 3], max_tokens: 6, temperature: 0, logprobs: 0, logit_bias: { 300: 100 } });
  assert.equal(forced.status, 200, forced.text);
  const plain = await comp({ prompt: [1, 2, 3], max_tokens: 6, temperature: 0, logprobs: 0 });
  const tokens = forced.json.choices[0].logprobs.tokens;
  assert.equal(tokens.length, 6);
  assert.ok(tokens.every((t) => t === tokens[0]), JSON.stringify(tokens));
  assert.notDeepEqual(plain.json.choices[0].logprobs.tokens, tokens);
  const sampled = await comp({ prompt: [1, 2, 3], max_tokens: 6, temperature: 1, seed: 7, logprobs: 0, logit_bias: { 300: 100 } });
  assert.deepEqual(sampled.json.choices[0].logprobs.tokens, tokens);
  expectError(await comp({ prompt: [1], logit_bias: { 300: 101 } }), 400, 'logit_bias');
  expectError(await comp({ prompt: [1], logit_bias: { abc: 1 } }), 400, 'logit_bias');
  expectError(await comp({ prompt: [1], logit_bias: { 99999999: 1 } }), 400, 'logit_bias');
  expectError(await comp({ prompt: [1], logit_bias: [1, 2] }), 400, 'logit_bias');
});

test('stop_token_ids end generation at those tokens', async () => {
  const r = await comp({ prompt: [1, 2, 3], max_tokens: 20, temperature: 0, logit_bias: { 300: 100 }, stop_token_ids: [300] });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].finish_reason, 'stop');
  assert.equal(r.json.usage.completion_tokens, 1);
  expectError(await comp({ prompt: [1], stop_token_ids: [-1] }), 400, 'stop_token_ids');
  expectError(await comp({ prompt: [1], stop_token_ids: 5 }), 400, 'stop_token_ids');
});

test('response_format: text is accepted; unknown types and shapes are refused by name', async () => {
  const ok = await chat({ messages: msgs, max_tokens: 2, response_format: { type: 'text' }, ...noThink });
  assert.equal(ok.status, 200, ok.text);
  expectError(await chat({ messages: msgs, response_format: { type: 'yaml' } }), 400, 'response_format');
  expectError(await chat({ messages: msgs, response_format: 'json' }), 400, 'response_format');
});

test('best_of, suffix and the legacy function fields', async () => {
  assert.equal((await comp({ prompt: 'x', max_tokens: 1, best_of: 1 })).status, 200);
  expectError(await comp({ prompt: 'x', best_of: 3 }), 400, 'best_of');
  assert.equal((await comp({ prompt: 'x', max_tokens: 1, suffix: '' })).status, 200);
  expectError(await comp({ prompt: 'x', suffix: 'the end' }), 400, 'suffix');
  expectError(await chat({ messages: msgs, functions: [{ name: 'f' }] }), 400, 'functions');
  expectError(await chat({ messages: msgs, function_call: 'auto' }), 400, 'function_call');
  expectError(await chat({ messages: msgs, modalities: ['text', 'audio'] }), 400, 'modalities');
});

test('the developer role is a system message', async () => {
  const withDev = await chat({ messages: [{ role: 'developer', content: 'Be brief.' }, ...msgs], max_tokens: 4, temperature: 0, ...noThink, logprobs: true });
  const withSys = await chat({ messages: [{ role: 'system', content: 'Be brief.' }, ...msgs], max_tokens: 4, temperature: 0, ...noThink, logprobs: true });
  assert.equal(withDev.status, 200, withDev.text);
  assert.equal(withDev.json.usage.prompt_tokens, withSys.json.usage.prompt_tokens);
  assert.deepEqual(withDev.json.choices[0].message, withSys.json.choices[0].message);
});

test('tools must be function definitions', async () => {
  expectError(await chat({ messages: msgs, tools: [{ type: 'function' }] }), 400, 'tools');
  expectError(await chat({ messages: msgs, tools: [{ type: 'retrieval', function: { name: 'f' } }] }), 400, 'tools');
  expectError(await chat({ messages: msgs, tools: [{ type: 'function', function: { name: '' } }] }), 400, 'tools');
  expectError(await chat({ messages: msgs, tools: [{ type: 'function', function: { name: 'f', parameters: 3 } }] }), 400, 'tools');
  const ok = await chat({ messages: msgs, max_tokens: 2, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }], ...noThink });
  assert.equal(ok.status, 200, ok.text);
});

test('response ids are random, not a per-process sequence', async () => {
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push((await chat({ messages: msgs, max_tokens: 1, ...noThink })).json.id);
  for (let i = 0; i < 3; i++) ids.push((await comp({ prompt: 'x', max_tokens: 1 })).json.id);
  for (const id of ids.slice(0, 3)) assert.match(id, /^chatcmpl-[0-9a-f]{24}$/);
  for (const id of ids.slice(3)) assert.match(id, /^cmpl-[0-9a-f]{24}$/);
  assert.equal(new Set(ids).size, ids.length);
});

test('the served name is the directory name, trailing slash or not', async () => {
  const s = await startServer([], MODEL + '/', { servedName: null });
  try {
    const r = await raw(s.base, '/v1/models', { method: 'GET' });
    assert.equal(r.json.data[0].id, MODEL.split('/').filter(Boolean).pop());
  } finally {
    assert.equal(await s.stop(), 0);
  }
});
