// xgrammar (npm @mlc-ai/web-xgrammar, its WASM build) over megactx's own vocabulary, for
// xgrammar_compare.test.mjs: the other side of the token-mask comparison.
import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// The package is a UMD bundle inside a package marked "type": "module", so neither import nor require loads it as
// published; a copy named .cjs loads as CommonJS (the WASM is inlined in it, so the copy can go at once).
export function loadXgrammar() {
  const require = createRequire(import.meta.url);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'web-xgrammar-'));
  const copy = path.join(dir, 'web-xgrammar.cjs');
  fs.copyFileSync(require.resolve('@mlc-ai/web-xgrammar'), copy);
  try {
    return require(copy);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// GPT-2's byte-to-character table, which xgrammar's "byte_level" vocabulary type decodes: every byte string,
// valid UTF-8 or not, reaches xgrammar as exactly those bytes.
const BYTE_CHAR = (() => {
  const direct = [];
  for (let b = 0x21; b <= 0x7e; b++) direct.push(b);
  for (let b = 0xa1; b <= 0xac; b++) direct.push(b);
  for (let b = 0xae; b <= 0xff; b++) direct.push(b);
  const table = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) table[b] = String.fromCodePoint(direct.includes(b) ? b : 256 + extra++);
  return table;
})();

export function byteLevel(bytes) {
  let s = '';
  for (const b of bytes) s += BYTE_CHAR[b];
  return s;
}

// Runs `megactx grammar masks ARGS`: the JSON it prints, one value a line.
export function megactxJson(bin, args) {
  const r = spawnSync(bin, ['grammar', 'masks', ...args], { encoding: 'utf8', maxBuffer: 1 << 30 });
  if (r.status !== 0 && r.status !== 1) throw new Error(`megactx grammar masks ${args.join(' ')}: exit ${r.status}\n${r.stderr}`);
  return r.stdout.trim().split('\n').map((line) => JSON.parse(line));
}

// megactx's vocabulary (`grammar masks --vocab`): each id's bytes (empty: special, never allowed) and the stop ids;
// and xgrammar's TokenizerInfo over exactly those bytes.
export async function loadVocab(xgr, bin, modelArgs) {
  const [v] = megactxJson(bin, ['--vocab', ...modelArgs]);
  const bytes = v.tokens.map((h) => Buffer.from(h, 'hex'));
  const info = await xgr.TokenizerInfo.createTokenizerInfo(bytes.map(byteLevel), 'byte_level', false, v.n_tokens,
    v.stop_ids);
  return { n: v.n_tokens, stopIds: v.stop_ids, bytes, info };
}

// A set of ids as a bit array (one byte a token, for speed over ~150K ids).
export function fromRanges(ranges, n) {
  const set = new Uint8Array(n);
  for (const [lo, hi] of ranges) set.fill(1, lo, hi + 1);
  return set;
}

export function fromBitmask(words, n) {
  const set = new Uint8Array(n);
  for (let i = 0; i < n; i++) set[i] = (words[i >> 5] >>> (i & 31)) & 1;
  return set;
}
