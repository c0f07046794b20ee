// One OpenAI request body (JSON text) → a validated generation request: the chat format rendered and
// tokenized, sampling and limits checked, every field the server cannot honour refused by name. No engine and no
// HTTP here, so the whole of the request surface can be fuzzed (tests/fuzz/fuzz_api_request.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "server/structured_output.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

// What a request is checked against.
struct RequestContext {
    const Tokenizer* tokenizer = nullptr;  // null: only token-id prompts on /v1/completions
    int64_t vocab_size = 0;
    int64_t max_model_len = 0;
    std::string served_model_name = "megactx";
    chat::ChatFormat chat_format = chat::ChatFormat::kGlm5;
};

struct ApiRequest {
    bool chat = false, stream = false, include_usage = false;
    std::string model;
    std::vector<int32_t> prompt;
    GenerationParams gen;
    std::vector<std::string> stop;
    bool logprobs = false;
    chat::ParserOptions parser;  // chat: how to split reasoning and tool calls out of the output
    ConstraintSpec constraint;   // structured outputs asked for (compiled by the API into gen.constraint)
};

// The request's `model` (absent: the served name); another model's name is a 404.
std::string check_model_name(const chat::Json& body, const RequestContext& ctx);

// The chat prompt as /v1/chat/completions and /tokenize read it (each throws ApiError 400 naming the field):
// `messages`; `tools` (validated; an empty array when absent); the options — reasoning_effort, thinking,
// chat_template_kwargs (enable_thinking, thinking, clear_thinking), add_generation_prompt (default true),
// continue_final_message (default false) — with the format's thinking default; and the rendered prompt text.
std::vector<chat::Message> chat_messages_from_request(const chat::Json& body);
chat::Json tools_from_request(const chat::Json& body);
chat::ChatOptions chat_options_from_request(const chat::Json& body, chat::ChatFormat format);
std::string render_chat_prompt(const std::vector<chat::Message>& messages, const chat::Json& tools,
                               const chat::ChatOptions& options, const RequestContext& ctx);

// Parses and validates `body` for /v1/chat/completions (`chat`) or /v1/completions. Throws ApiError: 400 naming
// the field at fault (`param`), 404 for another model's name.
ApiRequest parse_api_request(const std::string& body, bool chat, const RequestContext& ctx);

// `n` random lowercase hex digits from the system's entropy source: response and tool-call ids that do not
// collide across restarts or replicas.
std::string random_hex(size_t n);

}  // namespace megactx
