#include "tokenizer/chat.h"

#include <string_view>

#include "core/error.h"

namespace megactx::chat {

namespace {

std::string_view content_or_empty(const Message& m) { return m.content ? std::string_view(*m.content) : ""; }

// Jinja truthiness of a JSON value.
bool truthy(const Json& v) {
    switch (v.type()) {
        case Json::value_t::null: return false;
        case Json::value_t::boolean: return v.get<bool>();
        case Json::value_t::number_integer: return v.get<int64_t>() != 0;
        case Json::value_t::number_unsigned: return v.get<uint64_t>() != 0;
        case Json::value_t::number_float: return v.get<double>() != 0.0;
        case Json::value_t::string: return !v.get_ref<const std::string&>().empty();
        default: return !v.empty();
    }
}

// Python str.split(sep): all pieces.
std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
    std::vector<std::string_view> parts;
    size_t pos = 0;
    for (size_t hit; (hit = s.find(sep, pos)) != std::string_view::npos; pos = hit + sep.size())
        parts.push_back(s.substr(pos, hit - pos));
    parts.push_back(s.substr(pos));
    return parts;
}

void check_tools(const Json& tools) {
    MEGACTX_CHECK(tools.is_null() || tools.is_array(), "tools: expected an array of function definitions, got {}",
                  tools.type_name());
    for (size_t i = 0; tools.is_array() && i < tools.size(); ++i)
        MEGACTX_CHECK(tools[i].is_object(), "tools[{}]: expected an object, got {}", i, tools[i].type_name());
}

// The GLM template's tool_to_json macro: `{"key": <json>, ...}` without `defer_loading` and `strict`. The key is
// printed between quotes unescaped, as the template does.
std::string glm_tool_json(const Json& tool) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : tool.items()) {
        if (k == "defer_loading" || k == "strict") continue;
        if (!first) out += ", ";
        first = false;
        out += '"';
        out += k;
        out += "\": ";
        out += py_json_dumps(v);
    }
    out += '}';
    return out;
}

constexpr std::string_view kGlmToolsHeader =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr std::string_view kGlmToolsFooter =
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

}  // namespace

Json tool_call_arguments(const ToolCall& tc, size_t i_msg, size_t i_call) {
    Json args = tc.arguments;
    if (args.is_string()) {
        args = Json::parse(args.get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
        MEGACTX_CHECK(!args.is_discarded(), "messages[{}].tool_calls[{}].function.arguments: not valid JSON", i_msg,
                      i_call);
    }
    MEGACTX_CHECK(args.is_object(), "messages[{}].tool_calls[{}].function.arguments: expected a JSON object, got {}",
                  i_msg, i_call, args.type_name());
    return args;
}

std::string render_glm5(const std::vector<Message>& messages, const Json& tools, const ChatOptions& options) {
    check_tools(tools);
    std::string out = "[gMASK]<sop>";
    if (options.enable_thinking)
        out += options.reasoning_effort == ReasoningEffort::kHigh ? "<|system|>Reasoning Effort: High"
                                                                  : "<|system|>Reasoning Effort: Max";
    if (tools.is_array() && !tools.empty()) {
        out += kGlmToolsHeader;
        for (const Json& tool : tools) {
            const Json& fn = tool.contains("function") ? tool["function"] : tool;
            if (!fn.is_object()) continue;
            if (fn.contains("defer_loading") && truthy(fn["defer_loading"])) continue;
            out += glm_tool_json(fn);
            out += '\n';
        }
        out += kGlmToolsFooter;
    }

    // Reasoning of past assistant turns is kept only after the last user turn (unless clear_thinking is off).
    int64_t i_last_user = -1;
    for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].role == Role::kUser) i_last_user = static_cast<int64_t>(i);

    for (size_t i = 0; i < messages.size(); ++i) {
        const Message& m = messages[i];
        switch (m.role) {
            case Role::kSystem:
                out += "<|system|>";
                out += content_or_empty(m);
                break;
            case Role::kUser:
                out += "<|user|>";
                out += content_or_empty(m);
                break;
            case Role::kTool:
                if (i == 0 || messages[i - 1].role != Role::kTool) out += "<|observation|>";
                out += "<tool_response>";
                out += content_or_empty(m);
                out += "</tool_response>";
                break;
            case Role::kAssistant: {
                out += "<|assistant|>";
                std::string_view content = content_or_empty(m);
                std::optional<std::string_view> reasoning;
                if (m.reasoning_content) {
                    reasoning = *m.reasoning_content;
                } else if (content.find("</think>") != std::string_view::npos) {
                    const auto parts = split(content, "</think>");
                    reasoning = split(parts.front(), "<think>").back();
                    content = parts.back();
                }
                const bool keep = !options.clear_thinking || static_cast<int64_t>(i) > i_last_user;
                if (keep && reasoning) {
                    out += "<think>";
                    out += *reasoning;
                    out += "</think>";
                } else {
                    out += "<think></think>";
                }
                out += py_strip(content);
                for (size_t j = 0; j < m.tool_calls.size(); ++j) {
                    const ToolCall& tc = m.tool_calls[j];
                    out += "<tool_call>";
                    out += tc.name;
                    const Json args = tool_call_arguments(tc, i, j);
                    for (const auto& [k, v] : args.items()) {
                        out += "<arg_key>";
                        out += k;
                        out += "</arg_key><arg_value>";
                        out += v.is_string() ? v.get_ref<const std::string&>() : py_json_dumps(v);
                        out += "</arg_value>";
                    }
                    out += "</tool_call>";
                }
                break;
            }
        }
    }
    if (options.add_generation_prompt) out += options.enable_thinking ? "<|assistant|><think>" : "<|assistant|><think></think>";
    return out;
}

