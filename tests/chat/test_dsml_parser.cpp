// DeepSeek-V3.2 output parsing: reasoning, DSML tool calls (typing, the `arguments` wrapper repair, malformed
// input), render → parse round trips on DeepSeek's gold conversation, and the streaming contract.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "parser_check.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"

namespace megactx::chat {
namespace {

const char* kTools = R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
        "location":{"type":"string"},"days":{"type":"integer"}},"required":["location"]}}},
    {"type":"function","function":{"name":"bash","parameters":{"type":"object","properties":{
        "command":{"type":"string"},"timeout":{"type":"integer"}},"required":["command"]}}},
    {"type":"function","function":{"name":"run","parameters":{"type":"object","properties":{
        "arguments":{"type":"string"}}}}}])";

ParserOptions dsv32_options(bool thinking = true) {
    ChatOptions c;
    c.enable_thinking = thinking;
    return parser_options_for(ChatFormat::kDeepSeekV32, c, Json::parse(kTools));
}

std::string call(const std::string& name, const std::string& params) {
    return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>\n";
}
std::string param(const std::string& name, const std::string& is_str, const std::string& value) {
    return "<｜DSML｜parameter name=\"" + name + "\" string=\"" + is_str + "\">" + value + "</｜DSML｜parameter>\n";
}
std::string block(const std::string& calls) {
    return "\n\n<｜DSML｜function_calls>\n" + calls + "</｜DSML｜function_calls>";
}

TEST(DsmlParser, OptionsFollowTheFormat) {
    const ParserOptions o = dsv32_options();
    EXPECT_TRUE(o.parse_tool_calls);
    EXPECT_EQ(o.tool_syntax, ToolCallSyntax::kDsml);
    EXPECT_TRUE(o.start_in_reasoning);
    EXPECT_FALSE(dsv32_options(false).start_in_reasoning);
    EXPECT_EQ(o.tool_params.at("bash").properties, (std::vector<std::string>{"command", "timeout"}));
    EXPECT_FALSE(parser_options_for(ChatFormat::kDeepSeekV32, ChatOptions{}, Json::array()).parse_tool_calls);
}

TEST(DsmlParser, ReasoningContentAndTypedCalls) {
    const auto r = parse_output(
        "Check the weather.</think>Looking it up." +
            block(call("get_weather", param("location", "true", " San Francisco ") + param("days", "false", "3")) +
                  call("bash", param("command", "true", "ls \"a b\"\n") + param("timeout", "false", " 2.5 "))),
        dsv32_options());
    EXPECT_EQ(r.reasoning, "Check the weather.");
    EXPECT_EQ(r.content, "Looking it up.");  // the blank line before the block is the format's, not content
    ASSERT_EQ(r.tool_calls.size(), 2u);
    EXPECT_EQ(r.tool_calls[0].name, "get_weather");
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": " San Francisco ", "days": 3})");
    EXPECT_EQ(r.tool_calls[1].name, "bash");
    EXPECT_EQ(r.tool_calls[1].arguments, R"({"command": "ls \"a b\"\n", "timeout": 2.5})");
    EXPECT_EQ(r.tool_calls[0].id, "call_0");
    EXPECT_EQ(r.tool_calls[1].id, "call_1");
}

TEST(DsmlParser, NonStringValues) {
    const auto r = parse_output(block(call("f", param("o", "false", "{\"a\":[1,2],\"b\":null}") +
                                                    param("t", "false", "true") + param("q", "false", "\"quoted\"") +
                                                    param("bad", "false", "{not json") + param("u", "false", "日本"))),
                                dsv32_options(false));
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].arguments,
              R"({"o": {"a": [1, 2], "b": null}, "t": true, "q": "quoted", "bad": "{not json", "u": "日本"})");
}

TEST(DsmlParser, MissingStringAttributeFallsBackToTheSchema) {
    const auto r = parse_output(
        block("<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\">42</｜DSML｜parameter>\n"
              "<｜DSML｜parameter name=\"days\">42</｜DSML｜parameter>\n</｜DSML｜invoke>\n"),
        dsv32_options(false));
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": "42", "days": 42})");
}

