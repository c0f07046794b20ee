// JSON Schema (draft 2020-12) to Grammar: every text the grammar derives is JSON that the schema accepts. The
// grammar may accept fewer texts than the schema (a sound subset); it never accepts more, so a
// keyword that cannot be enforced is a GrammarError naming it and its JSON pointer.
//
// Choices:
// - Text is standard JSON: strings with the JSON escapes and no raw control characters (and no \u escapes of
//   surrogates: code points above U+FFFF are written raw, so each string character is one code point); numbers by
//   the JSON grammar. Whitespace only between tokens inside objects and arrays, at most options.max_whitespace bytes
//   of [ \t\n] at each place; none around the top-level value (the output ends when the value closes).
// - `not` where it has an exact positive form (not false, not not X, not type, not one required property).
// - Keywords: those below are enforced; the other validation keywords of drafts 4 to 2020-12 (if/then/else,
//   dependencies, unevaluated*, ...) are errors; a keyword outside the specification is an annotation, as JSON
//   Schema says of unknown keywords. An $id (draft 4: id) below the root is an error only with a $ref inside it.
// - `enum` and `const` values are emitted in their canonical serialization: compact tokens, with the whitespace
//   JSON allows between them inside objects and arrays as everywhere else, and an integral number also as N.0
//   (JSON Schema compares numbers by value); they are filtered by
//   `type`, and other validation keywords beside them are an error.
// - No `type`: as JSON Schema says, a keyword constrains only the values of its own type (properties an object,
//   items an array, ...) and a value of any other type is valid; options.infer_type instead takes the type from the
//   keywords present (properties → object, items → array, ...), as llama.cpp and xgrammar do.
// - Objects: the required properties once each, the optional ones and the additional ones (additionalProperties,
//   default options.additional_properties_default) in any order, as a validator takes them: the member after each
//   set of required properties written is read by its own trie over the declared names (member_trie; a required
//   name not yet written takes its value schema and moves to the next set, an optional name its value schema,
//   another declared name nothing, any other key the additional schema), spelled without \u escapes so that "not a
//   declared name" is exact. An object with more than 6 required properties (64 sets) keeps them in order instead:
//   declared ones in the schema's order, then undeclared ones in `required`'s order (as llguidance orders them),
//   the optional ones anywhere around them and additional ones after the last required one (a subset). An optional
//   or additional key may come again (JSON parsers keep the last). minProperties is enforced when the required
//   properties meet it or it is 1; maxProperties when the declared properties cannot exceed it; otherwise an
//   error. patternProperties with one value schema for all patterns and no declared name matching one: declared
//   properties in the schema's order, then the pattern keys instead of additional properties (a subset where
//   those are allowed); propertyNames: an error unless empty.
// - Arrays: prefixItems, items, minItems, maxItems exactly (and the older items-as-an-array with additionalItems);
//   uniqueItems only false; contains is an error.
// - Integers: canonical integer text; minimum/maximum/exclusive bounds exactly by decimal range decomposition ("-0"
//   is not produced under bounds); format int32/int64 as ranges. Numbers: bounds must be integers and are exact; a
//   bounded number is written without an exponent. multipleOf: an error (except 1 on integers); other formats on
//   numbers are errors.
// - Strings: minLength/maxLength in code points (an escape is one); pattern (unanchored, as JSON Schema says: the
//   string contains a match; the regex front end's syntax), the matched characters that JSON must escape written
//   as their escapes (\" \\ \n ..., \u00XX); format: date-time, date, time,
//   uuid, email, ipv4, ipv6, hostname, uri, each a strict subset of its RFC; lengths, pattern and format do not
//   combine.
// - anyOf and oneOf are alternatives; oneOf only where no instance can match two branches (their types, enum/const
//   values or a required property's schemas tell them apart), else an error, so the grammar never accepts more
//   (options.exact_one_of false: oneOf as anyOf, as llama.cpp and xgrammar take it).
//   allOf, and keywords beside anyOf/oneOf/$ref, are merged into one schema when that is exact (properties, required,
//   bounds, types, enums; additionalProperties only where the sides' property sets allow it); anything else is an
//   error. A false branch is dropped; a property whose schema is false (or an enum with no value of its type) is
//   never written.
// - $ref: keywords beside it apply too (2019-09 on), or are ignored where the root's $schema is draft 3 to 7, as those
//   drafts say. JSON pointers into the document ("#", "#/$defs/...", "#/definitions/..."), recursion through named rules. Definitions are compiled when referenced, so an unused one is not checked.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "grammar/frontend_common.h"
#include "grammar/frontends.h"
#include "grammar/matcher.h"

namespace megactx::grammar {
namespace {

// ordered_json: properties keep the schema's order.
using json = nlohmann::ordered_json;

// "id" is draft 4's "$id".
const std::set<std::string> kAnnotations = {"title",    "description", "$schema",    "$id",      "id",       "default",
                                            "examples", "$comment",    "deprecated", "readOnly", "writeOnly"};
// Keywords of drafts 4 to 2020-12 that constrain values or references and that this front end does not enforce: an
// error. Any keyword outside the specification ("x-...", a vendor's or a typo's) is an annotation, as JSON Schema
// says of unknown keywords; it never constrains a value.
const std::set<std::string> kUnsupported = {
    "if",           "then",          "else",           "dependencies",     "dependentRequired",
    "dependentSchemas", "unevaluatedItems", "unevaluatedProperties", "maxContains", "minContains",
    "$dynamicRef",  "$recursiveRef", "$anchor",      "$dynamicAnchor", "$recursiveAnchor", "$vocabulary",
    "contentSchema", "divisibleBy", "disallow", "extends"};
const std::set<std::string> kObjectKeywords = {"properties",    "required",      "additionalProperties",
                                               "minProperties", "maxProperties", "patternProperties",
                                               "propertyNames"};
const std::set<std::string> kArrayKeywords = {"items",       "prefixItems", "additionalItems", "minItems",
                                              "maxItems",    "uniqueItems", "contains"};
const std::set<std::string> kStringKeywords = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kNumberKeywords = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                               "multipleOf"};
const std::set<std::string> kOtherKeywords = {"type", "enum",  "const", "anyOf",      "oneOf",
                                              "not",  "allOf", "$ref",  "$defs", "definitions"};
const std::vector<std::string> kTypes = {"null", "boolean", "object", "array", "string", "number", "integer"};

bool is_enforced(const std::string& k) {
    return kObjectKeywords.count(k) || kArrayKeywords.count(k) || kStringKeywords.count(k) ||
           kNumberKeywords.count(k) || kOtherKeywords.count(k);
}

bool is_annotation(const std::string& k) { return kAnnotations.count(k) || (!is_enforced(k) && !kUnsupported.count(k)); }



bool is_known(const std::string& k) { return !kUnsupported.count(k); }

// Some "$ref" anywhere in `s`.
bool has_ref(const json& s) {
    if (s.is_object() && s.contains("$ref")) return true;
    if (s.is_structured())
        for (const auto& item : s.items())
            if (has_ref(item.value())) return true;
    return false;
}

std::string child(const std::string& ptr, std::string_view key) {
    std::string out = ptr;
    out += '/';
    for (char c : key) {
        if (c == '~') {
            out += "~0";
        } else if (c == '/') {
            out += "~1";
        } else {
            out += c;
        }
    }
    return out;
}

std::string at(const std::string& ptr) { return ptr.empty() ? std::string("#") : fmt::format("#{}", ptr); }

[[noreturn]] void fail(const std::string& ptr, const std::string& what) {
    throw GrammarError(fmt::format("json schema: {} (at {})", what, at(ptr)));
}

// The code points of a UTF-8 string (nlohmann has validated it).
std::vector<uint32_t> code_points(const std::string& s) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t cp = len == 1 ? c : c & (0x3F >> (len - 1));
        for (int k = 1; k < len && i + static_cast<size_t>(k) < s.size(); ++k)
            cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
        out.push_back(cp);
        i += static_cast<size_t>(len);
    }
    return out;
}

// The two-character escapes and the code point each stands for.
constexpr std::pair<char, uint32_t> kShortEscapes[] = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},  {'b', 0x08},
                                                       {'f', 0x0C}, {'n', 0x0A},  {'r', 0x0D}, {'t', 0x09}};

// The set of JSON types a schema's `type` names ("integer" inside "number" collapses to "number").
std::set<std::string> parse_types(const json& t, const std::string& ptr) {
    std::set<std::string> out;
    const auto add = [&](const json& v) {
        if (!v.is_string() || std::find(kTypes.begin(), kTypes.end(), v.get<std::string>()) == kTypes.end())
            fail(child(ptr, "type"), fmt::format("unknown type {}", v.dump()));
        out.insert(v.get<std::string>());
    };
    if (t.is_array()) {
        for (const json& v : t) add(v);
    } else {
        add(t);
    }
    if (out.empty()) fail(child(ptr, "type"), "an empty type list allows nothing");
    if (out.count("number")) out.erase("integer");
    return out;
}

// A length or count keyword's value; a bound expands to one rule per unit, so it is capped.
constexpr uint64_t kMaxBound = 100'000;
int64_t bound_keyword(const json& s, const char* k, int64_t dflt, const std::string& ptr) {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number_unsigned()) fail(child(ptr, k), fmt::format("{} must be a non-negative integer", k));
    const uint64_t v = s[k].get<uint64_t>();
    if (v > kMaxBound)
        fail(child(ptr, k), fmt::format("{} {} is above the {} a grammar can spell out", k, v, kMaxBound));
    return static_cast<int64_t>(v);
}

bool value_has_type(const json& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (v.is_number_integer()) return true;
    return v.is_number_float() && std::floor(v.get<double>()) == v.get<double>();
}

// An enum or const none of whose values has the schema's type: no value matches it.
bool no_enum_value(const json& s) {
    if (!s.is_object() || !s.contains("type") || !(s.contains("enum") || s.contains("const"))) return false;
    if (s.contains("enum") && !s["enum"].is_array()) return false;
    const std::set<std::string> types = parse_types(s["type"], "");
    const json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    return std::none_of(values.begin(), values.end(), [&](const json& v) {
        return std::any_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(v, t); });
    });
}

class Compiler {
  public:
    Compiler(json root, const JsonSchemaOptions& options) : root_(std::move(root)), options_(options) {
        // Drafts 3 to 7 ignore the keywords beside a $ref; 2019-09 on apply them too (as is the default here).
        if (root_.is_object() && root_.contains("$schema") && root_["$schema"].is_string()) {
            const std::string d = root_["$schema"].get<std::string>();
            for (const char* old : {"draft-03", "draft-04", "draft-06", "draft-07"})
                if (d.find(old) != std::string::npos) ref_overrides_ = true;
        }
        if (options_.max_whitespace < 0 || static_cast<uint64_t>(options_.max_whitespace) > kMaxBound)
            throw GrammarError(fmt::format("json schema: max_whitespace {} out of range", options_.max_whitespace));
        if (options_.max_whitespace > 0) ws_ = b_.repeat(b_.bytes(ws_bytes()), 0, options_.max_whitespace, "ws");
    }

    Grammar finish(const Symbol& top) {
        const int32_t r = b_.rule("root");
        b_.add_alternative(r, {top});
        return b_.finish(r);
    }

    const json& root_schema() const { return root_; }
    Symbol schema(const json& s, const std::string& ptr, int depth = 0);
    Symbol any_object();
    Builder& builder() { return b_; }

  private:
    static ByteSet ws_bytes() {
        ByteSet w = ByteSet::of(' ');
        w.add('\t');
        w.add('\n');
        return w;
    }
    void ws(Sequence& s) const {
        if (ws_) s.push_back(*ws_);
    }
    Symbol lit(std::string_view s) { return b_.literal(s); }
    Symbol digit() { return b_.bytes(ByteSet::range('0', '9')); }

    Symbol any_value();
    // Any value of one JSON type (object, array, string, number, boolean, null).
    Symbol any_of_type(const std::string& type);
    Symbol string_char();
    Symbol any_string();
    Symbol any_number();
    Symbol any_integer();
    Symbol canonical_integer();

