// The JSON Schema front end, tested by matching: instances the schema accepts must match, instances it rejects (or
// the grammar deliberately leaves out, such as over-long whitespace) must not; unsupported keywords are errors.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/frontends.h"
#include "grammar/matcher.h"

namespace megactx::grammar {
namespace {

Grammar schema(std::string_view text, JsonSchemaOptions options = {}) { return compile_json_schema(text, options); }

// Two whitespace bytes at each place, so the tests can show the bound (the default is 16).
JsonSchemaOptions ws2() {
    JsonSchemaOptions o;
    o.max_whitespace = 2;
    return o;
}

// `s` as a JSON string literal (backslashes and quotes escaped).
std::string json_quote(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + '"';
}

void check(const Grammar& g, const std::vector<std::string_view>& accept, const std::vector<std::string_view>& reject) {
    for (std::string_view t : accept) EXPECT_TRUE(matches(g, t)) << "should accept: " << t;
    for (std::string_view t : reject) EXPECT_FALSE(matches(g, t)) << "should reject: " << t;
}

// `"name":1`, after a comma when `comma`.
std::string fmt_member(char name, bool comma) {
    std::string m = comma ? ",\"" : "\"";
    m += name;
    return m + "\":1";
}

// compile_json_schema throws a GrammarError whose message holds each of `needles`.
void expect_error(std::string_view text, const std::vector<std::string_view>& needles, JsonSchemaOptions o = {}) {
    try {
        compile_json_schema(text, o);
        ADD_FAILURE() << "no error for " << text;
    } catch (const GrammarError& e) {
        for (std::string_view n : needles)
            EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
    }
}

TEST(JsonSchema, TrueAndEmptyAllowAnyJson) {
    for (std::string_view s : {"true", "{}", R"({"title": "x", "description": "any"})"}) {
        const Grammar g = schema(s);
        check(g,
              {R"({"a":[1,2.5e3,-0.5E-2,"x\n\u00e9\/",null,true,false,{}]})", R"("s")", "-0", "0.25", "[]",
               "[ [ ] , { } ]", "\"\xC3\xA9\xE6\x97\xA5\""},
              {"01", "1.", ".5", "+1", R"("\u00g0")", "\"a\nb\"", R"("\x")", R"({"a":1,})", "[1 2]", "[,1]", "tru",
               R"({a:1})", " 1", "1 ", "\"\xC3\"", "nan"});
    }
    expect_error("false", {"false schema"});
}

// The any-value grammar against nlohmann's parser on random token strings: the same verdict on each (whitespace
// bounded loosely here, and none allowed around the value, which the parser would take).
TEST(JsonSchema, AnyValueAgreesWithAParser) {
    JsonSchemaOptions loose;
    loose.max_whitespace = 8;
    const Grammar g = schema("true", loose);
    const std::vector<std::string_view> tokens = {"{",  "}",    "[",   "]", ",", ":",  "\"a\"",
                                                  "\"", "\\n",  "1",   "0", "-", ".",  "e",
                                                  "E+", "true", "nul", "l", " ", "\t", "\"\\u00e9\""};
    std::mt19937 rng(51);
    int n_valid = 0;
    for (int trial = 0; trial < 20000; ++trial) {
        std::string text;
        const int n = 1 + static_cast<int>(rng() % 9);
        for (int i = 0; i < n; ++i) text += tokens[rng() % tokens.size()];
        const bool padded = text.front() == ' ' || text.front() == '\t' || text.back() == ' ' || text.back() == '\t';
        const bool valid = nlohmann::json::accept(text) && !padded;
        n_valid += valid;
        ASSERT_EQ(matches(g, text), valid) << text;
    }
    EXPECT_GT(n_valid, 500);
}

TEST(JsonSchema, WhitespaceIsBounded) {
    JsonSchemaOptions two;
    two.max_whitespace = 2;
    const Grammar g = schema(R"({"type": "object", "properties": {"a": {"type": "array"}}})", two);
    check(g, {R"({"a":[1,2]})", "{ \"a\" : [ 1 ,\t2 ] }", "{\n \"a\":[]}", "{  }", "{}"},
          {"{   \"a\":[]}", "{\"a\"   :[]}", "{\"a\":[1,   2]}", "{   }", "{\r\"a\":[]}", " {}"});
    JsonSchemaOptions none;
    none.max_whitespace = 0;
    check(schema("{}", none), {R"({"a":[1,{"b":null}]})"}, {R"({ "a":1})", R"({"a": 1})", "[1, 2]", "[ ]"});
    check(json_object_grammar(none), {"{}"}, {"{ }"});
}

// Whitespace at every place JSON allows it in a compact instance (next to a structural character outside a
// string): up to the bound accepted, one more byte rejected; never inside a token.
TEST(JsonSchema, WhitespaceAtEveryTokenBoundary) {
    const Grammar g = schema(R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}}, "meta": {"type": "object"}},
        "required": ["id", "tags"], "additionalProperties": false})", ws2());
    const std::string text = R"({"id":12,"tags":["a","b"],"meta":{"k":[true,null,-1.5],"":{}}})";
    ASSERT_TRUE(matches(g, text));
    bool in_string = false;
    int n_boundaries = 0;
    for (size_t i = 1; i < text.size(); ++i) {
        const char prev = text[i - 1], next = text[i];
        if (prev == '"' && (i < 2 || text[i - 2] != '\\')) in_string = !in_string;
        const auto structural = [](char c) { return std::string_view("{}[],:").find(c) != std::string_view::npos; };
        const bool boundary = !in_string && (structural(prev) || structural(next));
        n_boundaries += boundary;
        const std::string two = text.substr(0, i) + " \t" + text.substr(i);
        const std::string three = text.substr(0, i) + "\n  " + text.substr(i);
        EXPECT_EQ(matches(g, two), boundary) << two;
        EXPECT_FALSE(matches(g, three)) << three;
    }
    EXPECT_EQ(n_boundaries, 31);  // the gaps between its 32 tokens
}

