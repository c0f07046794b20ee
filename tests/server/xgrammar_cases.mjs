// The schemas, grammars and regexes xgrammar_compare.test.mjs runs through both implementations, each with
// instances that both accept. A schema case: `schema`, `values` (each written compact and, where whitespace is
// allowed, pretty-printed) and `texts` written out, `strict` (additionalProperties false unless said) and `ws` (whitespace bytes allowed at
// each place; 0: compact; `indent`: the pretty-printed form's, 2 unless said). A grammar case: `gbnf` (megactx's GBNF) and `ebnf` (the same language in xgrammar's EBNF)
// with `texts`. A regex case: `regex` and `texts`.

const address = {
  type: 'object',
  properties: {
    street: { type: 'string' },
    city: { type: 'string', minLength: 1, maxLength: 20 },
    zip: { type: 'string', pattern: '^[0-9]{5}$' },
  },
  required: ['street', 'city'],
};

export const SCHEMAS = [
  {
    name: 'person',
    schema: {
      type: 'object',
      properties: {
        name: { type: 'string' },
        age: { type: 'integer' },
        height: { type: 'number' },
        member: { type: 'boolean' },
        nickname: { type: ['string', 'null'] },
      },
      required: ['name', 'age', 'member'],
    },
    values: [
      { name: 'Ada Lovelace', age: 36, height: 1.65, member: true, nickname: null },
      { name: 'Zoë "Z" \\ Ünal\n', age: -7, member: false },
    ],
    // Whitespace runs up to the bound (16 bytes), in the places JSON allows them.
    texts: [`{${' '.repeat(16)}"name" :\t"A",\n${'\t'.repeat(15)}"age":1${' \n'.repeat(8)},"member": true${' '.repeat(16)}}`],
  },
  {
    name: 'enum_const',
    schema: {
      type: 'object',
      properties: {
        color: { enum: ['red', 'green', 'blue', 42, null] },
        version: { const: 'v1.2' },
        tags: { type: 'array', items: { enum: ['a', 'bb', 'ccc'] } },
      },
      required: ['color', 'version', 'tags'],
    },
    values: [{ color: 'green', version: 'v1.2', tags: ['bb', 'a', 'ccc'] }, { color: 42, version: 'v1.2', tags: [] }],
  },
  {
    name: 'arrays',
    schema: {
      type: 'object',
      properties: {
        points: { type: 'array', items: { type: 'array', items: { type: 'number' }, minItems: 2, maxItems: 3 } },
        pair: { type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }], items: false },
        some: { type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 4 },
      },
      required: ['points', 'pair', 'some'],
    },
    values: [{ points: [[1, 2.5], [-3e5, 0, 7]], pair: ['x', 9], some: [1, 2, 3, 4] }],
  },
  {
    name: 'integer_bounds',
    schema: {
      type: 'object',
      properties: {
        percent: { type: 'integer', minimum: 0, maximum: 100 },
        year: { type: 'integer', minimum: 1900, maximum: 2099 },
        delta: { type: 'integer', minimum: -50, exclusiveMaximum: 50 },
      },
      required: ['percent', 'year', 'delta'],
    },
    values: [{ percent: 100, year: 1987, delta: -49 }, { percent: 7, year: 2024, delta: 0 }],
  },
  {
    name: 'string_lengths',
    schema: {
      type: 'object',
      properties: {
        code: { type: 'string', minLength: 3, maxLength: 3 },
        note: { type: 'string', maxLength: 12 },
        id: { type: 'string', pattern: '^[A-Z]{2}-[0-9]+$' },
      },
      required: ['code', 'note', 'id'],
    },
    values: [{ code: 'abc', note: 'hello world!', id: 'AB-1234' }, { code: 'x\ty', note: '', id: 'ZZ-0' }],
  },
  {
    name: 'refs_anyof',
    schema: {
      type: 'object',
      properties: {
        home: { $ref: '#/$defs/address' },
        work: { anyOf: [{ $ref: '#/$defs/address' }, { type: 'null' }] },
        contact: { anyOf: [{ type: 'string' }, { type: 'integer' }] },
      },
      required: ['home', 'work', 'contact'],
      $defs: { address },
    },
    values: [
      { home: { street: '1 Main St', city: 'Springfield', zip: '12345' }, work: null, contact: 5551234 },
      { home: { street: '', city: 'X' }, work: { street: 'Elm', city: 'Y' }, contact: 'me@example.com' },
    ],
  },
  {
    name: 'nested_objects',
    schema: {
      type: 'object',
      properties: {
        meta: {
          type: 'object',
          properties: { id: { type: 'integer' }, labels: { type: 'array', items: { type: 'string' } } },
          required: ['id'],
        },
        items: {
          type: 'array',
          items: {
            type: 'object',
            properties: { sku: { type: 'string' }, qty: { type: 'integer', minimum: 1 } },
            required: ['sku', 'qty'],
          },
        },
      },
      required: ['meta', 'items'],
    },
    values: [{ meta: { id: 1, labels: ['x', 'y'] }, items: [{ sku: 'A-1', qty: 2 }, { sku: 'B', qty: 10 }] }],
  },
  {
    name: 'open_object',
    strict: false,
    schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] },
    values: [{ a: 1, b: 'extra', c: [true, null, { d: 1.5 }] }, { a: 2 }],
  },
  {
    name: 'any_json',
    strict: false,
    schema: {},
    values: [{ k: [1, -2.5e-3, 'é', null, { x: {} }], t: true }, 'text', 12.5, [[]]],
  },
  {
    name: 'compact',
    ws: 0,
    schema: {
      type: 'object',
      properties: { q: { type: 'string' }, n: { type: 'array', items: { type: 'integer' } } },
      required: ['q', 'n'],
    },
    values: [{ q: 'a, b: c', n: [1, 22, 333] }],
  },
  {
    name: 'whitespace_4',
    ws: 4,
    indent: 1,
    texts: ['{    "a"\t\t\t\t:[ \n\n true    ,false\n]\n\n\n }'],
    schema: {
      type: 'object',
      properties: { a: { type: 'array', items: { type: 'boolean' } } },
      required: ['a'],
    },
    values: [{ a: [true, false] }],
  },
  {
    name: 'formats',
    schema: {
      type: 'object',
      properties: {
        day: { type: 'string', format: 'date' },
        at: { type: 'string', format: 'date-time' },
        id: { type: 'string', format: 'uuid' },
        mail: { type: 'string', format: 'email' },
        ip: { type: 'string', format: 'ipv4' },
      },
      required: ['day', 'at', 'id', 'mail', 'ip'],
    },
    values: [{ day: '2024-02-29', at: '2024-02-29T13:45:00Z', id: '123e4567-e89b-12d3-a456-426614174000',
      mail: 'ada@example.com', ip: '192.168.0.1' }],
  },
  {
    name: 'number_bounds',
    schema: {
      type: 'object',
      properties: {
        ratio: { type: 'number', minimum: 0, maximum: 1 },
        temp: { type: 'number', exclusiveMinimum: -274 },
        count: { type: 'integer', minimum: 10 },
      },
      required: ['ratio', 'temp', 'count'],
    },
    values: [{ ratio: 0.25, temp: -12.5, count: 10 }, { ratio: 1, temp: 300, count: 12345 }],
  },
  {
    name: 'recursive_tree',
    schema: {
      $ref: '#/$defs/node',
      $defs: {
        node: {
          type: 'object',
          properties: { value: { type: 'integer' }, children: { type: 'array', items: { $ref: '#/$defs/node' } } },
          required: ['value'],
        },
      },
    },
    values: [{ value: 1, children: [{ value: 2 }, { value: 3, children: [{ value: 4, children: [] }] }] }],
  },
  {
    name: 'combinators',
    schema: {
      type: 'object',
      properties: {
        shape: {
          oneOf: [
            { type: 'object', properties: { kind: { const: 'circle' }, r: { type: 'number' } }, required: ['kind', 'r'] },
            { type: 'object', properties: { kind: { const: 'square' }, side: { type: 'number' } },
              required: ['kind', 'side'] },
          ],
        },
        maybe: { type: ['integer', 'null'] },
      },
      required: ['shape', 'maybe'],
    },
    values: [{ shape: { kind: 'circle', r: 2.5 }, maybe: null }, { shape: { kind: 'square', side: 4 }, maybe: -3 }],
  },
  {
    name: 'all_of',
    schema: {
      allOf: [{ type: 'object', properties: { a: { type: 'string' } }, required: ['a'] },
        { properties: { b: { type: 'boolean' } }, required: ['b'] }],
    },
    values: [{ a: 'x', b: false }],
  },
  {
    name: 'typed_additional',
    schema: { type: 'object', properties: { id: { type: 'integer' } }, required: ['id'],
      additionalProperties: { type: 'number' } },
    values: [{ id: 1, x: 2.5, y: -1 }, { id: 7 }],
  },
  {
    name: 'enum_escapes',
    schema: { type: 'array', items: { enum: ['a"b', 'tab\there', 'ünï', '€uro', ''] }, maxItems: 3 },
    values: [['a"b', 'ünï', ''], ['€uro']],
  },
  {
    name: 'optional_middle',
    schema: {
      type: 'object',
      properties: { a: { type: 'integer' }, b: { type: 'string' }, c: { type: 'boolean' }, d: { type: 'object' } },
      required: ['a', 'c'],
    },
    values: [{ a: 1, c: true }, { a: 2, b: 'x', c: false, d: {} }, { a: 3, c: true, d: {} }],
  },
  {
    name: 'negative_ranges',
    schema: {
      type: 'array',
      items: { type: 'integer', minimum: -1234, maximum: -17 },
      minItems: 2,
    },
    values: [[-17, -1234, -999, -100, -18]],
  },
  {
    name: 'unicode_escapes',
    strict: false,
    schema: { type: 'object', properties: { s: { type: 'string' } } },
    texts: ['{"s": "caf\\u00e9 \\u20ac \\n\\/ok"}', '{"s":"\\"quoted\\"","x":[1e10,-0.5E-3,true]}'],
  },
  {
    name: 'mixed_enums',
    schema: {
      type: 'object',
      properties: {
        e: { enum: [1.5, { a: [1, 2] }, [true, null], 'x y'] },
        u: { type: ['string', 'integer', 'boolean'] },
        city: { type: 'string', maxLength: 8 },
        word: { type: 'string', pattern: 'ab+c' },
      },
      required: ['e', 'u', 'city', 'word'],
    },
    // An enum value is written compact (json_schema.cpp), so the texts are written out.
    texts: ['{"e": {"a":[1,2]},\n "u": "ü", "city": "Zürich-Ö", "word": "xxabbbcyy"}',
      '{"e":1.5,"u":3,"city":"","word":"abc"}', '{ "e" : [true,null] , "u" : false , "city" : "Ωμέγα", "word": "-abc" }'],
  },
];