    json resolve(const std::string& ref, const std::string& ptr) const;
    json inline_refs(json s, const std::string& ptr, int depth) const;
    json merge(json a, json b, const std::string& ptr, int depth) const;
    std::set<std::string> kinds(const json& s, int depth) const;
    bool disjoint(const json& a, const json& b, int depth) const;
    void check_one_of(const std::vector<json>& branches, const std::string& ptr) const;
    json without_not(const json& s, const std::string& ptr) const;

    Symbol ref(const std::string& ref, const std::string& ptr);
    Symbol merged(const json& m, const std::string& ptr, int depth);
    Symbol typed(const json& s, const std::string& ptr, const std::string& type);
    Symbol enumeration(const json& s, const std::string& ptr);
    Symbol value_literal(const json& v);
    Symbol string(const json& s, const std::string& ptr);
    Symbol format(const std::string& f, const std::string& ptr);
    Symbol pattern(const std::string& p, const std::string& ptr);
    Symbol escaped(const ByteSet& chars);
    Symbol integer(const json& s, const std::string& ptr);
    Symbol number(const json& s, const std::string& ptr);
    Symbol object(const json& s, const std::string& ptr);
    Symbol array(const json& s, const std::string& ptr);
    Symbol additional_key(const std::vector<std::string>& declared);
    // One object member (key, ws, ':', ws, value) whose key is read by one trie over the declared names: a name in
    // `allowed` takes its value, another declared name (required, or false) nothing, any other key `additional`'s
    // value when given. `ws_colon` is ws ':' ws.
    Symbol member_trie(const std::vector<std::string>& declared,
                       const std::map<std::string, Symbol>& allowed, const std::optional<Symbol>& additional,
                       const Sequence& ws_colon);
    std::optional<std::pair<Symbol, Symbol>> pattern_members(const json& s, const std::string& ptr,
                                                             const std::vector<std::string>& declared);
    Symbol key_char_except(const std::set<uint32_t>& cps);
    std::optional<Symbol> spell(uint32_t cp);

    std::optional<Symbol> uint_range(const std::string& lo, const std::optional<std::string>& hi);
    Symbol nonneg_number(const std::string& lo, bool lo_incl, const std::optional<std::string>& hi, bool hi_incl,
                         const std::string& ptr);

    Builder b_;
    json root_;
    JsonSchemaOptions options_;
    bool ref_overrides_ = false;  // the root's $schema is draft 3 to 7: a $ref's siblings are ignored
    std::optional<Symbol> ws_;
    // A JSON pointer (or a merged schema's text) → its rule, made before the target compiles (recursion).
    std::map<std::string, int32_t> refs_, merged_;
    std::optional<Symbol> any_value_, any_object_value_, any_array_value_, string_char_, any_string_, any_number_, any_integer_, canonical_integer_, key_char_, non_ascii_;
};

Symbol Compiler::string_char() {
    if (string_char_) return *string_char_;
    ByteSet excl = ByteSet::range(0, 0x1F);
    excl.add('"');
    excl.add('\\');
    const Symbol raw = b_.utf8_char_except(excl, "char-raw");
    ByteSet esc;
    for (const auto& [c, cp] : kShortEscapes) esc.add(static_cast<uint8_t>(c));
    ByteSet hex = ByteSet::range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    const Symbol h = b_.bytes(hex);
    // \u escapes of surrogates left out: a pair would be two chars here but one code point to minLength/maxLength,
    // and a lone one is no character at all. Code points above U+FFFF are written raw.
    ByteSet d = ByteSet::of('d');
    d.add('D');
    const Symbol u = b_.alt(
        {{b_.bytes(hex.intersect(d.complement())), h, h, h}, {b_.bytes(d), b_.bytes(ByteSet::range('0', '7')), h, h}},
        "u-hex");
    string_char_ = b_.alt({{raw}, {lit("\\"), b_.bytes(esc)}, {lit("\\"), lit("u"), u}}, "char");
    return *string_char_;
}

Symbol Compiler::any_string() {
    if (!any_string_) any_string_ = b_.seq({lit("\""), b_.repeat(string_char(), 0, -1, "chars"), lit("\"")}, "string");
    return *any_string_;
}

Symbol Compiler::any_integer() {
    if (!any_integer_) {
        const Symbol natural =
            b_.alt({{lit("0")}, {b_.bytes(ByteSet::range('1', '9')), b_.repeat(digit(), 0, -1)}}, "natural");
        any_integer_ = b_.seq({b_.optional(lit("-")), natural}, "integer");
    }
    return *any_integer_;
}

// `type: integer` without bounds: "0", or an optional "-" and digits without a leading zero; "-0" (which JSON
// numbers allow, so any_integer() keeps it for them) is left out as it is under bounds.
Symbol Compiler::canonical_integer() {
    if (!canonical_integer_) {
        const Symbol positive = b_.seq({b_.bytes(ByteSet::range('1', '9')), b_.repeat(digit(), 0, -1)}, "positive");
        canonical_integer_ = b_.alt({{lit("0")}, {b_.optional(lit("-")), positive}}, "integer");
    }
    return *canonical_integer_;
}

Symbol Compiler::any_number() {
    if (!any_number_) {
        const Symbol frac = b_.optional(b_.seq({lit("."), b_.repeat(digit(), 1, -1)}), "frac");
        ByteSet e = ByteSet::of('e');
        e.add('E');
        ByteSet sign = ByteSet::of('+');
        sign.add('-');
        const Symbol exp =
            b_.optional(b_.seq({b_.bytes(e), b_.optional(b_.bytes(sign)), b_.repeat(digit(), 1, -1)}), "exp");
        any_number_ = b_.seq({any_integer(), frac, exp}, "number");
    }
    return *any_number_;
}

Symbol Compiler::any_value() {
    if (any_value_) return *any_value_;
    const int32_t value = b_.rule("value");
    any_value_ = Symbol::ref(value);
    Sequence member{any_string()};
    ws(member);
    member.push_back(lit(":"));
    ws(member);
    member.push_back(*any_value_);
    const Symbol m = b_.seq(member, "member");
    const auto list = [&](const Symbol& item, std::string_view open, std::string_view close, std::string_view hint) {
        Sequence sep;
        ws(sep);
        sep.push_back(lit(","));
        ws(sep);
        sep.push_back(item);
        Sequence empty{lit(open)}, full{lit(open)};
        ws(empty);
        empty.push_back(lit(close));
        ws(full);
        full.push_back(item);
        full.push_back(b_.repeat(b_.seq(sep), 0, -1));
        ws(full);
        full.push_back(lit(close));
        return b_.alt({empty, full}, hint);
    };
    any_object_value_ = list(m, "{", "}", "object");
    any_array_value_ = list(*any_value_, "[", "]", "array");
    for (const Symbol& s :
         {*any_object_value_, *any_array_value_, any_string(), any_number(), lit("true"), lit("false"), lit("null")})
        b_.add_alternative(value, {s});
    return *any_value_;
}

Symbol Compiler::any_of_type(const std::string& type) {
    any_value();
    if (type == "object") return *any_object_value_;
    if (type == "array") return *any_array_value_;
    if (type == "string") return any_string();
    if (type == "number") return any_number();
    if (type == "boolean") return b_.alt({{lit("true")}, {lit("false")}}, "boolean");
    return lit("null");
}

Symbol Compiler::any_object() {
    json s = json::object();
    s["type"] = "object";
    s["additionalProperties"] = true;
    return schema(s, "");
}

json Compiler::resolve(const std::string& ref, const std::string& ptr) const {
    if (ref.empty() || ref[0] != '#') fail(ptr, fmt::format("$ref \"{}\": only references within the document", ref));
    try {
        const json::json_pointer p(ref.substr(1));
        if (!root_.contains(p)) fail(ptr, fmt::format("$ref \"{}\" names nothing", ref));
        json target = root_.at(p);
        if (ref == "#" && target.is_object()) {  // the root's own $id, harmless anywhere
            target.erase("$id");
            target.erase("id");
        }
        return target;
    } catch (const json::exception& e) {
        fail(ptr, fmt::format("$ref \"{}\": {}", ref, e.what()));
    }
}

// `s` with a top-level $ref replaced by its target merged with the keywords beside it (the target alone where those
// are ignored: ref_overrides_).
json Compiler::inline_refs(json s, const std::string& ptr, int depth) const {
    if (depth > 64) fail(ptr, "$ref chain too deep (a reference to itself?)");
    if (!s.is_object() || !s.contains("$ref")) return s;
    if (!s["$ref"].is_string()) fail(child(ptr, "$ref"), "$ref must be a string");
    json target = resolve(s["$ref"].get<std::string>(), ptr);
    s.erase("$ref");
    target = inline_refs(std::move(target), ptr, depth + 1);
    if (ref_overrides_) return target;
    return merge(std::move(target), std::move(s), ptr, depth + 1);
}

json Compiler::merge(json a, json b, const std::string& ptr, int depth) const {
    a = inline_refs(std::move(a), ptr, depth + 1);
    b = inline_refs(std::move(b), ptr, depth + 1);
    if (a.is_boolean() || b.is_boolean()) {
        if (a == false || b == false) fail(ptr, "merging with a false schema allows nothing");
        return a.is_boolean() ? b : a;
    }
    if (!a.is_object() || !b.is_object()) fail(ptr, "a schema must be an object or a boolean");
    for (const json* s : {&a, &b})
        if (s->contains("allOf")) {
            json rest = *s;
            rest.erase("allOf");
            json merged = rest;
            for (const json& x : s->at("allOf")) merged = merge(std::move(merged), x, ptr, depth + 1);
            if (s == &a) {
                a = merged;
            } else {
                b = merged;
            }
        }
    // additionalProperties applies to the properties its own schema does not declare: the union of the property sets
    // is exact only when a side that says additionalProperties declares every property of the other.
    const auto keys = [](const json& s) {
        std::set<std::string> k;
        if (s.contains("properties") && s["properties"].is_object())
            for (const auto& [name, v] : s["properties"].items()) k.insert(name);
        return k;
    };
    const auto restricts = [](const json& s) {
        return s.contains("additionalProperties") && s["additionalProperties"] != true;
    };
    const auto covers = [&](const json& x, const json& y) {
        const auto kx = keys(x), ky = keys(y);
        return std::includes(kx.begin(), kx.end(), ky.begin(), ky.end());
    };
    if ((restricts(a) && !covers(a, b)) || (restricts(b) && !covers(b, a)))
        fail(ptr, "allOf of objects with different properties and additionalProperties cannot be merged exactly");
    for (auto& [k, v] : b.items()) {
        if (is_annotation(k) || k == "$defs" || k == "definitions") continue;
        if (!a.contains(k)) {
            a[k] = v;
            continue;
        }
        json& x = a[k];
        if (x == v) continue;
        if (k == "type") {
            const auto ta = parse_types(x, ptr), tb = parse_types(v, ptr);
            json out = json::array();
            for (const std::string& t : ta) {
                if (tb.count(t) || (t == "integer" && tb.count("number"))) {
                    out.push_back(t);
                } else if (t == "number" && tb.count("integer")) {
                    out.push_back("integer");
                }
            }
            if (out.empty()) fail(ptr, "allOf with disjoint types allows nothing");
            x = out;
        } else if (k == "required") {
            for (const json& r : v)
                if (std::find(x.begin(), x.end(), r) == x.end()) x.push_back(r);
        } else if (k == "properties") {
            for (auto& [name, sub] : v.items())
                x[name] = x.contains(name) ? merge(x[name], sub, child(child(ptr, k), name), depth + 1) : sub;
        } else if (k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems" ||
                   k == "minProperties") {
            if (v > x) x = v;
        } else if (k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems" ||
                   k == "maxProperties") {
            if (v < x) x = v;
        } else if (k == "enum") {
            json out = json::array();
            for (const json& e : x)
                if (std::find(v.begin(), v.end(), e) != v.end()) out.push_back(e);
            if (out.empty()) fail(ptr, "allOf with disjoint enums allows nothing");
            x = out;
        } else if (k == "items" || k == "additionalProperties") {
            x = x == false || v == false ? json(false) : merge(x, v, child(ptr, k), depth + 1);
        } else {
            fail(child(ptr, k), fmt::format("allOf: cannot merge two different '{}'", k));
        }
    }
    return a;
}