TEST(JsonSchema, Types) {
    check(schema(R"({"type": "string"})"), {R"("")", R"("a\"b")"}, {"1", "null", "\"a"});
    check(schema(R"({"type": "integer"})"), {"0", "-12", "1234567890123456789012"}, {"1.0", "1e3", "01", "\"1\""});
    check(schema(R"({"type": "number"})"), {"0", "-1.5", "2e10", "3.0E+2", "1E-0"}, {"1e", "--1", "0x1", "00.1"});
    check(schema(R"({"type": "boolean"})"), {"true", "false"}, {"1", "null"});
    check(schema(R"({"type": "null"})"), {"null"}, {"false", "{}"});
    check(schema(R"({"type": ["string", "null"]})"), {"null", R"("x")"}, {"1", "[]"});
    check(schema(R"({"type": ["integer", "number"]})"), {"1", "1.5"}, {"\"1\""});
    expect_error(R"({"type": "float"})", {"unknown type", "#/type"});
}

// "-0" is JSON and, as a value, an integer, but not canonical integer text: an integer without bounds leaves it out
// as one with bounds does (xgrammar's integer rule, too), while a number keeps it (-0.5 starts with it).
TEST(JsonSchema, UnboundedIntegerIsCanonical) {
    const Grammar g = schema(R"({"type": "integer"})");
    check(g, {"0", "-1", "10", "-907"}, {"-0", "-00", "-01", "00"});
    check(schema(R"({"type": ["integer", "null"]})"), {"0", "-3", "null"}, {"-0"});
    check(schema(R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})"), {R"({"n":0})"},
          {R"({"n":-0})"});
    check(schema(R"({"type": "number"})"), {"-0", "-0.5", "-0e1"}, {"-00"});
}

// Integers under bounds: every value in a window checked against the bounds.
TEST(JsonSchema, IntegerBoundsAreExact) {
    struct Case {
        std::string_view schema;
        int64_t lo, hi;  // inclusive
    };
    for (const Case& c : std::vector<Case>{
             {R"({"type": "integer", "minimum": 1, "maximum": 100})", 1, 100},
             {R"({"type": "integer", "minimum": -37, "maximum": 1234})", -37, 1234},
             {R"({"type": "integer", "exclusiveMinimum": 0})", 1, INT64_MAX},
             {R"({"type": "integer", "maximum": -5})", INT64_MIN, -5},
             {R"({"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10})", -9, 9},
             {R"({"type": "integer", "minimum": 0.5, "maximum": 99.5})", 1, 99},
             {R"({"type": "integer", "minimum": 7})", 7, INT64_MAX},
             {R"({"type": "integer", "minimum": 190, "maximum": 2099})", 190, 2099},
         }) {
        SCOPED_TRACE(c.schema);
        const Grammar g = schema(c.schema);
        int wrong = 0;
        for (int64_t v = -1100; v <= 2200; ++v) wrong += matches(g, std::to_string(v)) != (v >= c.lo && v <= c.hi);
        EXPECT_EQ(wrong, 0);
        EXPECT_EQ(matches(g, "123456789012"), c.hi == INT64_MAX);
        EXPECT_EQ(matches(g, "-123456789012"), c.lo == INT64_MIN);
        EXPECT_FALSE(matches(g, "-0"));
        EXPECT_FALSE(matches(g, "007"));
    }
    const Grammar i32 = schema(R"({"type": "integer", "format": "int32", "minimum": -5})");
    check(i32, {"-5", "2147483647"}, {"-6", "2147483648"});
    const Grammar i64 = schema(R"({"type": "integer", "format": "int64"})");
    check(i64, {"9223372036854775807", "-9223372036854775808", "0"}, {"9223372036854775808", "-9223372036854775809"});
    expect_error(R"({"type": "integer", "format": "uint8"})", {"format", "#/format"});
    expect_error(R"({"type": "number", "format": "double"})", {"format", "#/format"});
    expect_error(R"({"type": "integer", "minimum": 5, "maximum": 4})", {"allow nothing"});
    expect_error(R"({"type": "integer", "multipleOf": 3})", {"multipleOf", "#/multipleOf"});
    check(schema(R"({"type": "integer", "multipleOf": 1, "minimum": 0})"), {"0", "5"}, {"-1"});
}

TEST(JsonSchema, NumberBoundsAreExact) {
    check(schema(R"({"type": "number", "minimum": 0, "maximum": 1})"),
          {"0", "0.0", "0.5", "0.999", "1", "1.0", "1.000"}, {"1.01", "-0.1", "2", "-0", "1e0", "01.5", "-1"});
    check(schema(R"({"type": "number", "exclusiveMinimum": 0})"), {"0.001", "3", "12.5", "100000"},
          {"0", "0.0", "0.000", "-1", "-0.5"});
    check(schema(R"({"type": "number", "minimum": -2, "exclusiveMaximum": 3})"),
          {"-2", "-2.0", "-1.5", "-0.25", "0", "2.999", "2"}, {"-2.01", "-3", "3", "3.0", "3.5"});
    check(schema(R"({"type": "number", "maximum": -1})"), {"-1", "-1.0", "-5.25", "-100"}, {"-0.5", "0", "1"});
    check(schema(R"({"minimum": 10})"), {"10", "10.5", "11", "\"x\""}, {"9.99"});  // no type: only numbers bounded
    expect_error(R"({"type": "number", "minimum": 0.5})", {"must be an integer", "#/minimum"});
    expect_error(R"({"type": "number", "multipleOf": 0.5})", {"multipleOf"});
    expect_error(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})", {"allow nothing"});
}

// A large maxLength is one counted rule, not a rule per count (Snowplow's maxLength 65535 used to make 65K rules
// a string), and its bounds stay exact: 65535 characters, escapes and multi-byte ones among them, but not 65536.
TEST(JsonSchema, LargeStringBoundsAreFewRules) {
    const Grammar g = schema(R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 65535},
        "b": {"type": "string", "minLength": 65535, "maxLength": 65535}, "c": {"type": "array",
        "items": {"type": "integer"}, "minItems": 2, "maxItems": 65535}}, "required": ["a"]})");
    EXPECT_LT(g.rules.size(), 200u);
    EXPECT_LT(g.n_symbols(), 1000);
    const auto str = [](size_t n) {  // n code points: ASCII, an escape, a two-byte character in turn
        std::string s = "\"";
        for (size_t i = 0; i < n; ++i) s += i % 3 == 0 ? "x" : i % 3 == 1 ? "\\n" : "\xC3\xA9";
        return s + "\"";
    };
    const auto obj = [](const std::string& key, const std::string& value) {  // with "a", which is required
        return (key == "a" ? "{" : "{\"a\": \"\", ") + ("\"" + key + "\": " + value + "}");
    };
    check(g, {obj("a", str(0)), obj("a", str(1)), obj("a", str(65535)), obj("b", str(65535))},
          {obj("a", str(65536)), obj("b", str(65534)), obj("b", str(65536))});
    const auto array = [](size_t n) {
        std::string s = "[";
        for (size_t i = 0; i < n; ++i) s += i ? ", 1" : "1";
        return s + "]";
    };
    check(g, {obj("c", array(2)), obj("c", array(65535))}, {obj("c", array(1)), obj("c", array(65536))});
}