// Grammars in both dialects (xgrammar's EBNF is GBNF's syntax for what these use; where a spelling differs, both
// are given).
const arithmetic = `root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
`;
const list = `root ::= "[" ws (item (ws "," ws item)*)? ws "]"
item ::= "\\"" [a-z]{1,8} "\\""
ws ::= [ \\t\\n]{0,3}
`;
const kv = `root ::= line+
line ::= key "=" value "\\n"
key ::= [a-zA-Z_] [a-zA-Z0-9_]*
value ::= [^\\n#]* comment?
comment ::= "#" [^\\n]*
`;
const utf8 = `root ::= "«" [а-яё]+ "» " ("✓" | "✗") [^\\x00-\\x7F]?
`;
// xgrammar's web build reads a class range whose ends are above U+00FF by their low bytes ([а-я], U+0430-U+044F,
// as [0-O]), so its side spells the Cyrillic letters out.
const cyrillic = [...'абвгдеёжзийклмнопрстуфхцчшщъыьэюя'].map((ch) => `"${ch}"`).join(' | ');
const utf8Ebnf = `root ::= "«" (${cyrillic})+ "» " ("✓" | "✗") [^\\x00-\\x7F]?
`;

// llama.cpp's grammars/json.gbnf (MIT), as llama.cpp ships it.
const llamaJson = `root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\\"" (
    [^"\\\\\\x7F\\x00-\\x1F] |
    "\\\\" (["\\\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\\n" [ \\t]{0,20}
`;
// xgrammar's EBNF has no empty alternative: "" spells it.
const llamaJsonEbnf = llamaJson.replace('ws ::= |', 'ws ::= "" |');
const repeats = `root ::= "id:" [0-9]{2,} ("," [a-f]{1,3}){0,2} "." [^\\n.]{3} tail
tail ::= "" | "!" tail
`;

