// Structured outputs as clients ask for them (issue 51): OpenAI's `response_format` (json_object, json_schema with
// `strict`), vLLM's `structured_outputs` {json, regex, choice, grammar} and its older guided_json / guided_regex /
// guided_choice / guided_grammar, SGLang's `regex` / `ebnf` / `json_schema`, llama.cpp's `grammar` / `json_schema`.
// The request names at most one; it is found and checked here, compiled by the grammar engine (src/grammar) on the
// HTTP thread that parsed the request — never on the engine's step loop — and cached by its normalised text.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/constraint.h"
#include "tokenizer/chat_json.h"

namespace megactx {

class Tokenizer;

struct ConstraintSpec {
    enum class Kind { kNone, kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kToolCalls };
    Kind kind = Kind::kNone;
    std::string source;  // JSON Schema text (compact), the regex, the GBNF text or the tools array (tool calls)
    std::vector<std::string> choices;
    bool strict = false;  // JSON Schema: no undeclared properties unless the schema allows them (OpenAI strict)
    std::string param;    // the request field it came from, which errors name
    std::string tool_name;  // tool calls: the one function tool_choice names (empty: `required`, any of the tools)
    bool single_call = false;  // tool calls: parallel_tool_calls false
    bool text_first = false;   // tool calls: tool_choice auto with strict tools (text, then optionally calls)
    bool dsml = false;         // tool calls in DeepSeek-V3.2's DSML syntax (else GLM's <tool_call>)
    // Tool calls with text_first and a response_format too: an answer without calls follows this constraint instead
    // of being free text (null: free text).
    std::shared_ptr<const ConstraintSpec> content;
};

// The constraint `body` asks for (kind kNone: none). ApiError 400 for a malformed one or for two at once.
ConstraintSpec find_constraint(const chat::Json& body);

// Compiles constraints into grammars for one model's vocabulary; thread-safe. The vocabulary's byte trie is built
// on first use (once per server).
class ConstraintCompiler {
  public:
    // stop_ids: the tokens that end the output (the model's end-of-sequence ids).
    ConstraintCompiler(const Tokenizer& tokenizer, std::vector<int32_t> stop_ids, size_t cache_entries = 256);

    // The constraint for `spec`, starting after token `start_after` (-1: at the first token). ApiError 400 naming
    // spec.param when the grammar does not compile (a syntax error, an unsupported keyword, too large).
    std::shared_ptr<const OutputConstraint> compile(const ConstraintSpec& spec, int32_t start_after);
    int64_t cache_hits() const;

  private:
    const Tokenizer& tokenizer_;
    std::vector<int32_t> stop_ids_;
    size_t cache_entries_;
    std::once_flag vocab_once_;
    std::shared_ptr<const grammar::TokenVocab> vocab_;
    mutable std::mutex mu_;
    std::list<std::string> lru_;  // cache keys, most recently used first
    // A compiled grammar with its masks by state, shared by every request asking for the same constraint.
    struct Entry {
        std::shared_ptr<const grammar::Grammar> grammar;
        std::shared_ptr<grammar::MaskCache> masks;
    };
    std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> cache_;
    int64_t hits_ = 0;
};

}  // namespace megactx
