// The schemas, grammars and regexes xgrammar_compare.test.mjs runs through both implementations, each with
// instances that both accept. A schema case: `schema`, `values` (each written compact and, where whitespace is
// allowed, pretty-printed), `strict` (additionalProperties false unless said) and `ws` (whitespace bytes allowed at
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
    schema: {
      type: 'object',
      properties: { a: { type: 'array', items: { type: 'boolean' } } },
      required: ['a'],
    },
    values: [{ a: [true, false] }],
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

export const GRAMMARS = [
  { name: 'arithmetic', gbnf: arithmetic, ebnf: arithmetic, texts: ['(1+2.5)*-3/(4-5)', '12*(3+4)-0.5'] },
  { name: 'list', gbnf: list, ebnf: list, texts: ['[ "ab", "cdefgh",\n"z" ]', '[]', '["x","y"]'] },
  { name: 'key_value', gbnf: kv, ebnf: kv, texts: ['name=megactx # engine\nsize= 42\n', 'a_1=\n'] },
  { name: 'utf8', gbnf: utf8, ebnf: utf8Ebnf, texts: ['«привет» ✓', '«ёж» ✗é'] },
];

export const REGEXES = [
  { name: 'date', regex: '\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])', texts: ['2024-02-29', '1999-12-01'] },
  { name: 'email', regex: '[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,6}', texts: ['ada.lovelace+x@example.co.uk'] },
  { name: 'phone', regex: '\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}', texts: ['(555) 123-4567', '555 123-4567'] },
  { name: 'words', regex: '([A-Z][a-z]+ ){1,3}[A-Z][a-z]+\\.', texts: ['Hello World.', 'One Two Three Four.'] },
  { name: 'hex_or_word', regex: '(0x[0-9a-fA-F]+|[a-z]+|\\w\\s\\w)', texts: ['0xDEADbeef', 'hello', 'a\tb'] },
];
