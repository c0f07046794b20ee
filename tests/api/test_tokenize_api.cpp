// vLLM's /tokenize and /detokenize (server/tokenize_api.h) and the chat-request options they share with
// /v1/chat/completions, on the shipped glm-demo tokenizer: GLM-5 and DeepSeek-V3.2 chat formats, every kind of
// bad input a 400 naming the field.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request.h"
#include "server/structured_output.h"
#include "server/tokenize_api.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

using Json = chat::Json;

class TokenizeApi : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { tok_ = new Tokenizer(Tokenizer::load(MEGACTX_DEFAULT_MODEL_DIR)); }
    static void TearDownTestSuite() { delete tok_; }

    RequestContext ctx(chat::ChatFormat format = chat::ChatFormat::kGlm5) const {
        RequestContext c;
        c.tokenizer = tok_;
        c.vocab_size = static_cast<int64_t>(tok_->vocab_size()) + 8;  // a model vocabulary with padding rows
        c.max_model_len = 512;
        c.served_model_name = "demo";
        c.chat_format = format;
        return c;
    }
    std::vector<bool> decodable() const {
        std::vector<bool> d(static_cast<size_t>(ctx().vocab_size), false);
        for (size_t i = 0; i < tok_->vocab_size(); ++i) d[i] = true;
        return d;
    }
    Json tokenize(const Json& body, chat::ChatFormat format = chat::ChatFormat::kGlm5) const {
        return tokenize_request(body.dump(), ctx(format));
    }
    std::string decode(const Json& tokens) const { return tok_->decode(tokens.get<std::vector<int32_t>>(), false); }

    // The status and param of the ApiError `fn` throws (0, "" when it does not throw).
    template <class F>
    static std::pair<int, std::string> error_of(F fn) {
        try {
            fn();
        } catch (const ApiError& e) {
            EXPECT_FALSE(std::string(e.what()).empty());
            return {e.status, e.param};
        }
        return {0, ""};
    }

    static Tokenizer* tok_;
};
Tokenizer* TokenizeApi::tok_ = nullptr;

TEST_F(TokenizeApi, PromptWithAndWithoutSpecialTokens) {
    const Json r = tokenize({{"prompt", "Hello world, hello megactx!"}});
    const std::vector<int32_t> ids = tok_->encode("Hello world, hello megactx!", true);
    EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), ids);
    EXPECT_EQ(r["count"], ids.size());
    EXPECT_EQ(r["max_model_len"], 512);
    EXPECT_TRUE(r["token_strs"].is_null());
    EXPECT_EQ(tokenize({{"prompt", "Hi"}, {"add_special_tokens", false}})["tokens"].get<std::vector<int32_t>>(),
              tok_->encode("Hi", false));
    const Json s = tokenize({{"prompt", "Hi there"}, {"return_token_strs", true}, {"model", "demo"}});
    ASSERT_EQ(s["token_strs"].size(), s["tokens"].size());
    for (size_t i = 0; i < s["tokens"].size(); ++i)
        EXPECT_EQ(s["token_strs"][i], tok_->token_str(s["tokens"][i].get<int32_t>()));
}

TEST_F(TokenizeApi, MessagesRenderAsChatCompletionsDoes) {
    const Json msgs = Json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])");
    const Json r = tokenize({{"messages", msgs}});
    EXPECT_EQ(decode(r["tokens"]),
              "[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>Be brief.<|user|>Hi<|assistant|><think>");
    EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(),
              tok_->encode(chat::render_glm5(chat::messages_from_json(msgs), Json(), {}), false));
    const Json off = tokenize({{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
    EXPECT_TRUE(decode(off["tokens"]).ends_with("<|assistant|><think></think>"));
    const Json no_gen = tokenize({{"messages", msgs}, {"add_generation_prompt", false}});
    EXPECT_TRUE(decode(no_gen["tokens"]).ends_with("<|user|>Hi"));
    const Json cont = tokenize({{"messages", Json::parse(R"([{"role":"user","content":"Count"},
                                                             {"role":"assistant","content":"1, 2,"}])")},
                                {"add_generation_prompt", false},
                                {"continue_final_message", true}});
    EXPECT_TRUE(decode(cont["tokens"]).ends_with("<|assistant|><think></think>1, 2,"));
}

TEST_F(TokenizeApi, DeepSeekV32MessagesToolsAndThinking) {
    const auto v32 = chat::ChatFormat::kDeepSeekV32;
    const Json msgs = Json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"}])");
    const Json tools = Json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])");
    // Chat mode unless thinking is asked for, by either kwarg.
    EXPECT_EQ(decode(tokenize({{"messages", msgs}}, v32)["tokens"]),
              "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜></think>");
    for (const char* key : {"thinking", "enable_thinking"})
        EXPECT_TRUE(decode(tokenize({{"messages", msgs}, {"chat_template_kwargs", {{key, true}}}}, v32)["tokens"])
                        .ends_with("<｜Assistant｜><think>"))
            << key;
    EXPECT_TRUE(decode(tokenize({{"messages", msgs}, {"thinking", {{"type", "enabled"}}}}, v32)["tokens"])
                    .ends_with("<think>"));
    const std::string with_tools = decode(tokenize({{"messages", msgs}, {"tools", tools}}, v32)["tokens"]);
    EXPECT_TRUE(with_tools.starts_with("<｜begin▁of▁sentence｜>S\n\n## Tools\n")) << with_tools;
    EXPECT_NE(with_tools.find("<functions>\n{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}\n</functions>\n"),
              std::string::npos);
}