TEST(DsmlParser, SpuriousArgumentsWrapperIsRepaired) {
    const ParserOptions o = dsv32_options(false);
    auto args = [&](const std::string& calls) {
        const auto r = parse_output(block(calls), o);
        EXPECT_EQ(r.tool_calls.size(), 1u);
        return r.tool_calls.empty() ? std::string() : r.tool_calls[0].arguments;
    };
    // An object, as a JSON value or as JSON text in a string parameter.
    EXPECT_EQ(args(call("get_weather", param("arguments", "false", R"({"location": "Oslo", "days": 2})"))),
              R"({"location": "Oslo", "days": 2})");
    EXPECT_EQ(args(call("get_weather", param("arguments", "true", R"({"location": "Oslo"})"))),
              R"({"location": "Oslo"})");
    EXPECT_EQ(args(call("get_weather", param("input", "false", R"({"location": "Oslo"})"))), R"({"location": "Oslo"})");
    // A bare string goes to the tool's one required string parameter.
    EXPECT_EQ(args(call("bash", param("arguments", "true", "cd /x && ls"))), R"({"command": "cd /x && ls"})");
    // Not a wrapper: the tool declares `arguments`, there are other parameters, the tool is unknown, or the value
    // has nowhere to go.
    EXPECT_EQ(args(call("run", param("arguments", "true", R"({"a": 1})"))), R"({"arguments": "{\"a\": 1}"})");
    EXPECT_EQ(args(call("bash", param("arguments", "true", "x") + param("timeout", "false", "1"))),
              R"({"arguments": "x", "timeout": 1})");
    EXPECT_EQ(args(call("unknown", param("arguments", "false", R"({"a": 1})"))), R"({"arguments": {"a": 1}})");
    EXPECT_EQ(args(call("get_weather", param("arguments", "false", "7"))), R"({"arguments": 7})");
}

