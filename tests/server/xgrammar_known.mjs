// The differences between megactx's masks and xgrammar's that xgrammar_compare.test.mjs allows: classes of
// (state, token) pairs, each with its reason and the side that is right. `applies(d)` sees d.c (the case), d.prefix
// (the bytes before the state), d.bytes (the token's), d.stop and d.only ('megactx' or 'xgrammar': the side that
// allows the token). `embedded`: the class occurs with the embedded model's vocabulary (the test fails when it no
// longer does, so the list cannot go stale).

const has = (bytes, pred) => bytes.some(pred);
const schemaText = (d) => (d.c.schema ? JSON.stringify(d.c.schema) : '');
const lengthBounded = (d) => /"(minLength|maxLength)"/.test(schemaText(d));
// The value being written at the state, when it is a string or a number of a top-level property: its key and the
// bytes of it so far.
function currentValue(d) {
  const m = /"([^"\\]*)"\s*:\s*("(?:[^"\\]|\\.)*|-?[0-9.eE+-]*)$/.exec(d.prefix.toString('latin1'));
  return m ? { key: m[1], text: m[2], schema: d.c.schema?.properties?.[m[1]] ?? {} } : null;
}
// Code points U+0080-U+00FF a regex names in a class (\xHH, \u00HH; \s holds U+00A0 for xgrammar).
function latin1ClassCodePoints(regex) {
  const cps = new Set();
  if (!regex) return cps;
  for (const m of regex.matchAll(/\\(?:x|u00)([89a-fA-F][0-9a-fA-F])/g)) cps.add(parseInt(m[1], 16));
  if (regex.includes('\\s')) cps.add(0xa0);
  return cps;
}
const formatOf = (d) => currentValue(d)?.schema.format;
const startsWith = (bytes, s) => bytes.toString('latin1').startsWith(s);

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
    name: 'regex class code point U+0080-U+00FF',
    right: 'megactx',
    reason: 'xgrammar reads a code point from U+0080 to U+00FF in a regex class ([\\xe9], [\\u00e9], and \\s, ' +
      'which it translates to [\\f\\n\\r\\t\\v \\xa0]) as that one raw byte, which is not UTF-8 (U+00E9 is C3 A9), ' +
      'and refuses the character itself; megactx matches the code point as its UTF-8 bytes (and \\s is Python\'s ' +
      're.ASCII [ \\t\\n\\r\\f\\v], frontends.h)',
    embedded: true,
    applies: (d) => {
      const cps = latin1ClassCodePoints(d.c.regex);
      if (d.only === 'xgrammar') return cps.has(d.bytes[0]);
      return [...cps].some((cp) => d.bytes[0] === Buffer.from(String.fromCodePoint(cp))[0]);
    },
  },
  {
    name: 'regex dot',
    right: 'megactx',
    reason: 'xgrammar\'s regex . matches any one byte: the newline, and each byte of a UTF-8 sequence counted as a ' +
      'character of .{2,4}; Python\'s (megactx\'s) is one code point other than \\n',
    embedded: true,
    applies: (d) => /(^|[^\\])\./.test((d.c.regex ?? '').replace(/\[(\\.|[^\]])*\]/g, '')),
  },
  {
    name: 'whitespace inside an enum/const object or array',
    right: 'both',
    reason: 'an enum/const value that is an object or an array may be written with JSON whitespace between its ' +
      'tokens in megactx (as MaskBench writes instances, json.dumps with ", " and ": "), within the same bound as ' +
      'elsewhere; xgrammar takes only the compact text. Both are the same JSON value',
    embedded: true,
    applies: (d) => {
      if (d.only !== 'megactx' || !has(d.bytes, (b) => b === 0x20 || b === 0x09 || b === 0x0a)) return false;
      // The last property whose value opened with { or [ and whose enum/const holds an object or array.
      const keys = [...d.prefix.toString('latin1').matchAll(/"([^"\\]*)"\s*:\s*(?=[{[])/g)].map((m) => m[1]);
      return keys.some((k) => {
        const schema = d.c.schema?.properties?.[k];
        const values = schema ? [...(schema.enum ?? []), ...('const' in schema ? [schema.const] : [])] : [];
        return values.some((v) => v !== null && typeof v === 'object');
      });
    },
  },
  {
    name: 'object without properties, strict',
    right: 'both',
    reason: 'strict mode (--strict: additionalProperties false unless the schema says otherwise) leaves ' +
      '{"type": "object"} without properties only {}; xgrammar\'s strict mode still allows any members there',
    embedded: true,
    applies: (d) => {
      if (d.only !== 'xgrammar' || d.c.strict === false) return false;
      const m = /"([^"\\]*)"\s*:\s*\{[^{}]*$/.exec(d.prefix.toString('latin1'));
      const schema = m && d.c.schema?.properties?.[m[1]];
      return schema?.type === 'object' && !schema.properties;
    },
  },
  {
    name: 'integral enum number written with .0',
    right: 'megactx',
    reason: 'JSON Schema compares numbers by value, so 42.0 is the enum value 42 (and 2 the value 2.0): megactx ' +
      'writes an integral enum or const number as an integer or with ".0"; xgrammar only as the schema spells it',
    embedded: true,
    applies: (d) => d.only === 'megactx' && /"(enum|const)"/.test(schemaText(d)) &&
      /-?[0-9]+$/.test(d.prefix.toString('latin1')) && d.bytes.toString('latin1').startsWith('.'),
  },
  {
    name: 'optional properties in any order',
    right: 'megactx',
    reason: 'JSON Schema fixes no order of properties: megactx writes required, optional and additional ones in ' +
      'any order (an optional or additional key may come again: JSON parsers keep the last, where xgrammar allows ' +
      'each once); xgrammar writes every declared property in the schema\'s order, so at a key it allows fewer ' +
      'names',
    embedded: true,
    applies: (d) => {
      if (d.only !== 'megactx' || !schemaText(d).includes('"properties"')) return false;
      const pre = d.prefix.toString('latin1');
      // a key being started or spelled, or a comma that opens one more member after a value
      const atKey = /[{,]\s*"?[^"\\:]*$/.test(pre) && !/:\s*"[^"\\]*$/.test(pre);
      const moreMembers = d.bytes.toString('latin1').includes(',') && /([}\]"0-9el]|:)\s*$/.test(pre);
      return atKey || moreMembers;
    },
  },
  {
    name: 'declared name as an additional property',
    right: 'megactx',
    reason: 'an additional property\'s key is a name that properties does not declare (JSON Schema ' +
      'additionalProperties); xgrammar\'s additional keys are any string, so a declared key such as "s" may take ' +
      'any value, where its schema allows only a string; megactx spells the complement of the declared names',
    embedded: true,
    applies: (d) => {
      if (d.only !== 'xgrammar' || d.c.strict !== false) return false;
      const m = /"([^"\\]*)"\s*:\s*$/.exec(d.prefix.toString('latin1'));
      return Boolean(m && d.c.schema?.properties?.[m[1]]);
    },
  },
  {
    name: 'unanchored pattern',
    right: 'megactx',
    reason: 'JSON Schema\'s pattern is not anchored: "xxabbbcyy" matches "ab+c" (the string contains a match); ' +
      'xgrammar matches the pattern against the whole string',
    embedded: true,
    applies: (d) => {
      const p = currentValue(d)?.schema.pattern;
      return d.only === 'megactx' && p !== undefined && !(p.startsWith('^') && p.endsWith('$'));
    },
  },
  {
    name: 'format date: day of month',
    right: 'megactx',
    reason: 'megactx\'s full-date allows a month only its days (RFC 3339 section 5.7: 29 in February, 30 in April, ' +
      'June, September, November); xgrammar\'s allows 30 and 31 in every month',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && /^date/.test(formatOf(d) ?? '') &&
      /-(02|04|06|09|11)-$/.test(currentValue(d).text) && startsWith(d.bytes, '3'),
  },
  {
    name: 'format date-time: minute 60',
    right: 'megactx',
    reason: 'RFC 3339 section 5.6: time-minute is 00-59; xgrammar\'s date-time allows 60 there',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && formatOf(d) === 'date-time' &&
      /T\d\d:$/.test(currentValue(d).text) && startsWith(d.bytes, '6'),
  },
  {
    name: 'format email: local part and domain',
    right: 'both',
    reason: 'megactx\'s email is a strict subset of RFC 5321: a dot-atom local part of letters, digits and ' +
      '._%+- and a domain of at least two labels; xgrammar\'s allows RFC 5322\'s other atext characters (/ and ' +
      'the rest) and quoted local parts, and a one-label domain',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && formatOf(d) === 'email',
  },
  {
    name: 'format ipv4: leading zeros',
    right: 'megactx',
    reason: 'an ipv4 octet has no leading zero (RFC 2673 dotted-quad, as JSON Schema\'s test suite holds: 087 is ' +
      'ambiguous, octal to some parsers); xgrammar\'s octet allows 0 followed by digits',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && formatOf(d) === 'ipv4' &&
      /(^"|\.)0\d/.test(currentValue(d).text + d.bytes.toString('latin1')),
  },
  {
    name: 'number with a bound',
    right: 'megactx',
    reason: 'xgrammar 0.1.27 writes exclusiveMinimum -274 on a number as "-274" | ("-" | "0" | [1-9][0-9]*) ' +
      '("." [0-9]{1,6})?: it allows -274 itself, "-" alone and "-.5", no other negative, and at most 6 fraction ' +
      'digits; megactx\'s decimal range decomposition is exact',
    embedded: true,
    applies: (d) => {
      const v = currentValue(d);
      return v?.schema.type === 'number' && ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum']
        .some((k) => k in v.schema) && /^-?[0-9.]*$/.test(v.text);
    },
  },
  {
    name: 'allOf ignored by xgrammar',
    right: 'megactx',
    reason: 'xgrammar 0.1.27 does not compile allOf with several subschemas (it warns "Support for allOf with ' +
      'multiple options is still ongoing") and allows any JSON value instead; megactx merges them exactly',
    embedded: true,
    applies: (d) => d.only === 'xgrammar' && Array.isArray(d.c.schema?.allOf),
  },
];
