// GLM-5 chat format golden strings. Each expected string was also produced by rendering the GLM-5.2
// chat_template.jinja with @huggingface/jinja 0.5.11 (see docs/chat-formats.md, "Sources"), except where a
// test says it follows Python Jinja2 instead.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/chat.h"

namespace megactx::chat {
namespace {

std::string glm(const char* messages_json, const ChatOptions& o = {}, const char* tools_json = "null") {
    return render_glm5(messages_from_json(Json::parse(messages_json)), Json::parse(tools_json), o);
}

TEST(Glm5Format, SystemAndUser) {
    EXPECT_EQ(glm(R"([{"role":"system","content":"You are terse."},{"role":"user","content":"Hi there"}])"),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>You are terse.<|user|>Hi there<|assistant|><think>");
}

TEST(Glm5Format, MultiTurnKeepsReasoningOnlyAfterTheLastUserTurn) {
    // Reasoning is not stripped (GLM-5.2), content is; `<think>` in content is split off when no
    // reasoning_content is given.
    EXPECT_EQ(glm(R"([{"role":"user","content":"2+2?"},
                      {"role":"assistant","content":"4","reasoning_content":"Add them."},
                      {"role":"user","content":"And 3+3?"},
                      {"role":"assistant","content":"  6 \n","reasoning_content":"\nAdd again.\n"},
                      {"role":"assistant","content":"<think>\nhidden</think>\n\nvisible"}])"),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>2+2?<|assistant|><think></think>4<|user|>And 3+3?"
              "<|assistant|><think>\nAdd again.\n</think>6<|assistant|><think>\nhidden</think>visible"
              "<|assistant|><think>");
}

TEST(Glm5Format, ReasoningDoesNotLeakIntoALaterTurn) {
    // Python Jinja2 scopes `set` to one loop iteration, so a turn without reasoning gets an empty block.
    // (@huggingface/jinja and minja leak the previous turn's value here; transformers does not.)
    EXPECT_EQ(glm(R"([{"role":"user","content":"u"},{"role":"assistant","content":"a1","reasoning_content":"R"},
                      {"role":"tool","content":"t"},{"role":"assistant","content":"a2"}])"),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>u<|assistant|><think>R</think>a1<|observation|>"
              "<tool_response>t</tool_response><|assistant|><think></think>a2<|assistant|><think>");
}

TEST(Glm5Format, ThinkingOffDropsTheEffortLineAndClosesTheThinkBlock) {
    ChatOptions o;
    o.enable_thinking = false;
    EXPECT_EQ(glm(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello","reasoning_content":"greet"},
                      {"role":"user","content":"Bye"}])",
                  o),
              "[gMASK]<sop><|user|>Hi<|assistant|><think></think>Hello<|user|>Bye<|assistant|><think></think>");
}

TEST(Glm5Format, ReasoningEffortHigh) {
    ChatOptions o;
    o.reasoning_effort = parse_reasoning_effort("high");
    EXPECT_EQ(glm(R"([{"role":"user","content":"Hi"}])", o),
              "[gMASK]<sop><|system|>Reasoning Effort: High<|user|>Hi<|assistant|><think>");
    EXPECT_EQ(parse_reasoning_effort("max"), ReasoningEffort::kMax);
    EXPECT_THROW(parse_reasoning_effort("low"), Error);
}

TEST(Glm5Format, ToolsAreListedInASystemTurn) {
    // `function` is unwrapped, `strict` dropped, deferred tools skipped, non-ASCII kept, json.dumps spacing.
    const char* tools = R"([
        {"type":"function","function":{"name":"get_weather","description":"Current weather — °C",
         "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},
                       "required":["city"]},"strict":true}},
        {"type":"function","function":{"name":"hidden","description":"deferred","defer_loading":true}},
        {"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{}}}}])";
    EXPECT_EQ(glm(R"([{"role":"system","content":"Use tools."},{"role":"user","content":"Weather in Oslo?"}])", {},
                  tools),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>\n# Tools\n\nYou may call one or more functions to "
              "assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML "
              "tags:\n<tools>\n{\"name\": \"get_weather\", \"description\": \"Current weather — °C\", \"parameters\": "
              "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
              "\"integer\"}}, \"required\": [\"city\"]}}\n{\"name\": \"ping\", \"parameters\": {\"type\": \"object\", "
              "\"properties\": {}}}\n</tools>\n\nFor each function call, output the function name and arguments within "
              "the following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>"
              "{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>..."
              "</tool_call><|system|>Use tools.<|user|>Weather in Oslo?<|assistant|><think>");
    EXPECT_EQ(glm(R"([{"role":"user","content":"x"}])", {}, "[]"),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>x<|assistant|><think>");
}

TEST(Glm5Format, AssistantToolCallsWithStringAndNonStringArguments) {
    // Strings are raw, everything else json.dumps; null content renders as nothing (Python Jinja2 would print
    // "None" here, a known template bug; see docs/chat-formats.md).
    const char* messages = R"([{"role":"user","content":"Go"},
        {"role":"assistant","content":null,"reasoning_content":"Call it.","tool_calls":[
          {"id":"c0","type":"function","function":{"name":"search","arguments":
            {"query":"a \"b\" <c>","limit":3,"exact":false,"filters":{"lang":["en","fr"],"score":0.5},"note":null}}},
          {"id":"c1","type":"function","function":{"name":"ping","arguments":"{}"}}]}])";
    EXPECT_EQ(glm(messages),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Go<|assistant|><think>Call it.</think>"
              "<tool_call>search<arg_key>query</arg_key><arg_value>a \"b\" <c></arg_value><arg_key>limit</arg_key>"
              "<arg_value>3</arg_value><arg_key>exact</arg_key><arg_value>false</arg_value><arg_key>filters</arg_key>"
              "<arg_value>{\"lang\": [\"en\", \"fr\"], \"score\": 0.5}</arg_value><arg_key>note</arg_key>"
              "<arg_value>null</arg_value></tool_call><tool_call>ping</tool_call><|assistant|><think>");
}