TEST(JsonSchema, StringLengthsCountCodePoints) {
    check(schema(R"({"type": "string", "minLength": 2, "maxLength": 3})"),
          {R"("ab")", R"("a\n")", R"("abc")", R"("\u00e9\"x")", "\"\xC3\xA9\xE6\x97\xA5\xF0\x9F\x98\x80\""},
          {R"("a")", R"("abcd")", R"("\n")", R"("")", "\"\xC3\xA9\xE6\x97\xA5\xF0\x9F\x98\x80z\""});
    check(schema(R"({"type": "string", "maxLength": 0})"), {R"("")"}, {R"("a")"});
    // No surrogate escapes: a pair is one code point (written raw instead), a lone one none.
    check(schema(R"({"type": "string", "minLength": 2})"), {R"("\uD7FF\uE000")", "\"\xF0\x9F\x98\x80x\""},
          {R"("\ud83d\ude00")", R"("\uDC00x")", R"("\uD800x")"});
    expect_error(R"({"type": "string", "minLength": 3, "maxLength": 2})", {"allows nothing"});
    expect_error(R"({"type": "string", "minLength": 1000000000})", {"minLength", "#/minLength"});
    expect_error(R"({"type": "array", "maxItems": 18446744073709551615})", {"maxItems"});
    expect_error(R"({"type": "string", "minLength": 3, "format": "date"})", {"cannot be combined"});
}

TEST(JsonSchema, EnumAndConstAreCanonical) {
    const Grammar g = schema(R"({"enum": ["red", "green", 1, null, {"a": [1, 2]}, "q\"\u00e9"]})");
    check(g, {R"("red")", R"("green")", "1", "1.0", "null", R"({"a":[1,2]})", "\"q\\\"\xC3\xA9\""},
          {R"("blue")", R"({"a":[1,3]})", "1.00", R"("Red")", "\"q\\\"\\u00e9\""});
    check(schema(R"({"type": "string", "enum": ["a", 1]})"), {R"("a")"}, {"1"});
    check(schema(R"({"type": "integer", "enum": [1, 2.0, 2.5, "3"]})"), {"1", "2.0", "2", "1.0"}, {"2.5", "\"3\""});
    // numbers compare by value: an integral one is written as an integer or with ".0"
    check(schema(R"({"enum": [2.0, -7, 0.5, {"a": [3]}]})"), {"2", "2.0", "-7", "-7.0", "0.5", R"({"a":[3.0]})"},
          {"2.00", "0.50", "7", R"({"a":[3.5]})"});
    check(schema(R"({"const": {"k": true}})"), {R"({"k":true})"}, {R"({"k":false})", "{}"});
    check(schema(R"({"const": "x", "enum": ["x", "y"]})"), {R"("x")"}, {R"("y")"});
    expect_error(R"({"type": "string", "enum": [1]})", {"no value"});
    // An optional property whose enum has no value of its type can only be left out.
    check(schema(R"({"type": "object", "properties": {"a": {"type": "array", "enum": ["x"]}, "b": {"type": "integer"}},
        "additionalProperties": false})"),
          {"{}", R"({"b":1})"}, {R"({"a":"x"})", R"({"a":["x"]})"});
    expect_error(R"({"type": "object", "properties": {"a": {"type": "array", "const": "x"}}, "required": ["a"]})",
                 {"no value"});
}

// An object or array value is its tokens with the whitespace JSON allows between them, as Python's json.dumps
// writes it ({"a": [1, 2]}) or pretty-printed; never whitespace inside a token or around the whole value.
TEST(JsonSchema, EnumObjectsAndArraysTakeWhitespace) {
    const Grammar g = schema(R"({"enum": [{"a": [1, 2], "b": {}}, []]})");
    check(g, {R"({"a":[1,2],"b":{}})", R"({"a": [1, 2], "b": {}})", "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": { }\n}",
              "[]", "[ ]"},
          {R"({"a": [1, 2]})", R"({"a": [1, 2], "b": {}} )", R"( [])", R"({"b": {}, "a": [1, 2]})",
           R"({"a": [1, 2], "b": {"c": 1}})"});
    const JsonSchemaOptions compact{.max_whitespace = 0};
    check(schema(R"({"const": {"k": [true]}})", compact), {R"({"k":[true]})"}, {R"({"k": [true]})"});
    expect_error(R"({"enum": ["a", "bb"], "maxLength": 1})", {"maxLength", "beside enum"});
}

constexpr std::string_view kPerson = R"({
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "string"},
        "c": {"type": "boolean"}
    },
    "required": ["a"],
    "additionalProperties": false
})";

// Keywords beside a $ref apply too (2019-09 on, and without $schema); drafts 3 to 7 ignore them.
TEST(JsonSchema, RefSiblingsIgnoredBeforeDraft2019) {
    const std::string body = R"("type": "integer", "$ref": "#/definitions/n", "definitions": {"n": {"type": "number",
        "maximum": 5}}})";
    check(schema("{" + body), {"3", "-1"}, {"2.5", "6"});
    check(schema(R"({"$schema": "https://json-schema.org/draft/2020-12/schema", )" + body), {"3"}, {"2.5"});
    for (const char* draft : {"http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"}) {
        SCOPED_TRACE(draft);
        check(schema(std::string(R"({"$schema": ")") + draft + "\", " + body), {"3", "2.5"}, {"6", R"("3")"});
    }
    // oneOf's disjointness reads the $ref's target alone there: its type, not the ignored sibling's
    expect_error(R"({"$schema": "http://json-schema.org/draft-04/schema#", "oneOf": [{"type": "string",
        "$ref": "#/definitions/n"}, {"type": "number"}], "definitions": {"n": {"type": "number"}}})", {"oneOf"});
}

