#include "parallel/node_group.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "parallel/tp_group.h"

namespace megactx {

namespace {

// Ends the process at once: its ranks may be waiting in a collective that will never complete.
[[noreturn]] void exit_with(const std::string& why) {
    std::fprintf(stderr, "megactx: error: %s\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
}

// The next message, or false once the connection has ended (closed, or broken by the peer's death).
bool next_message(Connection& c, uint32_t& type, std::string& body) {
    try {
        return c.recv(type, body);
    } catch (const Error&) {
        return false;
    }
}

void put_batch(Writer& w, const Batch& b) {
    w.vec(b.tokens);
    w.vec(b.pos);
    w.vec(b.seq);
    w.u64(b.block_tables.size());
    for (const auto* t : b.block_tables) w.vec(*t);
    std::vector<uint8_t> logits(b.want_logits.begin(), b.want_logits.end());
    w.vec(logits);
    w.u64(static_cast<uint64_t>(b.pad_blocks));
    w.u64(b.want_hidden ? 1 : 0);
}

// The batch of a step; its block tables point into `tables`.
void get_batch(Reader& r, Batch& b, std::vector<std::vector<int32_t>>& tables) {
    b.tokens = r.vec<int32_t>();
    b.pos = r.vec<int32_t>();
    b.seq = r.vec<int32_t>();
    tables.resize(r.u64());
    for (auto& t : tables) t = r.vec<int32_t>();
    b.block_tables.clear();
    for (const auto& t : tables) b.block_tables.push_back(&t);
    const std::vector<uint8_t> logits = r.vec<uint8_t>();
    b.want_logits.assign(logits.begin(), logits.end());
    b.pad_blocks = static_cast<int64_t>(r.u64());
    b.want_hidden = r.u64() != 0;
}

}  // namespace

std::string encode_step(const KvShape& kv, const Batch* batch, const RankFollowers::MtpInputs* mtp) {
    Writer w;
    w.u64(static_cast<uint64_t>(kv.n_blocks));
    w.u64(static_cast<uint64_t>(kv.format));
    if (batch) put_batch(w, *batch);
    if (mtp) {
        w.vec(mtp->hidden);
        w.vec(mtp->reuse_topk);
        w.vec(mtp->tokens);
    }
    return w.data();
}

std::string node_ranks_text(int64_t node, int64_t per_node) {
    if (per_node == 1) return fmt::format("rank {}", node);
    return fmt::format("ranks {}-{}", node * per_node, node * per_node + per_node - 1);
}

FollowerNodes::FollowerNodes(std::unique_ptr<Rendezvous> rv, int64_t ranks_per_node)
    : rv_(std::move(rv)), per_node_(ranks_per_node) {
    const auto n = static_cast<size_t>(rv_->nnodes());
    answered_.assign(n, 0);
    closed_.assign(n, false);
    acked_.assign(n, false);
    error_.assign(n, "");
    for (int64_t k = 1; k < rv_->nnodes(); ++k) readers_.emplace_back([this, k] { read_loop(k); });
}

FollowerNodes::~FollowerNodes() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    send_all(kMsgStop, "");
    // Each node closes its connection once it has stopped; a node that does not is cut off after a while.
    {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(10), [&] {
            for (int64_t k = 1; k < rv_->nnodes(); ++k)
                if (!closed_[static_cast<size_t>(k)]) return false;
            return true;
        });
    }
    for (int64_t k = 1; k < rv_->nnodes(); ++k) rv_->peer(k).shutdown();
    for (auto& t : readers_) t.join();
}

void FollowerNodes::send_all(uint32_t type, const std::string& body) {
    for (int64_t k = 1; k < rv_->nnodes(); ++k) {
        try {
            rv_->peer(k).send(type, body);
        } catch (const Error&) {
            // a node that is gone: its reader reports it
        }
    }
}

