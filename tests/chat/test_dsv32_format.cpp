// DeepSeek-V3.2 chat format: DeepSeek's gold prompt (tests/data/deepseek_v32) byte for byte, then the rules the
// gold conversation does not reach (chat mode, developer role, tools without a system message, errors).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat.h"

namespace megactx::chat {
namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    EXPECT_TRUE(f.good()) << "cannot open " << path;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string dsv32(const char* messages_json, bool thinking = false, const char* tools_json = "null") {
    ChatOptions o;
    o.enable_thinking = thinking;
    return render_deepseek_v32(messages_from_json(Json::parse(messages_json)), Json::parse(tools_json), o);
}

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";

TEST(DeepSeekV32Format, GoldPromptFromDeepSeek) {
    const Json input = Json::parse(read_file(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/test_input.json"));
    std::string gold = read_file(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/test_output.txt");
    while (!gold.empty() && (gold.back() == '\n' || gold.back() == ' ')) gold.pop_back();  // the reference strips
    ChatOptions o;
    o.enable_thinking = true;
    const std::string prompt = render_deepseek_v32(messages_from_json(input["messages"]), input["tools"], o);
    EXPECT_EQ(prompt, gold);
    // The same conversation through the format switch the server uses.
    EXPECT_EQ(render_chat(ChatFormat::kDeepSeekV32, messages_from_json(input["messages"]), input["tools"], o), gold);
}

// Random conversations (chat and thinking mode, developer turns, tools with and without a system message, tool
// calls with every JSON type, missing tool results, null content) and the prompt DeepSeek's reference encoder
// renders for each (tests/data/deepseek_v32/make_cases.py).
TEST(DeepSeekV32Format, ReferenceEncoderCases) {
    const Json cases = Json::parse(read_file(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/cases.json"));
    ASSERT_GE(cases.size(), 40u);
    for (size_t i = 0; i < cases.size(); ++i) {
        const Json& c = cases[i];
        ChatOptions o;
        o.enable_thinking = c["thinking"].get<bool>();
        EXPECT_EQ(render_deepseek_v32(messages_from_json(c["messages"]), c["tools"], o),
                  c["expected"].get<std::string>())
            << "case " << i << ": " << c["messages"].dump();
    }
}

TEST(DeepSeekV32Format, ChatModeClosesTheThinkBlockAfterEveryUserTurn) {
    EXPECT_EQ(
        dsv32(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
                        {"role":"assistant","content":"Hello!","reasoning_content":"greet"},
                        {"role":"user","content":"Bye"}])"),
        std::string(kBos) +
            "Be "
            "brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜></think>");
}

TEST(DeepSeekV32Format, ThinkingModeOpensThinkOnlyAfterTheLastUserTurn) {
    const std::string p = dsv32(R"([{"role":"user","content":"Hi"},
                                    {"role":"assistant","content":"Hello!","reasoning_content":"greet"},
                                    {"role":"user","content":"Bye"}])",
                                true);
    // The earlier turn's reasoning is dropped; the prompt leaves the model inside <think>.
    EXPECT_EQ(p,
              std::string(kBos) +
                  "<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜><think>");
    EXPECT_TRUE(prompt_opens_reasoning(p));
    EXPECT_FALSE(prompt_opens_reasoning(dsv32(R"([{"role":"user","content":"Hi"}])")));
}

TEST(DeepSeekV32Format, AssistantAfterTheLastUserTurnKeepsItsReasoningInThinkingMode) {
    EXPECT_EQ(
        dsv32(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"A","reasoning_content":"R"}])", true),
        std::string(kBos) + "<｜User｜>Q<｜Assistant｜><think>R</think>A<｜end▁of▁sentence｜>");
    // Without reasoning the block is still closed.
    EXPECT_EQ(dsv32(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"A"}])", true),
              std::string(kBos) + "<｜User｜>Q<｜Assistant｜><think></think>A<｜end▁of▁sentence｜>");
}

TEST(DeepSeekV32Format, DeveloperRoleIsAUserTurnWithAPreamble) {
    EXPECT_EQ(dsv32(R"([{"role":"developer","content":"Use metric units."}])", true),
              std::string(kBos) + "<｜User｜>\n\n# The user's message is: Use metric units.<｜Assistant｜><think>");
    // ... and counts as the last user turn.
    EXPECT_EQ(dsv32(R"([{"role":"user","content":"a"},{"role":"developer","content":"b"}])", true),
              std::string(kBos) +
                  "<｜User｜>a<｜Assistant｜></think><｜User｜>\n\n# The user's message is: b<｜Assistant｜><think>");
    EXPECT_THROW(dsv32(R"([{"role":"developer","content":""}])"), Error);
}