// A value's kind for oneOf's disjointness: its JSON type, integers being numbers.
std::string kind_of_type(const std::string& t) { return t == "integer" ? "number" : t; }

std::string kind_of_value(const json& v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "boolean";
    if (v.is_number()) return "number";
    if (v.is_string()) return "string";
    return v.is_array() ? "array" : "object";
}

// The kinds some instance of `s` may have, as far as type, enum, const, $ref, allOf, anyOf and oneOf tell (every
// kind when they do not).
std::set<std::string> Compiler::kinds(const json& s, int depth) const {
    std::set<std::string> all;
    for (const std::string& t : kTypes) all.insert(kind_of_type(t));
    if (s.is_boolean()) return s.get<bool>() ? all : std::set<std::string>{};
    if (!s.is_object() || depth > 16) return all;
    if (ref_overrides_ && s.contains("$ref") && s["$ref"].is_string()) {  // its siblings are ignored
        try {
            return kinds(resolve(s["$ref"].get<std::string>(), ""), depth + 1);
        } catch (const GrammarError&) {
            return all;
        }
    }
    std::set<std::string> out = all;
    const auto keep = [&out](const std::set<std::string>& k) {
        std::set<std::string> both;
        for (const std::string& x : out)
            if (k.count(x)) both.insert(x);
        out = std::move(both);
    };
    if (s.contains("type")) {
        std::set<std::string> k;
        for (const std::string& t : parse_types(s["type"], "")) k.insert(kind_of_type(t));
        keep(k);
    }
    if (s.contains("const")) keep({kind_of_value(s["const"])});
    if (s.contains("enum") && s["enum"].is_array()) {
        std::set<std::string> k;
        for (const json& v : s["enum"]) k.insert(kind_of_value(v));
        keep(k);
    }
    if (s.contains("$ref") && s["$ref"].is_string()) {
        try {
            keep(kinds(resolve(s["$ref"].get<std::string>(), ""), depth + 1));
        } catch (const GrammarError&) {
        }
    }
    if (s.contains("allOf") && s["allOf"].is_array())
        for (const json& b : s["allOf"]) keep(kinds(b, depth + 1));
    for (const char* k : {"anyOf", "oneOf"}) {
        if (!s.contains(k) || !s[k].is_array()) continue;
        std::set<std::string> any;
        for (const json& b : s[k]) any.merge(kinds(b, depth + 1));
        keep(any);
    }
    return out;
}

// No instance can match both `a` and `b`, provably: their kinds differ, their enum/const values differ, in
// objects-only branches a property one requires has disjoint schemas in the two (or the other allows no such key),
// or a part that `a` or `b` must also match ($ref, allOf) is disjoint from the other. False when unsure.
bool Compiler::disjoint(const json& a, const json& b, int depth) const {
    if (depth > 8) return false;
    if (ref_overrides_) {  // a $ref's siblings are ignored: the target alone
        for (const auto& [x, y] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
            if (!x->is_object() || !x->contains("$ref") || !(*x)["$ref"].is_string()) continue;
            try {
                return disjoint(resolve((*x)["$ref"].get<std::string>(), ""), *y, depth + 1);
            } catch (const GrammarError&) {
                return false;
            }
        }
    }
    const std::set<std::string> ka = kinds(a, 0), kb = kinds(b, 0);
    if (std::none_of(ka.begin(), ka.end(), [&](const std::string& k) { return kb.count(k) > 0; })) return true;
    if (!a.is_object() || !b.is_object()) return false;
    const auto values = [](const json& s) -> std::optional<json> {
        if (s.contains("const")) return json::array({s["const"]});
        if (s.contains("enum") && s["enum"].is_array()) return s["enum"];
        return std::nullopt;
    };
    const auto va = values(a), vb = values(b);
    const auto in_b = [&](const json& v) { return std::find(vb->begin(), vb->end(), v) != vb->end(); };
    if (va && vb && std::none_of(va->begin(), va->end(), in_b)) return true;
    // An object of x has its required property p, with a value of x's schema for p; an object of y with p must give
    // it y's schema for p (false where y allows no such key): disjoint schemas make the objects disjoint.
    const auto value_schema = [](const json& s, const std::string& p) -> json {
        if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(p))
            return s["properties"][p];
        if (s.contains("patternProperties")) return true;
        return s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    };
    const auto by_required = [&](const json& x, const json& y) {
        if (!x.contains("required") || !x["required"].is_array()) return false;
        for (const json& p : x["required"])
            if (p.is_string() && disjoint(value_schema(x, p.get<std::string>()), value_schema(y, p.get<std::string>()),
                                          depth + 1))
                return true;
        return false;
    };
    const std::set<std::string> objects{"object"};
    if (ka == objects && kb == objects && (by_required(a, b) || by_required(b, a))) return true;
    // x ⊆ part and part ∩ y = ∅ give x ∩ y = ∅.
    const auto via_parts = [&](const json& x, const json& y) {
        if (x.contains("$ref") && x["$ref"].is_string()) {
            try {
                if (disjoint(resolve(x["$ref"].get<std::string>(), ""), y, depth + 1)) return true;
            } catch (const GrammarError&) {
            }
        }
        if (x.contains("allOf") && x["allOf"].is_array())
            for (const json& part : x["allOf"])
                if (disjoint(part, y, depth + 1)) return true;
        return false;
    };
    return via_parts(a, b) || via_parts(b, a);
}

// `s` without its `not`, where that has an exact positive form: not false (nothing more), not {"not": X} (X), not
// {"type": T} (the other types), not {"required": [p]} (an object without p); any other `not` is an error.
json Compiler::without_not(const json& s, const std::string& ptr) const {
    json rest = s;
    rest.erase("not");
    const json& n = s["not"];
    const std::string p = child(ptr, "not");
    const auto only = [&](const char* k) {
        return n.is_object() && n.contains(k) &&
               std::all_of(n.items().begin(), n.items().end(),
                           [&](const auto& item) { return item.key() == k || is_annotation(item.key()); });
    };
    if (n == false) return rest;
    if (only("not")) {
        if (n["not"] == true) return rest;
        return merge(rest, n["not"], p, 0);
    }
    if (only("type")) {
        const std::set<std::string> t = parse_types(n["type"], p);
        if (t.count("integer") && !t.count("number"))
            fail(p, "not {\"type\": \"integer\"} (numbers that are not integers) is not supported");
        json others = json::array();
        for (const std::string& x : kTypes)
            if (x != "integer" && !t.count(x)) others.push_back(x);
        if (others.empty()) fail(p, "not every type allows nothing");
        return merge(rest, json{{"type", others}}, p, 0);
    }
    if (only("required") && n["required"].is_array() && n["required"].size() == 1 && n["required"][0].is_string()) {
        json out = merge(rest, json{{"type", "object"}}, p, 0);
        if (!out.contains("properties")) out["properties"] = json::object();
        out["properties"][n["required"][0].get<std::string>()] = false;
        return out;
    }
    fail(p, "'not' is supported only as not false, not not, not type and not one required property");
}

// oneOf is anyOf when no instance can match two branches; otherwise the grammar would accept those instances.
void Compiler::check_one_of(const std::vector<json>& branches, const std::string& ptr) const {
    for (size_t i = 0; i < branches.size(); ++i)
        for (size_t j = i + 1; j < branches.size(); ++j)
            if (!disjoint(branches[i], branches[j], 0))
                fail(ptr, fmt::format("oneOf whose branches may both match is not supported (branches {} and {}; "
                                      "only branches told apart by type, enum/const or a required property's are)",
                                      i, j));
}

Symbol Compiler::ref(const std::string& r, const std::string& ptr) {
    if (auto it = refs_.find(r); it != refs_.end()) return Symbol::ref(it->second);
    const json target = resolve(r, ptr);
    std::string name = r.substr(r.find_last_of('/') == std::string::npos ? 1 : r.find_last_of('/') + 1);
    std::replace_if(
        name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)) && c != '-'; }, '-');
    const int32_t rule = b_.rule(name.empty() ? "ref" : fmt::format("ref-{}", name));
    refs_[r] = rule;
    b_.add_alternative(rule, {schema(target, r.substr(1))});
    return Symbol::ref(rule);
}

// A schema made by merging, one rule per distinct result, made before it compiles: merging inlines references, so
// the same merge recurs inside its own result ({"$ref": "#", "minProperties": 1} as a tree's items).
Symbol Compiler::merged(const json& m, const std::string& ptr, int depth) {
    const std::string key = m.dump();
    if (auto it = merged_.find(key); it != merged_.end()) return Symbol::ref(it->second);
    const int32_t rule = b_.rule("merged");
    merged_[key] = rule;
    b_.add_alternative(rule, {schema(m, ptr, depth + 1)});
    return Symbol::ref(rule);
}

Symbol Compiler::schema(const json& s, const std::string& ptr, int depth) {
    if (depth > 64) fail(ptr, "schema nested too deep");
    if (s.is_boolean()) {
        if (!s.get<bool>()) fail(ptr, "the false schema allows nothing");
        return any_value();
    }
    if (!s.is_object()) fail(ptr, "a schema must be an object or a boolean");
    bool constrained = false;
    for (const auto& [k, v] : s.items()) {
        if (!is_known(k)) fail(child(ptr, k), fmt::format("unsupported keyword '{}'", k));
        // An $id below the root would change what "#..." references inside it resolve against.
        if ((k == "$id" || (k == "id" && v.is_string())) && !ptr.empty() && has_ref(s))
            fail(child(ptr, k), fmt::format("{} below the root with a $ref inside is not supported", k));
        if (!is_annotation(k) && k != "$defs" && k != "definitions") constrained = true;
    }
    if (!constrained) return any_value();
    if (s.contains("not")) return schema(without_not(s, ptr), ptr, depth + 1);
    // Keywords beside $ref / allOf / anyOf / oneOf restrict each branch: merge them in.
    const auto siblings = [&](std::initializer_list<const char*> drop) {
        json rest = json::object();
        for (const auto& item : s.items()) {
            const std::string& k = item.key();  // (a structured binding cannot be captured by the lambda in C++20)
            if (!is_annotation(k) && k != "$defs" && k != "definitions" &&
                std::none_of(drop.begin(), drop.end(), [&](const char* d) { return k == d; }))
                rest[k] = item.value();
        }
        return rest;
    };
    if (s.contains("$ref")) {
        if (!s["$ref"].is_string()) fail(child(ptr, "$ref"), "$ref must be a string");
        const json rest = siblings({"$ref"});
        const std::string r = s["$ref"].get<std::string>();
        if (rest.empty() || ref_overrides_) return ref(r, ptr);
        return merged(merge(resolve(r, ptr), rest, ptr, 0), ptr, depth);
    }
    if (s.contains("allOf")) {
        if (!s["allOf"].is_array() || s["allOf"].empty()) fail(child(ptr, "allOf"), "allOf must be a non-empty array");
        json merged = siblings({"allOf"});
        for (size_t i = 0; i < s["allOf"].size(); ++i)
            merged = merge(std::move(merged), s["allOf"][i], child(child(ptr, "allOf"), std::to_string(i)), 0);
        return this->merged(merged, ptr, depth);
    }
    if (s.contains("anyOf") && s.contains("oneOf")) fail(ptr, "anyOf and oneOf together");
    for (const char* k : {"anyOf", "oneOf"}) {
        if (!s.contains(k)) continue;
        const json& branches = s[k];
        if (!branches.is_array() || branches.empty())
            fail(child(ptr, k), fmt::format("{} must be a non-empty array", k));
        const json rest = siblings({k});
        std::vector<json> alt_schemas;  // each branch with the keywords beside it
        std::vector<std::string> alt_ptrs;
        for (size_t i = 0; i < branches.size(); ++i) {
            if (branches[i] == false) continue;  // matches nothing
            alt_ptrs.push_back(child(child(ptr, k), std::to_string(i)));
            alt_schemas.push_back(rest.empty() ? branches[i] : merge(rest, branches[i], alt_ptrs.back(), 0));
        }
        if (alt_schemas.empty()) fail(child(ptr, k), fmt::format("every {} branch is false", k));
        if (std::string_view(k) == "oneOf" && options_.exact_one_of) check_one_of(alt_schemas, child(ptr, k));
        std::vector<Sequence> alts;
        for (size_t i = 0; i < alt_schemas.size(); ++i)
            alts.push_back({rest.empty() ? schema(alt_schemas[i], alt_ptrs[i], depth + 1)
                                         : merged(alt_schemas[i], alt_ptrs[i], depth)});
        return b_.alt(std::move(alts), k);
    }
    if (s.contains("enum") || s.contains("const")) return enumeration(s, ptr);

    std::set<std::string> types;
    if (s.contains("type")) {
        types = parse_types(s["type"], ptr);
    } else {
        for (const auto& [k, v] : s.items()) {
            if (kObjectKeywords.count(k)) types.insert("object");
            if (kArrayKeywords.count(k)) types.insert("array");
            if (kStringKeywords.count(k)) types.insert("string");
            if (kNumberKeywords.count(k)) types.insert("number");
        }
    }
    if (types.empty()) return any_value();
    std::vector<Sequence> alts;
    for (const std::string& t : types) alts.push_back({typed(s, ptr, t)});
    // No `type`: a keyword constrains only the values of its own type, and a value of another type is valid as it is.
    if (!s.contains("type") && !options_.infer_type)
        for (const char* t : {"object", "array", "string", "number", "boolean", "null"})
            if (!types.count(t) && !(std::string_view(t) == "number" && types.count("integer")))
                alts.push_back({any_of_type(t)});
    return b_.alt(std::move(alts), "type");
}

