// Tool calls under a grammar (tool_choice required or a named function), in GLM's and DeepSeek-V3.2's (DSML)
// syntax: the declared arguments in order, required ones present, string arguments raw, others JSON by their schema.
#include <gtest/gtest.h>

#include <memory>

#include "grammar/frontends.h"
#include "grammar/matcher.h"

namespace megactx::grammar {
namespace {

constexpr const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                   "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
])";

TEST(ToolCalls, RequiredAcceptsOneOrMoreWellFormedCalls) {
    const Grammar g = compile_glm_tool_calls(kTools);
    EXPECT_TRUE(matches(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                           "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"));
    EXPECT_TRUE(matches(g, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New York</arg_value>\n"
                           "<arg_key>days</arg_key>\n<arg_value>14</arg_value>\n<arg_key>unit</arg_key>"
                           "<arg_value>f</arg_value>\n</tool_call>\n<tool_call>now</tool_call>"));
    EXPECT_TRUE(matches(g, "<tool_call>now</tool_call>"));
    // Missing required, out of range, wrong order, undeclared, not an enum value, unknown tool, no call at all.
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                            "<arg_key>days</arg_key><arg_value>15</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value>"
                            "<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>now<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                            "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>unit</arg_key>"
                            "<arg_value>k</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>later</tool_call>"));
    EXPECT_FALSE(matches(g, ""));
    EXPECT_FALSE(matches(g, "Sure: <tool_call>now</tool_call>"));
}

