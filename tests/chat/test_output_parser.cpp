// Output parsers: reasoning split, GLM tool calls (typing, malformed input), GLM render → parse round trips, and
// the streaming contract (any chunking gives the whole-text result, deltas never split UTF-8).
#include <gtest/gtest.h>

#include <random>

#include "parser_check.h"
#include "tokenizer/output_parser.h"

namespace megactx::chat {
namespace {

ParserOptions glm_tools_options() {
    ParserOptions o;
    o.parse_tool_calls = true;
    o.start_in_reasoning = true;
    o.string_args = string_args_from_tools(Json::parse(R"([
        {"type":"function","function":{"name":"write","parameters":{"type":"object","properties":{
            "path":{"type":"string"},"text":{"type":"string"},"mode":{"type":"integer"}}}}},
        {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
            "query":{"type":"string"},"limit":{"type":"integer"}}}}}])"));
    return o;
}

TEST(ReasoningParser, InitialStateIsAParameter) {
    ParserOptions o;
    o.start_in_reasoning = true;
    auto r = parse_output("Think hard.</think>The answer.", o);
    EXPECT_EQ(r.reasoning, "Think hard.");
    EXPECT_EQ(r.content, "The answer.");
    r = parse_output("<think>again</think>x", o);  // a repeated opening tag at the start is dropped
    EXPECT_EQ(r.reasoning, "again");
    EXPECT_EQ(r.content, "x");
    r = parse_output("cut off mid-thought", o);
    EXPECT_EQ(r.reasoning, "cut off mid-thought");
    EXPECT_EQ(r.content, "");

    o.start_in_reasoning = false;  // DeepSeek-V3, or GLM with thinking off
    r = parse_output("<think>plan</think>done", o);
    EXPECT_EQ(r.reasoning, "plan");
    EXPECT_EQ(r.content, "done");
    r = parse_output("plain </think> text", o);  // a stray closing tag in content is just text
    EXPECT_EQ(r.content, "plain </think> text");
    o.parse_reasoning = false;
    EXPECT_EQ(parse_output("<think>x</think>", o).content, "<think>x</think>");
}

TEST(ToolCallParser, ArgumentTypingFollowsTheSchemaThenJson) {
    const ParserOptions o = glm_tools_options();
    const auto r = parse_output(
        "Need data.</think>Let me look.<tool_call>search<arg_key>query</arg_key><arg_value> 42 </arg_value>"
        "<arg_key>limit</arg_key><arg_value>5</arg_value></tool_call>\n<tool_call>other<arg_key>a</arg_key>\n"
        "<arg_value>[1, 2]</arg_value><arg_key>b</arg_key><arg_value> plain text </arg_value><arg_key>c</arg_key>"
        "<arg_value>\"quoted\"</arg_value><arg_key>d</arg_key><arg_value>{\"k\":1.50}</arg_value></tool_call>",
        o);
    EXPECT_EQ(r.reasoning, "Need data.");
    EXPECT_EQ(r.content, "Let me look.\n");
    ASSERT_EQ(r.tool_calls.size(), 2u);
    EXPECT_EQ(r.tool_calls[0].id, "call_0");
    EXPECT_EQ(r.tool_calls[0].name, "search");
    // `query` is a string in the schema: kept verbatim (whitespace too); `limit` parses as JSON.
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"query": " 42 ", "limit": 5})");
    EXPECT_EQ(r.tool_calls[1].id, "call_1");
    // No schema: JSON non-strings are parsed, anything else becomes the stripped text as a string.
    EXPECT_EQ(r.tool_calls[1].arguments, R"({"a": [1, 2], "b": "plain text", "c": "\"quoted\"", "d": {"k": 1.5}})");
    EXPECT_EQ(r.to_openai_message().dump(),
              R"({"role":"assistant","content":"Let me look.\n","reasoning_content":"Need data.","tool_calls":[)"
              R"({"id":"call_0","type":"function","function":{"name":"search","arguments":"{\"query\": \" 42 \", )"
              R"(\"limit\": 5}"}},{"id":"call_1","type":"function","function":{"name":"other","arguments":)"
              R"("{\"a\": [1, 2], \"b\": \"plain text\", \"c\": \"\\\"quoted\\\"\", \"d\": {\"k\": 1.5}}"}}]})");
}

TEST(ToolCallParser, WithoutToolsTheTagsAreContent) {
    ParserOptions o;
    const std::string text = "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>";
    EXPECT_EQ(parse_output(text, o).content, text);
    EXPECT_TRUE(parse_output(text, o).tool_calls.empty());
}