// A schema without `type`: each keyword constrains the values of its own type, and a value of another type is valid
// as it is (JSON Schema); with infer_type the keywords give the type, as llama.cpp and xgrammar take them.
TEST(JsonSchema, WithoutTypeKeywordsConstrainOnlyTheirOwnType) {
    const char* s = R"({"properties": {"a": {"type": "integer"}}, "required": ["a"], "maxItems": 1,
                        "minLength": 2})";
    check(schema(s), {R"({"a":1})", "[]", "[1]", R"("ab")", "3", "-2.5", "true", "null"},
          {"{}", R"({"a":"x"})", "[1,2]", R"("a")", "tru"});
    JsonSchemaOptions infer;
    infer.infer_type = true;
    check(schema(s, infer), {R"({"a":1})", "[]", "[1]", R"("ab")"}, {"3", "true", "null", "{}", "[1,2]", R"("a")"});
    check(schema(R"({"minimum": 1})", infer), {"1", "2.5"}, {"0", R"("x")", "null"});
    // a value of another type is any: an object or array of anything
    check(schema(R"({"items": {"type": "integer"}})"), {"[1,2]", R"({"x":[true,{"y":null}]})", R"("s")"},
          {R"(["a"])"});
}

// Required properties once each, optional ones (each with its own value schema) and additional ones, in any order (an
// optional or additional key is not checked for repeats, as JSON parsers keep the last).
TEST(JsonSchema, RequiredPropertiesOnceEachAllInAnyOrder) {
    check(schema(kPerson),
          {R"({"a":1})", R"({"a":1,"b":"x"})", R"({"a":1,"c":true})", R"({"a":1,"b":"x","c":false})",
           R"({ "a" : 1 , "c" : true })", R"({"b":"x","a":1})", R"({"c":true,"a":1,"b":"x"})",
           R"({"a":1,"b":"x","b":"y"})"},
          {"{}", R"({"b":"x"})", R"({"a":1,})", R"({"a":1,,"c":true})", R"({,"a":1})", R"({"a":1,"d":1})",
           R"({"a":"1"})", R"({"b":1,"a":1})", R"({"a":1,"a":2})", R"({"a":1 "b":"x"})"});
    const Grammar opt = schema(R"({"properties": {"b": {"type": "string"}, "c": {"type": "boolean"}},
                                   "additionalProperties": false})", ws2());
    check(opt, {"{}", "{ }", R"({"b":"x"})", R"({"c":true})", R"({"b":"x","c":true})", R"({"c":true,"b":"x"})"},
          {"{,}", R"({"b":"x",})", R"({,"c":true})", R"({"c":"x","b":"x"})", "{   }"});
    const Grammar last_required = schema(R"({"type": "object", "properties": {"x": {"type": "null"},
        "y": {"type": "null"}, "z": {"type": "null"}}, "required": ["z"], "additionalProperties": false})");
    check(last_required,
          {R"({"z":null})", R"({"x":null,"z":null})", R"({"x":null,"y":null,"z":null})",
           R"({"y":null,"x":null,"z":null})", R"({"z":null,"y":null})"},
          {R"({"x":null})", R"({,"z":null})", R"({"x":null,,"z":null})", R"({"z":null,"z":null})"});
    // Required properties that are not declared take the additional schema, in any order too.
    const Grammar undeclared = schema(R"({"type": "object", "properties": {"m": {"type": "null"}},
        "required": ["zeta", "alpha_b", "alpha"], "additionalProperties": {"type": "integer"}})");
    check(undeclared,
          {R"({"zeta":1,"alpha_b":2,"alpha":3})", R"({"m":null,"zeta":1,"alpha_b":2,"alpha":3,"k":4})",
           R"({"alpha":3,"k":4,"alpha_b":2,"m":null,"zeta":1})"},
          {R"({"zeta":1,"alpha_b":2})", R"({"zeta":1,"alpha_b":2,"alpha":"3"})", R"({"zeta":1,"alpha_b":2,"zeta":1})"});
    // More than kMaxUnorderedRequired (8) required properties: declared ones in the schema's order, then undeclared
    // ones in `required`'s order; optional ones anywhere, additional ones after the last required one.
    const Grammar nine = schema(R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}, "d": {}, "e": {},
        "f": {}, "g": {}, "h": {}, "o": {}}, "required": ["i", "h", "g", "f", "e", "d", "c", "b", "a"],
        "additionalProperties": true})");
    const std::string in_order = R"("a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1)";
    check(nine, {"{" + in_order + "}", R"({"o":1,)" + in_order + R"(,"x":1})"},
          {R"({"i":1,"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1})", R"({"x":1,)" + in_order + "}",
           R"({"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1})"});
}

// Every subset of four properties (two required), written in schema order and in the reverse order: accepted exactly
// when the required ones are there.
TEST(JsonSchema, EverySubsetOfOptionalProperties) {
    const Grammar g = schema(R"({"type": "object", "properties": {"w": {"type": "integer"}, "x": {"type": "integer"},
        "y": {"type": "integer"}, "z": {"type": "integer"}}, "required": ["x", "z"], "additionalProperties": false})");
    const std::string names = "wxyz";
    for (int mask = 0; mask < 16; ++mask) {
        std::string text = "{", reversed = "{";
        for (int i = 0; i < 4; ++i)
            if (mask & (1 << i)) text += fmt_member(names[static_cast<size_t>(i)], text.size() > 1);
        for (int i = 3; i >= 0; --i)
            if (mask & (1 << i)) reversed += fmt_member(names[static_cast<size_t>(i)], reversed.size() > 1);
        text += "}";
        reversed += "}";
        const bool has_required = (mask & 0b1010) == 0b1010;
        EXPECT_EQ(matches(g, text), has_required) << text;
        EXPECT_EQ(matches(g, reversed), has_required) << reversed;
    }
}

// Arrays of every length 0..7 against prefixItems, items and length bounds.
TEST(JsonSchema, EveryArrayLength) {
    const Grammar g = schema(R"({"prefixItems": [{"const": 0}, {"const": 1}], "items": {"type": "integer"},
                                 "minItems": 1, "maxItems": 5})");
    const Grammar closed = schema(R"({"prefixItems": [{"const": 0}, {"const": 1}, {"const": 2}], "items": false,
                                      "minItems": 2})");
    for (int n = 0; n <= 7; ++n) {
        std::string text = "[";
        for (int i = 0; i < n; ++i) {
            if (i > 0) text += ',';
            text += std::to_string(i);
        }
        text += "]";
        EXPECT_EQ(matches(g, text), n >= 1 && n <= 5) << text;
        EXPECT_EQ(matches(closed, text), n >= 2 && n <= 3) << text;
    }
}

