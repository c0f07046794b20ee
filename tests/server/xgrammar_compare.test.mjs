// Token masks against an independent implementation (issue 51): xgrammar (npm @mlc-ai/web-xgrammar, pinned in
// package.json) is given megactx's own vocabulary (`megactx grammar masks --vocab`) and the same constraint with
// the same options (whitespace bound, strict objects); at every token boundary of every instance (and of
// instances cut short) the allowed token sets must be equal, apart from the differences listed in KNOWN, each with
// its reason. The test fails on any other difference, and on a KNOWN entry that no longer occurs.
// XGR_DUMP=FILE writes every unexplained difference to FILE (the assertion shows the first 30).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadXgrammar, loadVocab, megactxJson, fromRanges, fromBitmask } from './xgrammar.mjs';
import { SCHEMAS, GRAMMARS, REGEXES } from './xgrammar_cases.mjs';
import { KNOWN } from './xgrammar_known.mjs';
import { modelDir } from '../tokenizer/model_path.mjs';

const BIN = process.env.MEGACTX_BIN;
const xgr = loadXgrammar();
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'megactx-xgr-'));
process.on('exit', () => fs.rmSync(tmp, { recursive: true, force: true }));

function writeTmp(name, text) {
  const file = path.join(tmp, name);
  fs.writeFileSync(file, text);
  return file;
}

// The texts a case's states are sampled along: each instance, and the instance cut at a third and at two thirds
// of its length (its last token then differs from the full text's, giving other states).
function textsOf(c) {
  const ws = c.ws ?? 16;
  const written = (v) => (ws > 0 ? [JSON.stringify(v), JSON.stringify(v, null, c.indent ?? 2)] : [JSON.stringify(v)]);
  const full = [...(c.values ?? []).flatMap(written), ...(c.texts ?? [])];
  const cuts = [];
  for (const t of full) {
    const chars = [...t];
    for (const f of [1 / 3, 2 / 3]) cuts.push(chars.slice(0, Math.max(1, Math.floor(chars.length * f))).join(''));
  }
  return [...full.map((text) => ({ text, full: true })), ...cuts.map((text) => ({ text, full: false }))];
}

// Both sides' constraint for a case: megactx's CLI flags and xgrammar's compiled grammar.
async function compile(compiler, c) {
  if (c.schema) {
    const ws = c.ws ?? 16;
    const strict = c.strict ?? true;
    const args = ['--json-schema', writeTmp(`${c.name}.json`, JSON.stringify(c.schema)), '--max-whitespace', `${ws}`];
    if (strict) args.push('--strict');
    const g = await compiler.compileJSONSchema(JSON.stringify(c.schema), ws > 0, ws > 0 ? undefined : -1,
      ws > 0 ? undefined : [',', ':'], strict, ws > 0 ? ws : undefined);
    return { args, g };
  }
  if (c.gbnf) {
    return { args: ['--grammar', writeTmp(`${c.name}.gbnf`, c.gbnf)], g: await compiler.compileGrammar(c.ebnf) };
  }
  const g = await compiler.compileStructuralTag({ type: 'structural_tag', format: { type: 'regex', pattern: c.regex } });
  return { args: ['--regex', c.regex], g };
}

