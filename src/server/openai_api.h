// The OpenAI-compatible API over the engine: request JSON → validated generation request (server/request.h)
// → engine → response JSON or SSE chunks, with reasoning_content and tool_calls parsed from the output. A
// request whose client goes away is cancelled, streamed or not. Endpoints: /v1/chat/completions, /v1/completions,
// /v1/models, /health, /metrics, and vLLM's /tokenize and /detokenize (server/tokenize_api.h). HTTP-library-free:
// handlers take HttpRequest and return HttpResponse (server/http.h).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/structured_output.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

struct ApiConfig {
    std::string served_model_name = "megactx";
    std::string api_key;  // empty: no authentication
    chat::ChatFormat chat_format = chat::ChatFormat::kGlm5;
    int64_t max_waiting = 1024;  // queued requests beyond this get 429
};

class OpenAiApi {
  public:
    // `tokenizer` may be null: then only token-id prompts to /v1/completions are served.
    OpenAiApi(Engine& engine, const Tokenizer* tokenizer, const ApiConfig& config);

    HttpResponse chat_completions(const HttpRequest& req);
    HttpResponse completions(const HttpRequest& req);
    HttpResponse models(const HttpRequest& req);
    HttpResponse health(const HttpRequest& req);
    HttpResponse metrics(const HttpRequest& req);
    HttpResponse tokenize(const HttpRequest& req);
    HttpResponse detokenize(const HttpRequest& req);

    // Stops taking new requests (shutdown): they get 503.
    void close() { closed_.store(true); }
    Metrics& metrics_registry() { return metrics_; }

    struct Pending;  // one request in flight (defined in the .cpp)

  private:
    HttpResponse handle(const HttpRequest& req, bool chat);
    // A request answered at once with JSON (no generation): auth, errors and the request count as for the others.
    HttpResponse answer(const HttpRequest& req, const std::function<chat::Json(const RequestContext&)>& fn);
    RequestContext request_context() const;
    void count_request(int status);  // megactx_requests_total{status}
    // The response for an exception out of a handler: an ApiError as it says, anything else a 500; counted.
    HttpResponse failed(const std::exception& error);
    void check_auth(const HttpRequest& req) const;
    // A finished request's speculative-decoding counts into /metrics, and the low-acceptance warning.
    void record_speculation(const SpecStats& s);

    Engine& engine_;
    const Tokenizer* tokenizer_;
    // Ids the tokenizer maps to text. A model's vocab_size can exceed its tokenizer's (padding rows, or
    // gen-model's small preset: 516 of 4096 ids); such ids decode to no text, as in Hugging Face's decode().
    std::vector<bool> decodable_;
    ApiConfig config_;
    std::unique_ptr<ConstraintCompiler> constraints_;  // structured outputs (null without a tokenizer)
    Metrics metrics_;
    std::atomic<bool> closed_{false};
};

}  // namespace megactx
