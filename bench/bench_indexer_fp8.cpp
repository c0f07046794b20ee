// bench_indexer_fp8: what FP8 does to the lightning indexer's top-k, with and without the Hadamard rotation
// (model-spec §3.3; ModelConfig::indexer_hadamard). A model's forward runs over a real text on the CPU in fp32;
// at every indexer call the same queries, gates and cached keys are also scored
//   (b) FP8: every query head vector and every key quantised as the FP8 path stores them (ue8m0 scale, e4m3 RNE:
//       fp8_indexer_pack / unpack), then scored in fp32 — the FP8 logits kernel's math;
//   (c) Hadamard + FP8: the same after rotating both by hadamard_transform;
// and each query's top-k slots are compared with the fp32 selection (a): recall = |S_b ∩ S_a| / topk, over the
// queries that have more than topk candidates (fewer: every candidate is selected, recall 1 by construction).
// The forward itself follows (a), so every layer sees the same inputs in all three. Prints a table per indexer
// layer and writes JSON with device, date, commit and every number.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cpu/cpu_ops.h"
#include "bench_util.h"
#include "core/error.h"
#include "engine/runner.h"
#include "kv/kv_format.h"
#include "model/glm_dsa.h"
#include "tokenizer/tokenizer.h"

#ifndef MEGACTX_SOURCE_DIR
#define MEGACTX_SOURCE_DIR "."
#endif

namespace megactx {
namespace {

using json = nlohmann::json;

struct Recall {
    double sum = 0, min = 1;
    int64_t rows = 0, exact_rows = 0;  // rows compared; rows whose whole top-k set equals the fp32 one
    void add(double r) {
        sum += r;
        min = std::min(min, r);
        ++rows;
        exact_rows += r == 1.0;
    }
    double mean() const { return rows > 0 ? sum / static_cast<double>(rows) : 1.0; }
};

// Rows of `x` ([rows, d]) as the FP8 indexer path sees them: optionally rotated, quantised, dequantised.
void fp8_rows(float* x, int64_t rows, int64_t d, bool hadamard) {
    std::vector<uint8_t> buf(static_cast<size_t>(fp8_indexer_block_bytes(d)));
    for (int64_t r = 0; r < rows; ++r) {
        float* v = x + r * d;
        if (hadamard) hadamard_transform(v, d);
        fp8_indexer_pack(v, d, 0, buf.data());
        fp8_indexer_unpack(buf.data(), d, 0, v);
    }
}

// The CPU oracle, scoring each indexer call three ways; results per indexer layer (the model calls indexer_topk
// once per full layer, in layer order, in every forward).
class RecallOps : public CpuOps {
  public:
    explicit RecallOps(std::vector<int64_t> full_layers) : layers_(std::move(full_layers)) {
        fp8_.resize(layers_.size());
        fp8_hadamard_.resize(layers_.size());
    }

    void indexer_topk(const IndexerTopkParams& p) override {
        CpuOps::indexer_topk(p);  // (a): the forward goes on with the exact selection
        const size_t layer = calls_++ % layers_.size();
        const std::vector<int32_t> exact(p.out_slots->i32(), p.out_slots->i32() + p.out_slots->numel());
        score_variant(p, false, exact, fp8_[layer]);
        score_variant(p, true, exact, fp8_hadamard_[layer]);
    }

    const std::vector<int64_t>& layers() const { return layers_; }
    const std::vector<Recall>& fp8() const { return fp8_; }
    const std::vector<Recall>& fp8_hadamard() const { return fp8_hadamard_; }

  private:
    void score_variant(const IndexerTopkParams& p, bool hadamard, const std::vector<int32_t>& exact, Recall& out) {
        const int64_t d = p.q->shape.back(), n = p.q->dim(0), k = p.topk;
        Tensor q = alloc(DType::F32, p.q->shape);        // [n, n_head_indexer, d_indexer]
        Tensor keys = alloc(DType::F32, p.keys->shape);  // [n_slots, d_indexer]
        Tensor slots = alloc(DType::I32, {n, k});
        std::copy_n(p.q->f32(), q.numel(), q.f32());
        std::copy_n(p.keys->f32(), keys.numel(), keys.f32());
        fp8_rows(q.f32(), q.numel() / d, d, hadamard);
        fp8_rows(keys.f32(), keys.dim(0), d, hadamard);
        IndexerTopkParams v = p;
        v.q = &q;
        v.keys = &keys;
        v.out_slots = &slots;
        CpuOps::indexer_topk(v);
        for (int64_t i = 0; i < n; ++i) {
            if (p.map.pos[i] + 1 <= k) continue;
            std::vector<int32_t> a(exact.begin() + i * k, exact.begin() + (i + 1) * k);
            std::vector<int32_t> b(slots.i32() + i * k, slots.i32() + (i + 1) * k);
            std::sort(a.begin(), a.end());
            std::sort(b.begin(), b.end());
            std::vector<int32_t> both;
            std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
            out.add(static_cast<double>(both.size()) / static_cast<double>(k));
        }
    }

