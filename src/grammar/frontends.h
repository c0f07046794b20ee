// The languages users write constraints in, each compiled to a Grammar (grammar/grammar.h). Every function throws
// GrammarError naming what is wrong and where: a syntax error, an unsupported feature, a size limit. Nothing is
// silently ignored: a JSON Schema keyword that cannot be enforced is an error.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace megactx::grammar {

// GBNF, llama.cpp's grammar format: `name ::= alternatives`, "literals" with \n \t \\ \" \xHH \uHHHH \UHHHHHHHH
// escapes, [classes] and [^negated], `.`, ( groups ), * + ? {m} {m,} {m,n}, # comments; rules referenced before
// they are defined; the start rule is `root` unless named.
// \uHHHH and \UHHHHHHHH are code points (matched as their UTF-8 bytes); \xHH up to 7F is ASCII, and from 80 up one
// raw byte, as Grammar::to_gbnf() prints UTF-8 sequences, so parse_gbnf(g.to_gbnf()) has g's language. `.` and a
// negated class are any well-formed UTF-8 code point (newline included) but those listed. A rule goes on over
// newlines until the next `name ::=`. Errors give the line and column.
Grammar parse_gbnf(std::string_view text, std::string_view root = "root");

// A regular expression matched against the whole output (as vLLM's and SGLang's `regex`): literals, . (any code
// point but \n), classes with ranges and negation, \d \w \s \D \W \S, escapes, groups (capturing, (?:...)),
// alternation, * + ? {m} {m,} {m,n} (lazy forms accepted: for a recogniser they are the same language), ^ and $
// at the ends. Backreferences and lookaround are errors.
// Python's syntax with re.ASCII's class escapes (\d is [0-9], \w [A-Za-z0-9_], \s [ \t\n\r\f\v]); non-ASCII
// characters, written or as \xHH \uHHHH \UHHHHHHHH, are code points matched as their UTF-8 bytes. ^ (or \A) may
// only open and $ (or \Z) only close a branch of the whole pattern; anchors elsewhere, \b, flags such as (?i),
// possessive quantifiers and atomic groups are errors that name the feature and its offset. Two ECMAScript forms
// that JSON Schema patterns use are read too: \u{H...}, and '-' beside a class escape as a literal ([\w-.]).
Grammar compile_regex(std::string_view pattern);
// The same into a grammar under construction (JSON Schema's `pattern`); the result matches exactly the pattern's
// strings, unanchored patterns included as written (the caller decides how to wrap them).
Symbol add_regex(Builder& b, std::string_view pattern);

// One of the strings, exactly (vLLM's `choice`).
Grammar compile_choices(const std::vector<std::string>& choices);

struct JsonSchemaOptions {
    // Whitespace between tokens: at most this many bytes of [ \t\n] at each place JSON allows it inside the value
    // (bounded, so a model cannot run on in whitespace forever; none before or after the value); 0: the compact form
    // with no whitespace at all. 16 leaves room for a newline and the indentation of pretty-printed JSON 7 levels
    // deep (2 spaces a level), which models write when they were trained on it.
    int max_whitespace = 16;
    // `additionalProperties` when a schema does not say: false (OpenAI's strict mode) or true (the JSON Schema
    // default).
    bool additional_properties_default = true;
    // oneOf: only when its branches are provably disjoint (their types, enum/const values or a required property's
    // schemas tell them apart), so that "exactly one" holds; otherwise a GrammarError. false: oneOf is anyOf (as llama.cpp and
    // xgrammar take it), accepting a value that matches two branches.
    bool exact_one_of = true;
    // A schema without `type`: false (JSON Schema's rule): its keywords constrain only values of their own type and a
    // value of another type is valid as it is ({"properties": ...} also allows 3 and "x"); true: the type is taken
    // from the keywords present (properties → object, items → array, minLength → string, ...), as llama.cpp and
    // xgrammar do, a subset that refuses such valid values.
    bool infer_type = false;
};

// A JSON Schema (draft 2020-12, the subset issue 51 names) as text; `true`/`{}` is any JSON value. What is exact,
// what is a subset and what is an error: the comment at the top of grammar/json_schema.cpp.
Grammar compile_json_schema(std::string_view schema_json, const JsonSchemaOptions& options = {});
// The tool-call syntax a chat format uses: GLM's <tool_call> blocks or DeepSeek-V3.2's DSML.
enum class ToolCallFormat { kGlm, kDsml };

struct ToolCallOptions {
    ToolCallFormat format = ToolCallFormat::kGlm;
    std::string only;        // a named function (tool_choice {"function": {"name"}}); empty: any of the tools
    bool single = false;     // exactly one call (a named function, or OpenAI's parallel_tool_calls: false)
    // tool_choice auto with strict tools: free text (never "<tool_call>") then, optionally, the calls.
    bool text_first = false;
    // With text_first: instead of free text, content that follows this grammar (a response_format) — the output is
    // either that content or the calls.
    std::shared_ptr<const Grammar> text;
    int max_whitespace = 16;  // inside JSON argument values
};

// Tool calls in GLM's format for an OpenAI `tools` array (JSON text): one or more calls (`tool_choice: required`), or
// exactly one of the named function, or (text_first) any text then optionally the calls. A tool whose `strict` is
// false under text_first keeps any arguments (keys and values without '<'); the others follow their schemas. Arguments are the declared properties in the schema's order (required ones
// present, no others); a string argument is raw text without '<' (GLM writes strings unquoted up to </arg_value>),
// constrained only by `enum`; other arguments are JSON by their schema.
Grammar compile_glm_tool_calls(std::string_view tools_json, const ToolCallOptions& options = {});
// The same in the syntax options.format names. DSML: the calls in one `<｜DSML｜function_calls>\n … \n</｜DSML｜
// function_calls>` block, one call per line, each parameter `<｜DSML｜parameter name="K" string="true|false">V
// </｜DSML｜parameter>\n` (string="true" exactly for string-typed arguments), as DeepSeek-V3.2's encoder writes
// them; under text_first the text before the block never holds `<｜DSML｜function_calls>`.
Grammar compile_tool_calls(std::string_view tools_json, const ToolCallOptions& options = {});

// Any JSON object (`response_format: {"type": "json_object"}`).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace megactx::grammar
