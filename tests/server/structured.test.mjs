// Structured outputs through the server: OpenAI's response_format (json_object, json_schema strict), vLLM's
// structured_outputs and guided_* fields, SGLang's regex, llama.cpp's grammar, streamed and not. On the tiny random
// model at temperature 1 every output is valid (checked by ajv, an independent JSON Schema validator) and ends with
// finish_reason stop; bad constraints are 400s naming the field, and the server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, raw, API_KEY } from './harness.mjs';

let server, client;
before(async () => {
  server = await startServer(['--max-model-len', '1024']);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: API_KEY, maxRetries: 0, timeout: 120000 });
});
after(async () => { assert.equal(await server.stop(), 0); });

const post = (p, body) => raw(server.base, p, { body: JSON.stringify(body) });
const noThink = { chat_template_kwargs: { enable_thinking: false } };
const user = (t) => [{ role: 'user', content: t }];

function expectError(r, status, param, words) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json?.error?.message, r.text);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
  if (words) assert.match(r.json.error.message, words, r.text);
}

const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 8 },
    days: { type: 'integer', minimum: 1, maximum: 14 },
    unit: { enum: ['celsius', 'fahrenheit'] },
    alerts: { type: 'array', items: { type: 'boolean' }, maxItems: 3 },
  },
  required: ['city', 'days', 'unit', 'alerts'],
  additionalProperties: false,
};

test('response_format json_schema (strict): every sampled output validates', async () => {
  const validate = new Ajv({ strict: true }).compile(weather);
  for (let seed = 0; seed < 6; seed++) {
    const r = await client.chat.completions.create({
      model: 'tiny', messages: user('Weather please'), max_tokens: 400, temperature: 1, seed, ...noThink,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema: weather } },
    });
    const text = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, 'stop', text);
    const value = JSON.parse(text);
    assert.ok(validate(value), `${text}: ${JSON.stringify(validate.errors)}`);
  }
});

test('response_format json_object, streamed: the deltas make one JSON object', async () => {
  for (let seed = 0; seed < 3; seed++) {
    const stream = await client.chat.completions.create({
      model: 'tiny', messages: user('An object'), max_tokens: 600, temperature: 1, seed, stream: true, ...noThink,
      response_format: { type: 'json_object' },
    });
    let text = '', finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    if (finish === 'stop') {
      const v = JSON.parse(text);
      assert.equal(typeof v, 'object', text);
      assert.ok(v !== null && !Array.isArray(v), text);
    } else {
      assert.equal(finish, 'length', text);  // a deep random object may not close in time: a prefix of one
      assert.ok(text.trimStart().startsWith('{'), text);
    }
  }
});

test('regex, choice and GBNF in the peers\' spellings, on chat and completions', async () => {
  const cases = [
    [{ regex: '[0-9]{3}-[a-z]{2,4}' }, /^[0-9]{3}-[a-z]{2,4}$/],                               // SGLang
    [{ guided_regex: '(yes|no), [0-9]+' }, /^(yes|no), [0-9]+$/],                              // vLLM (older)
    [{ structured_outputs: { regex: 'x[ab]{1,3}y' } }, /^x[ab]{1,3}y$/],                        // vLLM
    [{ structured_outputs: { choice: ['red', 'green', 'blue'] } }, /^(red|green|blue)$/],
    [{ guided_choice: ['alpha', 'beta'] }, /^(alpha|beta)$/],
    [{ grammar: 'root ::= "<" [0-9]+ ">" (" " root)?' }, /^<[0-9]+>( <[0-9]+>)*$/],            // llama.cpp GBNF
    [{ structured_outputs: { grammar: 'root ::= ("ab" | "cd"){2}' } }, /^(ab|cd){2}$/],
  ];
  for (const [fields, re] of cases) {
    for (const endpoint of ['/v1/chat/completions', '/v1/completions']) {
      const body = endpoint.includes('chat')
        ? { messages: user('go'), ...noThink } : { prompt: 'go' };
      const r = await post(endpoint, { ...body, ...fields, max_tokens: 200, temperature: 1, seed: 3 });
      assert.equal(r.status, 200, r.text);
      const c = r.json.choices[0];
      const text = endpoint.includes('chat') ? c.message.content : c.text;
      assert.equal(c.finish_reason, 'stop', `${JSON.stringify(fields)}: ${text}`);
      assert.match(text, re, JSON.stringify(fields));
    }
  }
});

