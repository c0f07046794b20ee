#include "server/request.h"

#include <algorithm>
#include <optional>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "server/structured_output.h"

namespace megactx {

using Json = chat::Json;

std::string random_hex(size_t n) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::random_device rd;
    std::string s;
    while (s.size() < n) {
        uint32_t bits = rd();
        for (int i = 0; i < 8 && s.size() < n; ++i, bits >>= 4) s += kHex[bits & 15];
    }
    return s;
}

namespace {

// Typed reads of request fields; a wrong type or range is a 400 naming the field. Null counts as absent.
struct Fields {
    const Json& j;

    const Json* get(const char* key) const {
        const auto it = j.find(key);
        return it == j.end() || it->is_null() ? nullptr : &*it;
    }
    std::optional<double> number(const char* key, double lo, double hi) const {
        const Json* v = get(key);
        if (!v) return std::nullopt;
        if (!v->is_number()) throw ApiError(400, fmt::format("'{}' must be a number", key), key);
        const double x = v->get<double>();
        if (!(x >= lo && x <= hi))
            throw ApiError(400, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), key);
        return x;
    }
    std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
        const Json* v = get(key);
        if (!v) return std::nullopt;
        if (!v->is_number_integer()) throw ApiError(400, fmt::format("'{}' must be an integer", key), key);
        if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
            throw ApiError(400, fmt::format("'{}' is out of range", key), key);
        }
        const int64_t x = v->get<int64_t>();
        if (x < lo || x > hi) throw ApiError(400, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), key);
        return x;
    }
    std::optional<bool> boolean(const char* key) const {
        const Json* v = get(key);
        if (!v) return std::nullopt;
        if (!v->is_boolean()) throw ApiError(400, fmt::format("'{}' must be true or false", key), key);
        return v->get<bool>();
    }
    std::optional<std::string> string(const char* key) const {
        const Json* v = get(key);
        if (!v) return std::nullopt;
        if (!v->is_string()) throw ApiError(400, fmt::format("'{}' must be a string", key), key);
        return v->get<std::string>();
    }
};

// messages (+ tools, thinking switches) rendered in the chat format and tokenized; the output parser's settings.
void parse_chat_prompt(const Fields& f, const RequestContext& ctx, ApiRequest& p) {
    if (!ctx.tokenizer)
        throw ApiError(400, "this model has no tokenizer.json: use /v1/completions with token ids");
    const std::vector<chat::Message> messages = chat_messages_from_request(f.j);
    Json tools = tools_from_request(f.j);
    if (const Json* tc = f.get("tool_choice")) {
        // required / a named function: the output is tool calls in the model's format, under a grammar.
        std::string only;
        bool forced = false;
        if (tc->is_object()) {
            const Json* fn = Fields{*tc}.get("function");
            const auto name = fn && fn->is_object() ? Fields{*fn}.string("name") : std::nullopt;
            if (Fields{*tc}.string("type") != "function" || !name)
                throw ApiError(400, "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                                    "\"function\": {\"name\": ...}}", "tool_choice");
            only = *name;
            forced = true;
        } else if (!tc->is_string() || (*tc != "auto" && *tc != "none" && *tc != "required")) {
            throw ApiError(400, "tool_choice must be 'auto', 'none', 'required' or a named function", "tool_choice");
        }
        if (tc->is_string() && *tc == "none") tools = Json::array();
        if (tc->is_string() && *tc == "required") forced = true;
        if (forced) {
            if (tools.empty()) throw ApiError(400, "tool_choice requires a non-empty 'tools'", "tool_choice");
            if (ctx.chat_format == chat::ChatFormat::kDeepSeekV3)
                throw ApiError(400,
                               "tool_choice 'required' and named functions need the GLM-5 or DeepSeek-V3.2 chat "
                               "format",
                               "tool_choice");
            if (p.constraint.kind != ConstraintSpec::Kind::kNone)
                throw ApiError(400, fmt::format("tool_choice and '{}' both constrain the output: send one",
                                                p.constraint.param), "tool_choice");
            p.constraint.kind = ConstraintSpec::Kind::kToolCalls;
            p.constraint.dsml = ctx.chat_format == chat::ChatFormat::kDeepSeekV32;
            p.constraint.source = tools.dump();
            p.constraint.tool_name = only;
            p.constraint.single_call = !f.boolean("parallel_tool_calls").value_or(true);
            p.constraint.param = "tool_choice";
        }
    }
    // tool_choice auto with strict tools: free text, then calls held to the strict tools' schemas; with a
    // response_format (or another content constraint) as well, either content that follows it or the calls.
    const bool any_strict = std::any_of(tools.begin(), tools.end(), [](const Json& t) {
        const Json* fn = Fields{t}.get("function");
        return fn && fn->is_object() && Fields{*fn}.boolean("strict").value_or(false);
    });
    if (any_strict && p.constraint.kind != ConstraintSpec::Kind::kToolCalls &&
        ctx.chat_format != chat::ChatFormat::kDeepSeekV3) {
        ConstraintSpec calls;
        calls.kind = ConstraintSpec::Kind::kToolCalls;
        calls.dsml = ctx.chat_format == chat::ChatFormat::kDeepSeekV32;
        calls.source = tools.dump();
        calls.text_first = true;
        calls.param = "tools";
        if (p.constraint.kind != ConstraintSpec::Kind::kNone)
            calls.content = std::make_shared<const ConstraintSpec>(std::move(p.constraint));
        p.constraint = std::move(calls);
    }
    const chat::ChatOptions opt = chat_options_from_request(f.j, ctx.chat_format);
    const std::string prompt = render_chat_prompt(messages, tools, opt, ctx);
    p.prompt = ctx.tokenizer->encode(prompt, false);
    p.parser = chat::parser_options_for(ctx.chat_format, opt, tools);
    p.parser.start_in_reasoning = chat::prompt_opens_reasoning(prompt);
    p.parser.id_prefix = "call_" + random_hex(24) + "_";
    p.logprobs = f.boolean("logprobs").value_or(false);
    const auto top = f.integer("top_logprobs", 0, 20);
    if (top && !p.logprobs) throw ApiError(400, "'top_logprobs' requires 'logprobs': true", "top_logprobs");
    p.gen.top_logprobs = p.logprobs ? top.value_or(0) : -1;
}

