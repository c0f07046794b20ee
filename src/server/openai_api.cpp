#include "server/openai_api.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "core/error.h"
#include "server/api_error.h"
#include "server/output_text.h"
#include "server/request.h"
#include "server/tokenize_api.h"
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

struct Piece {
    std::string text;
    int32_t token = -1;
    TokenLogprobs logprobs;
    bool has_logprobs = false;
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
    SpecStats spec;  // speculative decoding's counts (no verifications without --speculative-tokens)
    bool client_gone = false;
    // engine-thread state
    std::unique_ptr<OutputText> text;  // null without a tokenizer: token ids only
    Clock::time_point t_start = Clock::now(), t_first, t_last;
};

OpenAiApi::OpenAiApi(Engine& engine, const Tokenizer* tokenizer, const ApiConfig& config)
    : engine_(engine), tokenizer_(tokenizer), config_(config) {
    if (tokenizer_) {
        decodable_ = decodable_ids(*tokenizer_, engine_.model().config().vocab_size);
        const auto& eos = engine_.model().config().eos_token_ids;
        constraints_ = std::make_unique<ConstraintCompiler>(*tokenizer_, std::vector<int32_t>(eos.begin(), eos.end()));
    }
    metrics_.counter("megactx_requests_total", "Finished HTTP API requests by status code");
    metrics_.counter("megactx_requests_aborted_total", "Requests cancelled because the client went away");
    metrics_.counter("megactx_http_client_errors_total", "HTTP responses with a 4xx status, by status");
    metrics_.histogram("megactx_time_to_first_token_seconds", "Time to first token",
                       {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
    metrics_.histogram("megactx_time_per_output_token_seconds", "Mean time between output tokens of a request",
                       {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
    metrics_.histogram("megactx_e2e_request_latency_seconds", "Request latency",
                       {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
    Engine* e = &engine_;
    // Engine counters, read at scrape time: they move every step, not when a request ends.
    metrics_.counter("megactx_prompt_tokens_total", "Prompt tokens of admitted requests",
                     [e] { return e->stats().prompt_tokens; });
    metrics_.counter("megactx_generation_tokens_total", "Generated tokens",
                     [e] { return e->stats().generation_tokens; });
    metrics_.counter("megactx_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache",
                     [e] { return e->stats().prefix_hit_tokens; });
    metrics_.counter("megactx_preemptions_total", "Running requests preempted for KV blocks (recomputed later)",
                     [e] { return e->stats().preemptions; });
    metrics_.counter("megactx_engine_steps_total", "Engine steps run", [e] { return e->stats().steps; });
    metrics_.counter("megactx_engine_step_seconds_total", "Wall time of the engine steps",
                     [e] { return e->stats().step_s; });
    metrics_.gauge("megactx_requests_running", "Requests in the running batch", [e] { return e->stats().running; });
    metrics_.gauge("megactx_requests_waiting", "Requests waiting for admission", [e] { return e->stats().waiting; });
    metrics_.gauge("megactx_kv_blocks_used", "KV cache blocks in use (64 tokens each)",
                   [e] { return e->stats().kv_blocks_used; });
    metrics_.gauge("megactx_kv_blocks_total", "KV cache blocks", [e] { return e->stats().kv_blocks_total; });
    // The host KV tier (--kv-offload-memory; zero without one).
    metrics_.gauge("megactx_kv_device_tier_blocks_used", "KV blocks whose latent rows are on the device (host tier on)",
                   [e] { return e->stats().kv_device_blocks_used; });
    metrics_.gauge("megactx_kv_host_tier_blocks_used", "KV blocks whose latent rows are in the host tier",
                   [e] { return e->stats().kv_host_blocks_used; });
    metrics_.gauge("megactx_kv_host_tier_blocks_total", "Blocks of the host KV tier",
                   [e] { return e->stats().kv_host_blocks; });
    metrics_.counter("megactx_kv_fetched_bytes_total", "Latent bytes sparse attention fetched from the host tier",
                     [e] { return e->stats().kv_fetched_bytes; });
    metrics_.counter("megactx_kv_device_rows_selected_total",
                     "Latent rows (x layers) sparse attention selected that were on the device",
                     [e] { return e->stats().kv_selected_device_rows; });
    metrics_.counter("megactx_kv_host_rows_fetched_total",
                     "Latent rows (x layers) sparse attention selected that were fetched from the host tier",
                     [e] { return e->stats().kv_fetched_rows; });
    metrics_.counter("megactx_kv_fetch_stall_seconds_total",
                     "Time the compute waited for latent rows fetched from the host tier (the fetch stall)",
                     [e] { return e->stats().kv_fetch_stall_s; });
    metrics_.counter("megactx_kv_promotions_total", "KV blocks moved from the host tier to the device",
                     [e] { return e->stats().kv_promotions; });
    metrics_.counter("megactx_kv_demotions_total", "KV blocks moved from the device to the host tier",
                     [e] { return e->stats().kv_demotions; });
    metrics_.counter("megactx_kv_promotions_unread_total",
                     "KV blocks promoted to the device that the next step did not select",
                     [e] { return e->stats().kv_promotions_unread; });
    metrics_.gauge("megactx_kv_promotion_limit",
                   "Host blocks the next step may promote (halved while promotions go unread)",
                   [e] { return e->stats().kv_promotion_limit; });
    metrics_.gauge("megactx_kv_hot_set_hit_rate", "Selected latent rows found on the device / selected rows", [e] {
        const EngineStats s = e->stats();
        const int64_t all = s.kv_selected_device_rows + s.kv_fetched_rows;
        return all > 0 ? static_cast<double>(s.kv_selected_device_rows) / static_cast<double>(all) : 1.0;
    });
    metrics_.gauge("megactx_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / prompt tokens", [e] {
        const EngineStats s = e->stats();
        return s.prefix_query_tokens ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_query_tokens : 0.0;
    });
    metrics_.gauge("megactx_engine_alive", "1 while the engine loop runs", [e] { return e->alive() ? 1.0 : 0.0; });
    metrics_.counter("megactx_decode_graph_replays_total", "Decode steps replayed from recorded CUDA graphs",
                     [e] { return e->stats().graph_replays; });
    metrics_.gauge("megactx_decode_graphs", "Recorded decode graphs kept", [e] { return e->stats().graphs; });
    metrics_.counter("megactx_spec_decode_draft_tokens_total", "MTP draft tokens proposed",
                     [e] { return e->stats().spec.drafted; });
    metrics_.counter("megactx_spec_decode_accepted_tokens_total", "MTP draft tokens accepted",
                     [e] { return e->stats().spec.accepted; });
    metrics_.counter("megactx_spec_decode_verifications_total", "Target forwards that verified drafts",
                     [e] { return e->stats().spec.verifications; });
    metrics_.counter("megactx_spec_decode_draft_tokens_by_position_total",
                     "MTP draft tokens proposed at each draft position (finished requests)");
    metrics_.counter("megactx_spec_decode_accepted_tokens_by_position_total",
                     "MTP draft tokens accepted at each draft position (finished requests)");
    metrics_.histogram("megactx_spec_decode_acceptance_length", "Tokens per verification step, per request",
                       {1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8});
    metrics_.counter("megactx_spec_decode_low_acceptance_requests_total",
                     "Requests whose draft acceptance fell below half the server's running rate");
    metrics_.gauge("megactx_decode_graph_bytes", "Device memory the kept decode graphs reserve",
                   [e] { return e->stats().graph_bytes; });
}

namespace {

// usage.speculative_decoding: a request's draft and acceptance counts (with --speculative-tokens).
nlohmann::json speculation_json(const SpecStats& s) {
    nlohmann::json by_position = nlohmann::json::array();
    for (size_t i = 0; i < s.drafted_at.size(); ++i) {
        by_position.push_back(s.drafted_at[i] ? static_cast<double>(s.accepted_at[i]) / s.drafted_at[i] : 0.0);
    }
    return {{"draft_tokens", s.drafted},
            {"accepted_tokens", s.accepted},
            {"verification_steps", s.verifications},
            {"mean_acceptance_length", s.mean_acceptance_length()},
            {"acceptance_by_position", by_position}};
}

}  // namespace

void OpenAiApi::record_speculation(const SpecStats& s) {
    if (s.verifications == 0) return;
    for (size_t i = 0; i < s.drafted_at.size(); ++i) {
        const std::string label = fmt::format("position=\"{}\"", i);
        metrics_.inc("megactx_spec_decode_draft_tokens_by_position_total", static_cast<double>(s.drafted_at[i]), label);
        metrics_.inc("megactx_spec_decode_accepted_tokens_by_position_total", static_cast<double>(s.accepted_at[i]),
                     label);
    }
    metrics_.observe("megactx_spec_decode_acceptance_length", s.mean_acceptance_length());
    // A request far below the server's running acceptance is the first symptom of corrupted drafts (wrong
    // indices, another request's KV): say so, with the numbers.
    const SpecStats all = engine_.stats().spec;
    const double mine = static_cast<double>(s.accepted) / static_cast<double>(std::max<int64_t>(s.drafted, 1));
    const double server = static_cast<double>(all.accepted) / static_cast<double>(std::max<int64_t>(all.drafted, 1));
    if (s.drafted >= 16 && all.drafted >= 4 * s.drafted && mine < 0.5 * server) {
        metrics_.inc("megactx_spec_decode_low_acceptance_requests_total");
        std::fprintf(stderr,
                     "megactx serve: warning: a request accepted %lld of %lld drafts (%.0f%%), the server %.0f%% so "
                     "far: if this persists, drafts may be corrupted\n",
                     static_cast<long long>(s.accepted), static_cast<long long>(s.drafted), 100.0 * mine,
                     100.0 * server);
    }
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

HttpResponse OpenAiApi::tokenize(const HttpRequest& req) {
    return answer(req, [&](const RequestContext& ctx) { return tokenize_request(req.body, ctx); });
}

HttpResponse OpenAiApi::detokenize(const HttpRequest& req) {
    return answer(req, [&](const RequestContext& ctx) { return detokenize_request(req.body, ctx, decodable_); });
}

RequestContext OpenAiApi::request_context() const {
    RequestContext ctx;
    ctx.tokenizer = tokenizer_;
    ctx.vocab_size = engine_.model().config().vocab_size;
    ctx.max_model_len = engine_.max_model_len();
    ctx.served_model_name = config_.served_model_name;
    ctx.chat_format = config_.chat_format;
    return ctx;
}

HttpResponse OpenAiApi::answer(const HttpRequest& req, const std::function<Json(const RequestContext&)>& fn) {
    try {
        if (closed_.load()) throw ApiError(503, "the server is shutting down");
        check_auth(req);
        const Json out = fn(request_context());
        count_request(200);
        return json_response(200, out);
    } catch (const std::exception& e) {
        return failed(e);
    }
}

void OpenAiApi::count_request(int status) {
    metrics_.inc("megactx_requests_total", 1, fmt::format("status=\"{}\"", status));
}

HttpResponse OpenAiApi::failed(const std::exception& error) {
    if (const auto* e = dynamic_cast<const ApiError*>(&error)) {
        count_request(e->status);
        return error_response(*e);
    }
    count_request(500);
    return error_response(ApiError(500, std::string("internal error: ") + error.what()));
}

HttpResponse OpenAiApi::handle(const HttpRequest& req, bool is_chat) {
    auto count = [this](int status) { count_request(status); };
    try {
        if (closed_.load()) throw ApiError(503, "the server is shutting down");
        if (!engine_.alive()) throw ApiError(503, "the engine has stopped; the server cannot generate");
        check_auth(req);
        ApiRequest p = parse_api_request(req.body, is_chat, request_context());
        if (p.constraint.kind != ConstraintSpec::Kind::kNone) {
            if (!constraints_)
                throw ApiError(400, "structured outputs need the model's tokenizer.json", p.constraint.param);
            // Thinking: the reasoning is free; the constraint starts after the end-of-thinking token.
            int32_t start_after = -1;
            if (p.chat && p.parser.start_in_reasoning) {
                start_after = tokenizer_->token_id("</think>");
                if (start_after < 0)
                    throw ApiError(400, "structured outputs with thinking need a '</think>' token in the vocabulary",
                                   p.constraint.param);
            }
            p.gen.constraint = constraints_->compile(p.constraint, start_after);
        }
        if (engine_.stats().waiting >= config_.max_waiting) {
            throw ApiError(429, fmt::format("too many requests are waiting ({}); retry later", config_.max_waiting));
        }

        // Submit
        auto pending = std::make_shared<Pending>();
        if (tokenizer_) pending->text = std::make_unique<OutputText>(*tokenizer_, decodable_, p.stop);
        TokenSink sink = [pending](const TokenEvent& ev) -> bool {
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
                if (s.text) piece.text = s.text->push(ev.token, &matched);
                s.pieces.push_back(std::move(piece));
                s.cv.notify_all();
                return !matched;
            }
            if (s.text) {
                std::string tail = s.text->finish();
                if (!tail.empty()) s.pieces.push_back(Piece{tail, -1, {}, false});
            }
            s.done = true;
            s.finish = ev.finish;
            s.error = ev.error;
            s.n_prompt = ev.n_prompt;
            s.n_cached = ev.n_cached_prompt;
            s.n_generated = ev.n_generated;
            s.spec = ev.spec;
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

        const std::string rid = fmt::format("{}-{}", is_chat ? "chatcmpl" : "cmpl", random_hex(24));
        const int64_t created = unix_now();
        auto record = [this, count](const Pending& s) {
            count(s.finish == FinishReason::kError ? 500 : s.client_gone ? 499 : 200);
            if (s.client_gone) metrics_.inc("megactx_requests_aborted_total");
            const auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
            if (s.n_generated > 0) {
                metrics_.observe("megactx_time_to_first_token_seconds", secs(s.t_first - s.t_start));
                if (s.n_generated > 1) {
                    metrics_.observe("megactx_time_per_output_token_seconds",
                                     secs(s.t_last - s.t_first) / static_cast<double>(s.n_generated - 1));
                }
            }
            metrics_.observe("megactx_e2e_request_latency_seconds", secs(Clock::now() - s.t_start));
            record_speculation(s.spec);
        };
        // The access line's token counts, read after the response has been written.
        auto note = [pending] {
            std::lock_guard<std::mutex> lock(pending->mu);
            return fmt::format("prompt={} cached={} output={} finish={}", pending->n_prompt, pending->n_cached,
                               pending->n_generated,
                               pending->client_gone ? "client_gone" : finish_reason_name(pending->finish));
        };
        // Waits until the request is done, cancelling it if the client goes away meanwhile (polled every 50 ms:
        // a client that gave up must not keep its KV blocks and its share of every step).
        const std::function<bool()> connected = req.client_connected;
        auto wait_or_cancel = [this, pending, id, connected](const std::function<bool()>& ready) {
            std::unique_lock<std::mutex> lock(pending->mu);
            while (!pending->cv.wait_for(lock, std::chrono::milliseconds(50), ready)) {
                if (pending->client_gone) continue;
                lock.unlock();
                const bool here = connected();
                if (!here) engine_.cancel(id);
                lock.lock();
                if (!here) pending->client_gone = true;
            }
        };
        auto usage = [](const Pending& s) {
            Json u{{"prompt_tokens", s.n_prompt},
                   {"completion_tokens", s.n_generated},
                   {"total_tokens", s.n_prompt + s.n_generated},
                   {"prompt_tokens_details", {{"cached_tokens", s.n_cached}}}};
            if (s.spec.verifications > 0) u["speculative_decoding"] = speculation_json(s.spec);
            return u;
        };

        if (!p.stream) {
            wait_or_cancel([&] { return pending->done; });
            std::unique_lock<std::mutex> lock(pending->mu);
            record(*pending);
            if (pending->client_gone) {
                HttpResponse gone = error_response(ApiError(499, "the client closed the connection"));
                gone.access_note = note;
                return gone;
            }
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
            HttpResponse done = json_response(200, Json{{"id", rid},
                                                        {"object", is_chat ? "chat.completion" : "text_completion"},
                                                        {"created", created},
                                                        {"model", p.model},
                                                        {"choices", Json::array({choice})},
                                                        {"usage", usage(*pending)}});
            done.access_note = note;
            return done;
        }

        HttpResponse r;
        r.content_type = "text/event-stream";
        r.access_note = note;
        r.stream = [this, pending, id, p, rid, created, record, usage, wait_or_cancel](const ChunkWriter& write) {
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
                wait_or_cancel([&] { return pending->done || !pending->pieces.empty(); });
                {
                    std::lock_guard<std::mutex> lock(pending->mu);
                    batch.swap(pending->pieces);
                    done = pending->done;
                    if (pending->client_gone) ok = false;
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
    } catch (const std::exception& e) {
        return failed(e);
    }
}

}  // namespace megactx
