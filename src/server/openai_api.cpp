#include "server/openai_api.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "server/stop_matcher.h"
#include "tokenizer/output_parser.h"

namespace megactx {

using Json = chat::Json;
using Clock = std::chrono::steady_clock;

std::string api_error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                           const std::string& code) {
    const ApiError e(status, message, param, code);
    Json err = {{"message", message}, {"type", type.empty() ? e.type : type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) err["param"] = param;
    if (!code.empty())
        err["code"] = code;
    else
        err["code"] = status;
    return Json{{"error", err}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

HttpResponse json_response(int status, const Json& body) {
    HttpResponse r;
    r.status = status;
    r.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
    return r;
}

HttpResponse error_response(const ApiError& e) {
    HttpResponse r;
    r.status = e.status;
    r.body = api_error_body(e.status, e.what(), e.type, e.param, e.code);
    return r;
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

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

struct Piece {
    std::string text;
    int32_t token = -1;
    TokenLogprobs logprobs;
    bool has_logprobs = false;
};

// A parsed, validated request.
struct Parsed {
    bool chat = false, stream = false, include_usage = false;
    std::vector<int32_t> prompt;
    GenerationParams gen;
    std::vector<std::string> stop;
    bool logprobs = false;
    chat::ParserOptions parser;
    std::string model;
};

std::string token_text(const Tokenizer* tok, const std::vector<bool>& decodable, int32_t id) {
    if (!tok || id < 0 || static_cast<size_t>(id) >= decodable.size() || !decodable[static_cast<size_t>(id)]) return "";
    const int32_t one[1] = {id};
    return tok->decode(std::span<const int32_t>(one, 1), false);
}

Json bytes_of(const std::string& s) {
    Json b = Json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

Json chat_logprob_entry(const Tokenizer* tok, const std::vector<bool>& decodable, const Piece& p) {
    const std::string t = token_text(tok, decodable, p.token);
    Json top = Json::array();
    for (const auto& [id, lp] : p.logprobs.top) {
        const std::string s = token_text(tok, decodable, id);
        top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
    }
    return {{"token", t}, {"logprob", p.logprobs.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}};
}

const char* finish_name(FinishReason r, bool tool_calls) {
    if (r == FinishReason::kLength) return "length";
    if (r == FinishReason::kCancelled) return "abort";
    return tool_calls ? "tool_calls" : "stop";
}

}  // namespace

struct OpenAiApi::Pending {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Piece> pieces;
    bool done = false;
    FinishReason finish = FinishReason::kNone;
    std::string error;
    int64_t n_prompt = 0, n_cached = 0, n_generated = 0;
    bool client_gone = false;
    // engine-thread state
    std::unique_ptr<StreamDecoder> decoder;
    StopMatcher stop;
    bool stopped = false;
    Clock::time_point t_start = Clock::now(), t_first, t_last;

    explicit Pending(std::vector<std::string> stops) : stop(std::move(stops)) {}
};

OpenAiApi::OpenAiApi(Engine& engine, const Tokenizer* tokenizer, const ApiConfig& config)
    : engine_(engine), tokenizer_(tokenizer), config_(config) {
    if (tokenizer_) {
        decodable_.assign(static_cast<size_t>(engine_.model().config().vocab_size), false);
        for (size_t id = 0; id < decodable_.size() && id < tokenizer_->vocab_size(); ++id) {
            try {
                tokenizer_->token_str(static_cast<int32_t>(id));  // Error for an id the tokenizer lacks
                decodable_[id] = true;
            } catch (const Error&) {
            }
        }
    }
    metrics_.counter("megactx_requests_total", "Finished HTTP API requests by status code");
    metrics_.counter("megactx_prompt_tokens_total", "Prompt tokens of finished requests");
    metrics_.counter("megactx_generation_tokens_total", "Generated tokens of finished requests");
    metrics_.counter("megactx_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache");
    metrics_.histogram("megactx_time_to_first_token_seconds", "Time to first token",
                       {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
    metrics_.histogram("megactx_time_per_output_token_seconds", "Mean time between output tokens of a request",
                       {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
    metrics_.histogram("megactx_e2e_request_latency_seconds", "Request latency",
                       {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
    Engine* e = &engine_;
    metrics_.gauge("megactx_requests_running", "Requests in the running batch", [e] { return e->stats().running; });
    metrics_.gauge("megactx_requests_waiting", "Requests waiting for admission", [e] { return e->stats().waiting; });
    metrics_.gauge("megactx_kv_blocks_used", "KV cache blocks in use (64 tokens each)",
                   [e] { return e->stats().kv_blocks_used; });
    metrics_.gauge("megactx_kv_blocks_total", "KV cache blocks", [e] { return e->stats().kv_blocks_total; });
    metrics_.gauge("megactx_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / prompt tokens", [e] {
        const EngineStats s = e->stats();
        return s.prefix_query_tokens ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_query_tokens : 0.0;
    });
    metrics_.gauge("megactx_engine_alive", "1 while the engine loop runs", [e] { return e->alive() ? 1.0 : 0.0; });
    metrics_.gauge("megactx_decode_graph_replays", "Decode steps replayed from recorded CUDA graphs",
                   [e] { return e->stats().graph_replays; });
    metrics_.gauge("megactx_decode_graphs", "Recorded decode graphs kept", [e] { return e->stats().graphs; });
    metrics_.gauge("megactx_decode_graph_bytes", "Device memory the kept decode graphs reserve",
                   [e] { return e->stats().graph_bytes; });
}

void OpenAiApi::check_auth(const HttpRequest& req) const {
    if (config_.api_key.empty()) return;
    if (req.header("authorization") != "Bearer " + config_.api_key) {
        throw ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
    }
}

HttpResponse OpenAiApi::models(const HttpRequest& req) {
    try {
        check_auth(req);
    } catch (const ApiError& e) {
        return error_response(e);
    }
    const Json m = {{"id", config_.served_model_name},
                    {"object", "model"},
                    {"created", unix_now()},
                    {"owned_by", "megactx"},
                    {"max_model_len", engine_.max_model_len()}};
    return json_response(200, Json{{"object", "list"}, {"data", Json::array({m})}});
}

HttpResponse OpenAiApi::health(const HttpRequest&) {
    if (closed_.load()) return json_response(503, Json{{"status", "shutting down"}});
    if (!engine_.alive()) return json_response(503, Json{{"status", "engine stopped"}});
    return json_response(200, Json{{"status", "ok"}});
}

HttpResponse OpenAiApi::metrics(const HttpRequest&) {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_.render();
    return r;
}

HttpResponse OpenAiApi::chat_completions(const HttpRequest& req) { return handle(req, true); }
HttpResponse OpenAiApi::completions(const HttpRequest& req) { return handle(req, false); }

HttpResponse OpenAiApi::handle(const HttpRequest& req, bool is_chat) {
    auto count = [this](int status) {
        metrics_.inc("megactx_requests_total", 1, fmt::format("status=\"{}\"", status));
    };
    try {
        if (closed_.load()) throw ApiError(503, "the server is shutting down");
        if (!engine_.alive()) throw ApiError(503, "the engine has stopped; the server cannot generate");
        check_auth(req);
        Json body;
        try {
            body = Json::parse(req.body);
        } catch (const std::exception& e) {
            throw ApiError(400, std::string("request body is not valid JSON: ") + e.what());
        }
        if (!body.is_object()) throw ApiError(400, "request body must be a JSON object");
        const Fields f{body};
        Parsed p;
        p.chat = is_chat;
        p.model = f.string("model").value_or(config_.served_model_name);
        if (p.model != config_.served_model_name) {
            throw ApiError(404,
                           fmt::format("the model '{}' does not exist; this server serves '{}'", p.model,
                                       config_.served_model_name),
                           "model", "model_not_found");
        }
        if (const auto n = f.integer("n", 1, 1 << 20); n && *n != 1) {
            throw ApiError(400, "only n = 1 is supported", "n");
        }
        p.stream = f.boolean("stream").value_or(false);
        if (const Json* so = f.get("stream_options")) {
            if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
            p.include_usage = Fields{*so}.boolean("include_usage").value_or(false);
        }

        // Prompt
        if (is_chat) {
            if (!tokenizer_)
                throw ApiError(400, "this model has no tokenizer.json: use /v1/completions with token ids");
            const Json* msgs = f.get("messages");
            if (!msgs) throw ApiError(400, "'messages' is required", "messages");
            if (!msgs->is_array() || msgs->empty())
                throw ApiError(400, "'messages' must be a non-empty array", "messages");
            std::vector<chat::Message> messages;
            try {
                messages = chat::messages_from_json(*msgs);
            } catch (const Error& e) {
                throw ApiError(400, e.what(), "messages");
            }
            Json tools = Json::array();
            if (const Json* t = f.get("tools")) {
                if (!t->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
                tools = *t;
            }
            if (const Json* tc = f.get("tool_choice")) {
                if (!tc->is_string() || (*tc != "auto" && *tc != "none")) {
                    throw ApiError(400, "only tool_choice 'auto' and 'none' are supported", "tool_choice");
                }
                if (*tc == "none") tools = Json::array();
            }
            chat::ChatOptions opt;
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
                if (const auto et = Fields{*kw}.boolean("enable_thinking")) opt.enable_thinking = *et;
                if (const auto ct = Fields{*kw}.boolean("clear_thinking")) opt.clear_thinking = *ct;
            }
            std::string prompt;
            try {
                prompt = chat::render_chat(config_.chat_format, messages, tools, opt);
            } catch (const Error& e) {
                throw ApiError(400, e.what(), "messages");
            }
            p.prompt = tokenizer_->encode(prompt, false);
            p.parser = chat::parser_options_for(config_.chat_format, opt, tools);
            p.parser.id_prefix = fmt::format("call_{}_", next_id_.fetch_add(1));
            p.logprobs = f.boolean("logprobs").value_or(false);
            const auto top = f.integer("top_logprobs", 0, 20);
            if (top && !p.logprobs) throw ApiError(400, "'top_logprobs' requires 'logprobs': true", "top_logprobs");
            p.gen.top_logprobs = p.logprobs ? top.value_or(0) : -1;
        } else {
            const Json* pr = f.get("prompt");
            if (!pr) throw ApiError(400, "'prompt' is required", "prompt");
            const Json* one = pr;
            if (pr->is_array() && !pr->empty() && !(*pr)[0].is_number()) {
                if (pr->size() != 1)
                    throw ApiError(400, "batched prompts are not supported: send one prompt", "prompt");
                one = &(*pr)[0];
            }
            if (one->is_string()) {
                if (!tokenizer_)
                    throw ApiError(400, "this model has no tokenizer.json: send the prompt as token ids", "prompt");
                p.prompt = tokenizer_->encode(one->get<std::string>(), true);
            } else if (one->is_array()) {
                for (const auto& t : *one) {
                    if (!t.is_number_integer()) throw ApiError(400, "'prompt' token ids must be integers", "prompt");
                    const int64_t v = t.get<int64_t>();
                    if (v < 0 || v >= engine_.model().config().vocab_size) {
                        throw ApiError(400,
                                       fmt::format("prompt token id {} is out of range (vocabulary size {})", v,
                                                   engine_.model().config().vocab_size),
                                       "prompt");
                    }
                    p.prompt.push_back(static_cast<int32_t>(v));
                }
            } else {
                throw ApiError(400, "'prompt' must be a string or a list of token ids", "prompt");
            }
            if (f.boolean("echo").value_or(false)) throw ApiError(400, "'echo' is not supported", "echo");
            const auto lp = f.integer("logprobs", 0, 20);
            p.logprobs = lp.has_value();
            p.gen.top_logprobs = lp ? *lp : -1;
        }
        if (p.prompt.empty()) throw ApiError(400, "the prompt is empty", is_chat ? "messages" : "prompt");

        // Sampling and limits
        const int64_t max_len = engine_.max_model_len();
        const auto n_prompt = static_cast<int64_t>(p.prompt.size());
        if (n_prompt >= max_len) {
            throw ApiError(400,
                           fmt::format("the prompt is {} tokens; the maximum context length is {}", n_prompt, max_len),
                           is_chat ? "messages" : "prompt", "context_length_exceeded");
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
        if (engine_.stats().waiting >= config_.max_waiting) {
            throw ApiError(429, fmt::format("too many requests are waiting ({}); retry later", config_.max_waiting));
        }

        // Submit
        auto pending = std::make_shared<Pending>(p.stop);
        if (tokenizer_) pending->decoder = std::make_unique<StreamDecoder>(*tokenizer_, true);
        TokenSink sink = [pending, decodable = &decodable_](const TokenEvent& ev) -> bool {
            std::lock_guard<std::mutex> lock(pending->mu);
            Pending& s = *pending;
            if (ev.token >= 0) {
                if (s.client_gone) return false;
                if (s.n_generated == 0) s.t_first = Clock::now();
                s.t_last = Clock::now();
                s.n_generated = ev.n_generated;
                Piece piece;
                piece.token = ev.token;
                piece.logprobs = ev.logprobs;
                piece.has_logprobs = ev.has_logprobs;
                bool matched = false;
                // An id the tokenizer lacks adds no text (StreamDecoder would throw, on the engine thread).
                if (s.decoder && (*decodable)[static_cast<size_t>(ev.token)]) {
                    piece.text = s.stop.push(s.decoder->push(ev.token), &matched);
                }
                s.pieces.push_back(std::move(piece));
                s.cv.notify_all();
                if (matched) s.stopped = true;
                return !matched;
            }
            if (!s.stopped && s.decoder) {
                bool matched = false;
                std::string tail = s.stop.push(s.decoder->flush(), &matched);
                if (!matched) tail += s.stop.flush();
                if (!tail.empty()) s.pieces.push_back(Piece{tail, -1, {}, false});
            }
            s.done = true;
            s.finish = ev.finish;
            s.error = ev.error;
            s.n_prompt = ev.n_prompt;
            s.n_cached = ev.n_cached_prompt;
            s.n_generated = ev.n_generated;
            s.cv.notify_all();
            return true;
        };
        int64_t id;
        try {
            id = engine_.submit(p.prompt, p.gen, sink);
        } catch (const Error& e) {
            if (!engine_.alive()) throw ApiError(503, e.what());
            throw ApiError(400, e.what());
        }

        const std::string rid = fmt::format("{}-{}", is_chat ? "chatcmpl" : "cmpl", next_id_.fetch_add(1));
        const int64_t created = unix_now();
        auto record = [this, count](const Pending& s) {
            count(s.finish == FinishReason::kError ? 500 : 200);
            metrics_.inc("megactx_prompt_tokens_total", static_cast<double>(s.n_prompt));
            metrics_.inc("megactx_generation_tokens_total", static_cast<double>(s.n_generated));
            metrics_.inc("megactx_prefix_cache_hit_tokens_total", static_cast<double>(s.n_cached));
            const auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
            if (s.n_generated > 0) {
                metrics_.observe("megactx_time_to_first_token_seconds", secs(s.t_first - s.t_start));
                if (s.n_generated > 1) {
                    metrics_.observe("megactx_time_per_output_token_seconds",
                                     secs(s.t_last - s.t_first) / static_cast<double>(s.n_generated - 1));
                }
            }
            metrics_.observe("megactx_e2e_request_latency_seconds", secs(Clock::now() - s.t_start));
        };
        auto usage = [](const Pending& s) {
            return Json{{"prompt_tokens", s.n_prompt},
                        {"completion_tokens", s.n_generated},
                        {"total_tokens", s.n_prompt + s.n_generated},
                        {"prompt_tokens_details", {{"cached_tokens", s.n_cached}}}};
        };

        if (!p.stream) {
            std::unique_lock<std::mutex> lock(pending->mu);
            pending->cv.wait(lock, [&] { return pending->done; });
            record(*pending);
            if (pending->finish == FinishReason::kError) throw ApiError(500, "generation failed: " + pending->error);
            std::string text;
            Json lp_content = Json::array();
            Json c_tokens = Json::array(), c_lps = Json::array(), c_top = Json::array();
            for (const Piece& pc : pending->pieces) {
                text += pc.text;
                if (pc.token < 0 || !pc.has_logprobs) continue;
                if (is_chat) {
                    lp_content.push_back(chat_logprob_entry(tokenizer_, decodable_, pc));
                } else {
                    c_tokens.push_back(token_text(tokenizer_, decodable_, pc.token));
                    c_lps.push_back(pc.logprobs.logprob);
                    Json top = Json::object();
                    for (const auto& [tid, l] : pc.logprobs.top) top[token_text(tokenizer_, decodable_, tid)] = l;
                    c_top.push_back(top);
                }
            }
            Json choice = {{"index", 0}};
            if (is_chat) {
                const chat::ParsedOutput out = chat::parse_output(text, p.parser);
                Json msg = out.to_openai_message();
                msg["role"] = "assistant";
                choice["message"] = msg;
                choice["logprobs"] = p.logprobs ? Json{{"content", lp_content}} : Json(nullptr);
                choice["finish_reason"] = finish_name(pending->finish, !out.tool_calls.empty());
            } else {
                choice["text"] = text;
                choice["logprobs"] =
                    p.logprobs ? Json{{"tokens", c_tokens}, {"token_logprobs", c_lps}, {"top_logprobs", c_top}}
                               : Json(nullptr);
                choice["finish_reason"] = finish_name(pending->finish, false);
            }
            return json_response(200, Json{{"id", rid},
                                           {"object", is_chat ? "chat.completion" : "text_completion"},
                                           {"created", created},
                                           {"model", p.model},
                                           {"choices", Json::array({choice})},
                                           {"usage", usage(*pending)}});
        }

        HttpResponse r;
        r.content_type = "text/event-stream";
        r.stream = [this, pending, id, p, rid, created, record, usage](const ChunkWriter& write) {
            bool ok = true;
            auto chunk = [&](Json choice_delta, const Json& finish, const Json& logprobs) {
                Json choice = {{"index", 0}};
                if (p.chat) {
                    choice["delta"] = std::move(choice_delta);
                } else {
                    choice["text"] = choice_delta.is_string() ? choice_delta : Json("");
                }
                choice["logprobs"] = logprobs;
                choice["finish_reason"] = finish;
                const Json j = {{"id", rid},
                                {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
                                {"created", created},
                                {"model", p.model},
                                {"choices", Json::array({choice})}};
                ok = ok && write("data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n");
            };
            std::unique_ptr<chat::StreamingOutputParser> parser;
            bool any_tool_call = false;
            if (p.chat) {
                parser = std::make_unique<chat::StreamingOutputParser>(p.parser);
                chunk(Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
            }
            auto emit_text = [&](const std::string& text, const Json& logprobs) {
                if (!p.chat) {
                    if (!text.empty() || !logprobs.is_null()) chunk(Json(text), nullptr, logprobs);
                    return;
                }
                const std::vector<chat::StreamDelta> deltas = parser->feed(text);
                bool sent_lp = false;
                for (const auto& d : deltas) {
                    any_tool_call |= d.kind == chat::StreamDelta::Kind::kToolCallBegin;
                    chunk(d.to_openai(), nullptr, sent_lp ? Json(nullptr) : logprobs);
                    sent_lp = true;
                }
                if (!sent_lp && !logprobs.is_null()) chunk(Json::object(), nullptr, logprobs);
            };
            for (;;) {
                std::deque<Piece> batch;
                bool done;
                {
                    std::unique_lock<std::mutex> lock(pending->mu);
                    pending->cv.wait(lock, [&] { return pending->done || !pending->pieces.empty(); });
                    batch.swap(pending->pieces);
                    done = pending->done;
                }
                for (const Piece& pc : batch) {
                    Json lp = nullptr;
                    if (p.logprobs && pc.token >= 0 && pc.has_logprobs) {
                        if (p.chat) {
                            lp = Json{{"content", Json::array({chat_logprob_entry(tokenizer_, decodable_, pc)})}};
                        } else {
                            Json top = Json::object();
                            for (const auto& [tid, l] : pc.logprobs.top)
                                top[token_text(tokenizer_, decodable_, tid)] = l;
                            lp = Json{{"tokens", Json::array({token_text(tokenizer_, decodable_, pc.token)})},
                                      {"token_logprobs", Json::array({pc.logprobs.logprob})},
                                      {"top_logprobs", Json::array({top})}};
                        }
                    }
                    emit_text(pc.text, lp);
                }
                if (!ok) {  // the client went away: cancel, the engine frees its blocks at the next step
                    {
                        std::lock_guard<std::mutex> lock(pending->mu);
                        pending->client_gone = true;
                    }
                    engine_.cancel(id);
                    std::unique_lock<std::mutex> lock(pending->mu);
                    pending->cv.wait(lock, [&] { return pending->done; });
                    record(*pending);
                    return;
                }
                if (done) break;
            }
            if (pending->finish == FinishReason::kError) {
                write("data: " + api_error_body(500, "generation failed: " + pending->error) + "\n\n");
                write("data: [DONE]\n\n");
                record(*pending);
                return;
            }
            if (parser) {
                for (const auto& d : parser->finish()) {
                    any_tool_call |= d.kind == chat::StreamDelta::Kind::kToolCallBegin;
                    chunk(d.to_openai(), nullptr, nullptr);
                }
            }
            chunk(p.chat ? Json::object() : Json(""), finish_name(pending->finish, any_tool_call), nullptr);
            if (p.include_usage) {
                const Json j = {{"id", rid},
                                {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
                                {"created", created},
                                {"model", p.model},
                                {"choices", Json::array()},
                                {"usage", usage(*pending)}};
                write("data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n");
            }
            write("data: [DONE]\n\n");
            record(*pending);
        };
        return r;
    } catch (const ApiError& e) {
        count(e.status);
        return error_response(e);
    } catch (const std::exception& e) {
        count(500);
        return error_response(ApiError(500, std::string("internal error: ") + e.what()));
    }
}

}  // namespace megactx
