// DeepSeek-V3 parity: the native renderer against DeepSeek-V3's real chat_template rendered by @huggingface/jinja
// (tests/chat/setup.sh writes out/deepseek_v3_expected.json from deepseek_v3_cases.json). Byte-for-byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/chat.h"

namespace megactx::chat {
namespace {

Json read_json(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return Json::parse(ss.str());
}

TEST(DeepSeekV3Parity, MatchesTheReferenceTemplateByteForByte) {
    const std::filesystem::path dir = MEGACTX_CHAT_DIR;
    const auto expected_path = dir / "out" / "deepseek_v3_expected.json";
    if (!std::filesystem::exists(expected_path))
        GTEST_SKIP() << expected_path << " is missing: run tests/chat/setup.sh (scripts/test.sh does)";
    const Json cases = read_json(dir / "deepseek_v3_cases.json");
    const Json expected = read_json(expected_path)["cases"];
    ASSERT_EQ(cases.size(), expected.size()) << "stale reference: rerun tests/chat/setup.sh";
    for (size_t i = 0; i < cases.size(); ++i) {
        const Json& c = cases[i];
        ASSERT_EQ(c["name"], expected[i]["name"]) << "stale reference: rerun tests/chat/setup.sh";
        ChatOptions o;
        o.add_generation_prompt = c.value("add_generation_prompt", true);
        const std::string got =
            render_deepseek_v3(messages_from_json(c["messages"]), c.value("tools", Json()), o);
        EXPECT_EQ(got, expected[i]["prompt"].get<std::string>()) << c["name"];
    }
}

TEST(DeepSeekV3Format, ToolCallSectionsFollowTheTemplateQuirks) {
    // Only the first tool call of the conversation opens the section; later ones close it after themselves.
    const auto m = messages_from_json(Json::parse(R"([
        {"role":"user","content":"q"},
        {"role":"assistant","content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"f","arguments":{"x": [1, 2]}}},
            {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},
        {"role":"tool","content":"1"},{"role":"tool","content":"2"}])"));
    EXPECT_EQ(render_deepseek_v3(m, nullptr, {}),
              "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
              "<｜tool▁sep｜>f\n```json\n{\"x\": [1, 2]}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
              "<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
              "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>1<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>2"
              "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>");
    EXPECT_FALSE(prompt_opens_reasoning(ChatFormat::kDeepSeekV3, ChatOptions{}));
}

}  // namespace
}  // namespace megactx::chat