Symbol Compiler::typed(const json& s, const std::string& ptr, const std::string& type) {
    if (type == "null") return lit("null");
    if (type == "boolean") return b_.alt({{lit("true")}, {lit("false")}}, "boolean");
    if (type == "string") return string(s, ptr);
    if (type == "integer") return integer(s, ptr);
    if (type == "number") return number(s, ptr);
    if (type == "object") return object(s, ptr);
    return array(s, ptr);
}

Symbol Compiler::enumeration(const json& s, const std::string& ptr) {
    for (const auto& [k, v] : s.items())
        if (!is_annotation(k) && k != "$defs" && k != "definitions" && k != "enum" && k != "const" && k != "type")
            fail(child(ptr, k), fmt::format("'{}' beside enum/const is not supported", k));
    if (s.contains("enum") && !s["enum"].is_array()) fail(child(ptr, "enum"), "enum must be an array");
    json values = json::array();
    if (s.contains("const")) {
        if (!s.contains("enum") || std::find(s["enum"].begin(), s["enum"].end(), s["const"]) != s["enum"].end())
            values.push_back(s["const"]);
    } else {
        values = s["enum"];
    }
    std::vector<Sequence> alts;
    const std::optional<std::set<std::string>> types =
        s.contains("type") ? std::optional(parse_types(s["type"], ptr)) : std::nullopt;
    std::set<std::string> seen;
    for (const json& v : values) {
        if (types &&
            std::none_of(types->begin(), types->end(), [&](const std::string& t) { return value_has_type(v, t); }))
            continue;
        if (seen.insert(v.dump()).second) alts.push_back({value_literal(v)});
    }
    if (alts.empty()) fail(ptr, "enum/const allows no value (of the given type)");
    return b_.alt(std::move(alts), "enum");
}

// One JSON value exactly: its compact tokens, with the whitespace JSON allows between them inside objects and arrays
// (as everywhere else in the grammar), so that {"a": 1} matches an enum value {"a":1}.
Symbol Compiler::value_literal(const json& v) {
    if (v.is_number()) {  // JSON Schema compares numbers by value: 2 and 2.0 are one value, written either way
        const double x = v.get<double>();
        if (std::floor(x) == x && std::fabs(x) < 9007199254740992.0 && !(x == 0 && std::signbit(x))) {
            const std::string i = v.is_number_float() ? fmt::format("{:.0f}", x) : v.dump();
            return b_.alt({{lit(i)}, {lit(i + ".0")}}, "number");
        }
    }
    if (!v.is_object() && !v.is_array()) return lit(v.dump());
    Sequence s{lit(v.is_object() ? "{" : "[")};
    bool first = true;
    for (const auto& item : v.items()) {
        ws(s);
        if (!first) {
            s.push_back(lit(","));
            ws(s);
        }
        first = false;
        if (v.is_object()) {
            s.push_back(lit(json(item.key()).dump()));
            ws(s);
            s.push_back(lit(":"));
            ws(s);
        }
        s.push_back(value_literal(item.value()));
    }
    ws(s);
    s.push_back(lit(v.is_object() ? "}" : "]"));
    return b_.seq(std::move(s), "const");
}

Symbol Compiler::string(const json& s, const std::string& ptr) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (int(has_len) + int(s.contains("pattern")) + int(s.contains("format")) > 1)
        fail(ptr, "minLength/maxLength, pattern and format cannot be combined");
    if (s.contains("format")) {
        if (!s["format"].is_string()) fail(child(ptr, "format"), "format must be a string");
        return format(s["format"].get<std::string>(), child(ptr, "format"));
    }
    if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) fail(child(ptr, "pattern"), "pattern must be a string");
        return pattern(s["pattern"].get<std::string>(), child(ptr, "pattern"));
    }
    if (!has_len) return any_string();
    const auto count = [&](const char* k, int64_t dflt) { return bound_keyword(s, k, dflt, ptr); };
    const int64_t lo = count("minLength", 0), hi = count("maxLength", -1);
    if (hi >= 0 && hi < lo) fail(ptr, "maxLength below minLength allows nothing");
    return b_.seq({lit("\""), b_.repeat(string_char(), lo, hi, "chars"), lit("\"")}, "string");
}

// The JSON text of an integer, as a decimal string (nullopt: unbounded).
std::string integral(const json& v, bool up) {
    if (v.is_number_integer()) return v.dump();
    const double d = v.get<double>();
    return fmt::format("{}", static_cast<int64_t>(up ? std::ceil(d) : std::floor(d)));
}

// Decimal strings of non-negative integers: helpers for range decomposition.
bool dec_less(const std::string& a, const std::string& b) { return a.size() != b.size() ? a.size() < b.size() : a < b; }
std::string dec_add(std::string a, int d) {  // d = +1 or -1; a > 0 when d = -1
    if (d > 0) {
        int i = static_cast<int>(a.size()) - 1;
        while (i >= 0 && a[static_cast<size_t>(i)] == '9') a[static_cast<size_t>(i--)] = '0';
        if (i < 0) return a.insert(0, 1, '1');
        ++a[static_cast<size_t>(i)];
        return a;
    }
    int i = static_cast<int>(a.size()) - 1;
    while (a[static_cast<size_t>(i)] == '0') a[static_cast<size_t>(i--)] = '9';
    --a[static_cast<size_t>(i)];
    if (a.size() > 1 && a[0] == '0') a.erase(0, 1);
    return a;
}

// Every decimal string of the same length between x and y inclusive, as sequences of digit classes.
void same_length(const std::string& x, const std::string& y, Sequence prefix, std::vector<Sequence>& out) {
    if (x.empty()) {
        out.push_back(std::move(prefix));
        return;
    }
    const auto d = [](char c) { return Symbol::terminal(ByteSet::of(static_cast<uint8_t>(c))); };
    if (x[0] == y[0]) {
        prefix.push_back(d(x[0]));
        same_length(x.substr(1), y.substr(1), std::move(prefix), out);
        return;
    }
    const size_t rest = x.size() - 1;
    const bool x_low = x.find_first_not_of('0', 1) == std::string::npos;
    const bool y_high = y.find_first_not_of('9', 1) == std::string::npos;
    if (!x_low) {
        Sequence p = prefix;
        p.push_back(d(x[0]));
        same_length(x.substr(1), std::string(rest, '9'), std::move(p), out);
    }
    const char lo = static_cast<char>(x[0] + (x_low ? 0 : 1)), hi = static_cast<char>(y[0] - (y_high ? 0 : 1));
    if (lo <= hi) {
        Sequence p = prefix;
        p.push_back(Symbol::terminal(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi))));
        for (size_t i = 0; i < rest; ++i) p.push_back(Symbol::terminal(ByteSet::range('0', '9')));
        out.push_back(std::move(p));
    }
    if (!y_high) {
        Sequence p = prefix;
        p.push_back(d(y[0]));
        same_length(std::string(rest, '0'), y.substr(1), std::move(p), out);
    }
}

// The canonical decimal texts of lo..hi (hi nullopt: unbounded); nullopt when the range is empty.
std::optional<Symbol> Compiler::uint_range(const std::string& lo, const std::optional<std::string>& hi) {
    if (hi && dec_less(*hi, lo)) return std::nullopt;
    std::vector<Sequence> alts;
    const size_t last = hi ? hi->size() : lo.size();
    for (size_t len = lo.size(); len <= last; ++len) {
        std::string x = lo;
        if (len != lo.size()) {
            x.assign(len, '0');
            x[0] = '1';
        }
        const std::string y = hi && len == hi->size() ? *hi : std::string(len, '9');
        same_length(x, y, {}, alts);
    }
    if (!hi) alts.push_back({b_.bytes(ByteSet::range('1', '9')), b_.repeat(digit(), static_cast<int64_t>(last), -1)});
    return b_.alt(std::move(alts), "range");
}

// |v| for v < 0, INT64_MIN included.
std::string magnitude(int64_t v) { return std::to_string(uint64_t{0} - static_cast<uint64_t>(v)); }

Symbol Compiler::integer(const json& s, const std::string& ptr) {
    if (s.contains("multipleOf") && s["multipleOf"] != 1) fail(child(ptr, "multipleOf"), "multipleOf is not supported");
    // Bounds as signed decimal strings; the tighter of inclusive and exclusive wins.
    std::optional<int64_t> lo, hi;
    const auto tighten = [&](const char* k, bool is_lo, int shift) {
        if (!s.contains(k)) return;
        const std::string p = child(ptr, k);
        const json& v = s[k];
        if (!v.is_number() || std::fabs(v.get<double>()) > 1e18) fail(p, "a bound must be a number within 1e18");
        const int64_t b = std::stoll(integral(v, is_lo));
        // An exclusive bound that is not an integer rounds like an inclusive one.
        const bool exact = v.is_number_integer() || std::floor(v.get<double>()) == v.get<double>();
        const int64_t x = b + (exact ? shift : 0);
        if (is_lo) {
            lo = lo ? std::max(*lo, x) : x;
        } else {
            hi = hi ? std::min(*hi, x) : x;
        }
    };
    tighten("minimum", true, 0);
    tighten("exclusiveMinimum", true, 1);
    tighten("maximum", false, 0);
    tighten("exclusiveMaximum", false, -1);
    if (s.contains("format")) {  // OpenAPI's integer formats are ranges
        const json& f = s["format"];
        const int64_t max = f == "int32" ? INT32_MAX : f == "int64" ? INT64_MAX : 0;
        if (max == 0) fail(child(ptr, "format"), fmt::format("unsupported format {} on an integer", f.dump()));
        lo = std::max(lo.value_or(-max - 1), -max - 1);
        hi = std::min(hi.value_or(max), max);
    }
    if (!lo && !hi) return canonical_integer();
    if (lo && hi && *lo > *hi) fail(ptr, "the integer bounds allow nothing");
    std::vector<Sequence> alts;
    if (!hi || *hi >= 0)
        alts.push_back({*uint_range(std::to_string(lo ? std::max<int64_t>(*lo, 0) : 0),
                                    hi ? std::optional(std::to_string(*hi)) : std::nullopt)});
    if (!lo || *lo < 0)
        alts.push_back({lit("-"), *uint_range(hi && *hi < 0 ? magnitude(*hi) : "1",
                                              lo ? std::optional(magnitude(*lo)) : std::nullopt)});
    return b_.alt(std::move(alts), "integer");
}