void FollowerNodes::read_loop(int64_t node) {
    Connection& c = rv_->peer(node);
    for (;;) {
        uint32_t type = 0;
        std::string body;
        const bool got = next_message(c, type, body);
        std::unique_lock<std::mutex> lock(mu_);
        const auto k = static_cast<size_t>(node);
        if (!got) {
            closed_[k] = true;
            if (!stopping_ && !aborting_ && error_[k].empty())
                exit_with(fmt::format("tensor parallel: node {} ({}) exited; stopping", node,
                                      node_ranks_text(node, per_node_)));
            cv_.notify_all();
            return;
        }
        if (type == kMsgDone) {
            ++answered_[k];
        } else if (type == kMsgError) {
            error_[k] = body;
            ++answered_[k];
            // An error outside a step (a node that could not load its shard) has nobody waiting for it.
            if (answered_[k] > sent_)
                exit_with(
                    fmt::format("tensor parallel: node {} ({}): {}", node, node_ranks_text(node, per_node_), body));
        } else if (type == kMsgAbort) {
            acked_[k] = true;  // it leaves its collectives and exits
        } else {
            exit_with(fmt::format("tensor parallel: node {} sent message {} during a step", node, type));
        }
        cv_.notify_all();
    }
}

void FollowerNodes::send(uint32_t type, const std::string& body) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++sent_;
    }
    send_all(type, body);
}

bool FollowerNodes::all_settled() const {
    for (int64_t k = 1; k < rv_->nnodes(); ++k) {
        const auto i = static_cast<size_t>(k);
        if (answered_[i] < sent_ && !closed_[i] && !acked_[i]) return false;
    }
    return true;
}

int64_t FollowerNodes::died() const {
    for (int64_t k = 1; k < rv_->nnodes(); ++k) {
        const auto i = static_cast<size_t>(k);
        if (closed_[i] && !acked_[i] && error_[i].empty() && answered_[i] < sent_) return k;
    }
    return -1;
}

void FollowerNodes::wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return all_settled(); });
    for (int64_t k = 1; k < rv_->nnodes(); ++k) {
        const auto i = static_cast<size_t>(k);
        if (!error_[i].empty())
            MEGACTX_FAIL("tensor parallel: node {} ({}): {}", k, node_ranks_text(k, per_node_), error_[i]);
    }
    const int64_t dead = died();
    MEGACTX_CHECK(dead < 0, "tensor parallel: node {} ({}) exited mid-step", dead, node_ranks_text(dead, per_node_));
    // The step node 0 aborted: its own error is the cause. A later step: the nodes are gone.
    if (sent_ == aborted_step_) return;
    for (int64_t k = 1; k < rv_->nnodes(); ++k) {
        const auto i = static_cast<size_t>(k);
        MEGACTX_CHECK(answered_[i] >= sent_, "tensor parallel: node {} ({}) stopped after node 0 aborted a step", k,
                      node_ranks_text(k, per_node_));
    }
}

bool FollowerNodes::abort() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        aborting_ = true;
        aborted_step_ = sent_;
    }
    send_all(kMsgAbort, "");
    // Every node answers (its error), acknowledges the abort, or is gone: gone without either, it died, and that
    // is the cause of this node's failure (a collective whose peer left).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return all_settled(); });
    if (died() >= 0) return true;
    for (int64_t k = 1; k < rv_->nnodes(); ++k)
        if (!error_[static_cast<size_t>(k)].empty()) return true;
    return false;
}

namespace {

// What a follower node's reader thread hands its main thread.
struct Step {
    uint32_t type = 0;
    std::string body;
};

class StepQueue {
  public:
    void push(Step s) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            q_.push_back(std::move(s));
        }
        cv_.notify_all();
    }
    Step pop() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !q_.empty(); });
        Step s = std::move(q_.front());
        q_.pop_front();
        return s;
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Step> q_;
};

}  // namespace

