// Deterministic multilingual corpus for the tokenizer parity test and benchmark: one JSON string per line.
// Usage: node gen_corpus.mjs OUT.jsonl [MIN_BYTES]   (default 2.5 MB; the same seed always gives the same file)
//
// Characters are kept to Unicode 14 (what Debian 12's PCRE2 knows) and avoid U+0085 / U+FEFF, the two
// characters on which JavaScript's and Oniguruma's ideas of whitespace differ.
import fs from "fs";

const out = process.argv[2];
const minBytes = Number(process.argv[3] ?? 2_500_000);
if (!out) {
  console.error("usage: node gen_corpus.mjs OUT.jsonl [MIN_BYTES]");
  process.exit(2);
}

let state = 0x2545f491;
function rand() {
  // mulberry32
  state = (state + 0x6d2b79f5) | 0;
  let t = Math.imul(state ^ (state >>> 15), 1 | state);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const prose = {
  english: [
    "The quick brown fox doesn't jump over the lazy dog; it's already tired.",
    "We'll measure throughput in megabytes per second, and I've checked the numbers twice.",
    "Tokenizers turn text into integers, and they must do it exactly the same way every time.",
    "She said: \"Don't forget the semicolon!\" — then left the room at 3:45 p.m.",
    "A million-token context is only useful if the cache fits in memory.",
  ],
  latin_accents: [
    "Le cœur a ses raisons que la raison ne connaît point; été, hiver, où êtes-vous?",
    "Über den Wolken muß die Freiheit wohl grenzenlos sein, sagte der Fußgänger.",
    "¿Dónde está la estación? Mañana iré con mi pingüino a la montaña.",
    "Ação, coração e pão: não há razão para tanta emoção, disse João.",
    "Tiếng Việt có nhiều dấu: ắ, ằ, ẳ, ẵ, ặ, ệ, ộ và ữ trong một câu.",
    "Zażółć gęślą jaźń — polskie znaki są trudne dla wielu programów.",
    "Ångström, Øresund, smørrebrød og blåbærsyltetøy på en kald dag.",
  ],
  cyrillic: [
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Привіт, як справи? Ґанок і їжак живуть у селі біля річки.",
    "Токенизатор должен работать быстро и без ошибок на любом тексте.",
  ],
  greek: [
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία, είπε ο φιλόσοφος στην αγορά.",
    "Η γλώσσα μου έδωσαν ελληνική· το σπίτι φτωχικό στις αμμουδιές.",
  ],
  arabic: [
    "مرحبا بالعالم، هذه جملة عربية لاختبار المحلل اللغوي بدقة.",
    "الكتابة من اليمين إلى اليسار تحتوي أحيانا على أرقام مثل ١٢٣ و 456.",
  ],
  hebrew: [
    "שלום עולם, זהו משפט בעברית לבדיקת המפרק.",
    "בְּרֵאשִׁית בָּרָא אֱלֹהִים — טקסט עם ניקוד מלא.",
  ],
  devanagari: [
    "नमस्ते दुनिया, यह हिंदी में एक परीक्षण वाक्य है।",
    "संस्कृत में क्षत्रिय और ज्ञान जैसे संयुक्ताक्षर होते हैं। १२३४५",
  ],
  thai: [
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทยสำหรับทดสอบตัวตัดคำ",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ทำให้การตัดคำยากขึ้น",
  ],
  cjk: [
    "你好，世界！这是一个用于测试分词器的中文句子。",
    "北京的冬天很冷，但是火锅很好吃。我们明天见吧？",
    "東京は日本の首都です。ひらがなとカタカナ、そして漢字を使います。",
    "コンピューターのプログラムを書くのは楽しいですね。",
    "龘靐齉齾爩鱻麤龗灪籲 — rare characters from the Basic Multilingual Plane.",
    "𠀀𠀁𠀂𪚥𪜀 are supplementary-plane ideographs.",
  ],
  hangul: [
    "안녕하세요, 세계! 이것은 토크나이저 테스트를 위한 한국어 문장입니다.",
    "한글은 자모를 모아서 음절을 만듭니다: ㄱ ㄴ ㄷ ㄹ ㅏ ㅑ ㅓ ㅕ.",
  ],
};

const code = [
  "#include <vector>\nint main() {\n    std::vector<int> v{1, 2, 3};\n    for (auto& x : v) x *= 2;\n    return v[0] == 2 ? 0 : 1;\n}\n",
  "template <class T>\nT clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }\n",
  "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint(f\"{fib(30)=}\")\n",
  "class Node:\n\tdef __init__(self, value):\n\t\tself.value = value\n\t\tself.next = None\n",
  "const sum = (xs) => xs.reduce((a, b) => a + b, 0);\nconsole.log(`total: ${sum([1, 2, 3])}`);\n",
  "async function main() {\r\n  const res = await fetch('/v1/models');\r\n  if (!res.ok) throw new Error(res.statusText);\r\n}\r\n",
  "SELECT id, name FROM users WHERE created_at >= '2024-01-01' ORDER BY id DESC LIMIT 10;",
  "for i in $(seq 1 10); do echo \"$i\" >> /tmp/out.txt; done && cat /tmp/out.txt | wc -l",
  "x = [[1,2],[3,4]]; y = {k: v for k, v in zip('ab', x)}  # dict comprehension",
  "if (a != b && c <= d || !e) { ptr->field[i++] = *q-- >> 2; }",
];

const emoji = [
  "😀", "😂", "🥰", "🤖", "🚀", "🔥", "✨", "🎉", "👍", "👍🏻", "👍🏽", "👍🏿", "👋🏼", "🧑🏾‍💻", "👩‍🔬",
  "👨‍👩‍👧‍👦", "👩‍❤️‍👨", "🏳️‍🌈", "🏴‍☠️", "❤️", "☺️", "🇫🇷", "🇯🇵", "🇺🇸", "🇧🇷", "🇮🇳", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "1️⃣", "#️⃣",
];

const combining = [
  "e\u0301", "a\u0308\u0304", "n\u0303", "o\u0302\u0323", "Z\u0351\u0358\u0322a\u0344\u0336l\u0314\u0317g\u0365o\u0489",
  "\u0915\u094d\u0937", "\u05e9\u05c1\u05b8", "i\u0307\u0301", "A\u030a", "\u1100\u1161\u11a8",
];

const whitespace = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\u00a0", "\u3000", "\u2003", " \t \n", "        "];

const specials = [
  "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
  "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<|EOT|>",
  "<｜fim▁hole｜>", "<｜begin▁of", "▁of▁sentence｜>", "<|user|>", "<think>", "</think>", "[gMASK]<sop>",
];

function digits() {
  const kind = int(0, 6);
  if (kind === 0) return String(int(0, 9999));
  if (kind === 1) return Array.from({ length: int(5, 40) }, () => int(0, 9)).join("");
  if (kind === 2) return `${int(0, 999)}.${int(0, 99999)}e-${int(1, 30)}`;
  if (kind === 3) return `+1 (${int(200, 999)}) ${int(100, 999)}-${int(1000, 9999)}`;
  if (kind === 4) return "٠١٢٣٤٥٦٧٨٩".slice(0, int(1, 10));
  if (kind === 5) return "１２３４５６７８９０".slice(0, int(1, 10));
  return "०१२३४५६७८९".slice(0, int(1, 10));
}

function jsonDoc() {
  const obj = {
    id: int(1, 1e6),
    name: pick(["alpha", "Bêta", "гамма", "δέλτα", "イプシロン", "제타"]),
    tags: Array.from({ length: int(0, 4) }, () => pick(["x", "y", "z", "ü", "😀"])),
    nested: { ok: rand() < 0.5, value: Math.round(rand() * 1e6) / 1000, list: [1, 2, { k: null }] },
  };
  return rand() < 0.5 ? JSON.stringify(obj) : JSON.stringify(obj, null, rand() < 0.5 ? 2 : "\t");
}

function longWord() {
  const n = pick([1000, 4000, 10000]);
  const kind = int(0, 5);
  if (kind === 0) return "a".repeat(n);
  if (kind === 1) return Array.from({ length: n }, () => String.fromCharCode(97 + int(0, 25))).join("");
  if (kind === 2) return "ab".repeat(n / 2);
  if (kind === 3) return "你".repeat(n / 4) + "好".repeat(n / 4);
  if (kind === 4) return "😀".repeat(n / 10);
  return "7".repeat(n);
}

function sentence() {
  return pick(pick(Object.values(prose)));
}

// Words of random letters from one script, so the corpus is not only repeated sentences.
const alphabets = [
  [0x61, 0x7a], [0x41, 0x5a], [0xe0, 0xff], [0x430, 0x44f], [0x3b1, 0x3c9], [0x5d0, 0x5ea], [0x627, 0x64a],
  [0x905, 0x939], [0xe01, 0xe2e], [0x4e00, 0x9fa5], [0x3041, 0x3096], [0x30a1, 0x30fa], [0xac00, 0xd7a3],
];
function randomWords() {
  const [lo, hi] = pick(alphabets);
  return Array.from({ length: int(1, 12) }, () =>
    Array.from({ length: int(1, 9) }, () => String.fromCodePoint(int(lo, hi))).join(""),
  ).join(pick([" ", " ", ", ", "-", "_", ""]));
}

const generators = [
  [30, sentence],
  [20, randomWords],
  [8, () => pick(code)],
  [6, jsonDoc],
  [6, () => Array.from({ length: int(1, 6) }, () => pick(emoji)).join(pick(["", " ", ""]))],
  [5, () => Array.from({ length: int(1, 5) }, () => pick(combining)).join(pick(["", " "]))],
  [6, digits],
  [6, () => pick(whitespace)],
  [5, () => pick(specials)],
  [3, () => sentence().toUpperCase()],
  [3, () => `'s 't 're 've 'm 'll 'd 'S 'T 'RE "quoted" (paren) [bracket] {brace}`],
];
const totalWeight = generators.reduce((a, [w]) => a + w, 0);
function segment() {
  let r = rand() * totalWeight;
  for (const [w, g] of generators) {
    if ((r -= w) < 0) return g();
  }
  return sentence();
}

const lines = [];
let bytes = 0;
let n = 0;
while (bytes < minBytes) {
  let line;
  if (n % 400 === 399) {
    line = `word: ${longWord()} end`;
  } else {
    const k = int(1, 8);
    line = Array.from({ length: k }, segment).join(pick(["", " ", " ", "\n", "\t", ", "]));
  }
  lines.push(JSON.stringify(line));
  bytes += Buffer.byteLength(line, "utf8");
  ++n;
}
fs.writeFileSync(out, lines.join("\n") + "\n");
console.error(`gen_corpus: ${lines.length} lines, ${bytes} bytes of text -> ${out}`);
