#include "engine/runner.h"

#include <algorithm>

#include "core/error.h"

namespace megactx {

void validate_tokens(const ModelConfig& c, const std::vector<int32_t>& tokens, int64_t extra) {
    MEGACTX_CHECK(!tokens.empty(), "no tokens given");
    for (size_t i = 0; i < tokens.size(); ++i) {
        MEGACTX_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size,
                      "token id {} at index {} is out of range (vocabulary size {})", tokens[i], i, c.vocab_size);
    }
    const int64_t total = static_cast<int64_t>(tokens.size()) + extra;
    MEGACTX_CHECK(total <= c.max_position_embeddings,
                  "sequence of {} tokens is longer than the model's context (max_position_embeddings = {})", total,
                  c.max_position_embeddings);
}

namespace {

KvTierBlocks runner_blocks(const GlmDsaModel& m, int64_t max_tokens, KvFormat f, int64_t device_bytes,
                           int64_t host_bytes) {
    const int64_t need = (max_tokens + kBlockSize - 1) / kBlockSize;
    KvTierBlocks t{need, 0};
    if (host_bytes > 0) {
        t = kv_tier_blocks(m.config(), f, m.kv_layers(), device_bytes > 0 ? device_bytes : int64_t{2} << 30,
                           host_bytes, 0, max_tokens);
        t.device = std::min(t.device, need);
        t.host = std::min(t.host, need - t.device);
        MEGACTX_CHECK(t.device + t.host >= need,
                      "the sequence of {} tokens needs {} KV blocks; the device tier holds {} and the host tier {} "
                      "(raise --kv-cache-memory or --kv-offload-memory)",
                      max_tokens, need, t.device, t.host);
        if (t.host == 0) t.host = 1;  // a host tier was asked for: keep one (its code path) even when all fits
    } else if (device_bytes > 0) {
        const int64_t fit = device_bytes / (m.kv_bytes_per_token_max(f) * kBlockSize);
        MEGACTX_CHECK(fit >= need,
                      "the sequence of {} tokens needs {} KV blocks; --kv-cache-memory holds {} (raise it, or add "
                      "--kv-offload-memory for a host tier)",
                      max_tokens, need, fit);
    }
    return t;
}

}  // namespace

SequenceRunner::SequenceRunner(const GlmDsaModel& model, Ops& ops, int64_t max_tokens, KvFormat kv_format,
                               int64_t device_bytes, int64_t host_bytes)
    : SequenceRunner(model, ops, kv_format, runner_blocks(model, max_tokens, kv_format, device_bytes, host_bytes)) {}

SequenceRunner::SequenceRunner(const GlmDsaModel& model, Ops& ops, KvFormat kv_format, KvTierBlocks blocks)
    : model_(model),
      ops_(ops),
      kv_(ops, model.config(), blocks.device, kv_format, model.kv_layers(),
          KvTierOptions{blocks.host, blocks.rows_per_pass}),
      graphs_(model, ops, kv_) {
    model_.prepare_kv(kv_);  // tensor parallel: the other ranks' pools, now
}

std::vector<float> SequenceRunner::feed(const std::vector<int32_t>& tokens, int64_t chunk, bool all_logits) {
    const int64_t n = static_cast<int64_t>(tokens.size()), vocab = model_.config().vocab_size;
    if (chunk <= 0) chunk = n;
    std::vector<float> out;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        const int64_t m = std::min(chunk, n - i0);
        const bool last_chunk = i0 + m == n;
        kv_.end_step();  // (host tier) promotions after the last forward, then this chunk's blocks
        seq_.reserve(kv_.blocks(), seq_.n_tokens + m);
        Batch b;
        b.add_sequence(&seq_.blocks, tokens.data() + i0, m, seq_.n_tokens, all_logits);
        if (!all_logits && last_chunk) b.want_logits.back() = true;
        last_ = graphs_.forward(b);
        seq_.n_tokens += m;
        const size_t off = out.size();
        out.resize(off + static_cast<size_t>(last_.logits.numel()));
        if (last_.logits.numel() > 0) ops_.download(last_.logits, out.data() + off);
    }
    (void)vocab;
    return out;
}

std::vector<int32_t> SequenceRunner::generate(const std::vector<int32_t>& prompt, int64_t max_new,
                                              const SamplingParams& sp, bool stop_at_eos) {
    const ModelConfig& c = model_.config();
    validate_tokens(c, prompt, max_new);
    Sampler sampler(sp);
    std::vector<int32_t> out = prompt;
    std::vector<float> logits = feed(prompt, 0, false);
    for (int64_t i = 0; i < max_new; ++i) {
        const int32_t next = sampler.sample(logits.data(), c.vocab_size);
        out.push_back(next);
        if (stop_at_eos && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end())
            break;
        if (i + 1 < max_new) logits = feed({next}, 0, false);
    }
    return out;
}

}  // namespace megactx
