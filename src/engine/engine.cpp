#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace megactx {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::kNone:
            return "none";
        case FinishReason::kStop:
            return "stop";
        case FinishReason::kLength:
            return "length";
        case FinishReason::kCancelled:
            return "cancelled";
        case FinishReason::kError:
            return "error";
    }
    return "?";
}

namespace {

int64_t resolve_max_model_len(const ModelConfig& c, const EngineConfig& e) {
    const int64_t len = e.max_model_len > 0 ? e.max_model_len : c.max_position_embeddings;
    MEGACTX_CHECK(len <= c.max_position_embeddings,
                  "--max-model-len {} exceeds the model's max_position_embeddings ({})", len,
                  c.max_position_embeddings);
    return len;
}

int64_t resolve_blocks(const ModelConfig& c, const EngineConfig& e, int64_t kv_bytes_per_token) {
    if (e.n_kv_blocks > 0) return e.n_kv_blocks;
    const int64_t max_len = resolve_max_model_len(c, e);
    const int64_t want = e.scheduler.max_num_seqs * ((max_len + kBlockSize - 1) / kBlockSize);
    const int64_t bytes = e.kv_cache_bytes > 0 ? e.kv_cache_bytes : (int64_t{2} << 30);  // CPU default: 2 GiB
    const int64_t per_block = kv_bytes_per_token * kBlockSize;  // the fullest rank's layers (LayerSplit)
    const int64_t fit = bytes / per_block;
    MEGACTX_CHECK(fit >= 1, "KV cache budget of {} bytes holds no 64-token block ({} bytes per block)", bytes,
                  per_block);
    return std::min(want, fit);
}

}  // namespace

