#include "model/graphed_forward.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/tap.h"

namespace megactx {

GraphedForward::GraphedForward(const GlmDsaModel& model, Ops& ops, KvCache& kv, int64_t max_bytes)
    : model_(model), ops_(ops), kv_(kv), max_bytes_(max_bytes) {
    const char* env = std::getenv("MEGACTX_GRAPHS");
    enabled_ = ops.can_record() && (env == nullptr || std::strcmp(env, "0") != 0);
    if (env != nullptr && std::strcmp(env, "pad") == 0) enabled_ = pad_only_ = true;
}

GraphedForward::~GraphedForward() = default;

void GraphedForward::evict_lru() {
    auto it = graphs_.find(lru_.back());
    if (it->second.graph) {
        --stats_.graphs;
        stats_.bytes -= it->second.graph->bytes;
        ++stats_.evicted;
    }
    graphs_.erase(it);
    lru_.pop_back();
}

int64_t GraphedForward::bucket(const Batch& b) const {
    const int64_t n = b.n_tokens();
    if (!enabled_ || n == 0 || n > kMaxTokens || !model_.single_device() || Tap::instance().enabled()) return 0;
    if (b.pad_blocks != 0 || b.seq.size() != static_cast<size_t>(n) || b.pos.size() != static_cast<size_t>(n))
        return 0;
    // Each sequence's tokens together and consecutive, the sequences in order, every table used.
    int64_t need = 1;
    for (int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<size_t>(i);
        if (i == 0 ? b.seq[k] != 0
                   : !(b.seq[k] == b.seq[k - 1] + 1 || (b.seq[k] == b.seq[k - 1] && b.pos[k] == b.pos[k - 1] + 1)))
            return 0;
        need = std::max<int64_t>(need, b.pos[k] / kBlockSize + 1);
    }
    if (b.block_tables.size() != static_cast<size_t>(b.seq.back()) + 1) return 0;
    int64_t pad = 16;
    while (pad < need) pad *= 2;
    return pad;
}

ForwardResult GraphedForward::forward(const Batch& batch) {
    kv_.flush_tiers();  // (tiered KV) block moves since the last step, before anything is recorded
    // Target steps: decode and verification, where every row is scored (prefill chunks run eagerly).
    const bool scored = std::all_of(batch.want_logits.begin(), batch.want_logits.end(), [](bool w) { return w; });
    const int64_t pad = scored ? bucket(batch) : 0;
    if (pad == 0) return model_.forward(ops_, batch, kv_);
    Batch b = batch;
    b.pad_blocks = pad;
    auto step = [&] { return Result{model_.forward(ops_, b, kv_), {}}; };
    return run(kTarget, b, step, [&] { return BatchPlan::host_inputs(b); }).fwd;
}

ForwardResult GraphedForward::mtp_forward(const Batch& batch, const Tensor& hidden_in,
                                          const std::vector<int32_t>* reuse_topk) {
    kv_.flush_tiers();
    const int64_t n = batch.n_tokens(), H = model_.config().hidden_size;
    MEGACTX_CHECK(!reuse_topk || static_cast<int64_t>(reuse_topk->size()) == n * model_.config().index_topk,
                  "mtp_forward: reuse_topk must hold {} x {} slots, got {}", n, model_.config().index_topk,
                  reuse_topk ? reuse_topk->size() : 0);
    // The step on a batch (padded or not) and a hidden input; a reused top-k is uploaded first.
    auto step = [&](const Batch& b, const Tensor& h) {
        if (!reuse_topk) return model_.mtp_forward(ops_, b, h, kv_);
        Tensor r = ops_.upload_i32(*reuse_topk);
        r.shape = {n, model_.config().index_topk};
        return model_.mtp_forward(ops_, b, h, kv_, &r);
    };
    const int64_t pad = bucket(batch);
    if (pad == 0) return step(batch, hidden_in);
    Batch b = batch;
    b.pad_blocks = pad;
    MEGACTX_CHECK(hidden_in.dim(0) == n && hidden_in.dim(1) == H, "mtp_forward: hidden_in must be [{}, {}]", n, H);
    const Tensor h = stage_hidden(hidden_in);
    auto inputs = [&] {  // in upload order: the reused top-k, then the batch plan
        std::vector<std::vector<int32_t>> in;
        if (reuse_topk) in.push_back(*reuse_topk);
        for (auto& v : BatchPlan::host_inputs(b)) in.push_back(std::move(v));
        return in;
    };
    return run(reuse_topk ? kMtpReuse : kMtpIndexer, b, [&] { return Result{step(b, h), {}}; }, inputs).fwd;
}

Tensor GraphedForward::stage_hidden(const Tensor& hidden_in) {
    const int64_t H = model_.config().hidden_size;
    if (mtp_hidden_.data == nullptr) mtp_hidden_ = ops_.alloc(DType::F32, {kMaxTokens, H});
    MEGACTX_CHECK(hidden_in.dim(0) <= kMaxTokens, "GraphedForward: {} hidden rows for a staging buffer of {}",
                  hidden_in.dim(0), kMaxTokens);
    Tensor h = mtp_hidden_;  // the graph reads its hidden input here, at a fixed address
    h.shape = {hidden_in.dim(0), H};
    ops_.slice_cols(hidden_in, 0, h);
    return h;
}

std::vector<int32_t> GraphedForward::mtp_greedy_chain(const Batch& b0, const Tensor& hidden_in,
                                                      const std::vector<int32_t>& last_rows,
                                                      const std::vector<Batch>& steps, bool share) {
    kv_.flush_tiers();
    const auto n_seq = static_cast<int64_t>(last_rows.size());
    const int64_t k = static_cast<int64_t>(steps.size()) + 1, H = model_.config().hidden_size;
    MEGACTX_CHECK(hidden_in.dim(0) == b0.n_tokens() && hidden_in.dim(1) == H,
                  "mtp_greedy_chain: hidden_in must be [{}, {}]", b0.n_tokens(), H);
    const auto n_rows = b0.want_logits.empty() ? b0.n_tokens()
                                               : std::count(b0.want_logits.begin(), b0.want_logits.end(), true);
    // One logit row per drafting sequence, or (step 0 padded to whole verifications) every row scored and each
    // sequence's row picked by last_rows.
    const bool select = n_rows != n_seq;
    MEGACTX_CHECK(n_seq > 0 && (n_rows == n_seq || n_rows == b0.n_tokens()),
                  "mtp_greedy_chain: {} logit rows for {} drafting sequences in {} rows", n_rows, n_seq,
                  b0.n_tokens());
    for (const Batch& s : steps)
        MEGACTX_CHECK(s.n_tokens() == n_seq, "mtp_greedy_chain: a draft step of {} tokens for {} sequences",
                      s.n_tokens(), n_seq);
    // The chain's body on given batches (padded or not) and hidden input.
    auto chain = [&](const Batch& first, const std::vector<Batch>& rest, const Tensor& h0) {
        Result out;
        const ForwardResult m = model_.mtp_forward(ops_, first, h0, kv_);
        out.drafts = ops_.alloc(DType::I32, {k, n_seq});
        auto row = [&](int64_t j) {
            Tensor t = out.drafts;
            t.data = out.drafts.i32() + j * n_seq;
            t.shape = {n_seq};
            return t;
        };
        Tensor tok = row(0);
        Tensor idx;
        if (select || k > 1) idx = ops_.upload_i32(last_rows);
        if (select) {
            Tensor picked = ops_.alloc(DType::F32, {n_seq, m.logits.dim(1)});
            ops_.gather_rows(m.logits, idx, picked);
            ops_.argmax_rows(picked, tok);
        } else {
            ops_.argmax_rows(m.logits, tok);
        }
        if (k == 1) return out;
        Tensor hidden = ops_.alloc(DType::F32, {n_seq, H}), top;
        ops_.gather_rows(m.hidden, idx, hidden);
        if (share) {
            top = ops_.alloc(DType::I32, {n_seq, model_.config().index_topk});
            ops_.gather_rows(m.topk, idx, top);
        }
        for (int64_t j = 1; j < k; ++j) {
            const ForwardResult mj =
                model_.mtp_forward(ops_, rest[static_cast<size_t>(j - 1)], hidden, kv_, share ? &top : nullptr, &tok);
            tok = row(j);
            ops_.argmax_rows(mj.logits, tok);
            hidden = mj.hidden;
        }
        return out;
    };
    // One padding for the whole chain, so every step keeps its shape; 0 when any step does not qualify.
    int64_t pad = bucket(b0);
    for (size_t j = 0; j < steps.size() && pad > 0; ++j) {
        const int64_t p = bucket(steps[j]);
        pad = p == 0 ? 0 : std::max(pad, p);
    }
    std::vector<int32_t> drafts(static_cast<size_t>(k * n_seq));
    if (pad == 0) {
        const Result r = chain(b0, steps, hidden_in);
        ops_.download(r.drafts, drafts.data());
        return drafts;
    }
    Batch first = b0;
    first.pad_blocks = pad;
    std::vector<Batch> rest = steps;
    for (Batch& s : rest) s.pad_blocks = pad;
    const Tensor h = stage_hidden(hidden_in);
    for (const Batch& s : rest) model_.check_batch(s);  // run() checks the first; a replay checks nothing
    auto inputs = [&] {  // in upload order: step 0's plan, its drafting rows, then each step's plan
        std::vector<std::vector<int32_t>> in = BatchPlan::host_inputs(first);
        if (select || k > 1) in.push_back(last_rows);
        for (const Batch& s : rest)
            for (auto& v : BatchPlan::host_inputs(s)) in.push_back(std::move(v));
        return in;
    };
    const Result r =
        run(kChain + 2 * static_cast<int>(k) + (share ? 1 : 0), first, [&] { return chain(first, rest, h); }, inputs);
    ops_.download(r.drafts, drafts.data());
    return drafts;
}

GraphedForward::Result GraphedForward::run(int kind, const Batch& b, const std::function<Result()>& body,
                                           const std::function<std::vector<std::vector<int32_t>>()>& inputs) {
    std::vector<bool> rows = b.want_logits;
    if (rows.empty()) rows.assign(static_cast<size_t>(b.n_tokens()), true);
    const Key key{kind, b.seq, b.pad_blocks, rows};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
        if (graphs_.size() >= kMaxGraphs) evict_lru();
        lru_.push_front(key);
        it = graphs_.emplace(key, Entry{}).first;
        ++stats_.shapes;
        it->second.lru = lru_.begin();
    } else {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
    }
    Entry& e = it->second;
    // The first step of a shape runs eagerly, with the padded plan the graph will have.
    if (!e.seen || e.unrecordable || pad_only_) {
        e.seen = true;
        ++stats_.eager;
        return body();
    }
    // What forward checks first: bad input must not reach a recording (it would turn the shape's graph off) or a
    // replay (which runs no host code of the model).
    model_.check_batch(b);
    if (!e.graph) {
        Result r;
        try {
            e.graph = ops_.record([&] { r = body(); });
        } catch (const std::exception& ex) {
            std::fprintf(stderr, "megactx: CUDA graphs off for a step shape (%d tokens) that could not be recorded: %s\n",
                         static_cast<int>(b.n_tokens()), ex.what());
            e.graph.reset();
        }
        if (!e.graph) {  // nothing ran while recording: run the step eagerly, and this shape eagerly from now on
            e.unrecordable = true;
            ++stats_.unrecordable;
            ++stats_.eager;
            return body();
        }
        e.result = r;
        ++stats_.recorded;
        ++stats_.graphs;
        stats_.bytes += e.graph->bytes;
        // Over the memory cap: older graphs go (this one, the most recent, stays).
        while (stats_.bytes > max_bytes_ && lru_.size() > 1) evict_lru();
    }
    e.graph->inputs = inputs();
    ops_.replay(*e.graph);
    ++stats_.replayed;
    return e.result;
}

}  // namespace megactx