    std::vector<int64_t> layers_;
    std::vector<Recall> fp8_, fp8_hadamard_;
    int64_t calls_ = 0;
};

std::vector<int32_t> text_tokens(const std::string& model_dir, const std::string& text_path, int64_t n) {
    std::ifstream in(text_path);
    MEGACTX_CHECK(in.good(), "--text {}: cannot read the file", text_path);
    std::stringstream ss;
    ss << in.rdbuf();
    const Tokenizer tok = Tokenizer::load(model_dir);
    std::vector<int32_t> ids = tok.encode(ss.str());
    MEGACTX_CHECK(static_cast<int64_t>(ids.size()) >= n, "--text {}: {} tokens, fewer than --tokens {}", text_path,
                  ids.size(), n);
    ids.resize(static_cast<size_t>(n));
    return ids;
}

json layer_rows(const RecallOps& ops) {
    json rows = json::array();
    for (size_t l = 0; l < ops.layers().size(); ++l) {
        const Recall &b = ops.fp8()[l], &c = ops.fp8_hadamard()[l];
        rows.push_back(
            {{"layer", ops.layers()[l]},
             {"queries", b.rows},
             {"fp8", {{"recall_mean", b.mean()}, {"recall_min", b.min}, {"exact_rows", b.exact_rows}}},
             {"fp8_hadamard", {{"recall_mean", c.mean()}, {"recall_min", c.min}, {"exact_rows", c.exact_rows}}}});
        std::printf("%6lld %8lld   %9.5f %9.5f %7lld   %9.5f %9.5f %7lld\n", static_cast<long long>(ops.layers()[l]),
                    static_cast<long long>(b.rows), b.mean(), b.min, static_cast<long long>(b.exact_rows), c.mean(),
                    c.min, static_cast<long long>(c.exact_rows));
    }
    return rows;
}

int run(int argc, char** argv) {
    CLI::App app{"Top-k recall of the FP8 lightning indexer, with and without the Hadamard rotation, against fp32"};
    std::string model_dir = std::string(MEGACTX_SOURCE_DIR) + "/models/glm-demo", text, out;
    int64_t n_tokens = 4096, chunk = 512;
    app.add_option("--model", model_dir, "Model directory (config.json, weights, tokenizer.json)")
        ->capture_default_str();
    app.add_option("--text", text, "Text file to run over (default: the model directory's haystack.txt)");
    app.add_option("--tokens", n_tokens, "Tokens of the text to feed")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--chunk", chunk, "Tokens per forward (prefill chunk)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--out", out, "Write the results as JSON here");
    CLI11_PARSE(app, argc, argv);
    if (text.empty()) text = model_dir + "/haystack.txt";

    const GlmDsaModel model(model_dir);
    const ModelConfig& c = model.config();
    std::vector<int64_t> full;
    for (int64_t l = 0; l < c.n_layers; ++l)
        if (c.is_full(l)) full.push_back(l);
    const std::vector<int32_t> ids = text_tokens(model_dir, text, n_tokens);
    RecallOps ops(full);
    SequenceRunner runner(model, ops, n_tokens);
    runner.feed(ids, chunk, false);

    std::printf("%s: %lld tokens of %s, top-%lld, %lld indexer heads x %lld dims\n", model_dir.c_str(),
                static_cast<long long>(n_tokens), text.c_str(), static_cast<long long>(c.index_topk),
                static_cast<long long>(c.n_head_indexer), static_cast<long long>(c.d_indexer));
    std::printf("%6s %8s   %-27s   %-27s\n", "layer", "queries", "FP8: recall mean / min / exact",
                "Hadamard+FP8: mean / min / exact");
    json r = {{"bench", "bench_indexer_fp8"},
              {"model", model_dir},
              {"text", text},
              {"tokens", n_tokens},
              {"chunk", chunk},
              {"index_topk", c.index_topk},
              {"n_head_indexer", c.n_head_indexer},
              {"d_indexer", c.d_indexer},
              {"device", bench::device_info()},
              {"date", bench::utc_now()},
              {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
              {"dirty", bench::source_dirty(MEGACTX_SOURCE_DIR)}};
    r["layers"] = layer_rows(ops);
    if (!out.empty()) {
        std::ofstream f(out);
        MEGACTX_CHECK(f.good(), "--out {}: cannot write the file", out);
        f << r.dump(2) << "\n";
    }
    return 0;
}

}  // namespace
}  // namespace megactx

int main(int argc, char** argv) {
    try {
        return megactx::run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_indexer_fp8: %s\n", e.what());
        return 1;
    }
}