// Non-negative decimals I(.F)? with a value in [lo, hi] (each end inclusive or not), lo and hi integers.
Symbol Compiler::nonneg_number(const std::string& lo, bool lo_incl, const std::optional<std::string>& hi, bool hi_incl,
                               const std::string& ptr) {
    const Symbol digits = b_.repeat(digit(), 1, -1);
    const Symbol frac = b_.optional(b_.seq({lit("."), digits}), "frac");
    const Symbol nonzero_frac =
        b_.seq({lit("."), b_.repeat(digit(), 0, -1), b_.bytes(ByteSet::range('1', '9')), b_.repeat(digit(), 0, -1)});
    const Symbol zero_frac = b_.optional(b_.seq({lit("."), b_.repeat(lit("0"), 1, -1)}), "zero-frac");
    std::vector<Sequence> alts;
    // Whole parts strictly inside the range take any fraction.
    const std::string first = lo_incl ? lo : dec_add(lo, 1);
    if (!hi || !dec_less(*hi, "1")) {
        const std::optional<std::string> last = hi ? std::optional(dec_add(*hi, -1)) : std::nullopt;
        if (auto r = uint_range(first, last)) alts.push_back({*r, frac});
    }
    if (!lo_incl && (!hi || dec_less(lo, *hi))) alts.push_back({lit(lo), nonzero_frac});
    if (hi && hi_incl && (dec_less(lo, *hi) || lo_incl)) alts.push_back({lit(*hi), zero_frac});
    if (alts.empty()) fail(ptr, "the number bounds allow nothing");
    return b_.alt(std::move(alts), "bounded");
}

Symbol Compiler::number(const json& s, const std::string& ptr) {
    if (s.contains("multipleOf")) fail(child(ptr, "multipleOf"), "multipleOf is not supported");
    if (s.contains("format"))
        fail(child(ptr, "format"), fmt::format("unsupported format {} on a number", s["format"].dump()));
    struct Bound {
        int64_t v;
        bool incl;
    };
    std::optional<Bound> lo, hi;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
        if (!s.contains(k)) continue;
        const std::string p = child(ptr, k);
        const json& v = s[k];
        if (!v.is_number()) fail(p, "a bound must be a number");
        const double d = v.get<double>();
        if (!v.is_number_integer() && std::floor(d) != d) fail(p, "a bound on a non-integer number must be an integer");
        if (std::fabs(d) > 1e18) fail(p, "bound out of range");
        const Bound b{v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d), k[0] != 'e'};
        const bool is_lo = std::string_view(k).find("inimum") != std::string_view::npos;
        std::optional<Bound>& cur = is_lo ? lo : hi;
        if (!cur || (is_lo ? b.v > cur->v : b.v < cur->v) || (b.v == cur->v && !b.incl)) cur = b;
    }
    if (!lo && !hi) return any_number();
    std::vector<Sequence> alts;
    // Values >= 0 without a sign; values < 0 as "-" and a positive magnitude ("-0" is not produced).
    if (!hi || hi->v > 0 || (hi->v == 0 && hi->incl)) {
        const bool from_zero = !lo || lo->v < 0;
        alts.push_back({nonneg_number(from_zero ? "0" : std::to_string(lo->v), from_zero || lo->incl,
                                      hi ? std::optional(std::to_string(hi->v)) : std::nullopt, hi && hi->incl, ptr)});
    }
    if (!lo || lo->v < 0) {
        const bool to_zero = !hi || hi->v >= 0;
        alts.push_back(
            {lit("-"), nonneg_number(to_zero ? "0" : std::to_string(-hi->v), !to_zero && hi->incl,
                                     lo ? std::optional(std::to_string(-lo->v)) : std::nullopt, lo && lo->incl, ptr)});
    }
    if (alts.empty()) fail(ptr, "the number bounds allow nothing");
    return b_.alt(std::move(alts), "number");
}

Symbol Compiler::format(const std::string& f, const std::string& ptr) {
    const auto r = [&](const Symbol& x, int64_t lo, int64_t hi) { return b_.repeat(x, lo, hi); };
    const auto cls = [&](std::string_view ranges) {  // "a-zA-Z0-9" style
        ByteSet s;
        for (size_t i = 0; i < ranges.size(); ++i) {
            if (i + 2 < ranges.size() && ranges[i + 1] == '-') {
                s.add_range(static_cast<uint8_t>(ranges[i]), static_cast<uint8_t>(ranges[i + 2]));
                i += 2;
            } else {
                s.add(static_cast<uint8_t>(ranges[i]));
            }
        }
        return b_.bytes(s);
    };
    const Symbol d = digit();
    const auto two = [&](char a_lo, char a_hi, char b_lo, char b_hi) {
        return Sequence{b_.bytes(ByteSet::range(static_cast<uint8_t>(a_lo), static_cast<uint8_t>(a_hi))),
                        b_.bytes(ByteSet::range(static_cast<uint8_t>(b_lo), static_cast<uint8_t>(b_hi)))};
    };
    const auto quoted = [&](const Symbol& x) { return b_.seq({lit("\""), x, lit("\"")}, f); };
    const auto date = [&] {
        // Days by month; 29 February only in leap years.
        const Symbol year = r(d, 4, 4);
        const Symbol leap = b_.alt({{d, d,
                                     b_.alt({two('0', '0', '4', '4'),
                                             two('0', '0', '8', '8'),
                                             {cls("2468"), cls("048")},
                                             {cls("13579"), cls("26")}})},
                                    {b_.alt({{cls("02468"), cls("048")}, {cls("13579"), cls("26")}}), lit("00")}},
                                   "leap-year");
        const Symbol d28 = b_.alt({two('0', '0', '1', '9'), two('1', '1', '0', '9'), two('2', '2', '0', '8')});
        const Symbol d30 = b_.alt({{d28}, {lit("29")}, {lit("30")}});
        const Symbol d31 = b_.alt({{d30}, {lit("31")}});
        return b_.alt(
            {{year, lit("-"),
              b_.alt({{lit("01")}, {lit("03")}, {lit("05")}, {lit("07")}, {lit("08")}, {lit("10")}, {lit("12")}}),
              lit("-"), d31},
             {year, lit("-"), b_.alt({{lit("04")}, {lit("06")}, {lit("09")}, {lit("11")}}), lit("-"), d30},
             {year, lit("-02-"), d28},
             {leap, lit("-02-29")}},
            "date");
    };
    const auto time = [&] {
        const Symbol hh = b_.alt({two('0', '1', '0', '9'), two('2', '2', '0', '3')});
        const Symbol mm = b_.seq(two('0', '5', '0', '9'));
        const Symbol offset = b_.alt({{lit("Z")}, {cls("+-"), hh, lit(":"), mm}});
        return b_.seq({hh, lit(":"), mm, lit(":"), mm, b_.optional(b_.seq({lit("."), r(d, 1, 9)})), offset}, "time");
    };
    const auto ipv4 = [&] {
        const Symbol octet = b_.alt(
            {{lit("25"), cls("0-5")}, {lit("2"), cls("0-4"), d}, {lit("1"), d, d}, {cls("1-9"), d}, {d}}, "octet");
        return b_.seq({octet, lit("."), octet, lit("."), octet, lit("."), octet}, "ipv4");
    };
    const auto label = [&](int max) {  // a hostname label of at most `max` characters
        const Symbol an = cls("a-zA-Z0-9");
        return b_.seq({an, b_.optional(b_.seq({r(cls("a-zA-Z0-9-"), 0, max - 2), an}))}, "label");
    };
    if (f == "date") return quoted(date());
    if (f == "time") return quoted(time());
    if (f == "date-time") return quoted(b_.seq({date(), lit("T"), time()}));
    if (f == "uuid") {
        const Symbol h = cls("0-9a-fA-F");
        return quoted(b_.seq(
            {r(h, 8, 8), lit("-"), r(h, 4, 4), lit("-"), r(h, 4, 4), lit("-"), r(h, 4, 4), lit("-"), r(h, 12, 12)}));
    }
    if (f == "ipv4") return quoted(ipv4());
    if (f == "ipv6") {
        const Symbol h16 = r(cls("0-9a-fA-F"), 1, 4);
        const Symbol h16c = b_.seq({h16, lit(":")});
        const Symbol ls32 = b_.alt({{h16, lit(":"), h16}, {ipv4()}});
        const auto head = [&](int n) {  // [ *n( h16 ":" ) h16 ]
            return b_.optional(b_.seq({r(h16c, 0, n), h16}));
        };
        return quoted(b_.alt({{r(h16c, 6, 6), ls32},
                              {lit("::"), r(h16c, 5, 5), ls32},
                              {b_.optional(h16), lit("::"), r(h16c, 4, 4), ls32},
                              {head(1), lit("::"), r(h16c, 3, 3), ls32},
                              {head(2), lit("::"), r(h16c, 2, 2), ls32},
                              {head(3), lit("::"), h16c, ls32},
                              {head(4), lit("::"), ls32},
                              {head(5), lit("::"), h16},
                              {head(6), lit("::")}},
                             "ipv6"));
    }
    // At most 4 labels of at most 62 characters: 251 bytes, within the 253 a hostname may have.
    const auto hostname = [&] { return b_.seq({label(62), r(b_.seq({lit("."), label(62)}), 0, 3)}, "hostname"); };
    if (f == "hostname") return quoted(hostname());
    if (f == "email") {
        const Symbol atom = r(cls("a-zA-Z0-9!#$%&'*+=?^_`{|}~-"), 1, 64);
        const Symbol domain = b_.seq({label(62), r(b_.seq({lit("."), label(62)}), 1, 3)}, "domain");
        return quoted(b_.seq({atom, r(b_.seq({lit("."), atom}), 0, 3), lit("@"), domain}, "email"));
    }
    if (f == "uri") {
        // scheme ":" hier-part ["?" query] ["#" fragment] (RFC 3986), the hier-part either "//" [host [":" port]]
        // path-abempty with a reg-name host, or a path without an authority (path-absolute, -rootless or -empty:
        // "urn:isbn:0451450523", "mailto:a@b.org").
        const Symbol pct = b_.seq({lit("%"), cls("0-9a-fA-F"), cls("0-9a-fA-F")});
        const Symbol pchar = b_.alt({{cls("a-zA-Z0-9._~!$&'()*+,;=:@-")}, {pct}}, "pchar");
        const Symbol qchar = b_.alt({{pchar}, {cls("/?")}}, "qchar");
        const Symbol segments = r(b_.seq({lit("/"), r(pchar, 0, -1)}), 0, -1);
        const Symbol authority = b_.seq(
            {lit("//"), b_.optional(b_.seq({hostname(), b_.optional(b_.seq({lit(":"), r(d, 1, 5)}))})), segments});
        const Symbol no_authority =
            b_.seq({b_.optional(lit("/")), b_.optional(b_.seq({r(pchar, 1, -1), segments}))});
        return quoted(b_.seq({cls("a-zA-Z"), r(cls("a-zA-Z0-9+.-"), 0, -1), lit(":"),
                              b_.alt({{authority}, {no_authority}}, "hier-part"),
                              b_.optional(b_.seq({lit("?"), r(qchar, 0, -1)})),
                              b_.optional(b_.seq({lit("#"), r(qchar, 0, -1)}))},
                             "uri"));
    }
    fail(ptr, fmt::format("unsupported format '{}'", f));
}

