// MTP speculative decoding through the server: greedy completions (plain and streamed, with logprobs) equal a
// server without speculation; usage.speculative_decoding reports the request's drafts and acceptance, also in
// the stream's usage chunk; /metrics counts them; vLLM's --speculative-config is accepted, bad values refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, raw, parseMetrics, runServe, MODEL } from './harness.mjs';

let plain, spec;
before(async () => {
  plain = await startServer(['--max-model-len', '512']);
  spec = await startServer(['--max-model-len', '512', '--speculative-config', '{"method":"mtp","num_speculative_tokens":3}']);
});
after(async () => {
  assert.equal(await plain.stop(), 0);
  assert.equal(await spec.stop(), 0);
});

const post = (s, body) => raw(s.base, '/v1/completions', { body: JSON.stringify(body) });

async function streamed(s, body) {
  const r = await raw(s.base, '/v1/completions', { body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  assert.equal(r.status, 200, r.text);
  const chunks = r.text.split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]').map((l) => JSON.parse(l.slice(6)));
  const text = chunks.map((c) => c.choices?.[0]?.text ?? '').join('');
  return { text, usage: chunks.at(-1).usage };
}

test('greedy completions are the same with and without speculation', async () => {
  for (const prompt of [[1, 2, 3], [7, 70, 170, 270, 370], Array.from({ length: 150 }, (_, i) => (i * 37) % 500 + 2)]) {
    const body = { prompt, max_tokens: 24, temperature: 0, logprobs: 2, ignore_eos: true };
    const a = await post(plain, body);
    const b = await post(spec, body);
    assert.equal(a.status, 200, a.text);
    assert.equal(b.status, 200, b.text);
    assert.equal(b.json.choices[0].text, a.json.choices[0].text);
    assert.deepEqual(b.json.choices[0].logprobs.tokens, a.json.choices[0].logprobs.tokens);
    const la = a.json.choices[0].logprobs.token_logprobs, lb = b.json.choices[0].logprobs.token_logprobs;
    la.forEach((v, i) => assert.ok(Math.abs(v - lb[i]) < 1e-4, `token ${i}: ${v} vs ${lb[i]}`));
    assert.equal(a.json.usage.speculative_decoding, undefined);
    const sd = b.json.usage.speculative_decoding;
    assert.ok(sd.verification_steps > 0, JSON.stringify(sd));
    assert.equal(sd.acceptance_by_position.length, 3);
    assert.ok(sd.accepted_tokens <= sd.draft_tokens);
    // Every verification gives its accepted drafts plus one token; the prefill gave the first of the 24, and the
    // last is decoded without drafts unless a verification ended exactly at max_tokens.
    const n = sd.verification_steps + sd.accepted_tokens;
    assert.ok(n === 23 || n === 22, JSON.stringify(sd));
    assert.ok(Math.abs(sd.mean_acceptance_length - (1 + sd.accepted_tokens / sd.verification_steps)) < 1e-9);
    const sa = await streamed(plain, body), sb = await streamed(spec, body);
    assert.equal(sb.text, sa.text);
    assert.equal(sb.text, a.json.choices[0].text);
    assert.deepEqual(sb.usage.speculative_decoding, sd);
  }
});

test('/metrics counts drafted and accepted tokens, per position and in all', async () => {
  const m = parseMetrics((await raw(spec.base, '/metrics', { method: 'GET' })).text);
  assert.ok(m.megactx_spec_decode_draft_tokens_total > 0);
  assert.ok(m.megactx_spec_decode_accepted_tokens_total <= m.megactx_spec_decode_draft_tokens_total);
  assert.ok(m['megactx_spec_decode_draft_tokens_by_position_total{position="2"}'] > 0);
  assert.ok(m.megactx_spec_decode_acceptance_length_count >= 6);
  assert.equal(m.megactx_spec_decode_low_acceptance_requests_total, 0);
  const p = parseMetrics((await raw(plain.base, '/metrics', { method: 'GET' })).text);
  assert.equal(p.megactx_spec_decode_draft_tokens_total, 0);
});

test('bad speculative settings are one clear error at startup', async () => {
  for (const [args, msg] of [
    [['--speculative-tokens', '8'], /--speculative-tokens/],
    [['--speculative-config', '{"method":"eagle","num_speculative_tokens":3}'], /method must be "mtp"/],
    [['--speculative-config', 'nope'], /not JSON/],
    [['--speculative-tokens', '2', '--speculative-config', '{"method":"mtp","num_speculative_tokens":3}'], /disagree/],
    [['--speculative-config', '{"method":"mtp","num_speculative_tokens":3,"disable_by_batch_size":0}'], /disable_by_batch_size must be a positive integer/],
    [['--speculative-config', '{"method":"mtp","num_speculative_tokens":3,"disable_by_batch_size":4}',
      '--speculative-disable-by-batch-size', '2'], /disagree/],
    [['--speculative-tokens', '3', '--speculative-disable-by-batch-size', '-1'], /--speculative-disable-by-batch-size/],
  ]) {
    const r = await runServe(['--model', MODEL, '--port', '0', ...args]);
    assert.notEqual(r.code, 0, r.log);
    assert.match(r.log, msg);
  }
});
