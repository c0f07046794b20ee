#include "parallel/tp_group.h"

#include "core/error.h"
#include "model/tap.h"

namespace megactx {

TensorParallelGroup::TensorParallelGroup(const std::string& dir, const ParallelOptions& o,
                                         std::vector<std::unique_ptr<Ops>> ops, const CommFactory& make_comms)
    : TensorParallelGroup(dir, o, std::move(ops), make_comms, 0, nullptr) {}

TensorParallelGroup::TensorParallelGroup(const std::string& dir, const ParallelOptions& o,
                                         std::vector<std::unique_ptr<Ops>> ops, const CommFactory& make_comms,
                                         int64_t first_rank, std::unique_ptr<FollowerNodes> remote)
    : TensorParallelGroup(dir, o, std::move(ops), make_comms, first_rank, std::move(remote), nullptr) {}

TensorParallelGroup::TensorParallelGroup(const std::string& dir, const ParallelOptions& o,
                                         std::vector<std::unique_ptr<Ops>> ops, const CommFactory& make_comms,
                                         int64_t first_rank, std::unique_ptr<FollowerNodes> remote,
                                         const PipeFactory& make_pipes)
    : plan_(make_shard_plan(load_config(dir), o)), ops_(std::move(ops)), remote_(std::move(remote)) {
    const auto g = ops_.size();
    const int64_t world = o.n_gpus * o.pp;
    MEGACTX_CHECK(first_rank > 0 || remote_ || static_cast<int64_t>(g) == world,
                  "tensor parallel: {} backends for {} ranks", g, world);
    MEGACTX_CHECK(g >= 1 && first_rank >= 0 && first_rank + static_cast<int64_t>(g) <= world,
                  "tensor parallel: ranks {}..{} of a group of {}", first_rank,
                  first_rank + static_cast<int64_t>(g) - 1, world);
    // One communicator group per pipeline stage (its tensor-parallel ranks in this process).
    for (size_t begin = 0; begin < g;) {
        const int64_t stage = (first_rank + static_cast<int64_t>(begin)) / o.n_gpus;
        size_t end = begin;
        std::vector<Ops*> raw;
        while (end < g && (first_rank + static_cast<int64_t>(end)) / o.n_gpus == stage) raw.push_back(ops_[end++].get());
        for (auto& c : make_comms(raw)) comms_.push_back(std::move(c));
        begin = end;
    }
    MEGACTX_CHECK(comms_.size() == g, "tensor parallel: {} communicators for {} ranks", comms_.size(), g);
    if (o.pp > 1) {
        if (make_pipes) {
            pipes_ = make_pipes(first_rank, static_cast<int64_t>(g));
        } else {
            MEGACTX_CHECK(static_cast<int64_t>(g) == world, "pipeline: stages in other processes need their pipes");
            thread_pipes_ = std::make_unique<ThreadPipes>();
            for (size_t r = 0; r < g; ++r) pipes_.push_back(thread_pipes_->end(static_cast<int>(r)));
        }
        MEGACTX_CHECK(pipes_.size() == g, "pipeline: {} pipes for {} ranks", pipes_.size(), g);
    }
    // Shards load in parallel (slicing copies each rank's part of the checkpoint).
    models_.resize(g);
    std::vector<std::exception_ptr> errors(g);
    std::vector<std::thread> loaders;
    for (size_t r = 0; r < g; ++r) {
        loaders.emplace_back([&, r] {
            try {
                models_[r] = std::make_unique<GlmDsaModel>(dir, plan_, static_cast<int>(first_rank + r), *comms_[r]);
            } catch (...) {
                errors[r] = std::current_exception();
            }
        });
    }
    for (auto& t : loaders) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    for (size_t r = 0; r < pipes_.size(); ++r) models_[r]->set_pipe(pipes_[r].get());
    kv_.resize(g);
    models_[0]->set_followers(g > 1 || remote_ ? this : nullptr);
    for (size_t r = 1; r < g; ++r) threads_.emplace_back([this, r] { follower_loop(static_cast<int>(r)); });
}

TensorParallelGroup::~TensorParallelGroup() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    remote_.reset();  // the other nodes stop
    models_[0]->set_followers(nullptr);
}

void TensorParallelGroup::send_remote(uint32_t type, const KvCache& kv0, const Batch* batch, const MtpInputs* mtp) {
    if (!remote_) return;
    MEGACTX_CHECK(!kv0.tiered(), "--kv-offload-memory: a host KV tier with ranks on several nodes is not supported");
    remote_->send(type, encode_step(KvShape{kv0.n_blocks(), kv0.format()}, batch, mtp));
}