TEST(JsonSchema, AdditionalPropertiesExcludeDeclaredKeys) {
    const Grammar open = schema(R"({"type": "object", "properties": {"name": {"type": "string"},
        "a/b": {"type": "string"}}, "required": ["name"], "additionalProperties": true})");
    check(open,
          {R"({"name":"x","age":3})", R"({"name":"x","nam":1,"names":{"y":[]}})", R"({"name":"x","":1})",
           R"({"name":"x","a/c":1,"a\/c":2,"b\n":3})", R"({"name":"x","a/b":"y","z":null})"},
          {R"({"name":1})", R"({"name":"x","name":1})", R"({"name":"x","n\u0061me":1})", R"({"name":"x","a/b":1})",
           R"({"name":"x","a\/b":1})", R"({"name":"x","age":3,})"});
    // optional and additional properties may come before the required ones
    check(open, {R"({"a\/b":"y","name":"x"})", R"({"a/b":"y","name":"x","age":3})", R"({"age":3,"name":"x"})"},
          {R"({"age":3})", R"({"age":3,"name":"x","name":"y"})"});
    check(schema(R"({"properties": {"k": {"type": "string"}}, "additionalProperties": {"type": "integer"}})"),
          {R"({"k":"v","x":1,"y":2})", R"({"x":1})", "{}"}, {R"({"x":"v"})", R"({"k":1})"});
    // The option decides when the schema does not say.
    constexpr std::string_view s = R"({"type": "object", "properties": {"name": {"type": "string"}}})";
    JsonSchemaOptions strict;
    strict.additional_properties_default = false;
    check(schema(s), {R"({"name":"x","z":1})"}, {});
    check(schema(s, strict), {R"({"name":"x"})"}, {R"({"name":"x","z":1})"});
    // A required name that is not declared takes the additional schema.
    check(schema(R"({"required": ["id"], "additionalProperties": {"type": "integer"}})"), {R"({"id":1,"x":2})"},
          {"{}", R"({"x":2})", R"({"id":"1"})"});
    expect_error(R"({"required": ["id"], "additionalProperties": false})", {"required 'id'"});
    // Non-ASCII declared names: the complement is over code points, not bytes.
    check(schema("{\"properties\": {\"\xC3\xA9\": {\"type\": \"string\"}, \"\xE6\x97\xA5\xE6\x9C\xAC\": "
                 "{\"type\": \"string\"}}}"),
          {"{\"\xC3\xA9\":\"x\"}", "{\"\xC3\xA8\":1}", "{\"\xE6\x97\xA5\":1}",
           "{\"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\":1}", "{\"\xC3\xA9\xC3\xA9\":1}"},
          {"{\"\xC3\xA9\":1}", "{\"\xE6\x97\xA5\xE6\x9C\xAC\":1}", "{\"\xC3\xA9\":\"x\",\"\xC3\xA9\":1}"});
    // A property whose schema is false may not appear, not even as an additional one.
    check(schema(R"({"properties": {"a": false, "b": {}}, "additionalProperties": true})"),
          {R"({"b":1})", R"({"c":1})", "{}"}, {R"({"a":1})", R"({"b":1,"a":1})"});
}

// A hundred optional properties beside additional ones: any order, each value its own schema, and a key of either
// kind read through one trie (at most a few parser items alive inside a key, where each declared property used to
// keep its own).
TEST(JsonSchema, ManyOptionalPropertiesInAnyOrder) {
    std::string props;
    for (int i = 0; i < 100; ++i)
        props += (i ? ", " : "") + fmt::format(R"("p{}": {{"type": "{}"}})", i, i % 2 ? "integer" : "string");
    const Grammar g = schema(R"({"type": "object", "properties": {)" + props + "}}");
    check(g, {R"({"p99":1,"p0":"x","p42":"y","other":[1]})", R"({"p1":1,"p10":"x","p1x":null})", "{}"},
          {R"({"p99":"x"})", R"({"p0":1})", R"({"p1":1,"p10":1})"});
    check(schema(R"({"properties": {"a": {}, "b": {"type": "integer"}}, "additionalProperties": true})"),
          {R"({"a":"x","b":1})", R"({"b":2,"z":3,"a":[]})"}, {R"({"b":"x"})", R"({"z":1,"b":null})"});
    check(schema(R"({"properties": {"a": {}, "b": {}}, "additionalProperties": {"type": "integer"}})"),
          {R"({"a":"x","b":"y","c":3})", R"({"c":3,"b":"y","a":"x"})"}, {R"({"c":"z"})"});
}

TEST(JsonSchema, PropertyCounts) {
    check(schema(R"({"properties": {"b": {"type": "string"}}, "minProperties": 1})"), {R"({"b":"x"})", R"({"q":1})"},
          {"{}"});
    check(schema(R"({"properties": {"b": {}}, "required": ["b"], "minProperties": 1, "maxProperties": 1,
                     "additionalProperties": false})"),
          {R"({"b":1})"}, {"{}"});
    expect_error(R"({"properties": {"b": {}}, "minProperties": 2})", {"minProperties", "#/minProperties"});
    expect_error(R"({"type": "object", "maxProperties": 3})", {"maxProperties"});
    // Where other keys are allowed too, the grammar writes only the pattern's (a subset).
    check(schema(R"({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}})"), {R"({"x-a":1})", "{}"},
          {R"({"x-a":"1"})", R"({"y":1})"});
    // patternProperties: with no other keys allowed, one value schema, and declared names outside the patterns.
    const Grammar map = schema(R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
        "patternProperties": {"^[A-Z]{2}$": {"type": "string"}, "^x-": {"type": "string"}},
        "additionalProperties": false})");
    check(map, {R"({"id":1})", R"({"id":1,"EN":"a","FR":"b"})", R"({"id":1,"x-tag":"t"})", R"({"EN":"a","id":1})"},
          {R"({"id":1,"ENG":"a"})", R"({"id":1,"EN":1})", R"({"EN":"a"})", R"({"id":1,"en":"a"})",
           R"({"id":1,"EN":"a","id":2})"});
    // declared properties in any order beside the pattern keys
    check(schema(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["b"], "patternProperties": {"^x-": {"type": "string"}}})"),
          {R"({"b":1,"a":2})", R"({"x-1":"s","a":2,"b":1})", R"({"a":2,"x-1":"s","b":1})"},
          {R"({"a":2})", R"({"b":1,"c":2})", R"({"b":1,"x-1":2})"});
    expect_error(R"({"properties": {"ab": {}}, "patternProperties": {"^a": {}}, "additionalProperties": false})",
                 {"'ab'", "#/patternProperties/^a"});
    expect_error(R"({"patternProperties": {"^a": {"type": "string"}, "^b": {}}, "additionalProperties": false})",
                 {"different schemas"});
    expect_error(R"({"patternProperties": {"^a": {}}, "additionalProperties": false, "maxProperties": 2})",
                 {"maxProperties"});
    expect_error(R"({"propertyNames": {"maxLength": 3}})", {"propertyNames"});
}