// The bytes of a pattern's terminal as JSON string text: those that need no escape as they are, '"' and '\\' and the
// control characters by their escapes (\u00XX, either case, for those without a two-character one).
Symbol Compiler::escaped(const ByteSet& chars) {
    ByteSet bad = ByteSet::range(0, 0x1F);
    bad.add('"');
    bad.add('\\');
    if (chars.intersect(bad).empty()) return Symbol::terminal(chars);
    std::vector<Sequence> alts;
    if (const ByteSet raw = chars.intersect(bad.complement()); !raw.empty()) alts.push_back({Symbol::terminal(raw)});
    for (int c = 0; c < 0x100; ++c) {
        if (!bad.has(static_cast<uint8_t>(c)) || !chars.has(static_cast<uint8_t>(c))) continue;
        const auto* e = std::find_if(std::begin(kShortEscapes), std::end(kShortEscapes),
                                     [&](const auto& x) { return x.second == static_cast<uint32_t>(c); });
        if (e != std::end(kShortEscapes)) {
            alts.push_back({lit(std::string{'\\', e->first})});
        } else {
            const int d = c % 16;
            ByteSet last = ByteSet::of(static_cast<uint8_t>(d < 10 ? '0' + d : 'a' + d - 10));
            if (d >= 10) last.add(static_cast<uint8_t>('A' + d - 10));
            alts.push_back({lit(fmt::format("\\u00{}", c / 16)), Symbol::terminal(last)});
        }
    }
    return b_.alt(std::move(alts), "escaped");
}

Symbol Compiler::pattern(const std::string& p, const std::string& ptr) {
    // A string contains a match of a|b when it contains one of a or of b: each top-level branch on its own, with its
    // own anchors.
    int depth = 0;
    bool in_class = false;
    std::vector<size_t> bars;  // top-level '|'s
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == '\\') {
            ++i;
        } else if (in_class) {
            in_class = p[i] != ']';
        } else if (p[i] == '[') {
            in_class = true;
        } else if (p[i] == '(') {
            ++depth;
        } else if (p[i] == ')') {
            --depth;
        } else if (p[i] == '|' && depth == 0) {
            bars.push_back(i);
        }
    }
    if (!bars.empty()) {
        std::vector<Sequence> alts;
        size_t from = 0;
        bars.push_back(p.size());
        for (const size_t bar : bars) {
            alts.push_back({pattern(p.substr(from, bar - from), ptr)});
            from = bar + 1;
        }
        return b_.alt(std::move(alts), "pattern-alt");
    }
    std::string body = p;
    const size_t n_start = body.starts_with('^') ? 1 : body.starts_with("\\A") ? 2 : 0;
    const bool start = n_start > 0;
    body.erase(0, n_start);
    size_t n_backslashes = 0;  // before the last character: an odd count escapes it
    for (size_t i = body.size(); i >= 2 && body[i - 2] == '\\'; --i) ++n_backslashes;
    const bool end = !body.empty() && n_backslashes % 2 == (body.back() == '$' ? 0 : 1) &&
                     (body.back() == '$' || body.back() == 'Z' || body.back() == 'z');
    if (end) body.erase(body.size() - (body.back() == '$' ? 1 : 2));
    // The pattern matches the string's characters, not its JSON text: compile it alone, then copy it with each
    // character that JSON must escape spelled as its escape (they are ASCII, so never inside a multi-byte
    // character).
    Builder sub;
    Grammar g;
    try {
        const int32_t r = sub.rule("pattern");
        sub.add_alternative(r, {add_regex(sub, body)});
        g = sub.finish(r);
    } catch (const GrammarError& e) {
        fail(ptr, fmt::format("pattern \"{}\": {}", p, e.what()));
    }
    std::vector<bool> productive(g.rules.size(), false);
    const auto ok = [&](const Sequence& seq) {
        return std::all_of(seq.begin(), seq.end(), [&](const Symbol& s) {
            return s.is_rule() ? productive[static_cast<size_t>(s.rule)] : !s.bytes.empty();
        });
    };
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < g.rules.size(); ++i)
            if (!productive[i] && ((g.rules[i].counted() && g.rules[i].min == 0) ||
                                   std::any_of(g.rules[i].alternatives.begin(), g.rules[i].alternatives.end(), ok)))
                productive[i] = changed = true;
    }
    std::vector<int32_t> map(g.rules.size(), -1);
    for (size_t i = 0; i < g.rules.size(); ++i)
        if (productive[i]) map[i] = b_.rule(g.rules[i].name);
    for (size_t i = 0; i < g.rules.size(); ++i) {
        if (!productive[i]) continue;
        if (g.rules[i].counted()) {  // item{min,max} stays counted; of an item that derives nothing, only ε is left
            const Symbol& item = g.rules[i].alternatives[0][0];
            if (!ok({item})) {
                b_.add_alternative(map[i], {});
                continue;
            }
            const Symbol copy = item.is_rule() ? Symbol::ref(map[static_cast<size_t>(item.rule)]) : escaped(item.bytes);
            b_.set_repeat(map[i], copy, g.rules[i].min, g.rules[i].max);
            continue;
        }
        for (const Sequence& seq : g.rules[i].alternatives) {
            if (!ok(seq)) continue;
            Sequence out;
            for (const Symbol& s : seq) out.push_back(s.is_rule() ? Symbol::ref(map[static_cast<size_t>(s.rule)]) : escaped(s.bytes));
            b_.add_alternative(map[i], std::move(out));
        }
    }
    Sequence content{lit("\"")};
    const Symbol chars = b_.repeat(string_char(), 0, -1, "chars");
    if (!start) content.push_back(chars);
    content.push_back(Symbol::ref(map[static_cast<size_t>(g.root)]));
    if (!end) content.push_back(chars);
    content.push_back(lit("\""));
    return b_.seq(std::move(content), "pattern");
}

// Key characters of additional properties: any code point, raw where JSON allows, or its two-character escape; no
// \u escapes, so that each code point has at most two spellings and "not a declared name" stays exact.
Symbol Compiler::key_char_except(const std::set<uint32_t>& cps) {
    ByteSet ascii = ByteSet::range(0x20, 0x7F);
    ascii = ascii.intersect(ByteSet::of('"').complement()).intersect(ByteSet::of('\\').complement());
    std::vector<Sequence> alts;
    const auto add = [&](uint32_t lo, uint32_t hi) {  // a range of only surrogates has no encoding
        if (lo <= hi && !(lo >= 0xD800 && hi <= 0xDFFF)) alts.push_back({b_.utf8_range(lo, hi)});
    };
    if (cps.empty() || *cps.rbegin() < 0x80) {  // the usual case (ASCII names): every non-ASCII code point
        if (!non_ascii_) non_ascii_ = b_.utf8_range(0x80, 0x10FFFF, "non-ascii");
        alts.push_back({*non_ascii_});
    }
    uint32_t from = cps.empty() || *cps.rbegin() < 0x80 ? 0x110000 : 0x80;
    for (uint32_t cp : cps) {
        if (cp < 0x80) {
            ascii = ascii.intersect(ByteSet::of(static_cast<uint8_t>(cp)).complement());
            continue;
        }
        add(from, cp - 1);
        from = cp + 1;
    }
    add(from, 0x10FFFF);
    if (!ascii.empty()) alts.push_back({b_.bytes(ascii)});
    for (const auto& [c, cp] : kShortEscapes)
        if (!cps.count(cp)) alts.push_back({lit("\\"), lit(std::string(1, c))});
    return b_.alt(std::move(alts), "key-char");
}

std::optional<Symbol> Compiler::spell(uint32_t cp) {
    std::vector<Sequence> alts;
    std::string spelled;
    if (cp >= 0x20 && cp != '"' && cp != '\\' && frontend::append_utf8(spelled, cp)) alts.push_back({lit(spelled)});
    for (const auto& [c, x] : kShortEscapes)
        if (x == cp) alts.push_back({lit("\\"), lit(std::string(1, c))});
    if (alts.empty()) return std::nullopt;  // a control character without a short escape
    return b_.alt(std::move(alts), "key-cp");
}

// patternProperties' keys and their value: one value schema for every pattern (so a key matching two needs nothing
// more) and no declared property matching a pattern (so the keys are apart from the declared ones). They take the
// place of additional properties: where those are allowed (a key that matches no pattern) the grammar is a subset
// and writes none. Keys are not checked for duplicates, as additional properties' are not. nullopt: no
// patternProperties.
std::optional<std::pair<Symbol, Symbol>> Compiler::pattern_members(const json& s, const std::string& ptr,
                                                                   const std::vector<std::string>& declared) {
    if (!s.contains("patternProperties")) return std::nullopt;
    const std::string pp = child(ptr, "patternProperties");
    if (!s["patternProperties"].is_object()) fail(pp, "patternProperties must be an object");
    if (s["patternProperties"].empty()) return std::nullopt;
    const json& value = s["patternProperties"].begin().value();
    std::vector<Sequence> keys;
    for (const auto& item : s["patternProperties"].items()) {
        if (item.value() != value) fail(pp, "patternProperties with different schemas is not supported");
        const std::string p = child(pp, item.key());
        Compiler alone(json::object(), options_);
        const Grammar g = alone.finish(alone.pattern(item.key(), p));
        for (const std::string& name : declared) {
            const std::string quoted = json(name).dump();
            if (quoted.find('\\') != std::string::npos || matches(g, quoted))
                fail(p, fmt::format("declared property '{}' matching a patternProperties pattern is not supported",
                                    name));
        }
        keys.push_back({pattern(item.key(), p)});
    }
    return std::pair{b_.alt(std::move(keys), "pattern-key"),
                     schema(value, child(pp, s["patternProperties"].begin().key()))};
}

namespace {

// Objects with up to this many required properties take them in any order (a rule per subset of them written);
// others take them in order.
constexpr size_t kMaxUnorderedRequired = 8;

// A node of the trie of declared property names, by code point; children come after their parent.
struct NameNode {
    std::string name;  // the declared name ending here, if any
    bool declared = false;
    bool live = false;  // member_trie: a member can be completed from here
    std::map<uint32_t, size_t> next;
};

std::vector<NameNode> name_trie(const std::vector<std::string>& declared) {
    std::vector<NameNode> trie(1);
    for (const std::string& name : declared) {
        size_t n = 0;
        for (uint32_t cp : code_points(name)) {
            auto it = trie[n].next.find(cp);
            if (it == trie[n].next.end()) {
                trie.push_back({});
                it = trie[n].next.emplace(cp, trie.size() - 1).first;
            }
            n = it->second;
        }
        trie[n].declared = true;
        trie[n].name = name;
    }
    return trie;
}

}  // namespace

// A quoted key that is none of `declared`: the complement of their trie.
Symbol Compiler::additional_key(const std::vector<std::string>& declared) {
    if (declared.empty()) return any_string();
    const std::vector<NameNode> trie = name_trie(declared);
    if (!key_char_) key_char_ = key_char_except({});
    const Symbol free_tail = b_.seq({b_.repeat(*key_char_, 0, -1, "key-chars"), lit("\"")}, "key-tail");
    std::vector<int32_t> rules(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) rules[i] = b_.rule("key-node");
    for (size_t i = 0; i < trie.size(); ++i) {
        if (!trie[i].declared) b_.add_alternative(rules[i], {lit("\"")});
        std::set<uint32_t> children;
        for (const auto& [cp, n] : trie[i].next) {
            children.insert(cp);
            if (const auto s = spell(cp)) b_.add_alternative(rules[i], {*s, Symbol::ref(rules[n])});
        }
        b_.add_alternative(rules[i], {key_char_except(children), free_tail});
    }
    return b_.seq({lit("\""), Symbol::ref(rules[0])}, "key");
}

