#include "server/tokenize_api.h"

#include "core/error.h"
#include "server/api_error.h"

namespace megactx {

using Json = chat::Json;

namespace {

// The body as a JSON object, with the model checked as the other endpoints check it.
Json request_object(const std::string& text, const RequestContext& ctx) {
    Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) throw ApiError(400, "request body is not valid JSON");
    if (!body.is_object()) throw ApiError(400, "request body must be a JSON object");
    check_model_name(body, ctx);
    if (!ctx.tokenizer) throw ApiError(400, "this model has no tokenizer.json: there is nothing to tokenize with");
    return body;
}

// An optional boolean field (null counts as absent).
bool flag(const Json& body, const char* key, bool fallback) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) throw ApiError(400, fmt::format("'{}' must be true or false", key), key);
    return it->get<bool>();
}

bool present(const Json& body, const char* key) {
    const auto it = body.find(key);
    return it != body.end() && !it->is_null();
}

}  // namespace

Json tokenize_request(const std::string& text, const RequestContext& ctx) {
    const Json body = request_object(text, ctx);
    const bool has_prompt = present(body, "prompt"), has_messages = present(body, "messages");
    if (has_prompt && has_messages) throw ApiError(400, "send either 'prompt' or 'messages', not both", "messages");
    if (!has_prompt && !has_messages) throw ApiError(400, "'prompt' or 'messages' is required", "prompt");

    std::vector<int32_t> ids;
    if (has_prompt) {
        if (!body["prompt"].is_string()) throw ApiError(400, "'prompt' must be a string", "prompt");
        ids =
            ctx.tokenizer->encode(body["prompt"].get_ref<const std::string&>(), flag(body, "add_special_tokens", true));
    } else {
        // The prompt /v1/chat/completions would send to the model; its special tokens are in the text already.
        const std::vector<chat::Message> messages = chat_messages_from_request(body);
        const Json tools = tools_from_request(body);
        const chat::ChatOptions options = chat_options_from_request(body, ctx.chat_format);
        const std::string prompt = render_chat_prompt(messages, tools, options, ctx);
        ids = ctx.tokenizer->encode(prompt, flag(body, "add_special_tokens", false));
    }
    const bool strs = flag(body, "return_token_strs", false);
    const auto n = static_cast<int64_t>(ids.size());
    if (n > ctx.max_model_len) {
        throw ApiError(400,
                       fmt::format("the prompt is {} tokens; the maximum context length is {}", n, ctx.max_model_len),
                       has_prompt ? "prompt" : "messages", "context_length_exceeded");
    }
    Json out = {{"count", n}, {"max_model_len", ctx.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
    if (strs) {
        Json s = Json::array();
        for (int32_t id : ids) s.push_back(ctx.tokenizer->token_str(id));
        out["token_strs"] = std::move(s);
    }
    return out;
}

Json detokenize_request(const std::string& text, const RequestContext& ctx, const std::vector<bool>& decodable) {
    const Json body = request_object(text, ctx);
    if (!present(body, "tokens")) throw ApiError(400, "'tokens' is required", "tokens");
    const Json& tokens = body["tokens"];
    if (!tokens.is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    ids.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        const Json& t = tokens[i];
        if (!t.is_number_integer())
            throw ApiError(400, fmt::format("'tokens[{}]' must be an integer token id, got {}", i, t.dump()), "tokens");
        const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(ctx.vocab_size)
                                                     : t.get<int64_t>() >= 0 && t.get<int64_t>() < ctx.vocab_size;
        if (!in_range) {
            throw ApiError(400,
                           fmt::format("'tokens[{}]': {} is not a token id (the vocabulary has {} tokens)", i, t.dump(),
                                       ctx.vocab_size),
                           "tokens");
        }
        const auto id = static_cast<int32_t>(t.get<int64_t>());
        if (static_cast<size_t>(id) < decodable.size() && decodable[static_cast<size_t>(id)]) ids.push_back(id);
    }
    return {{"prompt", ctx.tokenizer->decode(ids, false)}};
}

}  // namespace megactx