TEST(DsmlParser, MalformedInput) {
    const ParserOptions o = dsv32_options(false);
    // Unterminated block and call: closed at the end; an open value is complete.
    auto r = parse_output(
        "Hi\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"bash\">\n"
        "<｜DSML｜parameter name=\"command\" string=\"true\">echo hi",
        o);
    EXPECT_EQ(r.content, "Hi");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"command": "echo hi"})");
    // An incomplete invoke header at the end is dropped; an empty name drops the call.
    r = parse_output(
        block(call("", param("a", "true", "x")) + call("bash", "")) + "<｜DSML｜function_calls><｜DSML｜invoke na", o);
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "bash");
    EXPECT_EQ(r.tool_calls[0].arguments, "{}");
    EXPECT_EQ(r.tool_calls[0].id, "call_0");
    // A missing parameter close is ended by the invoke's; a repeated name keeps its first value; text after the
    // block is content; DeepSeek-V4's block name is accepted.
    r = parse_output(
        "<｜DSML｜tool_calls><｜DSML｜invoke name=\"bash\"><｜DSML｜parameter name=\"command\" "
        "string=\"true\">a</｜DSML｜parameter><｜DSML｜parameter name=\"command\" string=\"true\">b"
        "</｜DSML｜parameter><｜DSML｜parameter name=\"timeout\" string=\"false\">5</｜DSML｜invoke>"
        "</｜DSML｜tool_calls> after",
        o);
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"command": "a", "timeout": 5})");
    EXPECT_EQ(r.content, " after");
    // Without tools the markup is content.
    ParserOptions no_tools = o;
    no_tools.parse_tool_calls = false;
    std::string text = "x";
    text += block(call("bash", param("command", "true", "ls")));
    EXPECT_EQ(parse_output(text, no_tools).content, text);
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// DeepSeek's own round trip: each assistant turn of the gold conversation, rendered after its context, parses
// back to that message (the reference's parse_message_from_completion_text check).
TEST(DsmlParser, GoldConversationRoundTrips) {
    const Json input = Json::parse(read_file(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/test_input.json"));
    ASSERT_TRUE(input.is_object());
    const std::vector<Message> messages = messages_from_json(input["messages"]);
    ChatOptions c;
    c.enable_thinking = true;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role != Role::kAssistant) continue;
        const std::vector<Message> context(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
        const std::string before = render_deepseek_v32(context, input["tools"], c);
        std::vector<Message> with = context;
        with.push_back(messages[i]);
        const std::string all = render_deepseek_v32(with, input["tools"], c);
        ASSERT_TRUE(all.starts_with(before));
        std::string generated = all.substr(before.size());
        const std::string eos = "<｜end▁of▁sentence｜>";  // a stop token: not part of the parsed text
        ASSERT_TRUE(generated.ends_with(eos));
        generated.resize(generated.size() - eos.size());

        ParserOptions po = parser_options_for(ChatFormat::kDeepSeekV32, c, input["tools"]);
        po.start_in_reasoning = prompt_opens_reasoning(before);
        const ParsedOutput r = parse_output(generated, po);
        const Message& m = messages[i];
        EXPECT_TRUE(po.start_in_reasoning) << i;  // every turn of the gold conversation is in thinking mode
        EXPECT_EQ(r.reasoning, m.reasoning_content.value_or("")) << i;
        EXPECT_EQ(r.content, m.content.value_or("")) << i;
        ASSERT_EQ(r.tool_calls.size(), m.tool_calls.size()) << i;
        for (size_t k = 0; k < r.tool_calls.size(); ++k) {
            EXPECT_EQ(r.tool_calls[k].name, m.tool_calls[k].name);
            EXPECT_EQ(r.tool_calls[k].arguments, m.tool_calls[k].arguments.get<std::string>());  // byte for byte
        }
        check_streaming(generated, po, {1}, true);
        check_streaming(generated, po, {3, 7, 1, 20}, true);
    }
}

// The reference encoder's random conversations (tests/data/deepseek_v32/cases.json): every assistant turn that
// follows a user turn or complete tool results, rendered after its context, parses back to its reasoning (in
// thinking mode), content and calls, whole and streamed. Turns whose text holds a think tag are left out: the
// reference parser refuses those too.
TEST(DsmlParser, ReferenceCasesRoundTrip) {
    const Json cases = Json::parse(read_file(std::string(MEGACTX_TEST_DATA) + "/deepseek_v32/cases.json"));
    ASSERT_TRUE(cases.is_array());
    size_t n_checked = 0, n_calls = 0;
    for (const Json& c : cases) {
        const std::vector<Message> messages = messages_from_json(c["messages"]);
        ChatOptions o;
        o.enable_thinking = c["thinking"].get<bool>();
        for (size_t i = 0; i < messages.size(); ++i) {
            const Message& m = messages[i];
            const auto has_think = [](const std::optional<std::string>& s) {
                return s && s->find("think>") != std::string::npos;
            };
            if (m.role != Role::kAssistant || has_think(m.content) || has_think(m.reasoning_content)) continue;
            const std::vector<Message> context(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
            const std::string before = render_deepseek_v32(context, c["tools"], o);
            if (!before.ends_with(o.enable_thinking ? "<think>" : "</think>")) continue;
            std::vector<Message> with = context;
            with.push_back(m);
            std::string generated = render_deepseek_v32(with, c["tools"], o).substr(before.size());
            generated.resize(generated.size() - std::string_view("<｜end▁of▁sentence｜>").size());

            ParserOptions po = parser_options_for(ChatFormat::kDeepSeekV32, o, c["tools"]);
            po.start_in_reasoning = prompt_opens_reasoning(before);
            po.parse_tool_calls = true;  // calls may name tools the request did not offer
            const ParsedOutput r = parse_output(generated, po);
            EXPECT_EQ(r.reasoning, o.enable_thinking ? m.reasoning_content.value_or("") : "") << generated;
            EXPECT_EQ(r.content, m.content.value_or("")) << generated;
            ASSERT_EQ(r.tool_calls.size(), m.tool_calls.size()) << generated;
            for (size_t k = 0; k < r.tool_calls.size(); ++k) {
                EXPECT_EQ(r.tool_calls[k].name, m.tool_calls[k].name);
                EXPECT_EQ(Json::parse(r.tool_calls[k].arguments),
                          Json::parse(m.tool_calls[k].arguments.get<std::string>()))
                    << generated;
            }
            check_streaming(generated, po, {1}, true);
            check_streaming(generated, po, {2, 5, 13}, true);
            ++n_checked;
            n_calls += r.tool_calls.size();
        }
    }
    EXPECT_GE(n_checked, 20u);
    EXPECT_GE(n_calls, 10u);
}

// Generated outputs: DSML pieces, partial tags, stray tags and multi-byte text in random order.
std::string random_dsml_output(std::mt19937& rng) {
    static const char* kPieces[] = {"<think>",
                                    "</think>",
                                    "<｜DSML｜function_calls>",
                                    "</｜DSML｜function_calls>",
                                    "<｜DSML｜tool_calls>",
                                    "<｜DSML｜invoke name=\"bash\">",
                                    "<｜DSML｜invoke name=\"get_weather\">",
                                    "<｜DSML｜invoke name=\"\">",
                                    "<｜DSML｜invoke",
                                    "</｜DSML｜invoke>",
                                    "<｜DSML｜parameter name=\"command\" string=\"true\">",
                                    "<｜DSML｜parameter name=\"arguments\" string=\"true\">",
                                    "<｜DSML｜parameter name=\"days\" string=\"false\">",
                                    "<｜DSML｜parameter name=\"location\">",
                                    "</｜DSML｜parameter>",
                                    "<｜DSML｜",
                                    "</｜DSML｜para",
                                    "<｜",
                                    "<",
                                    ">",
                                    "\"",
                                    "text",
                                    " ",
                                    "\n",
                                    "\n\n",
                                    "42",
                                    "{\"location\": \"x\"}",
                                    "[1, {\"a\": null}]",
                                    "é",
                                    "日本",
                                    "🙂",
                                    "{",
                                    "}"};
    std::string s;
    for (int n = static_cast<int>(rng() % 40); n > 0; --n) s += kPieces[rng() % std::size(kPieces)];
    return s;
}

TEST(DsmlParser, AnyChunkingGivesTheWholeTextResult) {
    std::mt19937 rng(32);
    for (int iter = 0; iter < 4000; ++iter) {
        const std::string text = random_dsml_output(rng);
        ParserOptions o = dsv32_options(iter % 2 == 0);
        o.parse_tool_calls = iter % 7 != 0;
        check_streaming(text, o, {1}, true);
        check_streaming(text, o, {1 + rng() % 4, 1 + rng() % 16, 1 + rng() % 64}, true);
    }
}

TEST(DsmlParser, ArbitraryBytesNeverBreakTheContract) {
    std::mt19937 rng(11);
    for (int iter = 0; iter < 2000; ++iter) {
        std::string text = random_dsml_output(rng);
        for (int k = static_cast<int>(rng() % 4); k > 0; --k)
            text.insert(text.begin() + static_cast<std::ptrdiff_t>(rng() % (text.size() + 1)),
                        static_cast<char>(0x80 + rng() % 0x80));
        check_streaming(text, dsv32_options(), {1}, false);
        check_streaming(text, dsv32_options(), {1 + rng() % 5, 1 + rng() % 11}, false);
    }
}

TEST(DsmlParser, StreamsStringArgumentsAsTheyArrive) {
    StreamingOutputParser p(dsv32_options(false));
    std::vector<StreamDelta> d = p.feed("Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"bash\">\n");
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].to_openai(), Json::parse(R"({"content":"Sure."})"));
    EXPECT_EQ(d[1].kind, StreamDelta::Kind::kToolCallBegin);
    EXPECT_EQ(d[1].name, "bash");
    d = p.feed("<｜DSML｜parameter name=\"command\" string=\"true\">echo hel");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].text, R"({"command": "echo hel)");
    d = p.feed("lo</｜DSML｜para");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].text, "lo");
    d = p.feed("meter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].text, "\"}");
    EXPECT_TRUE(p.finish().empty());
    // A possible wrapper is held back until its call closes, then sent repaired.
    StreamingOutputParser w(dsv32_options(false));
    d = w.feed(
        "<｜DSML｜function_calls><｜DSML｜invoke name=\"bash\"><｜DSML｜parameter name=\"arguments\" "
        "string=\"true\">ls -l");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].kind, StreamDelta::Kind::kToolCallBegin);
    d = w.feed("</｜DSML｜parameter></｜DSML｜invoke>");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].text, R"({"command": "ls -l"})");
}

}  // namespace
}  // namespace megactx::chat