test('bad constraints are 400s naming the field; the server keeps serving', async () => {
  const chat = (extra) => post('/v1/chat/completions', { messages: user('x'), max_tokens: 4, ...noThink, ...extra });
  const js = (schema) => ({ response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
  expectError(await chat(js({ type: 'integer', multipleOf: 3 })), 400, 'response_format', /multipleOf/);
  expectError(await chat(js({ type: 'object', properties: { a: { $ref: '#/$defs/missing' } } })), 400, 'response_format');
  expectError(await chat(js({ type: 'strnig' })), 400, 'response_format');
  expectError(await chat(js({ type: 'string', minLength: 1, maxLength: 10000000 })), 400, 'response_format', /maxLength/);
  expectError(await chat({ response_format: { type: 'json_schema', json_schema: { name: 's' } } }), 400, 'response_format');
  expectError(await chat({ response_format: { type: 'yaml' } }), 400, 'response_format');
  expectError(await chat({ regex: '(a' }), 400, 'regex');
  expectError(await chat({ regex: '(a)\\1' }), 400, 'regex');
  expectError(await chat({ grammar: 'root ::= missing' }), 400, 'grammar', /missing/);
  expectError(await chat({ guided_choice: [] }), 400, 'guided_choice');
  expectError(await chat({ guided_json: '{not json' }), 400, 'guided_json');
  expectError(await chat({ regex: 'a', grammar: 'root ::= "a"' }), 400);  // two constraints at once
  expectError(await chat({ ignore_eos: true, regex: 'a+' }), 400);
  const ok = await chat({ response_format: { type: 'text' } });
  assert.equal(ok.status, 200, ok.text);
});

test('tool_choice required and a named function: GLM tool calls whose arguments validate', async () => {
  const params = {
    type: 'object',
    // (A free string argument would run on at temperature 1 on the random model: raw text ends only at '<'.)
    properties: { city: { type: 'string', enum: ['Oslo', 'Bergen'] }, days: { type: 'integer', minimum: 1, maximum: 14 },
      unit: { type: 'string', enum: ['c', 'f'] } },
    required: ['city', 'days'],
    additionalProperties: false,
  };
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: params } },
    { type: 'function', function: { name: 'now', parameters: { type: 'object', properties: {} } } },
  ];
  const validate = new Ajv().compile(params);
  const cases = [
    [{ tool_choice: 'required', parallel_tool_calls: false }, null],
    [{ tool_choice: { type: 'function', function: { name: 'get_weather' } } }, 'get_weather'],
    [{ tool_choice: 'required' }, null],  // parallel calls: as many as the model makes
  ];
  for (let seed = 0; seed < 4; seed++) {
    for (const [fields, name] of cases) {
      const r = await client.chat.completions.create({
        model: 'tiny', messages: user('Weather?'), tools, max_tokens: 120, temperature: 1, seed, ...noThink, ...fields,
      });
      const choice = r.choices[0];
      const calls = choice.message.tool_calls ?? [];
      if (fields.parallel_tool_calls === false || name) {
        assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
        assert.equal(calls.length, 1, JSON.stringify(choice));
      } else {
        assert.ok(['tool_calls', 'length'].includes(choice.finish_reason), JSON.stringify(choice));
        assert.ok(calls.length >= 1, JSON.stringify(choice));
      }
      // Cut by max_tokens, the last call may be unfinished: the ones before it are whole.
      const whole = choice.finish_reason === 'length' ? calls.slice(0, -1) : calls;
      for (const call of whole) {
        if (name) assert.equal(call.function.name, name);
        if (call.function.name === 'get_weather') {
          const args = JSON.parse(call.function.arguments);
          assert.ok(validate(args), `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
        } else {
          assert.equal(call.function.name, 'now');
        }
      }
    }
  }
  const chat = (extra) => post('/v1/chat/completions', { messages: user('x'), max_tokens: 4, ...noThink, ...extra });
  expectError(await chat({ tool_choice: 'required' }), 400, 'tool_choice');
  expectError(await chat({ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }), 400, 'tool_choice', /nope/);
  expectError(await chat({ tools, tool_choice: 'required', response_format: { type: 'json_object' } }), 400, 'tool_choice');
  expectError(await chat({ tools, tool_choice: 'sometimes' }), 400, 'tool_choice');
});

test('tool_choice auto with a strict tool and a response_format: content that follows it, or calls held to the tool', async () => {
  const params = { type: 'object', properties: { days: { type: 'integer', minimum: 1, maximum: 14 } }, required: ['days'],
    additionalProperties: false };
  const tools = [{ type: 'function', function: { name: 'get_weather', strict: true, parameters: params } }];
  const validateArgs = new Ajv().compile(params);
  const validateContent = new Ajv({ strict: true }).compile(weather);
  const seen = { content: 0, calls: 0 };
  for (let seed = 0; seed < 8; seed++) {
    const r = await client.chat.completions.create({
      model: 'tiny', messages: user('Weather?'), tools, max_tokens: 400, temperature: 1, seed, ...noThink,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema: weather } },
    });
    const choice = r.choices[0];
    const calls = choice.message.tool_calls ?? [];
    if (calls.length > 0) {
      seen.calls++;
      const whole = choice.finish_reason === 'length' ? calls.slice(0, -1) : calls;
      for (const call of whole) {
        assert.equal(call.function.name, 'get_weather');
        assert.ok(validateArgs(JSON.parse(call.function.arguments)), call.function.arguments);
      }
    } else {
      seen.content++;
      const text = choice.message.content;
      assert.equal(choice.finish_reason, 'stop', text);
      assert.ok(validateContent(JSON.parse(text)), `${text}: ${JSON.stringify(validateContent.errors)}`);
    }
  }
  assert.ok(seen.content + seen.calls === 8);
  // The content's own errors name the content's field.
  const r = await post('/v1/chat/completions', { model: 'tiny', messages: user('x'), tools, ...noThink,
    response_format: { type: 'json_schema', json_schema: { name: 'w', schema: { type: 'number', multipleOf: 3 } } } });
  expectError(r, 400, 'response_format');
});

test('tool_choice auto with a strict tool: text, and any call held to its schema', async () => {
  const params = { type: 'object', properties: { days: { type: 'integer', minimum: 1, maximum: 14 } }, required: ['days'],
    additionalProperties: false };
  const tools = [{ type: 'function', function: { name: 'get_weather', strict: true, parameters: params } }];
  const validate = new Ajv().compile(params);
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.create({
      model: 'tiny', messages: user('Weather?'), tools, max_tokens: 80, temperature: 1, seed, ...noThink,
    });
    const choice = r.choices[0];
    const calls = choice.message.tool_calls ?? [];
    const whole = choice.finish_reason === 'length' ? calls.slice(0, -1) : calls;
    for (const call of whole) {
      assert.equal(call.function.name, 'get_weather');
      assert.ok(validate(JSON.parse(call.function.arguments)), call.function.arguments);
    }
  }
});