TEST(JsonSchema, Arrays) {
    check(schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})"),
          {"[1]", "[1,2,3]", "[ 1 , 2 ]"}, {"[]", "[1,2,3,4]", "[1,]", "[,1]", R"(["a"])", "[1 2]"});
    const Grammar tuple = schema(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})");
    check(tuple, {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", "[1]", R"(["a","b"])"});
    check(schema(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"},
                     "minItems": 3})"),
          {R"(["a",1,true])", R"(["a",1,true,false])"}, {R"(["a",1])", R"(["a",1,2])", "[]"});
    check(schema(R"({"prefixItems": [{"const": 1}], "minItems": 2, "maxItems": 2})"), {"[1,\"x\"]", "[1,[2]]"},
          {"[1]", "[2,2]", "[1,2,3]"});
    check(schema(R"({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}})"),
          {"[[1,2],[],[3]]", "[]"}, {"[[1],[\"a\"]]", "[1]"});
    check(schema(R"({"type": "array", "uniqueItems": false, "maxItems": 0})"), {"[]"}, {"[1]"});
    expect_error(R"({"type": "array", "uniqueItems": true})", {"uniqueItems", "#/uniqueItems"});
    expect_error(R"({"type": "array", "contains": {"type": "integer"}})", {"contains"});
    expect_error(R"({"type": "array", "minItems": 3, "maxItems": 2})", {"allow nothing"});
    // Draft 4's tuples: an array-valued items, then additionalItems (any value when absent).
    check(schema(R"({"items": [{"type": "string"}, {"type": "integer"}], "additionalItems": false})"),
          {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", "[1]"});
    check(schema(R"({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "null"}})"),
          {R"(["a",null,null])"}, {R"(["a",1])"});
    check(schema(R"({"type": "array", "items": [{"type": "string"}]})"), {R"(["a",1,{}])"}, {"[1]"});
    check(schema(R"({"type": "array", "items": {"type": "integer"}, "additionalItems": false})"), {"[1,2]"}, {"[\"a\"]"});
    expect_error(R"({"prefixItems": [{}], "items": [{}]})", {"prefixItems", "#/items"});
}

TEST(JsonSchema, RefsRecurse) {
    const Grammar list = schema(R"({
        "$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
            "required": ["value", "next"], "additionalProperties": false}},
        "$ref": "#/$defs/node"})");
    check(list, {R"({"value":1,"next":null})", R"({"value":1,"next":{"value":2,"next":{"value":3,"next":null}}})"},
          {R"({"value":1})", R"({"value":1,"next":{"value":2}})", R"({"value":1,"next":{"value":"2","next":null}})"});
    const Grammar tree = schema(R"({"type": "object", "properties": {"name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["name"], "additionalProperties": false})");
    check(tree, {R"({"name":"r","children":[{"name":"a"},{"name":"b","children":[{"name":"c","children":[]}]}]})"},
          {R"({"name":"r","children":[{"children":[]}]})", R"({"name":"r","children":[1]})"});
    check(schema(R"({"definitions": {"id": {"type": "integer", "minimum": 0}},
                     "properties": {"id": {"$ref": "#/definitions/id"}}, "additionalProperties": false})"),
          {R"({"id":5})", "{}"}, {R"({"id":-5})"});
    // Keywords beside $ref restrict the target.
    check(schema(R"({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "maximum": 3})"), {"3", "-1"}, {"4"});
    expect_error(R"({"$ref": "#/$defs/missing"})", {"names nothing"});
    expect_error(R"({"$ref": "https://example.com/s.json"})", {"within the document"});
}

TEST(JsonSchema, PatternsAreUnanchoredAndNeedNoEscapes) {
    const auto pat = [](std::string_view p) {
        return schema(std::string(R"({"type": "string", "pattern": )") + json_quote(p) + "}");
    };
    check(pat("^[a-z]+$"), {R"("abc")"}, {R"("")", R"("aBc")", R"("abc1")", R"(" abc")"});
    check(pat("\\d{3}"), {R"("123")", R"("x123y")", R"("a\n1234")"}, {R"("12a")", R"("")", R"(123)"});
    check(pat("^ab"), {R"("ab")", R"("abzz\"")"}, {R"("zab")", R"("a")"});
    check(pat("c$"), {R"("abc")", R"("\u00e9c")"}, {R"("cab")"});
    check(pat("\\Ax\\Z"), {R"("x")"}, {R"("xx")"});
    check(pat("(cat|dog)s?"), {R"("hotdogs")", R"("cat")"}, {R"("cow")"});
    // The pattern matches characters; those JSON must escape are written as their escapes (MaskBench's "\{.*\}"
    // holding a quoted JSON text), the others as they are.
    check(pat("^.+$"), {R"("a b")", "\"\xC3\xA9\"", R"("a\"b")", R"("{\"k\": 1}")", R"("\t\\")"},
          {R"("a\nb")", R"("")", R"("a"b")"});
    check(pat("x"), {R"("\"x\\")"}, {R"("\u0078")"});
    check(pat("^\"$"), {R"("\"")"}, {R"(""")", R"("\u0022")"});
    check(pat("^[\\x00-\\x1f]$"), {R"("\u0001")", R"("\u001f")", R"("\u001F")", R"("\n")", R"("\b")"},
          {R"("\u0020")", R"("\u000a")", "\"\x01\""});
    // Top-level alternatives, each with its own anchors.
    check(pat("^ab|cd$|ef"), {R"("abz")", R"("zcd")", R"("zefz")"}, {R"("zab")", R"("cdz")", R"("e f")"});
    expect_error(R"j({"type": "string", "pattern": "a(?=b)"})j", {"pattern", "#/pattern"});
    expect_error(R"({"type": "string", "pattern": "a", "maxLength": 3})", {"cannot be combined"});
}

TEST(JsonSchema, AnyOfOneOfAllOf) {
    check(schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})"), {"1", R"("ab")"},
          {R"("abc")", "true"});
    check(schema(R"({"oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "integer"}}]})"),
          {"null", "[1,2]"}, {"[\"a\"]", "1"});
    // Keywords beside anyOf apply to every branch.
    check(schema(R"({"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": false,
                     "anyOf": [{"required": ["x"]}, {"properties": {"x": {"minimum": 5}}}]})"),
          {R"({"x":1})", "{}", R"({"x":7})"}, {R"({"y":1})", R"({"x":"1"})"});
    check(schema(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})"),
          {R"({"a":1,"b":"x"})", R"({"a":1,"b":"x","c":null})"}, {R"({"a":1})", R"({"b":"x"})", R"({"a":1,"b":2})"});
    check(schema(R"({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 10}, {"type": "number"}]})"),
          {"0", "10", "5"}, {"-1", "11", "5.5"});
    check(schema(R"({"allOf": [{"enum": [1, 2, 3]}, {"enum": [2, 3, 4]}]})"), {"2", "3"}, {"1", "4"});
    // allOf through a recursive reference.
    check(schema(R"({"type": "object", "properties": {"v": {"type": "integer"},
                     "next": {"allOf": [{"$ref": "#"}, {"required": ["v"]}]}}, "additionalProperties": false})"),
          {R"({"v":1,"next":{"v":2,"next":{"v":3}}})", "{}"},
          {R"({"v":1,"next":{}})", R"({"next":{"v":1,"next":{}}})"});
    check(schema(R"({"type": "integer", "anyOf": [false, {"maximum": 2}]})"), {"2"}, {"3"});
    expect_error(R"({"oneOf": [false]})", {"every oneOf branch is false"});
    // oneOf compiles only when no value can match two branches: by type, by enum/const values, by a required
    // property with const values (a discriminator); otherwise it cannot hold "exactly one" and is an error.
    check(schema(R"({"oneOf": [{"type": "integer"}, {"type": "string"}, {"enum": [true]}]})"), {"1", R"("a")", "true"},
          {"false", "1.5"});
    check(schema(R"({"oneOf": [{"enum": [1, 2]}, {"const": 3}]})"), {"1", "3"}, {"4"});
    check(schema(R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                                "required": ["k"]},
                               {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]})"),
          {R"({"k":"a","x":1})", R"({"k":"b"})"}, {R"({"k":"c"})", "{}"});
    expect_error(R"({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}]})", {"oneOf"});
    expect_error(R"({"oneOf": [{"enum": [1, 2]}, {"const": 2}]})", {"oneOf"});
    expect_error(R"({"oneOf": [{}, {"type": "null"}]})", {"oneOf"});
    {  // exact_one_of false: oneOf as anyOf, a value matching both branches accepted
        JsonSchemaOptions o;
        o.exact_one_of = false;
        check(schema(R"({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}]})", o),
              {R"("a")", R"("ab")", R"("abcd")"}, {"1"});
    }
    // oneOf: only branches that no instance can match both, else an instance matching two would be accepted.
    expect_error(R"({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})", {"oneOf", "#/oneOf"});
    expect_error(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", {"oneOf"});
    const Grammar tagged = schema(R"({"oneOf": [{"$ref": "#/$defs/a"}, {"type": "object", "properties":
        {"kind": {"enum": ["b", "c"]}, "x": {"type": "integer"}}, "required": ["kind", "x"]}, {"type": "string"}],
        "$defs": {"a": {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]}}})");
    check(tagged, {R"({"kind":"a"})", R"({"kind":"c","x":1})", R"("s")"}, {R"({"kind":"b"})", R"({"kind":"d","x":1})"});
    check(schema(R"({"oneOf": [{"enum": [1, 2]}, {"const": 3}, {"allOf": [{"type": "boolean"}]}]})"), {"1", "3", "true"},
          {"4"});
    // Told apart by a property one branch requires and the other forbids (additionalProperties false) or types
    // differently when present.
    check(schema(R"({"type": "object", "oneOf": [
        {"properties": {"graph": {"type": "string"}}, "required": ["graph"], "additionalProperties": false},
        {"properties": {"graphs": {"type": "array"}}, "additionalProperties": false},
        {"properties": {"n": {"type": "integer"}, "graph": {"type": "null"}}, "required": ["n"]}]})"),
          {R"({"graph":"g"})", R"({"graphs":[]})", "{}", R"({"n":1,"graph":null})"}, {R"({"graph":1})"});
    expect_error(R"({"type": "object", "oneOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
        {"properties": {"b": {}}}]})", {"oneOf"});
    expect_error(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", {"disjoint types"});
    expect_error(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                               {"properties": {"b": {}}}]})",
                 {"additionalProperties"});
    expect_error(R"({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})", {"pattern"});
    check(schema(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                                {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}]})"),
          {R"({"a":1})", "{}"}, {R"({"a":"1"})", R"({"a":1,"b":"x"})"});
}

TEST(JsonSchema, Formats) {
    const auto f = [](std::string_view name) {
        return schema(std::string(R"({"type": "string", "format": ")") + std::string(name) + "\"}");
    };
    check(f("date"), {R"("2024-02-29")", R"("2000-02-29")", R"("2023-12-31")", R"("2023-04-30")"},
          {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-13-01")", R"("2023-00-10")",
           R"("2023-1-1")", R"("2023-01-00")"});
    check(f("time"), {R"("10:30:00Z")", R"("23:59:59.5+05:30")"}, {R"("24:00:00Z")", R"("10:60:00Z")", R"("10:30Z")"});
    check(f("date-time"), {R"("2024-01-15T10:30:00Z")", R"("2024-01-15T10:30:00.123-08:00")"},
          {R"("2024-01-15 10:30:00Z")", R"("2024-01-15T10:30:00")", R"("2024-01-15")"});
    check(f("uuid"), {R"("123e4567-e89b-12d3-a456-426614174000")"},
          {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
    check(f("email"), {R"("a.b@example.com")", R"("x+y@mail.example.org")"},
          {R"("a@b")", R"("@x.com")", R"("a..b@x.com")", R"("a b@x.com")"});
    check(f("ipv4"), {R"("192.168.0.255")", R"("0.0.0.0")"}, {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.2.3")"});
    check(f("ipv6"),
          {R"("::1")", R"("::")", R"("2001:db8::8a2e:370:7334")", R"("::ffff:192.0.2.1")", R"("1:2:3:4:5:6:7:8")",
           R"("fe80::")"},
          {R"("1:2:3:4:5:6:7:8:9")", R"(":::")", R"("1::2::3")", R"("12345::")", R"("1:2:3:4:5:6:7")"});
    check(f("hostname"), {R"("example.com")", R"("a-b.c")", R"("localhost")"},
          {R"("-a.com")", R"("a-.com")", R"("a..b")", R"("a_b.com")"});
    check(f("uri"),
          {R"("https://example.com/a/b?x=1&y=2#frag")", R"("http://localhost:8080")", R"("urn:isbn:0451450523")",
           R"("mailto:a@b.org")", R"("ecdsa-koblitz-pubkey:14RZvYazz9H2")", R"("file:///etc/hosts")", R"("x:/a/b")"},
          {R"("example.com")", R"("https://exa mple.com")", R"("1http://x.com")", R"(":x")", R"("x:a b")",
           R"("https://a.com:123456")"});
    expect_error(R"({"type": "string", "format": "color"})", {"unsupported format 'color'", "#/format"});
}

TEST(JsonSchema, ErrorsNameKeywordAndPointer) {
    expect_error(R"({"items": {"not": {"enum": [1]}}})", {"'not'", "#/items/not"});
    expect_error(R"({"items": {"not": {}}})", {"#/items"});
    expect_error(R"({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}})", {"'if'"});
    expect_error(R"({"type": "object", "properties": {"a": {"dependentRequired": {}}}})", {"dependentRequired"});
    expect_error(R"({"type": "object",)", {"parse error"});
    expect_error(R"({"properties": {"a": false}, "required": ["a"]})", {"false schema", "#/properties/a"});
    expect_error("[1]", {"must be an object or a boolean"});
    expect_error(R"({"$defs": {"x": {"$id": "x.json", "items": {"$ref": "#/$defs/y"}}, "y": {}}, "$ref": "#/$defs/x"})",
                 {"$id", "#/$defs/x/$id"});
    expect_error(R"({"properties": {"a": {"id": "a.json", "properties": {"b": {"$ref": "#"}}}}})", {"id below"});
    check(schema(R"({"$id": "https://example.com/tree", "type": "object", "properties": {"kids": {"type": "array",
        "items": {"$ref": "#", "minProperties": 1}}}, "additionalProperties": false})"),
          {R"({"kids":[{"kids":[]}]})", "{}"}, {R"({"kids":[{}]})"});
}

// `not` where it has an exact positive form.
TEST(JsonSchema, NotInItsPositiveForms) {
    check(schema(R"({"not": {"type": ["string", "number"]}})"), {"null", "true", "{}", "[]"}, {R"("a")", "1", "1.5"});
    check(schema(R"({"type": ["integer", "string"], "not": {"type": "string"}})"), {"1"}, {R"("a")", "1.5"});
    check(schema(R"({"not": {"not": {"type": "integer", "minimum": 2}}})"), {"2", "7"}, {"1", R"("a")"});
    check(schema(R"({"type": "integer", "not": false})"), {"1"}, {R"("a")"});
    check(schema(R"({"properties": {"a": {}, "b": {}}, "not": {"required": ["a"]}})"), {"{}", R"({"b":1})"},
          {R"({"a":1})", R"({"b":1,"a":2})", "1"});
    expect_error(R"({"not": {"type": "integer"}})", {"integer", "#/not"});
    expect_error(R"({"not": {"required": ["a", "b"]}})", {"'not'"});
}

// JSON Schema: an unknown keyword is an annotation. An $id (draft 4: id) that no $ref resolves against changes
// nothing.
TEST(JsonSchema, UnknownKeywordsAreAnnotations) {
    check(schema(R"({"type": "object", "properties": {"a": {"type": "string", "foo": 1, "x-order": 2}},
        "_format": "x", "additionalProperties": false})"),
          {R"({"a":"x"})", "{}"}, {R"({"a":1})", R"({"b":1})"});
    check(schema(R"({"id": "http://x/root.json", "type": "object", "properties": {"a": {"id": "#a", "type": "integer"},
        "b": {"$id": "b.json", "type": "boolean"}}, "additionalProperties": false})"),
          {R"({"a":1,"b":true})"}, {R"({"a":true})"});
}

TEST(JsonSchema, JsonObjectGrammar) {
    check(json_object_grammar(), {"{}", R"({"a":[1,{"b":null}],"c":"d"})", "{ \"a\" : 1 }"},
          {"[]", "1", R"("x")", "{", R"({"a"})", "{\"a\":1}x"});
}

TEST(JsonSchema, ToolCallArguments) {
    const Grammar g = schema(R"({
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "City and country"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}
        },
        "required": ["location"],
        "additionalProperties": false
    })");
    check(g,
          {R"({"location":"Paris, France"})", R"({"location":"Oslo","unit":"celsius","days":7})",
           R"({"location":"Oslo","days":14})"},
          {R"({"location":"Oslo","unit":"kelvin"})", R"({"location":"Oslo","days":15})",
           R"({"location":"Oslo","days":0})", R"({"unit":"celsius"})", R"({"location":"Oslo","extra":1})"});
}

TEST(JsonSchema, OpenAiStrictSchema) {
    JsonSchemaOptions strict;
    strict.additional_properties_default = false;
    const Grammar g = schema(R"({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "status": {"type": "string", "enum": ["active", "inactive"]},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "zip": {"type": ["string", "null"]}},
                "required": ["street", "zip"],
                "additionalProperties": false
            },
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
            "score": {"anyOf": [{"type": "number"}, {"type": "null"}]}
        },
        "required": ["name", "status", "address", "tags", "score"],
        "additionalProperties": false,
        "$defs": {"tag": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}}
    })",
                             strict);
    check(
        g,
        {R"({"name":"A","status":"active","address":{"street":"Main 1","zip":null},"tags":[],"score":null})",
         R"({"name":"A","status":"inactive","address":{"street":"S","zip":"0150"},"tags":[{"label":"x"},{"label":"y"}],"score":4.5})"},
        {R"({"name":"A","status":"active","address":{"street":"S","zip":null},"tags":[]})",
         R"({"name":"A","status":"paused","address":{"street":"S","zip":null},"tags":[],"score":1})",
         R"({"name":"A","status":"active","address":{"street":"S"},"tags":[],"score":1})",
         R"({"name":"A","status":"active","address":{"street":"S","zip":null},"tags":[{"label":"x","c":1}],"score":1})"});
}

}  // namespace
}  // namespace megactx::grammar