Engine::Engine(const GlmDsaModel& model, Ops& ops, const EngineConfig& config)
    : model_(model),
      ops_(ops),
      config_(config),
      max_model_len_(resolve_max_model_len(model.config(), config)),
      kv_(ops, model.config(), resolve_blocks(model.config(), config, model.kv_bytes_per_token_max(config.kv_format)),
          config.kv_format, model.kv_layers()),
      graphs_(model, ops, kv_) {
    MEGACTX_CHECK(config.scheduler.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
    MEGACTX_CHECK(config.scheduler.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be at least 1");
    snapshot_.kv_blocks_total = kv_.n_blocks();
    model_.prepare_kv(kv_);  // tensor parallel: the other ranks' pools, now
}

Engine::~Engine() { stop(); }

int64_t Engine::submit(std::vector<int32_t> prompt, const GenerationParams& params, TokenSink sink) {
    const ModelConfig& c = model_.config();
    MEGACTX_CHECK(!prompt.empty(), "the prompt is empty");
    for (size_t i = 0; i < prompt.size(); ++i) {
        MEGACTX_CHECK(prompt[i] >= 0 && prompt[i] < c.vocab_size,
                      "prompt token id {} at index {} is out of range (vocabulary size {})", prompt[i], i,
                      c.vocab_size);
    }
    params.sampling.validate();
    for (const auto& [token, bias] : params.sampling.logit_bias) {
        MEGACTX_CHECK(token < c.vocab_size, "logit_bias: token id {} is out of range (vocabulary size {})", token,
                      c.vocab_size);
    }
    for (int32_t t : params.stop_token_ids) {
        MEGACTX_CHECK(t >= 0 && t < c.vocab_size, "stop_token_ids: {} is out of range (vocabulary size {})", t,
                      c.vocab_size);
    }
    MEGACTX_CHECK(params.max_tokens >= 1, "max_tokens must be at least 1, got {}", params.max_tokens);
    const int64_t total = static_cast<int64_t>(prompt.size()) + params.max_tokens;
    MEGACTX_CHECK(total <= max_model_len_,
                  "the prompt ({} tokens) plus max_tokens ({}) is {} tokens, beyond the maximum context length of {}",
                  prompt.size(), params.max_tokens, total, max_model_len_);
    MEGACTX_CHECK(total <= kv_capacity_tokens(),
                  "the prompt ({} tokens) plus max_tokens ({}) does not fit in the KV cache ({} tokens)", prompt.size(),
                  params.max_tokens, kv_capacity_tokens());
    MEGACTX_CHECK(alive_.load(), "the engine is not running");

    auto s = std::make_unique<Sequence>();
    s->n_prompt = static_cast<int64_t>(prompt.size());
    s->tokens = std::move(prompt);
    s->params = params;
    s->sampler = std::make_unique<Sampler>(params.sampling);
    s->sink = std::move(sink);
    s->t_arrival = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    s->id = next_id_++;
    const int64_t id = s->id;
    inbox_.push_back(std::move(s));
    cv_.notify_one();
    return id;
}

void Engine::cancel(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    cv_.notify_one();
}

void Engine::drain_inbox() {
    std::vector<std::unique_ptr<Sequence>> inbox;
    std::vector<int64_t> cancels;
    {
        std::lock_guard<std::mutex> lock(mu_);
        inbox.swap(inbox_);
        cancels.swap(cancels_);
    }
    for (auto& s : inbox) {
        waiting_.push_back(s.get());
        seqs_[s->id] = std::move(s);
    }
    for (int64_t id : cancels) {
        const auto it = seqs_.find(id);
        if (it != seqs_.end()) finish(it->second.get(), FinishReason::kCancelled);
    }
}

void Engine::free_kv(Sequence* s) {
    s->kv.free(kv_.blocks());
    s->block_hashes.clear();
    s->n_computed = 0;
}

void Engine::finish(Sequence* s, FinishReason r, const std::string& error) {
    TokenEvent ev;
    ev.request_id = s->id;
    ev.finish = r;
    ev.error = error;
    ev.n_prompt = s->n_prompt;
    ev.n_cached_prompt = s->n_cached_prompt;
    ev.n_generated = s->n_generated();
    if (s->sink) s->sink(ev);
    free_kv(s);
    running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
    seqs_.erase(s->id);
}

PrefixMatch Engine::match_prefix(const Sequence& s, std::vector<int32_t>* blocks, std::vector<uint64_t>* hashes) const {
    PrefixMatch m;
    if (!config_.prefix_caching) return m;
    // At least one token must be computed to produce logits.
    const int64_t max_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / kBlockSize;
    uint64_t parent = 0;
    auto& alloc = const_cast<KvCache&>(kv_).blocks();
    for (int64_t i = 0; i < max_blocks; ++i) {
        const uint64_t h = block_hash(parent, s.tokens.data() + i * kBlockSize, kBlockSize);
        const auto b = alloc.lookup(h);
        if (!b) break;
        ++m.n_blocks;
        m.n_shared += alloc.refcount(*b) > 0;
        if (blocks) blocks->push_back(*b);
        if (hashes) hashes->push_back(h);
        parent = h;
    }
    return m;
}

void Engine::admit(Sequence* s) {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;
    const PrefixMatch m = match_prefix(*s, &blocks, &hashes);
    for (int32_t b : blocks) kv_.blocks().retain(b);
    s->kv.blocks = std::move(blocks);
    s->block_hashes = std::move(hashes);
    s->n_computed = m.n_blocks * kBlockSize;
    s->kv.n_tokens = s->n_computed;
    const bool first_admission = s->n_generated() == 0;
    if (first_admission) {
        s->n_cached_prompt = std::min(s->n_computed, s->n_prompt);
        counters_.prefix_query_tokens += s->n_prompt;
        counters_.prefix_hit_tokens += s->n_cached_prompt;
        counters_.prompt_tokens += s->n_prompt;
    }
    s->arrival = next_arrival_++;
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
    running_.push_back(s);
}

void Engine::publish_full_blocks(Sequence* s) {
    if (!config_.prefix_caching) return;
    const int64_t n_full = s->n_computed / kBlockSize;
    while (static_cast<int64_t>(s->block_hashes.size()) < n_full) {
        const size_t i = s->block_hashes.size();
        const uint64_t parent = i == 0 ? 0 : s->block_hashes[i - 1];
        const uint64_t h = block_hash(parent, s->tokens.data() + i * kBlockSize, kBlockSize);
        kv_.blocks().publish(s->kv.blocks[i], h);
        s->block_hashes.push_back(h);
    }
}

void Engine::update_snapshot() {
    EngineStats snap = counters_;
    snap.running = static_cast<int64_t>(running_.size());
    snap.waiting = static_cast<int64_t>(waiting_.size());
    snap.kv_blocks_total = kv_.n_blocks();
    snap.kv_blocks_used = kv_.blocks().n_used();
    snap.kv_blocks_cached = kv_.blocks().n_cached();
    snap.graph_replays = graphs_.stats().replayed;
    snap.graphs = graphs_.stats().graphs;
    snap.graph_bytes = graphs_.stats().bytes;
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_ = snap;
}

bool Engine::step() {
    const bool worked = step_once();
    update_snapshot();
    return worked;
}

bool Engine::step_once() {
    drain_inbox();
    if (running_.empty() && waiting_.empty()) return false;
    // Test hook (docs/testing.md): MEGACTX_FAULT_STEP=N makes step N fail as a backend fault would, so the
    // tests can check that the server reports a dead engine instead of hanging.
    static const int64_t fault_step = [] {
        const char* v = std::getenv("MEGACTX_FAULT_STEP");
        return v ? std::atoll(v) : int64_t{-1};
    }();
    if (counters_.steps == fault_step)
        MEGACTX_FAIL("fault injected at engine step {} (MEGACTX_FAULT_STEP)", fault_step);
    const SchedulePlan plan = schedule(config_.scheduler, running_, waiting_, kv_.blocks(),
                                       [&](const Sequence& s) { return match_prefix(s, nullptr, nullptr); });

    // Preempted sequences drop their KV and go back to the front of the queue, oldest first; they are
    // recomputed (through the prefix cache where their blocks survive) when admitted again.
    for (auto it = plan.preempted.rbegin(); it != plan.preempted.rend(); ++it) {
        Sequence* s = *it;
        free_kv(s);
        running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
        waiting_.push_front(s);
        ++counters_.preemptions;
    }
    std::sort(waiting_.begin(), waiting_.begin() + static_cast<long>(plan.preempted.size()),
              [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
    for (Sequence* s : plan.admitted) admit(s);  // matched blocks are retained before anything is allocated
    if (plan.chunks.empty()) return !plan.preempted.empty();

    Batch batch;
    for (const ScheduledChunk& ch : plan.chunks) {
        Sequence* s = ch.seq;
        s->kv.reserve(kv_.blocks(), s->n_computed + ch.n_tokens);
        const bool last = s->n_computed + ch.n_tokens == static_cast<int64_t>(s->tokens.size());
        batch.add_sequence(&s->kv.blocks, s->tokens.data() + s->n_computed, ch.n_tokens, s->n_computed, false);
        batch.want_logits.back() = last;
    }
    const ForwardResult out = graphs_.forward(batch);
    const int64_t vocab = model_.config().vocab_size;
    std::vector<float> logits(static_cast<size_t>(out.logits.numel()));
    if (!logits.empty()) ops_.download(out.logits, logits.data());

    std::vector<std::pair<Sequence*, FinishReason>> done;
    int64_t row = 0;
    const auto& eos = model_.config().eos_token_ids;
    for (const ScheduledChunk& ch : plan.chunks) {
        Sequence* s = ch.seq;
        s->n_computed += ch.n_tokens;
        s->kv.n_tokens = s->n_computed;
        publish_full_blocks(s);
        if (s->n_computed != static_cast<int64_t>(s->tokens.size())) continue;
        const float* raw = logits.data() + row++ * vocab;
        std::vector<float> l(raw, raw + vocab);
        const std::vector<int32_t> prompt(s->tokens.begin(), s->tokens.begin() + s->n_prompt);
        const std::vector<int32_t> output(s->tokens.begin() + s->n_prompt, s->tokens.end());
        apply_penalties(s->params.sampling, prompt, output, l.data(), vocab);
        const int32_t tok = s->sampler->sample(l.data(), vocab);
        s->tokens.push_back(tok);
        ++counters_.generation_tokens;

        TokenEvent ev;
        ev.request_id = s->id;
        ev.token = tok;
        ev.n_prompt = s->n_prompt;
        ev.n_cached_prompt = s->n_cached_prompt;
        ev.n_generated = s->n_generated();
        if (s->params.top_logprobs >= 0) {
            ev.logprobs = token_logprobs(raw, vocab, tok, s->params.top_logprobs);
            ev.has_logprobs = true;
        }
        const bool keep = s->sink ? s->sink(ev) : true;
        const bool is_stop = (!s->params.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) ||
                             std::find(s->params.stop_token_ids.begin(), s->params.stop_token_ids.end(), tok) !=
                                 s->params.stop_token_ids.end();
        if (!keep || is_stop) {
            done.push_back({s, FinishReason::kStop});
        } else if (s->n_generated() >= s->params.max_tokens ||
                   static_cast<int64_t>(s->tokens.size()) >= max_model_len_) {
            done.push_back({s, FinishReason::kLength});
        }
    }
    for (auto& [s, r] : done) finish(s, r);
    ++counters_.steps;
    return true;
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = snapshot_;
    s.waiting += static_cast<int64_t>(inbox_.size());
    s.alive = alive_.load();
    return s;
}

void Engine::fail_all(const std::string& error) {
    std::vector<Sequence*> all;
    for (auto& [id, s] : seqs_) all.push_back(s.get());
    for (Sequence* s : all) finish(s, FinishReason::kError, error);
}

void Engine::loop() {
    while (!stopping_.load()) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] {
                return stopping_.load() || !inbox_.empty() || !cancels_.empty() || !running_.empty() ||
                       !waiting_.empty();
            });
        }
        if (stopping_.load()) break;
        try {
            step();
        } catch (const std::exception& e) {
            // A failed step leaves sequences in an unknown state: fail them all and stop serving, so
            // clients get an error now and /health turns 503 instead of hanging.
            alive_.store(false);
            fail_all(std::string("engine step failed: ") + e.what());
            update_snapshot();
            return;
        }
    }
    drain_inbox();
    std::vector<Sequence*> all;
    for (auto& [id, s] : seqs_) all.push_back(s.get());
    for (Sequence* s : all) finish(s, FinishReason::kCancelled);
    update_snapshot();
}

void Engine::start() {
    if (thread_.joinable()) return;
    stopping_.store(false);
    thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
    stopping_.store(true);
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

}  // namespace megactx