TEST(DeepSeekV32Format, ToolsWithoutASystemMessageGoInFront) {
    const std::string p = dsv32(R"([{"role":"user","content":"Hi"}])", false,
                                R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])");
    EXPECT_TRUE(p.starts_with(std::string(kBos) + "\n\n## Tools\n\nYou have access")) << p;
    EXPECT_TRUE(
        p.ends_with("<functions>\n{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}\n</functions>\n"
                    "<｜User｜>Hi<｜Assistant｜></think>"))
        << p;
}

TEST(DeepSeekV32Format, ToolCallArgumentsAreTypedParameters) {
    const std::string p = dsv32(R"([{"role":"user","content":"go"},
        {"role":"assistant","content":"Sure.","tool_calls":[{"type":"function","function":{"name":"f",
          "arguments":"{\"s\": \"x <y>\", \"n\": 3, \"xs\": [1, 2.5], \"o\": {\"a\": null}, \"b\": false, \"u\": \"é\"}"}},
          {"type":"function","function":{"name":"g","arguments":{}}}]},
        {"role":"tool","content":"r1"},{"role":"tool","content":"r2"}])");
    EXPECT_EQ(p, std::string(kBos) +
                     "<｜User｜>go<｜Assistant｜></think>Sure.\n\n<｜DSML｜function_calls>\n"
                     "<｜DSML｜invoke name=\"f\">\n"
                     "<｜DSML｜parameter name=\"s\" string=\"true\">x <y></｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"xs\" string=\"false\">[1, 2.5]</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"o\" string=\"false\">{\"a\": null}</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"b\" string=\"false\">false</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"u\" string=\"true\">é</｜DSML｜parameter>\n"
                     "</｜DSML｜invoke>\n"
                     "<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n"
                     "</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n"
                     "<function_results>\n<result>r1</result>\n<result>r2</result>\n</function_results>\n\n</think>");
}

TEST(DeepSeekV32Format, ToolResultsNeedAMatchingAssistantCall) {
    EXPECT_THROW(dsv32(R"([{"role":"tool","content":"x"}])"), Error);
    EXPECT_THROW(dsv32(R"([{"role":"user","content":"u"},{"role":"assistant","content":"a"},
                           {"role":"tool","content":"x"}])"),
                 Error);
    EXPECT_THROW(dsv32(R"([{"role":"user","content":"u"},{"role":"assistant","content":null,
                           "tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},
                           {"role":"tool","content":"x"},{"role":"tool","content":"y"}])"),
                 Error);
    EXPECT_THROW(dsv32(R"([{"role":"user","content":"u"},{"role":"assistant","content":null,
                           "tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}])"),
                 Error);
}

TEST(DeepSeekV32Format, ContinueFinalMessageLeavesTheLastTurnOpen) {
    ChatOptions o;
    o.enable_thinking = false;
    o.add_generation_prompt = false;
    o.continue_final_message = true;
    const auto msgs = messages_from_json(
        Json::parse(R"([{"role":"user","content":"Count"},{"role":"assistant","content":"1, 2,"}])"));
    EXPECT_EQ(render_chat(ChatFormat::kDeepSeekV32, msgs, Json(), o),
              std::string(kBos) + "<｜User｜>Count<｜Assistant｜></think>1, 2,");
    o.add_generation_prompt = true;
    EXPECT_THROW(render_chat(ChatFormat::kDeepSeekV32, msgs, Json(), o), Error);
    o.add_generation_prompt = false;
    EXPECT_THROW(render_chat(ChatFormat::kDeepSeekV32, {msgs[0]}, Json(), o), Error);
}

TEST(DeepSeekV32Format, ModelTypeSelectsTheFormat) {
    EXPECT_EQ(chat_format_for_model_type("deepseek_v32"), ChatFormat::kDeepSeekV32);
    EXPECT_EQ(chat_format_for_model_type("glm_moe_dsa"), ChatFormat::kGlm5);
    EXPECT_EQ(chat_format_for_model_type("deepseek_v3"), ChatFormat::kDeepSeekV3);
    EXPECT_EQ(chat_format_for_model_type("llama"), std::nullopt);
    EXPECT_STREQ(chat_format_name(ChatFormat::kDeepSeekV32), "deepseek_v32");
}

}  // namespace
}  // namespace megactx::chat