TEST(ToolCalls, NamedFunctionIsExactlyOneCallOfIt) {
    ToolCallOptions o;
    o.only = "now";
    const Grammar g = compile_glm_tool_calls(kTools, o);
    EXPECT_TRUE(matches(g, "<tool_call>now</tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>now</tool_call><tool_call>now</tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                            "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"));
    o.only = "missing";
    EXPECT_THROW(compile_glm_tool_calls(kTools, o), GrammarError);
}

TEST(ToolCalls, UnenforceableArgumentsAreErrors) {
    EXPECT_THROW(compile_glm_tool_calls(R"([{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}}}}])"), GrammarError);
    EXPECT_THROW(compile_glm_tool_calls(R"([{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {}, "required": ["x"]}}}])"), GrammarError);
    EXPECT_THROW(compile_glm_tool_calls("[]"), GrammarError);
    EXPECT_THROW(compile_glm_tool_calls(R"([{"type": "function"}])"), GrammarError);
}

TEST(ToolCalls, AutoWithStrictToolsIsTextThenCallsHeldToTheirSchemas) {
    // get_weather strict, now not: text first, then calls; the strict tool's arguments follow its schema.
    const std::string tools = R"([
      {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {"type": "object",
        "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["days"]}}},
      {"type": "function", "function": {"name": "now"}}])";
    ToolCallOptions o;
    o.text_first = true;
    const Grammar g = compile_glm_tool_calls(tools, o);
    EXPECT_TRUE(matches(g, ""));
    EXPECT_TRUE(matches(g, "It is sunny. <tool_ca is not a call"));
    EXPECT_TRUE(matches(g, "Let me check.<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"));
    EXPECT_TRUE(matches(g, "<tool_call>now<arg_key>tz</arg_key><arg_value>UTC</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>30</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather</tool_call>"));  // days is required
    EXPECT_FALSE(matches(g, "x<tool_call>later</tool_call>"));       // no such tool
}

// tool_choice auto with strict tools and a response_format: the output is content that follows the
// response_format's grammar (embedded whole) or the calls, never free text, never both.
TEST(ToolCalls, ContentGrammarOrCalls) {
    const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "strict": true,
        "parameters": {"type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["days"], "additionalProperties": false}}}])";
    ToolCallOptions o;
    o.text_first = true;
    o.text = std::make_shared<const Grammar>(
        compile_json_schema(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"));
    const Grammar g = compile_glm_tool_calls(tools, o);
    EXPECT_TRUE(matches(g, R"({"city": "Oslo"})"));
    EXPECT_TRUE(matches(g, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"));
    EXPECT_FALSE(matches(g, "It is sunny."));
    EXPECT_FALSE(matches(g, R"({"town": "Oslo"})"));
    EXPECT_FALSE(matches(g, R"({"city": "Oslo"}<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>)"));
    EXPECT_FALSE(matches(g, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>30</arg_value></tool_call>"));
}

// Builder::embed copies a grammar's rules under fresh names: two copies of one grammar side by side.
TEST(ToolCalls, EmbedCopiesAGrammar) {
    const Grammar inner = parse_gbnf("root ::= \"(\" root \")\" | \"x\"\n");
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.embed(inner), b.literal("-"), b.embed(inner)});
    const Grammar g = b.finish(root);
    EXPECT_TRUE(matches(g, "((x))-x"));
    EXPECT_FALSE(matches(g, "((x)-x"));
    EXPECT_EQ(g.rules.size(), 2 * inner.rules.size() + 1);
}

TEST(ToolCalls, TextWithoutAStringHoldsNoOccurrence) {
    Builder b;
    const int32_t root = b.rule("root");
    b.add_alternative(root, {b.text_without("abab")});
    const Grammar g = b.finish(root);
    for (const char* ok : {"", "aba", "abaab", "bbbbabaa", "ababa"}) {
        const bool has = std::string(ok).find("abab") != std::string::npos;
        EXPECT_EQ(matches(g, ok), !has) << ok;
    }
    EXPECT_FALSE(matches(g, "xxababyy"));
    EXPECT_FALSE(matches(g, "aabab"));
}

// DeepSeek-V3.2's DSML: the calls in one block, typed parameters as the encoder writes them.
std::string dsml_invoke(const std::string& name, const std::string& params) {
    return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>";
}
std::string dsml_param(const std::string& key, const std::string& is_str, const std::string& value) {
    return "<｜DSML｜parameter name=\"" + key + "\" string=\"" + is_str + "\">" + value + "</｜DSML｜parameter>\n";
}
std::string dsml_block(const std::string& calls) {
    return "<｜DSML｜function_calls>\n" + calls + "\n</｜DSML｜function_calls>";
}

TEST(ToolCalls, DsmlRequiredAcceptsWellFormedBlocks) {
    ToolCallOptions o;
    o.format = ToolCallFormat::kDsml;
    const Grammar g = compile_tool_calls(kTools, o);
    const std::string oslo = dsml_param("city", "true", "Oslo") + dsml_param("days", "false", "3");
    EXPECT_TRUE(matches(g, dsml_block(dsml_invoke("get_weather", oslo))));
    EXPECT_TRUE(matches(g, dsml_block(dsml_invoke("get_weather", oslo + dsml_param("unit", "true", "f")) + "\n" +
                                      dsml_invoke("now", ""))));
    // The string attribute follows the schema type; missing required, out of range, wrong order, not an enum value,
    // an unknown tool, calls outside a block, GLM's syntax.
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("get_weather", dsml_param("city", "false", "Oslo") +
                                                                      dsml_param("days", "false", "3")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke(
                                "get_weather", dsml_param("city", "true", "Oslo") + dsml_param("days", "true", "3")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("get_weather", dsml_param("city", "true", "Oslo")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("get_weather", dsml_param("city", "true", "Oslo") +
                                                                      dsml_param("days", "false", "15")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("get_weather", dsml_param("days", "false", "3") +
                                                                      dsml_param("city", "true", "Oslo")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("get_weather", oslo + dsml_param("unit", "true", "k")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("later", ""))));
    EXPECT_FALSE(matches(g, dsml_invoke("now", "")));
    EXPECT_FALSE(matches(g, "<tool_call>now</tool_call>"));
    EXPECT_FALSE(matches(g, ""));
    // The GLM entry point stays GLM whatever the options say.
    EXPECT_TRUE(matches(compile_glm_tool_calls(kTools, o), "<tool_call>now</tool_call>"));
}

TEST(ToolCalls, DsmlNamedFunctionAndTextFirst) {
    ToolCallOptions o;
    o.format = ToolCallFormat::kDsml;
    o.only = "now";
    Grammar g = compile_tool_calls(kTools, o);
    EXPECT_TRUE(matches(g, dsml_block(dsml_invoke("now", ""))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("now", "") + "\n" + dsml_invoke("now", ""))));
    // tool_choice auto with a strict tool: text, then optionally the block; a tool that is not strict keeps any
    // parameters.
    const std::string tools = R"([
      {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {"type": "object",
        "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["days"]}}},
      {"type": "function", "function": {"name": "now"}}])";
    o = ToolCallOptions{};
    o.format = ToolCallFormat::kDsml;
    o.text_first = true;
    g = compile_tool_calls(tools, o);
    EXPECT_TRUE(matches(g, ""));
    EXPECT_TRUE(matches(g, "It is sunny. <｜DSML｜function_ is not a block"));
    EXPECT_TRUE(
        matches(g, "Let me check.\n\n" + dsml_block(dsml_invoke("get_weather", dsml_param("days", "false", "3")))));
    EXPECT_TRUE(matches(g, dsml_block(dsml_invoke("now", dsml_param("tz", "true", "UTC")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("get_weather", dsml_param("days", "false", "30")))));
    EXPECT_FALSE(matches(g, dsml_block(dsml_invoke("now", dsml_param("t\"z", "true", "UTC")))));
    EXPECT_FALSE(matches(g, "x" + dsml_block(dsml_invoke("later", ""))));
}

}  // namespace
}  // namespace megactx::grammar
