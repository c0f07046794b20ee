// libFuzzer target: the OpenAI request surface (JSON body → validated generation request, server/request.h).
// The first byte picks the endpoint (chat or completions); the rest is the body. Every input must either give a
// request the engine accepts — a non-empty prompt of in-vocabulary ids that fits the context with max_tokens,
// valid sampling settings — or an ApiError with a 4xx status and a message. Nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "model/gen_tokenizer.h"
#include "server/api_error.h"
#include "server/request.h"

namespace {

void require(bool ok) {
    if (!ok) std::abort();
}

constexpr int64_t kVocab = 512;

const megactx::RequestContext& context() {
    static const std::unique_ptr<megactx::Tokenizer> tokenizer = [] {
        const std::string dir = (std::filesystem::temp_directory_path() / "megactx-fuzz-api-request").string();
        std::filesystem::create_directories(dir);
        megactx::write_glm_tokenizer(dir, kVocab);
        return std::make_unique<megactx::Tokenizer>(megactx::Tokenizer::load(dir));
    }();
    static const megactx::RequestContext ctx = [] {
        megactx::RequestContext c;
        c.tokenizer = tokenizer.get();
        c.vocab_size = kVocab;
        c.max_model_len = 256;
        c.served_model_name = "tiny";
        return c;
    }();
    return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const bool chat = data[0] & 1;
    const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
    const megactx::RequestContext& ctx = context();
    try {
        const megactx::ApiRequest r = megactx::parse_api_request(body, chat, ctx);
        require(r.chat == chat);
        require(!r.prompt.empty());
        for (int32_t id : r.prompt) require(id >= 0 && id < ctx.vocab_size);
        require(r.gen.max_tokens >= 1);
        require(static_cast<int64_t>(r.prompt.size()) + r.gen.max_tokens <= ctx.max_model_len);
        r.gen.sampling.validate();  // throws (and so aborts below) on settings the engine would refuse
        for (const auto& [id, bias] : r.gen.sampling.logit_bias) require(id >= 0 && id < ctx.vocab_size);
        for (int32_t id : r.gen.stop_token_ids) require(id >= 0 && id < ctx.vocab_size);
        require(r.model == ctx.served_model_name);
    } catch (const megactx::ApiError& e) {
        require(e.status >= 400 && e.status < 500);
        require(std::string(e.what()).size() > 0);
    }
    return 0;
}
