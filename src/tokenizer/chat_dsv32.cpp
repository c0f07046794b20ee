// DeepSeek-V3.2's chat format. The model ships no Jinja template; DeepSeek's encoding_dsv32.py renders the
// conversation, and this is a C++ rendering of the same rules, checked byte for byte against DeepSeek's gold
// prompt (tests/data/deepseek_v32/, tests/chat/test_dsv32_format.cpp). The rules: docs/chat-formats.md.
#include <string_view>

#include "core/error.h"
#include "tokenizer/chat.h"

namespace megactx::chat {

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUserTurn = "<｜User｜>";
constexpr std::string_view kAssistantTurn = "<｜Assistant｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// The tools section of the system prompt, up to the tool schemas (one json.dumps line per function follow, then
// kToolsTail).
constexpr std::string_view kToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your "
    "reply to the user:\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and "
    "objects should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters "
    "and \"false\" for other types (numbers, booleans, arrays, objects).\n\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
    "thinking block. Here is an example:\n\n"
    "<｜DSML｜function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n\n"
    "<think>...thinking about results</think>\n\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kToolsTail = "\n</functions>\n";

std::string_view text_of(const Message& m) { return m.content ? std::string_view(*m.content) : ""; }

bool is_user_turn(const Message& m) { return m.role == Role::kUser || (m.role == Role::kSystem && m.developer); }

// "\n\n## Tools ... </functions>\n": the function objects (unwrapped from {"type": "function", "function": …}),
// every key kept, as json.dumps.
std::string tools_section(const Json& tools) {
    std::string out = "\n\n";
    out += kToolsHead;
    for (size_t i = 0; i < tools.size(); ++i) {
        const Json& tool = tools[i];
        MEGACTX_CHECK(tool.is_object(), "tools[{}]: expected an object, got {}", i, tool.type_name());
        const Json& fn = tool.contains("function") ? tool["function"] : tool;
        MEGACTX_CHECK(fn.is_object(), "tools[{}].function: expected an object, got {}", i, fn.type_name());
        if (i) out += '\n';
        out += py_json_dumps(fn);
    }
    out += kToolsTail;
    return out;
}

// `<｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>` per argument, joined by newlines: string
// values raw, others json.dumps.
std::string dsml_parameters(const ToolCall& tc, size_t i_msg, size_t i_call) {
    const Json args = tool_call_arguments(tc, i_msg, i_call);
    std::string out;
    bool first = true;
    for (const auto& [key, value] : args.items()) {
        if (!first) out += '\n';
        first = false;
        out += "<｜DSML｜parameter name=\"";
        out += key;
        out += value.is_string() ? "\" string=\"true\">" : "\" string=\"false\">";
        out += value.is_string() ? value.get_ref<const std::string&>() : py_json_dumps(value);
        out += "</｜DSML｜parameter>";
    }
    return out;
}

std::string dsml_function_calls(const Message& m, size_t i_msg) {
    std::string out = "\n\n<｜DSML｜function_calls>\n";
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        if (j) out += '\n';
        out += "<｜DSML｜invoke name=\"";
        out += m.tool_calls[j].name;
        out += "\">\n";
        out += dsml_parameters(m.tool_calls[j], i_msg, j);
        out += "\n</｜DSML｜invoke>";
    }
    out += "\n</｜DSML｜function_calls>";
    return out;
}

}  // namespace

std::string render_deepseek_v32(const std::vector<Message>& messages, const Json& tools, const ChatOptions& options) {
    MEGACTX_CHECK(tools.is_null() || tools.is_array(), "tools: expected an array of function definitions, got {}",
                  tools.type_name());
    const bool thinking = options.enable_thinking;
    const bool has_tools = tools.is_array() && !tools.empty();
    // The tools go into the first message when it is a system message, else into an empty system message put
    // in front of the conversation (no index below moves: that message is rendered before the loop).
    const bool tools_in_first =
        has_tools && !messages.empty() && messages[0].role == Role::kSystem && !messages[0].developer;

    int64_t i_last_user = -1;  // user or developer
    for (size_t i = messages.size(); i-- > 0;)
        if (is_user_turn(messages[i])) {
            i_last_user = static_cast<int64_t>(i);
            break;
        }
    // After a user turn or tool results: `<think>` opens the answer's reasoning in thinking mode when this is the
    // last user turn or comes after it; otherwise `</think>` (no reasoning).
    const auto think_tag = [&](size_t i, bool or_later) {
        const auto ii = static_cast<int64_t>(i);
        return thinking && (ii == i_last_user || (or_later && ii > i_last_user)) ? kThinkOpen : kThinkClose;
    };

    std::string out(kBos);
    if (has_tools && !tools_in_first) out += tools_section(tools);
    for (size_t i = 0; i < messages.size(); ++i) {
        const Message& m = messages[i];
        switch (m.role) {
            case Role::kSystem:
                if (m.developer) {
                    MEGACTX_CHECK(!text_of(m).empty(), "messages[{}]: a developer message needs non-empty content", i);
                    out += kUserTurn;
                    out += "\n\n# The user's message is: ";
                    out += text_of(m);
                    out += kAssistantTurn;
                    out += think_tag(i, false);
                } else {
                    out += text_of(m);
                    if (i == 0 && tools_in_first) out += tools_section(tools);
                }
                break;
            case Role::kUser:
                out += kUserTurn;
                out += text_of(m);
                out += kAssistantTurn;
                out += think_tag(i, false);
                break;
            case Role::kTool: {
                // The k-th tool message after an assistant turn answers its k-th call; the first opens
                // <function_results>, the one answering the last call closes it.
                size_t i_call_msg = i;
                while (i_call_msg > 0 && messages[i_call_msg - 1].role == Role::kTool) --i_call_msg;
                MEGACTX_CHECK(i_call_msg > 0 && messages[i_call_msg - 1].role == Role::kAssistant &&
                                  !messages[i_call_msg - 1].tool_calls.empty(),
                              "messages[{}]: a tool message must follow an assistant message with tool_calls", i);
                const size_t n_calls = messages[i_call_msg - 1].tool_calls.size();
                const size_t order = i - i_call_msg + 1;
                MEGACTX_CHECK(order <= n_calls,
                              "messages[{}]: tool result {} follows an assistant message with only {} tool calls", i,
                              order, n_calls);
                if (order == 1) out += "\n\n<function_results>";
                out += "\n<result>";
                out += text_of(m);
                out += "</result>";
                if (order == n_calls) {
                    out += "\n</function_results>\n\n";
                    out += think_tag(i, true);
                }
                break;
            }
            case Role::kAssistant:
                // Reasoning is shown only for turns after the last user turn, in thinking mode; earlier turns'
                // reasoning is dropped, and in chat mode there is none.
                if (thinking && static_cast<int64_t>(i) > i_last_user) {
                    if (m.reasoning_content) out += *m.reasoning_content;
                    out += kThinkClose;
                }
                out += text_of(m);
                if (!m.tool_calls.empty()) out += dsml_function_calls(m, i);
                out += kEos;
                break;
        }
    }
    return out;
}

}  // namespace megactx::chat