// Every token on which the two masks differ, at every state along the text (`out`: megactx's masks along it).
async function diffAlong(vocab, c, compiled, text, full, out) {
  assert.equal(out.refused, -1, `${c.name}: megactx refuses token ${out.refused} of ${JSON.stringify(text)}`);
  if (full) assert.ok(out.accepting, `${c.name}: megactx does not accept ${JSON.stringify(text)}`);
  const matcher = await xgr.GrammarMatcher.createGrammarMatcher(compiled.g, vocab.stopIds);
  const diffs = [];
  let prefix = Buffer.alloc(0);
  let states = 0;
  for (let i = 0; i <= out.ids.length; i++) {
    const mine = fromRanges(out.masks[i], vocab.n);
    const theirs = fromBitmask(await matcher.getNextTokenBitmask(), vocab.n);
    for (let t = 0; t < vocab.n; t++) {
      if (mine[t] === theirs[t]) continue;
      diffs.push({ c, text, state: i, prefix, token: t, bytes: vocab.bytes[t], stop: vocab.stopIds.includes(t),
        only: mine[t] ? 'megactx' : 'xgrammar' });
    }
    states++;
    if (i === out.ids.length) continue;
    // Where xgrammar's mask refuses the text's next token, that token is among the differences just listed: the
    // walk stops there.
    if (!theirs[out.ids[i]]) break;
    assert.ok(matcher.acceptToken(out.ids[i]), `${c.name}: xgrammar refuses token ${i} its own mask allows`);
    prefix = Buffer.concat([prefix, vocab.bytes[out.ids[i]]]);
  }
  matcher.dispose();
  return { diffs, states };
}

function shown(d) {
  return `${d.c.name} state ${d.state} after ${JSON.stringify(d.prefix.toString('latin1'))}: ${d.only} only, ` +
    `token ${d.token} ${d.stop ? '(stop)' : JSON.stringify(d.bytes.toString('latin1'))}`;
}

async function compareAll(t, cases, modelArgs) {
  const vocab = await loadVocab(xgr, BIN, modelArgs);
  const compiler = await xgr.GrammarCompiler.createGrammarCompiler(vocab.info, false);
  const seen = new Map(KNOWN.map((k) => [k.name, 0]));
  const unexplained = [];
  let states = 0, differing = 0;
  for (const c of cases) {
    const compiled = await compile(compiler, c);
    const texts = textsOf(c);
    const jsonl = writeTmp(`${c.name}.jsonl`, texts.map(({ text }) => JSON.stringify(text)).join('\n') + '\n');
    const outs = megactxJson(BIN, ['--jsonl', jsonl, ...compiled.args, ...modelArgs]);
    for (const [i, { text, full }] of texts.entries()) {
      const r = await diffAlong(vocab, c, compiled, text, full, outs[i]);
      states += r.states;
      for (const d of r.diffs) {
        const k = KNOWN.find((k) => k.applies(d));
        if (k) seen.set(k.name, seen.get(k.name) + 1);
        else unexplained.push(shown(d));
      }
      differing += r.diffs.length;
    }
    compiled.g.dispose();
  }
  compiler.dispose();
  t.diagnostic(`${cases.length} constraints, ${states} states, vocabulary ${vocab.n}: ${differing} differing ` +
    `(state, token) pairs, by reason ${JSON.stringify(Object.fromEntries(seen))}`);
  if (process.env.XGR_DUMP) fs.writeFileSync(process.env.XGR_DUMP, unexplained.join('\n') + '\n');
  assert.deepEqual(unexplained.slice(0, 30), [], `${unexplained.length} unexplained differences`);
  return seen;
}

const ALL = [...SCHEMAS, ...GRAMMARS, ...REGEXES];

test('masks equal xgrammar\'s over the embedded model\'s vocabulary, but for the explained differences', async (t) => {
  const seen = await compareAll(t, ALL, []);
  const unused = KNOWN.filter((k) => k.embedded && seen.get(k.name) === 0).map((k) => k.name);
  assert.deepEqual(unused, [], 'explained differences that no longer occur');
});

// The DeepSeek-V3 tokenizer (128K tokens; tests/tokenizer/setup.sh installs it): other token shapes (long runs of
// spaces, digits split by three) on a part of the cases.
test('masks equal xgrammar\'s over DeepSeek-V3\'s vocabulary, but for the explained differences', async (t) => {
  let model;
  try {
    model = modelDir();
  } catch (e) {
    t.skip(e.message);
    return;
  }
  const names = ['person', 'refs_anyof', 'integer_bounds', 'compact', 'arithmetic', 'utf8', 'date', 'phone'];
  await compareAll(t, ALL.filter((c) => names.includes(c.name)), ['--model', model]);
});