TEST_F(TokenizeApi, BadTokenizeRequestsNameTheField) {
    const Json msgs = Json::parse(R"([{"role":"user","content":"Hi"}])");
    const auto err = [&](const std::string& body) { return error_of([&] { tokenize_request(body, ctx()); }); };
    const auto e = [&](const Json& body) { return err(body.dump()); };
    using P = std::pair<int, std::string>;
    EXPECT_EQ(err("{not json").first, 400);
    EXPECT_EQ(err("[1]").first, 400);
    EXPECT_EQ(e({{"prompt", "x"}, {"messages", msgs}}), P(400, "messages"));
    EXPECT_EQ(e(Json::object()), P(400, "prompt"));
    EXPECT_EQ(e({{"prompt", 5}}), P(400, "prompt"));
    EXPECT_EQ(e({{"prompt", Json::array({1, 2})}}), P(400, "prompt"));
    EXPECT_EQ(e({{"prompt", "x"}, {"add_special_tokens", "yes"}}), P(400, "add_special_tokens"));
    EXPECT_EQ(e({{"prompt", "x"}, {"return_token_strs", 1}}), P(400, "return_token_strs"));
    EXPECT_EQ(e({{"prompt", "x"}, {"model", "other"}}), P(404, "model"));
    EXPECT_EQ(e({{"messages", "hi"}}), P(400, "messages"));
    EXPECT_EQ(e({{"messages", Json::array()}}), P(400, "messages"));
    EXPECT_EQ(e({{"messages", Json::parse(R"([{"role":"wizard","content":"x"}])")}}), P(400, "messages"));
    EXPECT_EQ(e({{"messages", msgs}, {"tools", "none"}}), P(400, "tools"));
    EXPECT_EQ(e({{"messages", msgs}, {"chat_template_kwargs", {{"thinking", "on"}}}}), P(400, "chat_template_kwargs"));
    EXPECT_EQ(e({{"messages", msgs}, {"continue_final_message", true}}), P(400, "continue_final_message"));
    EXPECT_EQ(e({{"messages", msgs}, {"add_generation_prompt", false}, {"continue_final_message", true}}),
              P(400, "messages"));  // the last message is not an assistant turn
    std::string long_prompt;
    for (int i = 0; i < 600; ++i) long_prompt += " w" + std::to_string(i);
    EXPECT_EQ(e({{"prompt", long_prompt}}).first, 400);  // beyond max_model_len (512)
    // DeepSeek-V3.2: a tool result with no call to answer.
    EXPECT_EQ(error_of([&] {
                  tokenize(
                      {{"messages", Json::parse(R"([{"role":"user","content":"u"},{"role":"tool","content":"r"}])")}},
                      chat::ChatFormat::kDeepSeekV32);
              }),
              P(400, "messages"));
}