// prompt: a string (tokenized with the special tokens) or token ids.
void parse_completion_prompt(const Fields& f, const RequestContext& ctx, ApiRequest& p) {
    const Json* pr = f.get("prompt");
    if (!pr) throw ApiError(400, "'prompt' is required", "prompt");
    const Json* one = pr;
    if (pr->is_array() && !pr->empty() && !(*pr)[0].is_number()) {
        if (pr->size() != 1)
            throw ApiError(400, "batched prompts are not supported: send one prompt", "prompt");
        one = &(*pr)[0];
    }
    if (one->is_string()) {
        if (!ctx.tokenizer)
            throw ApiError(400, "this model has no tokenizer.json: send the prompt as token ids", "prompt");
        p.prompt = ctx.tokenizer->encode(one->get<std::string>(), true);
    } else if (one->is_array()) {
        for (const auto& t : *one) {
            if (!t.is_number_integer()) throw ApiError(400, "'prompt' token ids must be integers", "prompt");
            const int64_t v = t.get<int64_t>();
            if (v < 0 || v >= ctx.vocab_size) {
                throw ApiError(400,
                               fmt::format("prompt token id {} is out of range (vocabulary size {})", v,
                                           ctx.vocab_size),
                               "prompt");
            }
            p.prompt.push_back(static_cast<int32_t>(v));
        }
    } else {
        throw ApiError(400, "'prompt' must be a string or a list of token ids", "prompt");
    }
    if (f.boolean("echo").value_or(false)) throw ApiError(400, "'echo' is not supported", "echo");
    if (const auto suffix = f.string("suffix"); suffix && !suffix->empty()) {
        throw ApiError(400, "'suffix' (fill-in-the-middle) is not supported", "suffix");
    }
    const auto lp = f.integer("logprobs", 0, 20);
    p.logprobs = lp.has_value();
    p.gen.top_logprobs = lp ? *lp : -1;
}

}  // namespace

std::string check_model_name(const Json& body, const RequestContext& ctx) {
    const std::string model = Fields{body}.string("model").value_or(ctx.served_model_name);
    if (model != ctx.served_model_name) {
        throw ApiError(404,
                       fmt::format("the model '{}' does not exist; this server serves '{}'", model,
                                   ctx.served_model_name),
                       "model", "model_not_found");
    }
    return model;
}

std::vector<chat::Message> chat_messages_from_request(const Json& body) {
    const Fields f{body};
    const Json* msgs = f.get("messages");
    if (!msgs) throw ApiError(400, "'messages' is required", "messages");
    if (!msgs->is_array() || msgs->empty())
        throw ApiError(400, "'messages' must be a non-empty array", "messages");
    try {
        return chat::messages_from_json(*msgs);
    } catch (const Error& e) {
        throw ApiError(400, e.what(), "messages");
    }
}