void TensorParallelGroup::start(const KvCache& kv0, FollowerJob job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_fn_ = std::move(job);
        n_blocks_ = kv0.n_blocks();
        n_device_blocks_ = kv0.tiered() ? kv0.tiers().n_device() : kv0.n_blocks();
        tier_ = kv0.tiered() ? kv0.tier_options() : KvTierOptions{};
        format_ = kv0.format();
        started_kv0_ = &kv0;
        running_ = size() - 1;
        error_ = nullptr;
        ++job_;
    }
    cv_.notify_all();
}

void TensorParallelGroup::prepare(KvCache& kv0) {
    if (kv0.tiered()) {
        kv0.log_tier_events();
        kv0_ = &kv0;
    }
    send_remote(kMsgPrepare, kv0, nullptr, nullptr);
    start(kv0, [](int, Ops&, KvCache&) {});  // each follower makes its cache before running a job
    end_forward();
}

void TensorParallelGroup::begin_forward(const Batch& batch, const KvCache& kv0) {
    send_remote(kMsgForward, kv0, &batch, nullptr);
    start(kv0, [this, &batch](int r, Ops& ops, KvCache& kv) {
        models_[static_cast<size_t>(r)]->forward(ops, batch, kv);
    });
}

void TensorParallelGroup::begin_mtp_forward(const Batch& batch, const KvCache& kv0, const MtpInputs& in) {
    send_remote(kMsgMtpForward, kv0, &batch, &in);
    start(kv0, [this, &batch, &in](int r, Ops& ops, KvCache& kv) {
        const GlmDsaModel& m = *models_[static_cast<size_t>(r)];
        const int64_t n = batch.n_tokens();
        Tensor hidden = ops.alloc(DType::F32, {n, m.config().hidden_size});
        ops.upload(in.hidden.data(), hidden);
        Tensor topk, tokens;
        if (!in.reuse_topk.empty()) {
            topk = ops.alloc(DType::I32, {n, m.config().index_topk});
            ops.upload(in.reuse_topk.data(), topk);
        }
        if (!in.tokens.empty()) tokens = ops.upload_i32(in.tokens);
        m.mtp_forward(ops, batch, hidden, kv, in.reuse_topk.empty() ? nullptr : &topk,
                      in.tokens.empty() ? nullptr : &tokens);
    });
}

void TensorParallelGroup::end_forward() {
    std::exception_ptr local;
    {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return running_ == 0; });
        job_fn_ = nullptr;
        if (kv0_ != nullptr && kv0_ == started_kv0_) kv0_->clear_tier_events();  // every follower replayed them
        local = error_;
    }
    if (remote_) remote_->wait();  // a node's error is the cause of a local rank's PeerGone
    if (local) std::rethrow_exception(local);
}

bool TensorParallelGroup::abort(const std::exception_ptr& cause) {
    if (abort_handler_) abort_handler_(cause);
    bool follower_failed = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        follower_failed = error_ != nullptr;
    }
    for (auto& c : comms_) c->abort();
    for (auto& p : pipes_) p->abort();
    if (remote_ && remote_->abort()) follower_failed = true;
    return follower_failed;
}

void TensorParallelGroup::run_on_followers(const KvCache& kv0, const FollowerJob& fn) {
    MEGACTX_CHECK(!remote_, "tensor parallel: a job on the followers of other processes");
    start(kv0, fn);
    end_forward();
}

void TensorParallelGroup::follower_loop(int rank) {
    const auto r = static_cast<size_t>(rank);
    Tap::mute_this_thread();
    uint64_t seen = 0;
    for (;;) {
        FollowerJob job;
        int64_t n_blocks = 0, n_device = 0;
        KvFormat format = KvFormat::F32;
        KvTierOptions tier;
        const KvCache* kv0 = nullptr;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || job_ != seen; });
            if (stop_) return;
            seen = job_;
            job = job_fn_;
            n_blocks = n_blocks_;
            n_device = n_device_blocks_;
            tier = tier_;
            format = format_;
            kv0 = started_kv0_;
        }
        std::exception_ptr err;
        try {
            const bool tiered = tier.n_host_blocks > 0;
            if (!kv_[r] || kv_[r]->n_blocks() != n_blocks || kv_[r]->format() != format ||
                kv_[r]->tiered() != tiered) {
                kv_[r].reset();
                kv_[r] = std::make_unique<KvCache>(*ops_[r], models_[r]->config(), n_device, format,
                                                   models_[r]->kv_layers(), tier);
            }
            // Rank 0 changes its log only between jobs (allocation, end of step), never while followers run.
            if (tiered) kv_[r]->replay_tier_events(kv0->tier_events());
            job(rank, *ops_[r], *kv_[r]);
        } catch (...) {
            err = std::current_exception();
        }
        if (err) {
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (!error_) error_ = err;
            }
            for (auto& c : comms_) c->abort();  // rank 0 and the other followers may wait for this rank
            for (auto& p : pipes_) p->abort();
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            --running_;
        }
        cv_.notify_all();
    }
}

}  // namespace megactx