export const GRAMMARS = [
  { name: 'arithmetic', gbnf: arithmetic, ebnf: arithmetic, texts: ['(1+2.5)*-3/(4-5)', '12*(3+4)-0.5'] },
  { name: 'list', gbnf: list, ebnf: list, texts: ['[ "ab", "cdefgh",\n"z" ]', '[]', '["x","y"]'] },
  { name: 'key_value', gbnf: kv, ebnf: kv, texts: ['name=megactx # engine\nsize= 42\n', 'a_1=\n'] },
  { name: 'llama_json', gbnf: llamaJson, ebnf: llamaJsonEbnf,
    texts: ['{"a": [1, -2.5e+3, "x\\u00e9\\n", true, null],\n  "b": {}}', '{}', '{"k":"Zoë"}'] },
  { name: 'repeats', gbnf: repeats, ebnf: repeats, texts: ['id:123,ab,f.xy!!!', 'id:00.ä b'] },
  { name: 'utf8', gbnf: utf8, ebnf: utf8Ebnf, texts: ['«привет» ✓', '«ёж» ✗é'] },
];

export const REGEXES = [
  { name: 'date', regex: '\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])', texts: ['2024-02-29', '1999-12-01'] },
  { name: 'email', regex: '[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,6}', texts: ['ada.lovelace+x@example.co.uk'] },
  { name: 'phone', regex: '\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}', texts: ['(555) 123-4567', '555 123-4567'] },
  { name: 'words', regex: '([A-Z][a-z]+ ){1,3}[A-Z][a-z]+\\.', texts: ['Hello World.', 'One Two Three Four.'] },
  { name: 'dot', regex: 'a.{2,4}b', texts: ['axyzb', 'a\téb'] },
  { name: 'anchors', regex: '^\\[[^\\]]*\\]$|^x+$', texts: ['[x)]', '[]', 'xxx'] },
  { name: 'nested_groups', regex: '((ab|cd)+(ef)?){2}[.?!]*', texts: ['abcdefab!?', 'cdcd'] },
  { name: 'escapes', regex: '\\$\\d+(\\.\\d\\d)?\\t[\\x41-\\x46\\u00e9]{3}\\\\', texts: ['$12.50\tAéF\\', '$0\tééé\\'] },
  { name: 'hex_or_word', regex: '(0x[0-9a-fA-F]+|[a-z]+|\\w\\s\\w)', texts: ['0xDEADbeef', 'hello', 'a\tb'] },
];
