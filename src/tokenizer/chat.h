// Chat formats: a conversation (independent of HTTP) rendered into the prompt text a model was trained on.
//   - GLM-5 family (GLM-5 / 5.1 / 5.2): `[gMASK]<sop>`, `<|system|>` `<|user|>` `<|assistant|>` `<|observation|>`
//     turns, `<think>…</think>`, reasoning effort line, XML-ish tool calls (model-spec §8).
//   - DeepSeek-V3: the `chat_template` of DeepSeek-V3's tokenizer_config.json, quirks included.
//   - DeepSeek-V3.2 (`deepseek_v32`, no Jinja template): DeepSeek's encoding_dsv32 rules — thinking / chat
//     mode, the developer role, tools listed in the system prompt, DSML `<｜DSML｜function_calls>` tool calls,
//     `<function_results>` tool outputs (chat_dsv32.cpp).
// Every rule, its source and what is verified vs inferred: docs/chat-formats.md.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_json.h"

namespace megactx::chat {

enum class Role { kSystem, kUser, kAssistant, kTool };

struct ToolCall {
    std::string id;
    std::string name;
    // The function arguments: a JSON object, or (OpenAI wire shape) a string holding JSON text. GLM needs the
    // object (a string is parsed); DeepSeek-V3 prints the text (an object is printed like json.dumps).
    Json arguments = Json::object();
};

struct Message {
    Role role = Role::kUser;
    std::optional<std::string> content;            // nullopt = JSON null (assistant turns that only call tools)
    std::optional<std::string> reasoning_content;  // assistant only
    std::vector<ToolCall> tool_calls;              // assistant only
    std::string tool_call_id;                      // tool only
    // Role "developer" (stored as kSystem): only DeepSeek-V3.2 renders it differently from a system message.
    bool developer = false;
};

enum class ReasoningEffort { kMax, kHigh };

struct ChatOptions {
    bool add_generation_prompt = true;
    bool enable_thinking = true;
    ReasoningEffort reasoning_effort = ReasoningEffort::kMax;
    // GLM `clear_thinking`: true (the template default) keeps reasoning only for assistant turns after the last
    // user turn; false keeps it for every turn ("preserved thinking").
    bool clear_thinking = true;
    // vLLM's continue_final_message: the last message must be an assistant turn, rendered open (no end-of-turn
    // marker) so the model continues it. Needs add_generation_prompt off.
    bool continue_final_message = false;
};

enum class ChatFormat { kGlm5, kDeepSeekV3, kDeepSeekV32 };

// The chat format of a model by its config.json `model_type`: glm_moe_dsa → GLM-5, deepseek_v3 → DeepSeek-V3,
// deepseek_v32 → DeepSeek-V3.2; nullopt for any other type.
std::optional<ChatFormat> chat_format_for_model_type(std::string_view model_type);
const char* chat_format_name(ChatFormat format);  // "glm5", "deepseek_v3", "deepseek_v32"

// `tools` is the OpenAI `tools` array (function definitions) or null / an empty array.
std::string render_glm5(const std::vector<Message>& messages, const Json& tools, const ChatOptions& options);
std::string render_deepseek_v3(const std::vector<Message>& messages, const Json& tools, const ChatOptions& options);
// Thinking mode when options.enable_thinking, else chat mode. add_generation_prompt is not used: as in the
// reference encoder, every user turn ends with `<｜Assistant｜>` and `<think>` (the last user turn, thinking
// mode) or `</think>`. Tools are listed in the first message when it is a system message, else in an empty
// system message put first.
std::string render_deepseek_v32(const std::vector<Message>& messages, const Json& tools, const ChatOptions& options);
std::string render_chat(ChatFormat format, const std::vector<Message>& messages, const Json& tools,
                        const ChatOptions& options);

// Whether the rendered prompt leaves the model inside a reasoning block (GLM with thinking on and a generation
// prompt ends in `<think>`): the output parser's initial state.
bool prompt_opens_reasoning(ChatFormat format, const ChatOptions& options);
// The same question asked of a rendered prompt: it ends with an open `<think>` (GLM thinking on; DeepSeek-V3.2 in
// thinking mode after a user turn or tool results).
bool prompt_opens_reasoning(std::string_view prompt);

// The arguments of messages[i_msg].tool_calls[i_call] as a JSON object (JSON text is parsed), as GLM and
// DeepSeek-V3.2 render them key by key; anything else is an error naming the field.
Json tool_call_arguments(const ToolCall& tool_call, size_t i_msg, size_t i_call);

// OpenAI `messages` JSON → messages. Content may be a string, null, or a list of text parts
// ({"type":"text","text":…} or plain strings), which are concatenated. Errors name the field
// (`messages[2].tool_calls[0].function.name: …`).
std::vector<Message> messages_from_json(const Json& messages);

// "max" | "high" → effort; anything else is an error naming `reasoning_effort`.
ReasoningEffort parse_reasoning_effort(const std::string& value);

}  // namespace megactx::chat