Symbol Compiler::member_trie(const std::vector<std::string>& declared, const std::map<std::string, Symbol>& allowed,
                             const std::optional<Symbol>& additional, const Sequence& ws_colon) {
    // Every declared name allowed and taking the additional properties' value schema: any key does.
    if (additional && allowed.size() == declared.size() &&
        std::all_of(allowed.begin(), allowed.end(), [&](const auto& a) { return a.second == *additional; })) {
        Sequence m{any_string()};
        m.insert(m.end(), ws_colon.begin(), ws_colon.end());
        m.push_back(*additional);
        return b_.seq(std::move(m), "member");
    }
    std::vector<NameNode> trie = name_trie(declared);
    // Children come after their parent: live from the leaves up.
    for (size_t i = trie.size(); i-- > 0;) {
        NameNode& node = trie[i];
        node.live = additional.has_value() || (node.declared && allowed.count(node.name));
        for (const auto& [cp, c] : node.next) node.live = node.live || trie[c].live;
    }
    const auto value_after = [&](const Symbol& value) {  // '"' ws ':' ws value
        Sequence m{lit("\"")};
        m.insert(m.end(), ws_colon.begin(), ws_colon.end());
        m.push_back(value);
        return m;
    };
    std::optional<Symbol> free_member;  // the rest of a key that is no declared name, then its value
    if (additional) {
        if (!key_char_) key_char_ = key_char_except({});
        Sequence tail{b_.repeat(*key_char_, 0, -1, "key-chars")};
        const Sequence v = value_after(*additional);
        tail.insert(tail.end(), v.begin(), v.end());
        free_member = b_.seq(std::move(tail), "key-tail");
    }
    std::vector<int32_t> rules(trie.size(), -1);
    for (size_t i = 0; i < trie.size(); ++i)
        if (trie[i].live) rules[i] = b_.rule("key-node");
    for (size_t i = 0; i < trie.size(); ++i) {
        const NameNode& node = trie[i];
        if (!node.live) continue;
        if (node.declared) {
            if (const auto it = allowed.find(node.name); it != allowed.end())
                b_.add_alternative(rules[i], value_after(it->second));
        } else if (additional) {
            b_.add_alternative(rules[i], value_after(*additional));
        }
        std::set<uint32_t> children;
        for (const auto& [cp, c] : node.next) {
            children.insert(cp);
            if (!trie[c].live) continue;
            if (const auto sp = spell(cp)) b_.add_alternative(rules[i], {*sp, Symbol::ref(rules[c])});
        }
        if (free_member) b_.add_alternative(rules[i], {key_char_except(children), *free_member});
    }
    if (!trie[0].live) return b_.alt({}, "no-member");
    return b_.seq({lit("\""), Symbol::ref(rules[0])}, "member");
}

Symbol Compiler::object(const json& s, const std::string& ptr) {
    if (s.contains("propertyNames") && s["propertyNames"] != true && s["propertyNames"] != json::object())
        fail(child(ptr, "propertyNames"), "propertyNames is not supported");
    std::set<std::string> required;
    std::vector<std::string> required_order;  // undeclared required properties come in this order
    if (s.contains("required")) {
        if (!s["required"].is_array()) fail(child(ptr, "required"), "required must be an array");
        for (const json& r : s["required"]) {
            if (!r.is_string()) fail(child(ptr, "required"), "required must list strings");
            if (required.insert(r.get<std::string>()).second) required_order.push_back(r.get<std::string>());
        }
    }
    const json additional =
        s.contains("additionalProperties") ? s["additionalProperties"] : json(options_.additional_properties_default);
    const bool any_additional = additional != false;
    std::vector<std::string> declared, names;  // declared: never additional keys; names: those that may be written
    std::vector<Symbol> values;
    if (s.contains("properties")) {
        if (!s["properties"].is_object()) fail(child(ptr, "properties"), "properties must be an object");
        for (const auto& [k, v] : s["properties"].items()) {
            declared.push_back(k);
            if ((v == false || no_enum_value(v)) && !required.count(k)) continue;  // may not appear at all
            names.push_back(k);
            values.push_back(schema(v, child(child(ptr, "properties"), k)));
        }
    }
    for (const std::string& r : required_order)
        if (std::find(declared.begin(), declared.end(), r) == declared.end()) {
            if (!any_additional)
                fail(child(ptr, "required"), fmt::format("required '{}' is neither declared nor allowed", r));
            declared.push_back(r);
            names.push_back(r);
            values.push_back(schema(additional, child(ptr, "additionalProperties")));
        }
    const size_t n = names.size();
    size_t n_required = 0;
    for (const std::string& nm : names) n_required += required.count(nm);
    bool nonempty = false;
    if (s.contains("minProperties")) {
        if (!s["minProperties"].is_number_unsigned()) fail(child(ptr, "minProperties"), "must be an integer");
        const uint64_t m = s["minProperties"].get<uint64_t>();
        if (m == 1 && n_required == 0) {
            nonempty = true;
        } else if (m > n_required) {
            fail(child(ptr, "minProperties"), "minProperties above the required count is not supported");
        }
    }
    if (s.contains("maxProperties")) {
        if (!s["maxProperties"].is_number_unsigned()) fail(child(ptr, "maxProperties"), "must be an integer");
        const uint64_t m = s["maxProperties"].get<uint64_t>();
        if (m < n_required) fail(child(ptr, "maxProperties"), "maxProperties below the required count allows nothing");
        const bool patterns = s.contains("patternProperties") && s["patternProperties"].is_object() &&
                              !s["patternProperties"].empty();
        if (any_additional || patterns || m < n)
            fail(child(ptr, "maxProperties"), "maxProperties below the possible property count is not supported");
    }
    const auto member = [&](const Symbol& key, const Symbol& value) {
        Sequence m{key};
        ws(m);
        m.push_back(lit(":"));
        ws(m);
        m.push_back(value);
        return b_.seq(std::move(m), "member");
    };
    const auto comma = [&](const Symbol& item) {
        Sequence c;
        ws(c);
        c.push_back(lit(","));
        ws(c);
        c.push_back(item);
        return c;
    };
    // The object: "{" ws "}" where it may be empty, and "{" ws `body` (a member and what follows it), then ws "}"
    // unless the body closes the object itself.
    const auto braces = [&](bool may_be_empty, const std::optional<Symbol>& body, bool body_closes) {
        std::vector<Sequence> alts;
        if (may_be_empty) {
            Sequence e{lit("{")};
            ws(e);
            e.push_back(lit("}"));
            alts.push_back(std::move(e));
        }
        if (body) {
            Sequence full{lit("{")};
            ws(full);
            full.push_back(*body);
            if (!body_closes) {
                ws(full);
                full.push_back(lit("}"));
            }
            alts.push_back(std::move(full));
        }
        if (alts.empty()) fail(ptr, "the object constraints allow nothing");
        return b_.alt(std::move(alts), "object");
    };
    const bool patterns = s.contains("patternProperties") && s["patternProperties"].is_object() &&
                          !s["patternProperties"].empty();
    std::map<std::string, Symbol> optional;
    std::vector<Symbol> req;
    for (size_t i = 0; i < n; ++i) {
        if (required.count(names[i])) {
            req.push_back(member(lit(json(names[i]).dump()), values[i]));
        } else {
            optional.emplace(names[i], values[i]);
        }
    }
    Sequence ws_colon;
    ws(ws_colon);
    ws_colon.push_back(lit(":"));
    ws(ws_colon);
    const size_t k = req.size();
    const std::optional<Symbol> additional_value =
        any_additional && !patterns
            ? std::optional<Symbol>(schema(additional, child(ptr, "additionalProperties")))
            : std::nullopt;
    if (k <= kMaxUnorderedRequired) {
        // Members in any order. One member rule per required property (its key, then its value) and one for
        // every other member (free: an optional or additional key, read by one trie over the declared names that
        // refuses the required ones; with patternProperties, an optional key or a pattern key), shared by all the
        // states; rest[m] is what follows a member once the required properties in bit set m are written: the end
        // when all are, another free member and rest[m], or a required member j not in m and rest[m | j].
        const std::vector<Symbol>& required_member = req;
        std::optional<Symbol> free_member;
        if (patterns) {  // the pattern keys instead of additional ones (a subset where those are allowed)
            std::vector<Sequence> free;
            if (!optional.empty()) free.push_back({member_trie(declared, optional, std::nullopt, ws_colon)});
            if (auto p = pattern_members(s, ptr, declared)) {
                free.push_back({member(p->first, p->second)});
            } else if (any_additional) {
                free.push_back({member(additional_key(declared),
                                       schema(additional, child(ptr, "additionalProperties")))});
            }
            if (!free.empty()) free_member = b_.alt(std::move(free), "member");
        } else if (!optional.empty() || additional_value) {
            free_member = member_trie(declared, optional, additional_value, ws_colon);
        }
        const size_t full = (size_t{1} << k) - 1;
        std::vector<Symbol> rest(full + 1);
        for (size_t m = 0; m <= full; ++m) rest[m] = Symbol::ref(b_.rule("rest"));
        // The members that may come next in state m, each followed by the rest of its state.
        const auto next = [&](size_t m) {
            std::vector<Sequence> alts;
            if (free_member) alts.push_back({*free_member, rest[m]});
            for (size_t j = 0; j < k; ++j)
                if (!(m >> j & 1)) alts.push_back({required_member[j], rest[m | size_t{1} << j]});
            return alts;
        };
        for (size_t m = 0; m <= full; ++m) {
            const int32_t r = rest[m].rule;
            if (m == full) {
                Sequence end;
                ws(end);
                end.push_back(lit("}"));
                b_.add_alternative(r, std::move(end));
            }
            for (Sequence& a : next(m)) {
                Sequence c = comma(a[0]);
                c.push_back(a[1]);
                b_.add_alternative(r, std::move(c));
            }
        }
        std::vector<Sequence> first = next(0);
        return braces(k == 0 && !nonempty,
                      first.empty() ? std::nullopt : std::optional<Symbol>(b_.alt(std::move(first), "members")), true);
    }
    if (!patterns) {
        // More than kMaxUnorderedRequired required properties: in order, each once; the optional ones anywhere
        // around them and additional properties after the last required one, in any order. Their keys are read by
        // one trie (member_trie), so a key's bytes keep one parser item alive however many properties are declared.
        std::optional<Symbol> optional_member, any_member;  // an optional member; one that may also be additional
        if (!optional.empty() && k > 0) optional_member = member_trie(declared, optional, std::nullopt, ws_colon);
        if (!optional.empty() || any_additional)
            any_member = member_trie(declared, optional, additional_value, ws_colon);
        const auto more = [&](const std::optional<Symbol>& m) {  // zero or more ", m"
            return m ? std::optional<Symbol>(b_.repeat(b_.seq(comma(*m)), 0, -1, "members")) : std::nullopt;
        };
        const std::optional<Symbol> more_optional = more(optional_member), more_any = more(any_member);
        // rest[j]: what follows once something is written and j required members are: optional members and the
        // next required one and rest[j + 1], or (j = k) any members and the end.
        std::vector<Symbol> rest(k + 1);
        for (size_t j = k + 1; j-- > 0;) {
            Sequence r;
            if (j < k) {
                if (more_optional) r.push_back(*more_optional);
                const Sequence c = comma(req[j]);
                r.insert(r.end(), c.begin(), c.end());
                r.push_back(rest[j + 1]);
            } else if (more_any) {
                r.push_back(*more_any);
            }
            rest[j] = r.empty() ? b_.alt({{}}, "end") : b_.seq(std::move(r), "rest");
        }
        std::vector<Sequence> first;  // the first member and what follows it
        if (k > 0) {
            if (optional_member) first.push_back({*optional_member, rest[0]});
            first.push_back({req[0], rest[1]});
        } else if (any_member) {
            first.push_back({*any_member, rest[0]});
        }
        return braces(k == 0 && !nonempty,
                      first.empty() ? std::nullopt : std::optional<Symbol>(b_.alt(std::move(first), "members")), false);
    }
    std::vector<Symbol> members;
    for (size_t i = 0; i < n; ++i) members.push_back(member(lit(json(names[i]).dump()), values[i]));
    std::optional<Symbol> extra;
    if (auto p = pattern_members(s, ptr, declared)) {
        extra = member(p->first, p->second);
    } else if (any_additional) {
        extra = member(additional_key(declared), schema(additional, child(ptr, "additionalProperties")));
    }
    // after[i]: the members from i on when one has been written (each after a comma); first[i]: the same when none
    // has been written and at least one must be (so "{" ws ws "}" cannot double the whitespace bound).
    std::vector<Symbol> after(n + 1);
    std::vector<std::optional<Symbol>> first(n + 1);
    after[n] = extra ? b_.repeat(b_.seq(comma(*extra)), 0, -1, "extra") : b_.alt({{}}, "end");
    if (extra) {
        Sequence f{*extra};
        f.push_back(after[n]);
        first[n] = b_.seq(f, "extra");
    }
    for (size_t i = n; i-- > 0;) {
        const bool req = required.count(names[i]) > 0;
        Sequence with = comma(members[i]);
        with.push_back(after[i + 1]);
        after[i] = req ? b_.seq(with, "props") : b_.alt({with, {after[i + 1]}}, "props");
        std::vector<Sequence> f{{members[i], after[i + 1]}};
        if (!req && first[i + 1]) f.push_back({*first[i + 1]});
        first[i] = b_.alt(std::move(f), "props");
    }
    return braces(n_required == 0 && !nonempty, first[0], false);
}