int run_follower_node(Rendezvous& rv, TensorParallelGroup& group) {
    Connection& c = rv.peer(0);
    const int64_t node = rv.node_rank();
    std::mutex send_mu;
    StepQueue steps;
    // The reader: steps go to the queue; node 0 aborting or leaving ends this process at once (its ranks may be
    // waiting in a collective that will never complete).
    std::thread reader([&] {
        for (;;) {
            uint32_t type = 0;
            std::string body;
            const bool got = next_message(c, type, body);
            if (!got)
                exit_with(fmt::format("tensor parallel: node 0 ({}) exited; node {} stops",
                                      node_ranks_text(0, group.size()), node));
            if (type == kMsgAbort) {
                {
                    std::lock_guard<std::mutex> lock(send_mu);
                    try {
                        c.send(kMsgAbort, "");
                    } catch (const Error&) {
                    }
                }
                exit_with(
                    fmt::format("tensor parallel: node 0 aborted the step (its error is reported there); "
                                "node {} stops",
                                node));
            }
            const bool stop = type == kMsgStop;
            steps.push(Step{type, std::move(body)});
            if (stop) return;
        }
    });

    // A step that failed here ends this process: its ranks may wait in a collective that gloo cannot cancel, and
    // its connections closing releases the other nodes' ranks.
    const auto fail = [&](const std::exception_ptr& cause) {
        try {
            std::rethrow_exception(cause);
        } catch (const PeerGone&) {
            // Another process left mid-collective: node 0's leaving is reported by the reader (which ends this
            // process); another node's by node 0. Give them the time to.
            std::this_thread::sleep_for(std::chrono::seconds(5));
            exit_with(fmt::format("tensor parallel: node {}: another node left mid-step", node));
        } catch (const std::exception& e) {
            {
                std::lock_guard<std::mutex> lock(send_mu);
                try {
                    c.send(kMsgError, e.what());
                } catch (const Error&) {
                }
            }
            exit_with(e.what());
        } catch (...) {
            exit_with(fmt::format("tensor parallel: node {}: a rank failed", node));
        }
    };
    group.set_abort_handler(fail);  // this node's first rank failed while its other ranks may wait for it
    GlmDsaModel& model = group.model();
    Ops& ops = group.ops();
    std::unique_ptr<KvCache> kv;
    KvShape shape;
    for (;;) {
        Step s = steps.pop();
        if (s.type == kMsgStop) {
            reader.join();
            return 0;
        }
        try {
            Reader r(s.body);
            KvShape want;
            want.n_blocks = static_cast<int64_t>(r.u64());
            want.format = static_cast<KvFormat>(r.u64());
            if (!kv || want.n_blocks != shape.n_blocks || want.format != shape.format) {
                kv.reset();
                kv = std::make_unique<KvCache>(ops, model.config(), want.n_blocks, want.format, model.kv_layers());
                shape = want;
                model.prepare_kv(*kv);
            }
            if (s.type == kMsgForward || s.type == kMsgMtpForward) {
                Batch batch;
                std::vector<std::vector<int32_t>> tables;
                get_batch(r, batch, tables);
                if (s.type == kMsgForward) {
                    model.forward(ops, batch, *kv);
                } else {
                    const std::vector<float> hidden_in = r.vec<float>();
                    const std::vector<int32_t> reuse = r.vec<int32_t>(), toks = r.vec<int32_t>();
                    const int64_t n = batch.n_tokens();
                    Tensor hidden = ops.alloc(DType::F32, {n, model.config().hidden_size});
                    ops.upload(hidden_in.data(), hidden);
                    Tensor topk, tokens;
                    if (!reuse.empty()) {
                        topk = ops.alloc(DType::I32, {n, model.config().index_topk});
                        ops.upload(reuse.data(), topk);
                    }
                    if (!toks.empty()) tokens = ops.upload_i32(toks);
                    model.mtp_forward(ops, batch, hidden, *kv, reuse.empty() ? nullptr : &topk,
                                      toks.empty() ? nullptr : &tokens);
                }
            } else {
                MEGACTX_CHECK(s.type == kMsgPrepare, "tensor parallel: node 0 sent message {}", s.type);
            }
            std::lock_guard<std::mutex> lock(send_mu);
            c.send(kMsgDone, "");
        } catch (...) {
            fail(std::current_exception());
        }
    }
}

}  // namespace megactx