std::string render_deepseek_v3(const std::vector<Message>& messages, const Json& tools, const ChatOptions& options) {
    check_tools(tools);  // the V3 template does not render tools; they are still validated
    static constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
    static constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";

    std::string out(kBos);
    bool first_system = true;
    for (const Message& m : messages) {
        if (m.role != Role::kSystem) continue;
        if (!first_system) out += "\n\n";
        first_system = false;
        out += content_or_empty(m);
    }

    // The template's namespace flags. `is_first` and `is_output_first` are never reset, so only the first tool
    // call / tool output of the whole conversation opens its section; this is reproduced on purpose.
    bool is_first = false, is_tool = false, is_output_first = true;
    for (const Message& m : messages) {
        switch (m.role) {
            case Role::kSystem:
                break;
            case Role::kUser:
                is_tool = false;
                out += "<｜User｜>";
                out += content_or_empty(m);
                break;
            case Role::kAssistant:
                if (!m.content) {
                    is_tool = false;
                    for (const ToolCall& tc : m.tool_calls) {
                        out += is_first ? "\n<｜tool▁call▁begin｜>"
                                        : "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
                        out += "function<｜tool▁sep｜>";
                        out += tc.name;
                        out += "\n```json\n";
                        out += tc.arguments.is_string() ? tc.arguments.get_ref<const std::string&>()
                                                        : py_json_dumps(tc.arguments);
                        out += "\n```<｜tool▁call▁end｜>";
                        if (is_first) {
                            out += "<｜tool▁calls▁end｜>";
                            out += kEos;
                        }
                        is_first = true;
                    }
                } else {
                    out += is_tool ? "<｜tool▁outputs▁end｜>" : "<｜Assistant｜>";
                    out += *m.content;
                    out += kEos;
                    is_tool = false;
                }
                break;
            case Role::kTool:
                is_tool = true;
                out += is_output_first ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" : "\n<｜tool▁output▁begin｜>";
                out += content_or_empty(m);
                out += "<｜tool▁output▁end｜>";
                is_output_first = false;
                break;
        }
    }
    if (is_tool) out += "<｜tool▁outputs▁end｜>";
    if (options.add_generation_prompt && !is_tool) out += "<｜Assistant｜>";
    return out;
}

std::string render_chat(ChatFormat format, const std::vector<Message>& messages, const Json& tools,
                        const ChatOptions& options) {
    if (options.continue_final_message) {
        MEGACTX_CHECK(!options.add_generation_prompt,
                      "continue_final_message and add_generation_prompt cannot both be true");
        MEGACTX_CHECK(!messages.empty() && messages.back().role == Role::kAssistant,
                      "continue_final_message: the last message must be an assistant message");
    }
    std::string out;
    switch (format) {
        case ChatFormat::kGlm5: out = render_glm5(messages, tools, options); break;
        case ChatFormat::kDeepSeekV3: out = render_deepseek_v3(messages, tools, options); break;
        case ChatFormat::kDeepSeekV32: out = render_deepseek_v32(messages, tools, options); break;
    }
    // Both DeepSeek formats close an assistant turn with end-of-sentence; GLM's turns have no end marker.
    static constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
    if (options.continue_final_message && format != ChatFormat::kGlm5 && std::string_view(out).ends_with(kEos))
        out.resize(out.size() - kEos.size());
    return out;
}

bool prompt_opens_reasoning(ChatFormat format, const ChatOptions& options) {
    return format == ChatFormat::kGlm5 && options.add_generation_prompt && options.enable_thinking;
}

bool prompt_opens_reasoning(std::string_view prompt) { return prompt.ends_with("<think>"); }