Symbol Compiler::array(const json& s, const std::string& ptr) {
    if (s.contains("contains")) fail(child(ptr, "contains"), "contains is not supported");
    if (s.contains("uniqueItems") && s["uniqueItems"] != false)
        fail(child(ptr, "uniqueItems"), "uniqueItems is not supported");
    // Drafts 4 to 2019-09 write prefixItems as an array-valued items, and the items after it as additionalItems
    // (which means nothing beside a schema-valued items).
    const bool tuple = s.contains("items") && s["items"].is_array();
    if (tuple && s.contains("prefixItems")) fail(child(ptr, "items"), "an array-valued items beside prefixItems");
    const char* prefix_key = tuple ? "items" : "prefixItems";
    std::vector<Symbol> prefix;
    if (s.contains(prefix_key)) {
        if (!s[prefix_key].is_array()) fail(child(ptr, prefix_key), "prefixItems must be an array");
        for (size_t i = 0; i < s[prefix_key].size(); ++i)
            prefix.push_back(schema(s[prefix_key][i], child(child(ptr, prefix_key), std::to_string(i))));
    }
    const char* items_key = tuple ? "additionalItems" : "items";
    const json items = s.contains(items_key) ? s[items_key] : json(true);
    const auto count = [&](const char* k, int64_t dflt) { return bound_keyword(s, k, dflt, ptr); };
    const auto k = static_cast<int64_t>(prefix.size());
    const int64_t min = count("minItems", 0);
    int64_t max = count("maxItems", -1);
    if (items == false) max = max < 0 ? k : std::min(max, k);
    if (max >= 0 && min > max) fail(ptr, "the array constraints allow nothing");
    std::optional<Symbol> item;
    if (items != false && (max < 0 || max > k)) item = schema(items, child(ptr, items_key));
    const auto comma = [&](const Symbol& x) {
        Sequence c;
        ws(c);
        c.push_back(lit(","));
        ws(c);
        c.push_back(x);
        return b_.seq(std::move(c), "next");
    };
    // rest(i): what follows once i >= 1 elements are written.
    std::function<Symbol(int64_t)> rest = [&](int64_t i) -> Symbol {
        if (i >= k) {
            if (!item) return b_.alt({{}}, "end");
            return b_.repeat(comma(*item), std::max<int64_t>(0, min - i), max < 0 ? -1 : max - i, "items");
        }
        std::vector<Sequence> alts;
        if (i >= min) alts.push_back({});
        if (max < 0 || i < max) alts.push_back({comma(prefix[static_cast<size_t>(i)]), rest(i + 1)});
        return b_.alt(std::move(alts), "items");
    };
    std::vector<Sequence> alts;
    if (min == 0) {
        Sequence e{lit("[")};
        ws(e);
        e.push_back(lit("]"));
        alts.push_back(std::move(e));
    }
    if (max != 0 && (k > 0 || item)) {
        Sequence full{lit("[")};
        ws(full);
        full.push_back(k > 0 ? prefix[0] : *item);
        full.push_back(rest(1));
        ws(full);
        full.push_back(lit("]"));
        alts.push_back(std::move(full));
    }
    if (alts.empty()) fail(ptr, "the array constraints allow nothing");
    return b_.alt(std::move(alts), "array");
}

json parse(std::string_view text) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw GrammarError(fmt::format("json schema: {}", e.what()));
    }
}

// One call's pieces in a format's syntax (docs/chat-formats.md):
//   GLM:  <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, a newline allowed after the
//         name and after each tag pair as the model writes them;
//   DSML: <｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n...
//         </｜DSML｜invoke>, as DeepSeek-V3.2's encoder writes them.
// A string argument is its raw text, the others JSON (json.dumps spacing fits the whitespace bound).
struct CallSyntax {
    ToolCallFormat format;

    Symbol open(Builder& b, const std::string& name) const {
        if (format == ToolCallFormat::kGlm)
            return b.seq({b.literal("<tool_call>"), b.literal(name), b.optional(b.literal("\n"), "nl")}, "open");
        return b.literal("<｜DSML｜invoke name=\"" + name + "\">\n");
    }
    Symbol close(Builder& b) const {
        return b.literal(format == ToolCallFormat::kGlm ? "</tool_call>" : "</｜DSML｜invoke>");
    }
    // One argument: key (a literal or any key), value, and whether the value is a string (DSML's attribute).
    Symbol arg(Builder& b, Symbol key, Symbol value, std::optional<bool> is_string) const {
        if (format == ToolCallFormat::kGlm) {
            const Symbol nl = b.optional(b.literal("\n"), "nl");
            return b.seq({b.literal("<arg_key>"), key, b.literal("</arg_key>"), nl, b.literal("<arg_value>"), value,
                          b.literal("</arg_value>"), nl},
                         "arg");
        }
        const Symbol attr = is_string ? b.literal(*is_string ? "true" : "false")
                                      : b.alt({{b.literal("true")}, {b.literal("false")}}, "string-attr");
        return b.seq({b.literal("<｜DSML｜parameter name=\""), key, b.literal("\" string=\""), attr, b.literal("\">"),
                      value, b.literal("</｜DSML｜parameter>\n")},
                     "arg");
    }
};

Symbol tool_call(Compiler& c, const json& tool, const std::string& ptr, bool any_arguments, const CallSyntax& syn) {
    Builder& b = c.builder();
    const json& fn = tool.at("function");
    const std::string name = fn.at("name").get<std::string>();
    if (any_arguments) {  // a tool that is not strict: any keys and values, none holding '<' (nor '"' in a DSML key)
        const Symbol raw = b.repeat(b.utf8_char_except(ByteSet::of('<')), 0, -1, "raw");
        ByteSet dsml_key = ByteSet::of('<');
        dsml_key.add('"');
        const Symbol key =
            syn.format == ToolCallFormat::kGlm ? raw : b.repeat(b.utf8_char_except(dsml_key), 0, -1, "key");
        return b.seq({syn.open(b, name), b.repeat(syn.arg(b, key, raw, std::nullopt), 0, -1, "args"), syn.close(b)},
                     "call");
    }
    json params = fn.contains("parameters") ? fn["parameters"] : json::object();
    if (!params.is_object()) fail(child(ptr, "parameters"), "parameters must be an object schema");
    if (params.contains("type") && params["type"] != "object")
        fail(child(ptr, "parameters"), "the parameters of a tool call must be an object");
    for (const auto& [k, v] : params.items()) {
        static const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties",
                                                     "title", "description", "$schema"};
        if (!kKnown.count(k))
            fail(child(child(ptr, "parameters"), k), fmt::format("'{}' is not supported in tool parameters", k));
    }
    std::set<std::string> required;
    if (params.contains("required"))
        for (const json& r : params["required"]) required.insert(r.get<std::string>());
    std::vector<std::pair<std::string, Symbol>> args;  // in the schema's order
    if (params.contains("properties")) {
        for (const auto& [k, v] : params["properties"].items()) {
            const std::string at = child(child(child(ptr, "parameters"), "properties"), k);
            Symbol value;
            const bool is_string = v.is_object() && v.contains("type") && v["type"] == "string";
            if (is_string) {
                for (const auto& [kk, vv] : v.items())
                    if (kk != "type" && kk != "enum" && kk != "description" && kk != "title")
                        fail(child(at, kk), fmt::format("'{}' on a string argument: GLM writes string arguments raw, "
                                                        "and only 'enum' constrains them", kk));
                if (v.contains("enum")) {
                    std::vector<Sequence> alts;
                    for (const json& e : v["enum"]) {
                        if (!e.is_string()) fail(child(at, "enum"), "a string argument's enum must list strings");
                        alts.push_back({b.literal(e.get<std::string>())});
                    }
                    value = b.alt(std::move(alts), "enum");
                } else {  // raw text up to </arg_value>: any characters but '<'
                    value = b.repeat(b.utf8_char_except(ByteSet::of('<')), 0, -1, "raw");
                }
            } else {
                value = c.schema(v, at);
            }
            args.push_back({k, syn.arg(b, b.literal(k), value, is_string)});
        }
    }
    for (const std::string& r : required)
        if (std::none_of(args.begin(), args.end(), [&](const auto& a) { return a.first == r; }))
            fail(child(ptr, "parameters"), fmt::format("required argument '{}' is not among the properties", r));
    // Arguments in the schema's order; an optional one may be left out.
    Sequence seq{syn.open(b, name)};
    for (const auto& [k, sym] : args) seq.push_back(required.count(k) ? sym : b.optional(sym, "opt-arg"));
    seq.push_back(syn.close(b));
    return b.seq(std::move(seq), "call");
}

}  // namespace

Grammar compile_glm_tool_calls(std::string_view tools_json, const ToolCallOptions& options) {
    ToolCallOptions glm = options;
    glm.format = ToolCallFormat::kGlm;
    return compile_tool_calls(tools_json, glm);
}

Grammar compile_tool_calls(std::string_view tools_json, const ToolCallOptions& options) {
    const CallSyntax syn{options.format};
    const json tools = parse(tools_json);
    if (!tools.is_array() || tools.empty()) throw GrammarError("tool calls: 'tools' must be a non-empty array");
    JsonSchemaOptions jo;
    jo.max_whitespace = options.max_whitespace;
    jo.additional_properties_default = false;  // arguments: exactly the declared ones
    Compiler c(json::object(), jo);
    Builder& b = c.builder();
    std::vector<Sequence> calls;
    for (size_t i = 0; i < tools.size(); ++i) {
        const json& t = tools[i];
        const std::string ptr = fmt::format("tools[{}]", i);
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
            !t["function"].contains("name") || !t["function"]["name"].is_string())
            throw GrammarError(fmt::format("tool calls: {} must be {{\"type\": \"function\", \"function\": "
                                           "{{\"name\", \"parameters\"}}}}", ptr));
        if (!options.only.empty() && t["function"]["name"] != options.only) continue;
        const bool strict = t["function"].value("strict", false) == true;
        calls.push_back({tool_call(c, t, ptr, options.text_first && !strict, syn)});
    }
    if (calls.empty()) throw GrammarError(fmt::format("tool calls: no tool is named '{}'", options.only));
    const Symbol call = b.alt(std::move(calls), "tool");
    // One call for a named function; one or more, a newline allowed between (GLM) or required (DSML), for `required`.
    const bool glm = options.format == ToolCallFormat::kGlm;
    const Symbol sep = glm ? b.optional(b.literal("\n"), "nl") : b.literal("\n");
    Symbol body =
        options.only.empty() && !options.single ? b.seq({call, b.repeat(b.seq({sep, call}), 0, -1, "more")}) : call;
    // DSML calls sit in one <｜DSML｜function_calls> block.
    const std::string_view block_open = glm ? "<tool_call>" : "<｜DSML｜function_calls>";
    if (!glm)
        body =
            b.seq({b.literal("<｜DSML｜function_calls>\n"), body, b.literal("\n</｜DSML｜function_calls>")}, "block");
    if (options.text_first && options.text) return c.finish(b.alt({{b.embed(*options.text)}, {body}}, "content-or-calls"));
    if (options.text_first) return c.finish(b.seq({b.text_without(block_open), b.optional(body, "calls")}));
    return c.finish(body);
}

Grammar compile_json_schema(std::string_view schema_json, const JsonSchemaOptions& options) {
    Compiler c(parse(schema_json), options);
    return c.finish(c.schema(c.root_schema(), ""));
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
    Compiler c(json::object(), options);
    return c.finish(c.any_object());
}

}  // namespace megactx::grammar
