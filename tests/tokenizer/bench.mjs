// @huggingface/tokenizers encode throughput on the same corpus and the same way as bench/bench_tokenizer.cpp
// (single thread, add_special_tokens=true, first pass cold, later passes with the library's cache warm).
// Usage: node bench.mjs CORPUS.jsonl [PASSES]
import fs from "fs";
import path from "path";
import { Tokenizer } from "@huggingface/tokenizers";
import { modelDir } from "./model_path.mjs";

const corpus = process.argv[2];
const passes = Math.max(1, Number(process.argv[3] ?? 3));
const dir = modelDir();
const t0 = performance.now();
const tok = new Tokenizer(
  JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
);
const loadS = (performance.now() - t0) / 1000;
const lines = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
const bytes = lines.reduce((a, l) => a + Buffer.byteLength(l, "utf8"), 0);
const seconds = [];
let ids = 0;
for (let p = 0; p < passes; ++p) {
  let n = 0;
  const s = performance.now();
  for (const l of lines) n += tok.encode(l, { add_special_tokens: true }).ids.length;
  seconds.push((performance.now() - s) / 1000);
  ids = n;
}
const best = Math.min(...seconds);
console.log(JSON.stringify({
  impl: "@huggingface/tokenizers", version: JSON.parse(fs.readFileSync(new URL("./node_modules/@huggingface/tokenizers/package.json", import.meta.url))).version,
  node: process.version, lines: lines.length, bytes, ids, passes, load_s: loadS,
  first_pass_s: seconds[0], best_pass_s: best, mb_per_s_first: bytes / seconds[0] / 1e6, mb_per_s_best: bytes / best / 1e6,
}));