std::optional<ChatFormat> chat_format_for_model_type(std::string_view model_type) {
    if (model_type == "glm_moe_dsa") return ChatFormat::kGlm5;
    if (model_type == "deepseek_v3") return ChatFormat::kDeepSeekV3;
    if (model_type == "deepseek_v32") return ChatFormat::kDeepSeekV32;
    return std::nullopt;
}

const char* chat_format_name(ChatFormat format) {
    switch (format) {
        case ChatFormat::kGlm5: return "glm5";
        case ChatFormat::kDeepSeekV3: return "deepseek_v3";
        case ChatFormat::kDeepSeekV32: return "deepseek_v32";
    }
    return "?";
}

ReasoningEffort parse_reasoning_effort(const std::string& value) {
    if (value == "max") return ReasoningEffort::kMax;
    if (value == "high") return ReasoningEffort::kHigh;
    MEGACTX_FAIL("reasoning_effort: expected \"max\" or \"high\", got \"{}\"", value);
}

namespace {

std::optional<std::string> content_from_json(const Json& c, const std::string& field) {
    if (c.is_null()) return std::nullopt;
    if (c.is_string()) return c.get<std::string>();
    MEGACTX_CHECK(c.is_array(), "{}: expected a string, null or a list of text parts, got {}", field, c.type_name());
    std::string text;
    for (size_t i = 0; i < c.size(); ++i) {
        const Json& part = c[i];
        if (part.is_string()) {
            text += part.get_ref<const std::string&>();
            continue;
        }
        MEGACTX_CHECK(part.is_object() && part.value("type", "") == "text", "{}[{}]: only text parts are supported",
                      field, i);
        const auto it = part.find("text");
        MEGACTX_CHECK(it != part.end() && it->is_string(), "{}[{}].text: expected a string", field, i);
        text += it->get_ref<const std::string&>();
    }
    return text;
}

std::string string_field(const Json& obj, const char* key, const std::string& field, bool required) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
        MEGACTX_CHECK(!required, "{}.{}: missing", field, key);
        return {};
    }
    MEGACTX_CHECK(it->is_string(), "{}.{}: expected a string, got {}", field, key, it->type_name());
    return it->get<std::string>();
}

}  // namespace

std::vector<Message> messages_from_json(const Json& messages) {
    MEGACTX_CHECK(messages.is_array(), "messages: expected an array, got {}", messages.type_name());
    std::vector<Message> out;
    out.reserve(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string field = fmt::format("messages[{}]", i);
        const Json& j = messages[i];
        MEGACTX_CHECK(j.is_object(), "{}: expected an object, got {}", field, j.type_name());
        Message m;
        const std::string role = string_field(j, "role", field, true);
        if (role == "system" || role == "developer") {  // developer: OpenAI's newer name for system
            m.role = Role::kSystem;
            m.developer = role == "developer";
        }
        else if (role == "user") m.role = Role::kUser;
        else if (role == "assistant") m.role = Role::kAssistant;
        else if (role == "tool") m.role = Role::kTool;
        else MEGACTX_FAIL("{}.role: expected system, developer, user, assistant or tool, got \"{}\"", field, role);
        if (const auto it = j.find("content"); it != j.end()) m.content = content_from_json(*it, field + ".content");
        if (const auto it = j.find("reasoning_content"); it != j.end() && !it->is_null())
            m.reasoning_content = string_field(j, "reasoning_content", field, false);
        m.tool_call_id = string_field(j, "tool_call_id", field, false);
        if (const auto it = j.find("tool_calls"); it != j.end() && !it->is_null()) {
            MEGACTX_CHECK(it->is_array(), "{}.tool_calls: expected an array", field);
            for (size_t k = 0; k < it->size(); ++k) {
                const std::string tfield = fmt::format("{}.tool_calls[{}]", field, k);
                const Json& t = (*it)[k];
                MEGACTX_CHECK(t.is_object(), "{}: expected an object", tfield);
                ToolCall tc;
                tc.id = string_field(t, "id", tfield, false);
                const auto fn = t.find("function");
                MEGACTX_CHECK(fn != t.end() && fn->is_object(), "{}.function: expected an object", tfield);
                tc.name = string_field(*fn, "name", tfield + ".function", true);
                const auto args = fn->find("arguments");
                MEGACTX_CHECK(args != fn->end() && (args->is_string() || args->is_object()),
                              "{}.function.arguments: expected a JSON string or an object", tfield);
                tc.arguments = *args;
                m.tool_calls.push_back(std::move(tc));
            }
        }
        out.push_back(std::move(m));
    }
    return out;
}

}  // namespace megactx::chat