Json tools_from_request(const Json& body) {
    const Fields f{body};
    const Json* t = f.get("tools");
    if (!t) return Json::array();
    if (!t->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
    for (size_t i = 0; i < t->size(); ++i) {
        const Json& tool = (*t)[i];
        const std::string at = fmt::format("tools[{}]", i);
        if (!tool.is_object()) throw ApiError(400, at + " must be an object", "tools");
        const auto type = Fields{tool}.string("type");
        if (type != "function") throw ApiError(400, at + ".type must be 'function'", "tools");
        const Json* fn = Fields{tool}.get("function");
        if (!fn || !fn->is_object()) throw ApiError(400, at + ".function must be an object", "tools");
        const auto name = Fields{*fn}.string("name");
        if (!name || name->empty()) throw ApiError(400, at + ".function.name must be a non-empty string", "tools");
        if (const Json* params = Fields{*fn}.get("parameters"); params && !params->is_object()) {
            throw ApiError(400, at + ".function.parameters must be an object", "tools");
        }
    }
    return *t;
}

chat::ChatOptions chat_options_from_request(const Json& body, chat::ChatFormat format) {
    const Fields f{body};
    chat::ChatOptions opt;
    // DeepSeek-V3.2 answers in chat mode unless thinking is asked for (as vLLM serves it); GLM thinks by default.
    if (format == chat::ChatFormat::kDeepSeekV32) opt.enable_thinking = false;
    if (const auto effort = f.string("reasoning_effort")) {
        const std::string& e = *effort;
        if (e == "none" || e == "minimal") {
            opt.enable_thinking = false;
        } else if (e == "low" || e == "medium" || e == "high") {
            opt.reasoning_effort = chat::ReasoningEffort::kHigh;
        } else if (e == "max" || e == "xhigh") {
            opt.reasoning_effort = chat::ReasoningEffort::kMax;
        } else {
            throw ApiError(400,
                           "'reasoning_effort' must be one of max, high (or none, minimal, low, medium, xhigh)",
                           "reasoning_effort");
        }
    }
    if (const Json* th = f.get("thinking")) {  // GLM API: {"type": "enabled" | "disabled"}
        const auto type = th->is_object() ? Fields{*th}.string("type") : std::nullopt;
        if (!type || (*type != "enabled" && *type != "disabled")) {
            throw ApiError(400, "'thinking.type' must be 'enabled' or 'disabled'", "thinking");
        }
        opt.enable_thinking = *type == "enabled";
    }
    if (const Json* kw = f.get("chat_template_kwargs")) {
        if (!kw->is_object())
            throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
        const Fields k{*kw};
        const auto check = [](const char* key, auto read) {
            try {
                return read();
            } catch (const ApiError&) {
                throw ApiError(400, fmt::format("'chat_template_kwargs.{}' must be true or false", key),
                               "chat_template_kwargs");
            }
        };
        // `enable_thinking` (GLM, Qwen) and `thinking` (DeepSeek): either one true turns thinking on.
        const auto et = check("enable_thinking", [&] { return k.boolean("enable_thinking"); });
        const auto t = check("thinking", [&] { return k.boolean("thinking"); });
        if (et || t) opt.enable_thinking = et.value_or(false) || t.value_or(false);
        if (const auto ct = check("clear_thinking", [&] { return k.boolean("clear_thinking"); }))
            opt.clear_thinking = *ct;
    }
    opt.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
    opt.continue_final_message = f.boolean("continue_final_message").value_or(false);
    if (opt.add_generation_prompt && opt.continue_final_message) {
        throw ApiError(400, "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true",
                       "continue_final_message");
    }
    return opt;
}

std::string render_chat_prompt(const std::vector<chat::Message>& messages, const Json& tools,
                               const chat::ChatOptions& options, const RequestContext& ctx) {
    try {
        return chat::render_chat(ctx.chat_format, messages, tools, options);
    } catch (const Error& e) {
        throw ApiError(400, e.what(), "messages");
    }
}

ApiRequest parse_api_request(const std::string& text, bool chat, const RequestContext& ctx) {
    Json body;
    try {
        body = Json::parse(text);
    } catch (const std::exception& e) {
        throw ApiError(400, std::string("request body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw ApiError(400, "request body must be a JSON object");
    const Fields f{body};
    ApiRequest p;
    p.chat = chat;
    p.model = check_model_name(body, ctx);
    if (const auto n = f.integer("n", 1, 1 << 20); n && *n != 1) {
        throw ApiError(400, "only n = 1 is supported", "n");
    }
    if (const auto best_of = f.integer("best_of", 1, 1 << 20); best_of && *best_of != 1) {
        throw ApiError(400, "only best_of = 1 is supported", "best_of");
    }
    // OpenAI fields that would change the output and that this server does not implement: refused, never ignored.
    for (const char* key : {"functions", "function_call", "prediction", "audio"}) {
        if (f.get(key)) throw ApiError(400, fmt::format("'{}' is not supported", key), key);
    }
    if (const Json* m = f.get("modalities")) {
        if (!m->is_array() || std::any_of(m->begin(), m->end(), [](const Json& x) { return x != "text"; })) {
            throw ApiError(400, "only the 'text' modality is supported", "modalities");
        }
    }
    p.constraint = find_constraint(body);  // response_format and the peers' structured-output fields
    p.stream = f.boolean("stream").value_or(false);
    if (const Json* so = f.get("stream_options")) {
        if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
        p.include_usage = Fields{*so}.boolean("include_usage").value_or(false);
    }

    if (chat) {
        parse_chat_prompt(f, ctx, p);
    } else {
        parse_completion_prompt(f, ctx, p);
    }
    if (p.prompt.empty()) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt");

    // Sampling and limits
    const int64_t max_len = ctx.max_model_len;
    const auto n_prompt = static_cast<int64_t>(p.prompt.size());
    if (n_prompt >= max_len) {
        throw ApiError(400,
                       fmt::format("the prompt is {} tokens; the maximum context length is {}", n_prompt, max_len),
                       chat ? "messages" : "prompt", "context_length_exceeded");
    }
    auto max_tokens = f.integer("max_completion_tokens", 1, INT64_MAX);
    if (!max_tokens) max_tokens = f.integer("max_tokens", 1, INT64_MAX);
    p.gen.max_tokens = max_tokens.value_or(max_len - n_prompt);
    if (n_prompt + p.gen.max_tokens > max_len) {
        throw ApiError(400,
                       fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the maximum context "
                                   "length of {}",
                                   n_prompt, p.gen.max_tokens, max_len),
                       "max_tokens", "context_length_exceeded");
    }
    SamplingParams& sp = p.gen.sampling;
    sp.temperature = static_cast<float>(f.number("temperature", 0.0, 2.0).value_or(1.0));
    sp.top_p = static_cast<float>(f.number("top_p", 1e-9, 1.0).value_or(1.0));
    const int64_t top_k = f.integer("top_k", -1, 1 << 30).value_or(0);
    sp.top_k = top_k < 0 ? 0 : top_k;
    sp.min_p = static_cast<float>(f.number("min_p", 0.0, 1.0).value_or(0.0));
    sp.presence_penalty = static_cast<float>(f.number("presence_penalty", -2.0, 2.0).value_or(0.0));
    sp.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
    sp.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 1e-6, 100.0).value_or(1.0));
    if (const auto seed = f.integer("seed", INT64_MIN, INT64_MAX)) {
        sp.seed = static_cast<uint64_t>(*seed);
    } else {
        sp.seed = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
    }
    if (const Json* st = f.get("stop")) {
        if (st->is_string()) {
            p.stop.push_back(st->get<std::string>());
        } else if (st->is_array()) {
            for (const auto& s : *st) {
                if (!s.is_string()) throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
                p.stop.push_back(s.get<std::string>());
            }
        } else {
            throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
        }
    }
    p.gen.ignore_eos = f.boolean("ignore_eos").value_or(false);
    const auto token_id = [&](const Json& v, const char* param) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= ctx.vocab_size) {
            throw ApiError(400,
                           fmt::format("'{}': {} is not a token id (the vocabulary has {} tokens)", param, v.dump(),
                                       ctx.vocab_size),
                           param);
        }
        return static_cast<int32_t>(v.get<int64_t>());
    };
    if (const Json* ids = f.get("stop_token_ids")) {
        if (!ids->is_array()) throw ApiError(400, "'stop_token_ids' must be a list of token ids", "stop_token_ids");
        for (const Json& v : *ids) p.gen.stop_token_ids.push_back(token_id(v, "stop_token_ids"));
    }
    if (const Json* lb = f.get("logit_bias")) {  // OpenAI: {"token id": bias in [-100, 100]}, added to the logits
        if (!lb->is_object()) throw ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias");
        for (const auto& [key, bias] : lb->items()) {
            const bool digits = !key.empty() && key.size() <= 10 &&
                                std::all_of(key.begin(), key.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
            if (!digits) throw ApiError(400, fmt::format("'logit_bias' key '{}' is not a token id", key), "logit_bias");
            const int32_t id = token_id(Json(std::stoll(key)), "logit_bias");
            if (!bias.is_number() || !(bias.get<double>() >= -100.0 && bias.get<double>() <= 100.0)) {
                throw ApiError(400, fmt::format("'logit_bias' of token {} must be a number in [-100, 100]", key),
                               "logit_bias");
            }
            sp.logit_bias.emplace_back(id, static_cast<float>(bias.get<double>()));
        }
    }
    return p;
}

}  // namespace megactx
