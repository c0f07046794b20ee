// vLLM's /tokenize and /detokenize on the real server: prompts and chat messages (the prompt /v1/chat/completions
// would send), token strings, the round trip, auth, and bad input answered with a 400 while the server keeps
// serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, raw } from './harness.mjs';

let server;
before(async () => { server = await startServer(['--max-model-len', '1024']); });
after(async () => { assert.equal(await server.stop(), 0); });

const post = (path, body) => raw(server.base, path, { body: typeof body === 'string' ? body : JSON.stringify(body) });
const tokenize = (body) => post('/tokenize', body);
const detokenize = (body) => post('/detokenize', body);

function expectError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json && r.json.error && r.json.error.message.length > 0, 'OpenAI error body: ' + r.text);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
}

test('a prompt: tokens, count, max_model_len, and the round trip', async () => {
  const r = await tokenize({ model: 'tiny', prompt: 'hello world' });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(Object.keys(r.json).sort(), ['count', 'max_model_len', 'token_strs', 'tokens']);
  assert.equal(r.json.count, r.json.tokens.length);
  assert.ok(r.json.count > 0);
  assert.equal(r.json.max_model_len, 1024);
  assert.equal(r.json.token_strs, null);
  const d = await detokenize({ model: 'tiny', tokens: r.json.tokens });
  assert.equal(d.status, 200, d.text);
  assert.ok(d.json.prompt.endsWith('hello world'), d.text);
  const s = await tokenize({ prompt: 'hello world', return_token_strs: true, add_special_tokens: false });
  assert.equal(s.json.token_strs.length, s.json.count);
  assert.ok(s.json.token_strs.every((t) => typeof t === 'string'));
  assert.equal((await detokenize({ tokens: s.json.tokens })).json.prompt, 'hello world');
});

test('messages: the chat prompt, with the generation prompt and thinking switches', async () => {
  const messages = [{ role: 'user', content: 'hello' }];
  const r = await tokenize({ messages });
  assert.equal(r.status, 200, r.text);
  const prompt = (await detokenize({ tokens: r.json.tokens })).json.prompt;
  assert.equal(prompt, '[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>hello<|assistant|><think>');
  const off = await tokenize({ messages, chat_template_kwargs: { enable_thinking: false } });
  assert.ok((await detokenize({ tokens: off.json.tokens })).json.prompt.endsWith('<|assistant|><think></think>'));
  const bare = await tokenize({ messages, add_generation_prompt: false });
  assert.ok((await detokenize({ tokens: bare.json.tokens })).json.prompt.endsWith('<|user|>hello'));
  const tools = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: {} } } }];
  const t = await tokenize({ messages, tools });
  assert.equal(t.status, 200, t.text);
  const withTools = (await detokenize({ tokens: t.json.tokens })).json.prompt;
  assert.ok(withTools.includes('<tools>\n{"name": "lookup", "parameters": {"type": "object", "properties": {}}}\n</tools>'),
    withTools);
});

test('bad input is a 400 naming the field, and the server keeps serving', async () => {
  expectError(await tokenize('{"prompt": '), 400);
  expectError(await tokenize({}), 400, 'prompt');
  expectError(await tokenize({ prompt: 'x', messages: [{ role: 'user', content: 'x' }] }), 400, 'messages');
  expectError(await tokenize({ prompt: 42 }), 400, 'prompt');
  expectError(await tokenize({ prompt: 'x', add_special_tokens: 'yes' }), 400, 'add_special_tokens');
  expectError(await tokenize({ prompt: 'x', return_token_strs: 1 }), 400, 'return_token_strs');
  expectError(await tokenize({ messages: 'hi' }), 400, 'messages');
  expectError(await tokenize({ messages: [{ role: 'user', content: 'x' }], continue_final_message: true }), 400,
    'continue_final_message');
  expectError(await tokenize({ prompt: 'x', model: 'other' }), 404, 'model');
  expectError(await tokenize({ prompt: Array.from({ length: 1200 }, (_, i) => `w${i}`).join(' ') }), 400, 'prompt');
  expectError(await detokenize({}), 400, 'tokens');
  expectError(await detokenize({ tokens: 'abc' }), 400, 'tokens');
  expectError(await detokenize({ tokens: [1, 'x'] }), 400, 'tokens');
  expectError(await detokenize({ tokens: [-1] }), 400, 'tokens');
  expectError(await detokenize({ tokens: [1e12] }), 400, 'tokens');
  expectError(await raw(server.base, '/tokenize', { body: '{"prompt":"x"}', headers: { authorization: 'Bearer nope' } }), 401);
  const ok = await tokenize({ prompt: 'still here' });
  assert.equal(ok.status, 200, ok.text);
});