TEST(ToolCallParser, MalformedCallsHaveADefinedResult) {
    ParserOptions o;
    o.parse_tool_calls = true;
    struct Case {
        const char* text;
        const char* content;
        std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
    };
    const Case cases[] = {
        // Unterminated call at the end of output: closed as if </tool_call> had arrived.
        {"<tool_call>f<arg_key>a</arg_key><arg_value>1", "", {{"f", R"({"a": 1})"}}},
        {"<tool_call>f<arg_key>a</arg_key><arg_value>x y", "", {{"f", R"({"a": "x y"})"}}},
        {"<tool_call>f", "", {{"f", "{}"}}},
        {"<tool_call> f \n<arg_key>a</arg_key><arg_val", "", {{"f", "{}"}}},
        {"<tool_call>", "", {}},
        // A key without a value, or an unterminated key, is dropped.
        {"<tool_call>f<arg_key>a</arg_key></tool_call>ok", "ok", {{"f", "{}"}}},
        {"<tool_call>f<arg_key>a</arg_key><arg_key>b</arg_key><arg_value>2</arg_value></tool_call>", "",
         {{"f", R"({"b": 2})"}}},
        {"<tool_call>f<arg_key>a<arg_value>1</arg_value></tool_call>", "", {{"f", "{}"}}},
        // </tool_call> inside a value ends both.
        {"<tool_call>f<arg_key>a</arg_key><arg_value>xy</tool_call>z", "z", {{"f", R"({"a": "xy"})"}}},
        // An empty name drops the whole call.
        {"a<tool_call><arg_key>k</arg_key><arg_value>1</arg_value></tool_call>b", "ab", {}},
        {"a<tool_call>  </tool_call>b", "ab", {}},
        // The first of two equal keys wins; text between tags is ignored.
        {"<tool_call>f junk? <arg_key>k</arg_key> x <arg_value>1</arg_value> y <arg_key>k</arg_key>"
         "<arg_value>2</arg_value><arg_value>orphan</arg_value></tool_call>",
         "",
         {{"f junk?", R"({"k": 1})"}}},
        // Invalid UTF-8 in a value becomes U+FFFD, so arguments stay valid JSON.
        {"<tool_call>f<arg_key>s</arg_key><arg_value>\xff\xe2\x82</arg_value></tool_call>", "",
         {{"f", "{\"s\": \"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"}"}}},
    };
    for (const Case& c : cases) {
        const auto r = parse_output(c.text, o);
        EXPECT_EQ(r.content, c.content) << c.text;
        ASSERT_EQ(r.tool_calls.size(), c.calls.size()) << c.text;
        for (size_t i = 0; i < c.calls.size(); ++i) {
            EXPECT_EQ(r.tool_calls[i].name, c.calls[i].first) << c.text;
            EXPECT_EQ(r.tool_calls[i].arguments, c.calls[i].second) << c.text;
        }
        check_streaming(c.text, o, {1}, false);
        check_streaming(c.text, o, {3, 1, 7}, false);
    }
}

TEST(StreamingParser, DeltasHaveTheOpenAIShape) {
    ParserOptions o = glm_tools_options();
    StreamingOutputParser p(o);
    std::vector<StreamDelta> d = p.feed("Hmm</think>Sure.<tool_call>write<arg_key>path</arg_key><arg_value>a.txt");
    auto rest = p.feed("</arg_value><arg_key>mode</arg_key><arg_value>644</arg_value></tool_call>");
    d.insert(d.end(), rest.begin(), rest.end());
    rest = p.finish();
    d.insert(d.end(), rest.begin(), rest.end());
    std::vector<std::string> shapes;
    for (const auto& x : d) shapes.push_back(x.to_openai().dump());
    const std::vector<std::string> expected = {
        R"({"reasoning_content":"Hmm"})",
        R"({"content":"Sure."})",
        R"({"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"write","arguments":""}}]})",
        R"({"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"a.txt"}}]})",
        R"({"tool_calls":[{"index":0,"function":{"arguments":"\", \"mode\": 644}"}}]})",
    };
    EXPECT_EQ(shapes, expected);
}

TEST(StreamingParser, StringArgumentsStreamAsTheyArrive) {
    StreamingOutputParser p(glm_tools_options());
    p.feed("</think><tool_call>write<arg_key>text</arg_key><arg_value>line 1\n");
    const auto d = p.feed("line 2 é");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].text, "line 2 é");
    const auto partial = p.feed("\xe2\x82");  // first two bytes of "€": held back
    EXPECT_TRUE(partial.empty());
    const auto euro = p.feed("\xac</arg");
    ASSERT_EQ(euro.size(), 1u);
    EXPECT_EQ(euro[0].text, "€");
}

// Random tool-call arguments covering the JSON types and awkward strings.
Json random_value(std::mt19937& rng, int depth, bool string_only) {
    static const char* kStrings[] = {"", "plain", " padded ", "123", "true", "null", "[1,2]", "{\"a\":1}",
                                     "quote \" and \\ back", "tab\tnew\nline", "ünïcødé 日本語 🙂", "<b>tag</b>",
                                     "a</arg_val", "x<arg_key>", "\x01\x1f ctl"};
    const int kind = string_only ? 0 : static_cast<int>(rng() % (depth > 1 ? 5 : 7));
    switch (kind) {
        case 0: return kStrings[rng() % std::size(kStrings)];
        case 1: return static_cast<int64_t>(rng() % 2000) - 1000;
        case 2: return (static_cast<double>(rng() % 100000) - 50000) / 64.0;
        case 3: return rng() % 2 == 0;
        case 4: return nullptr;
        case 5: {
            Json a = Json::array();
            for (int i = static_cast<int>(rng() % 3); i > 0; --i) a.push_back(random_value(rng, depth + 1, false));
            return a;
        }
        default: {
            Json o = Json::object();
            for (int i = static_cast<int>(rng() % 3); i > 0; --i)
                o["k" + std::to_string(rng() % 5)] = random_value(rng, depth + 1, false);
            return o;
        }
    }
}

