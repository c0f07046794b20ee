// Output parsers: generated text → `reasoning_content`, `content` and OpenAI `tool_calls`.
//   - reasoning: `<think>…</think>` (GLM and DeepSeek); the initial state is a parameter because a GLM prompt
//     with thinking on already opened `<think>`.
//   - GLM tool calls: `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>` → {id, name,
//     arguments: JSON text}, values typed by the tool schema / JSON-ness (vLLM glm47 convention).
//   - DeepSeek-V3.2 tool calls: `<｜DSML｜function_calls>` blocks of `<｜DSML｜invoke name="…">` with typed
//     `<｜DSML｜parameter name="…" string="true|false">` values (dsml.h), the spurious `arguments` wrapper
//     repaired.
//   - streaming: StreamingOutputParser takes arbitrary chunks (down to single bytes) and emits deltas whose
//     concatenation equals parse_output() on the whole text; tags split across chunks never leak, and no delta
//     ends inside a UTF-8 character.
// The grammar, the malformed-input rules and the streaming contract: docs/chat-formats.md.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat.h"

namespace megactx::chat {

enum class ToolCallSyntax { kGlm, kDsml };

// What a tool's JSON schema declares (`function.parameters`): property names in schema order, the required ones.
struct ToolParams {
    std::vector<std::string> properties;
    std::set<std::string> required;
};

struct ParserOptions {
    bool parse_reasoning = true;     // split `<think>…</think>` into reasoning
    bool start_in_reasoning = false; // the prompt ended inside `<think>`
    bool parse_tool_calls = false;   // tool-call blocks (only when the request offered tools)
    ToolCallSyntax tool_syntax = ToolCallSyntax::kGlm;
    std::string id_prefix = "call_"; // tool call i gets id `id_prefix + i`
    // Tool name → names of its arguments whose schema type is "string" (kept verbatim, never parsed as JSON).
    std::map<std::string, std::set<std::string>> string_args;
    // Tool name → its declared parameters (DSML: a lone `arguments`/`input` parameter the tool does not declare
    // is a wrapper around the real arguments).
    std::map<std::string, ToolParams> tool_params;
};

// string_args from an OpenAI `tools` array (`function.parameters.properties.<arg>.type == "string"`).
std::map<std::string, std::set<std::string>> string_args_from_tools(const Json& tools);
std::map<std::string, ToolParams> tool_params_from_tools(const Json& tools);

// The parser settings matching a rendered prompt: reasoning on, initial state from prompt_opens_reasoning(),
// tool calls when the format is GLM (`<tool_call>`) or DeepSeek-V3.2 (DSML) and `tools` is non-empty. A caller
// holding the rendered prompt should set start_in_reasoning from prompt_opens_reasoning(prompt): DeepSeek-V3.2's
// opening `<think>` depends on the messages, not only on the options.
ParserOptions parser_options_for(ChatFormat format, const ChatOptions& options, const Json& tools);

struct ParsedToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // JSON object text, e.g. `{"city": "Oslo", "days": 3}`
};

struct ParsedOutput {
    std::string content;
    std::string reasoning;
    std::vector<ParsedToolCall> tool_calls;

    // An OpenAI assistant message: content (null when empty), reasoning_content (when non-empty), tool_calls.
    Json to_openai_message() const;
};

ParsedOutput parse_output(std::string_view text, const ParserOptions& options);

struct StreamDelta {
    enum class Kind { kContent, kReasoning, kToolCallBegin, kToolCallArguments };
    Kind kind = Kind::kContent;
    std::string text;     // content / reasoning / an argument fragment
    int index = -1;       // tool call index (both tool-call kinds)
    std::string id, name; // kToolCallBegin

    // The OpenAI streaming `delta` object: {"content"}, {"reasoning_content"}, or {"tool_calls": [{index, id,
    // type, function: {name, arguments: ""}}]} / {"tool_calls": [{index, function: {arguments}}]}.
    Json to_openai() const;
};

class StreamingOutputParser {
public:
    explicit StreamingOutputParser(ParserOptions options);

    // Consumes a chunk; returns the deltas that are now certain (adjacent deltas of one kind merged).
    std::vector<StreamDelta> feed(std::string_view chunk);
    // End of output: flushes held-back text and closes an unterminated tool call. Call once.
    std::vector<StreamDelta> finish();

private:
    enum class State { kContent, kReasoning, kToolName, kArgs, kArgKey, kAfterKey, kArgValue, kSkipCall, kDsml };

    void run(bool final);
    void take_text(std::string_view s);
    void on_tag(std::string_view tag);
    void on_end();
    bool begin_call();
    void begin_value();
    void end_value();
    void close_call();
    bool emits_text() const;
    void emit(StreamDelta::Kind kind, std::string_view text);
    bool run_dsml(bool final);

    ParserOptions opt_;
    State state_;
    std::string buf_;                // bytes not yet assigned: a possible tag prefix or partial UTF-8
    bool think_block_start_ = false; // at the start of a reasoning block (a repeated `<think>` is dropped)
    std::string name_, key_, value_; // the tool call being read
    std::string call_name_;
    std::set<std::string> keys_;     // argument keys already emitted in this call (first one wins)
    int i_call_ = -1, n_calls_ = 0, n_pairs_ = 0;
    bool value_is_string_ = false, value_skip_ = false;
    // DSML: the body of the open `<｜DSML｜function_calls>` block (re-parsed as it grows), and per invoke of it the
    // call index (-1: dropped, no name) and how much of its arguments text has been sent.
    std::string dsml_body_;
    std::vector<int> dsml_call_;
    std::vector<size_t> dsml_sent_;
    std::vector<StreamDelta> out_;
};

}  // namespace megactx::chat
