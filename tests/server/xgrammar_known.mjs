// The differences between megactx's masks and xgrammar's that xgrammar_compare.test.mjs allows: classes of
// (state, token) pairs, each with its reason and the side that is right. `applies(d)` sees d.c (the case), d.prefix
// (the bytes before the state), d.bytes (the token's), d.stop and d.only ('megactx' or 'xgrammar': the side that
// allows the token). `embedded`: the class occurs with the embedded model's vocabulary (the test fails when it no
// longer does, so the list cannot go stale).

const has = (bytes, pred) => bytes.some(pred);
const schemaText = (d) => (d.c.schema ? JSON.stringify(d.c.schema) : '');
// Inside a JSON string whose length is bounded: the last unescaped '"' before the state opens a string value.
const lengthBounded = (d) => /"(minLength|maxLength)"/.test(schemaText(d));

export const KNOWN = [
  {
    name: 'impossible UTF-8 lead byte',
    right: 'megactx',
    reason: 'bytes C0, C1 and F5-FF never occur in UTF-8 (RFC 3629: C0/C1 would start overlong forms, F5 and up ' +
      'code points above U+10FFFF); xgrammar\'s decoder takes them as lead bytes by their bit pattern, so where any ' +
      'non-ASCII character may come it allows the one-byte tokens C0, C1, F5, F6, F7',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && has(d.bytes, (b) => b === 0xc0 || b === 0xc1 || b >= 0xf5),
  },
  {
    name: 'surrogate \\u escape',
    right: 'megactx',
    reason: 'megactx writes no \\u escape of a surrogate (D800-DFFF): a lone one is not a character, and a pair ' +
      'spells a code point that megactx writes raw, so each string character is one code point (json_schema.cpp); ' +
      'xgrammar allows any four hex digits',
    embedded: true,
    applies: (d) => {
      if (d.only !== 'xgrammar') return false;
      const text = Buffer.concat([d.prefix, d.bytes]).toString('latin1');
      const at = d.prefix.toString('latin1').lastIndexOf('\\');
      return at >= 0 && /^\\u[dD][89a-fA-F]/.test(text.slice(at));
    },
  },
  {
    name: '-0 integer',
    right: 'both',
    reason: '"-0" is JSON and an integer (value 0); megactx\'s unbounded integer is JSON\'s number grammar without ' +
      'fraction or exponent, so it writes it, while xgrammar\'s integer rule is "0" | "-"? [1-9] [0-9]*',
    embedded: true,
    applies: (d) => d.only === 'megactx' && d.prefix.at(-1) === 0x2d && d.bytes[0] === 0x30 &&
      /"integer"/.test(schemaText(d)),
  },
  {
    name: 'prefixItems array ended early',
    right: 'megactx',
    reason: 'JSON Schema 2020-12: prefixItems constrains the items present and requires none of them (minItems ' +
      'does), so ["x"] and [] are valid against prefixItems [string, integer] with items false; xgrammar requires ' +
      'every prefixItems entry',
    embedded: true,
    applies: (d) => d.only === 'megactx' && /"prefixItems"/.test(schemaText(d)) &&
      d.bytes.toString('latin1').trimStart().startsWith(']'),
  },
  {
    name: 'raw control character in a length-bounded string',
    right: 'megactx',
    reason: 'xgrammar writes a string with minLength/maxLength as [^"\\\\]{m,n}, which lets raw control characters ' +
      '(U+0000-U+001F) in: not JSON (RFC 8259 section 7 requires them escaped); megactx allows them only escaped',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && lengthBounded(d) && has(d.bytes, (b) => b < 0x20),
  },
  {
    name: 'escape in a length-bounded string',
    right: 'megactx',
    reason: 'for the same reason xgrammar allows no escape in a string with minLength/maxLength (so "x\\ty" with ' +
      'maxLength 3 cannot be written); megactx counts an escape as one character',
    embedded: true,
    applies: (d) => d.only === 'megactx' && lengthBounded(d) && has(d.bytes, (b) => b === 0x5c),
  },
  {
    name: 'regex \\s and byte A0',
    right: 'megactx',
    reason: 'xgrammar translates the regex class \\s to [\\f\\n\\r\\t\\v \\xa0] and matches \\xa0 as the lone ' +
      'byte A0, which is not UTF-8 (U+00A0 is C2 A0); megactx\'s \\s is Python\'s re.ASCII [ \\t\\n\\r\\f\\v] ' +
      '(frontends.h)',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && d.c.regex?.includes('\\s') && d.bytes[0] === 0xa0,
  },
];