TEST(ToolCallParser, RoundTripsThroughTheGlmRenderer) {
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 300; ++iter) {
        // Tool "t" declares its string arguments (exact round trip for any string); tool "u" has no schema, where
        // only strings that are not JSON and not padded survive unchanged.
        Json tools = Json::array();
        Json props_t = Json::object();
        Message m;
        m.role = Role::kAssistant;
        m.content = iter % 3 ? "Calling." : "";
        m.reasoning_content = "why";
        const int n_calls = 1 + static_cast<int>(rng() % 3);
        for (int c = 0; c < n_calls; ++c) {
            ToolCall tc;
            tc.name = c % 2 ? "u" : "t";
            const int n_args = static_cast<int>(rng() % 4);
            for (int a = 0; a < n_args; ++a) {
                const std::string key = "arg" + std::to_string(a);
                const bool str = rng() % 2 == 0;
                if (tc.name == "t") {
                    tc.arguments[key] = random_value(rng, 0, str);
                    if (tc.arguments[key].is_string()) props_t[key] = {{"type", "string"}};
                } else {
                    tc.arguments[key] = str ? Json("word" + std::to_string(a)) : random_value(rng, 1, false);
                    if (tc.arguments[key].is_string() && tc.arguments[key] != "word" + std::to_string(a))
                        tc.arguments[key] = "w";
                }
            }
            m.tool_calls.push_back(tc);
        }
        // A key typed "string" for one call must not hold a non-string in another call of "t".
        for (auto& tc : m.tool_calls)
            if (tc.name == "t")
                for (auto& [k, v] : tc.arguments.items())
                    if (props_t.contains(k) && !v.is_string()) v = "s";
        tools.push_back({{"type", "function"},
                         {"function", {{"name", "t"}, {"parameters", {{"type", "object"}, {"properties", props_t}}}}}});
        ChatOptions co;
        co.add_generation_prompt = false;
        const std::string prompt = render_glm5({m}, tools, co);
        const std::string head = "<|assistant|><think>";
        const std::string generated = prompt.substr(prompt.find(head) + head.size());

        const ParserOptions po = parser_options_for(ChatFormat::kGlm5, ChatOptions{}, tools);
        const ParsedOutput r = parse_output(generated, po);
        EXPECT_EQ(r.reasoning, "why");
        EXPECT_EQ(r.content, *m.content);
        ASSERT_EQ(r.tool_calls.size(), m.tool_calls.size()) << generated;
        for (size_t c = 0; c < r.tool_calls.size(); ++c) {
            EXPECT_EQ(r.tool_calls[c].name, m.tool_calls[c].name);
            EXPECT_EQ(Json::parse(r.tool_calls[c].arguments), m.tool_calls[c].arguments) << generated;
        }
        check_streaming(generated, po, {1}, true);
        check_streaming(generated, po, {1 + rng() % 9, 1 + rng() % 30, 2}, true);
    }
}

// Generated outputs: pieces of the grammar, partial tags, stray tags and multi-byte text in random order.
std::string random_output(std::mt19937& rng) {
    static const char* kPieces[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                    "<arg_value>", "</arg_value>", "<tool_", "</arg", "<", ">", "/", "text", " ",
                                    "\n", "query", "path", "42", "[1, {\"a\": null}]", "\"q\"", "é", "日本", "🙂",
                                    "write", "search", "<think", "</tool_call", "{", "}"};
    std::string s;
    for (int n = static_cast<int>(rng() % 40); n > 0; --n) s += kPieces[rng() % std::size(kPieces)];
    return s;
}

TEST(StreamingParser, AnyChunkingGivesTheWholeTextResult) {
    std::mt19937 rng(42);
    for (int iter = 0; iter < 3000; ++iter) {
        const std::string text = random_output(rng);
        ParserOptions o = glm_tools_options();
        o.start_in_reasoning = iter % 2 == 0;
        o.parse_tool_calls = iter % 5 != 0;
        check_streaming(text, o, {1}, true);
        check_streaming(text, o, {1 + rng() % 4, 1 + rng() % 16, 1 + rng() % 64}, true);
    }
}

TEST(StreamingParser, ArbitraryBytesNeverBreakTheContract) {
    std::mt19937 rng(7);
    for (int iter = 0; iter < 2000; ++iter) {
        std::string text = random_output(rng);
        for (int k = static_cast<int>(rng() % 4); k > 0; --k)
            text.insert(text.begin() + static_cast<std::ptrdiff_t>(rng() % (text.size() + 1)),
                        static_cast<char>(0x80 + rng() % 0x80));
        check_streaming(text, glm_tools_options(), {1}, false);
        check_streaming(text, glm_tools_options(), {1 + rng() % 5, 1 + rng() % 11}, false);
    }
}

}  // namespace
}  // namespace megactx::chat