TEST_F(TokenizeApi, DetokenizeRoundTripsAndChecksIds) {
    const Json t = tokenize({{"prompt", "Round trip: é 日本 🙂"}, {"add_special_tokens", false}});
    const auto d = decodable();
    EXPECT_EQ(detokenize_request(Json{{"tokens", t["tokens"]}}.dump(), ctx(), d)["prompt"],
              "Round trip: é 日本 🙂");
    // Padding ids of the model's vocabulary decode to nothing.
    Json padded = t["tokens"];
    padded.push_back(ctx().vocab_size - 1);
    EXPECT_EQ(detokenize_request(Json{{"tokens", padded}}.dump(), ctx(), d)["prompt"], "Round trip: é 日本 🙂");
    EXPECT_EQ(detokenize_request(R"({"tokens": []})", ctx(), d)["prompt"], "");
    const auto e = [&](const std::string& body) { return error_of([&] { detokenize_request(body, ctx(), d); }); };
    using P = std::pair<int, std::string>;
    EXPECT_EQ(e("{}"), P(400, "tokens"));
    EXPECT_EQ(e(R"({"tokens": "1 2"})"), P(400, "tokens"));
    EXPECT_EQ(e(R"({"tokens": [1, "2"]})"), P(400, "tokens"));
    EXPECT_EQ(e(R"({"tokens": [1.5]})"), P(400, "tokens"));
    EXPECT_EQ(e(R"({"tokens": [-1]})"), P(400, "tokens"));
    EXPECT_EQ(e(Json{{"tokens", {ctx().vocab_size}}}.dump()), P(400, "tokens"));
    EXPECT_EQ(e(R"({"tokens": [18446744073709551615]})"), P(400, "tokens"));
    EXPECT_EQ(e(R"({"tokens": [1], "model": "x"})"), P(404, "model"));
}

TEST_F(TokenizeApi, ChatCompletionsOnDeepSeekV32ParseDsmlAndFollowThinking) {
    RequestContext c = ctx(chat::ChatFormat::kDeepSeekV32);
    c.max_model_len = 8192;  // the demo tokenizer has no DeepSeek special tokens: their text takes many tokens
    const std::string tools = R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
    ApiRequest p = parse_api_request(
        R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"tools":)" + tools + "}", true, c);
    EXPECT_TRUE(p.parser.parse_tool_calls);
    EXPECT_EQ(p.parser.tool_syntax, chat::ToolCallSyntax::kDsml);
    EXPECT_FALSE(p.parser.start_in_reasoning);
    p = parse_api_request(
        R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"chat_template_kwargs":{"thinking":true}})",
        true, c);
    EXPECT_TRUE(p.parser.start_in_reasoning);
    EXPECT_FALSE(p.parser.parse_tool_calls);
    EXPECT_TRUE(tok_->decode(p.prompt, false).ends_with("<｜User｜>Hi<｜Assistant｜><think>"));
    // Tool results in thinking mode end in <think> too; the parser starts in reasoning from the prompt.
    p = parse_api_request(R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,
        "tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"ok"}],
        "max_tokens":4,"chat_template_kwargs":{"thinking":true},"tools":)" +
                              tools + "}",
                          true, c);
    EXPECT_TRUE(p.parser.start_in_reasoning);
    EXPECT_TRUE(tok_->decode(p.prompt, false).ends_with("</function_results>\n\n<think>"));
}

TEST_F(TokenizeApi, DeepSeekV32ToolChoiceConstrainsToDsmlCalls) {
    RequestContext c = ctx(chat::ChatFormat::kDeepSeekV32);
    c.max_model_len = 8192;
    const std::string tools = R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"x":{"type":"integer"}},"required":["x"]}}}])";
    ApiRequest p = parse_api_request(
        R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"tool_choice":"required","tools":)" + tools +
            "}",
        true, c);
    EXPECT_EQ(p.constraint.kind, ConstraintSpec::Kind::kToolCalls);
    EXPECT_TRUE(p.constraint.dsml);
    ConstraintCompiler compiler(*tok_, {0});
    EXPECT_NE(compiler.compile(p.constraint, -1), nullptr);
    // Strict tools under tool_choice auto: text, then DSML calls held to the schema.
    const std::string strict =
        R"([{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object",
        "properties":{"x":{"type":"integer"}},"required":["x"]}}}])";
    p = parse_api_request(R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"tools":)" + strict + "}",
                          true, c);
    EXPECT_EQ(p.constraint.kind, ConstraintSpec::Kind::kToolCalls);
    EXPECT_TRUE(p.constraint.text_first);
    EXPECT_TRUE(p.constraint.dsml);
    // DeepSeek-V3's format has no tool-call syntax to constrain.
    EXPECT_EQ(error_of([&] {
                  parse_api_request(
                      R"({"messages":[{"role":"user","content":"Hi"}],"tool_choice":"required","tools":)" + tools + "}",
                      true, ctx(chat::ChatFormat::kDeepSeekV3));
              }).first,
              400);
}

}  // namespace
}  // namespace megactx