TEST(Glm5Format, ConsecutiveToolResultsShareOneObservationTurn) {
    EXPECT_EQ(glm(R"([{"role":"user","content":"Go"},
        {"role":"assistant","content":"Checking.","tool_calls":[
          {"id":"c0","type":"function","function":{"name":"a","arguments":{"x":"1"}}},
          {"id":"c1","type":"function","function":{"name":"b","arguments":"{\"y\": 2}"}}]},
        {"role":"tool","tool_call_id":"c0","content":"{\"ok\": true}"},
        {"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"sec"},"ond"]},
        {"role":"assistant","content":"","reasoning_content":"more","tool_calls":[
          {"id":"c2","type":"function","function":{"name":"a","arguments":{"x":"3"}}}]},
        {"role":"tool","tool_call_id":"c2","content":"third"}])"),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Go<|assistant|><think></think>Checking."
              "<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call><tool_call>b<arg_key>y</arg_key>"
              "<arg_value>2</arg_value></tool_call><|observation|><tool_response>{\"ok\": true}</tool_response>"
              "<tool_response>second</tool_response><|assistant|><think>more</think><tool_call>a<arg_key>x</arg_key>"
              "<arg_value>3</arg_value></tool_call><|observation|><tool_response>third</tool_response>"
              "<|assistant|><think>");
}

TEST(Glm5Format, GenerationPromptOff) {
    ChatOptions o;
    o.add_generation_prompt = false;
    EXPECT_EQ(glm(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!","reasoning_content":"Say hi."}])",
                  o),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think>Say hi.</think>Hello!");
    EXPECT_FALSE(prompt_opens_reasoning(ChatFormat::kGlm5, o));
    EXPECT_TRUE(prompt_opens_reasoning(ChatFormat::kGlm5, ChatOptions{}));
}

TEST(Glm5Format, EmptyContent) {
    EXPECT_EQ(glm(R"([{"role":"system","content":""},{"role":"user","content":""},{"role":"assistant","content":""},
                      {"role":"user"}])"),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|><|user|><|assistant|><think></think><|user|>"
              "<|assistant|><think>");
}

TEST(Glm5Format, ClearThinkingOffKeepsAllReasoning) {
    ChatOptions o;
    o.clear_thinking = false;
    EXPECT_EQ(glm(R"([{"role":"user","content":"A"},{"role":"assistant","content":"B","reasoning_content":"r1"},
                      {"role":"user","content":"C"}])",
                  o),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>A<|assistant|><think>r1</think>B<|user|>C"
              "<|assistant|><think>");
}

TEST(ChatMessages, ErrorsNameTheField) {
    const auto message_of = [](const char* j) {
        try {
            messages_from_json(Json::parse(j));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(message_of(R"({"role":"user"})"), "messages: expected an array, got object");
    EXPECT_EQ(message_of(R"([{"role":"user"},{"role":"robot"}])"),
              "messages[1].role: expected system, developer, user, assistant or tool, got \"robot\"");
    EXPECT_EQ(message_of(R"([{"role":"user","content":[{"type":"image_url"}]}])"),
              "messages[0].content[0]: only text parts are supported");
    EXPECT_EQ(message_of(R"([{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])"),
              "messages[0].tool_calls[0].function.name: missing");
    EXPECT_EQ(message_of(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":3}}]}])"),
              "messages[0].tool_calls[0].function.arguments: expected a JSON string or an object");
    const auto bad_args = messages_from_json(
        Json::parse(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1"}}]}])"));
    EXPECT_THROW(render_glm5(bad_args, nullptr, {}), Error);
    EXPECT_THROW(render_glm5({}, Json::object(), {}), Error);
}

}  // namespace
}  // namespace megactx::chat
