// Which path runs a few tokens' FP8 routed experts (CudaOps::moe_experts), in plain C++ shared with a CPU unit test
// (tests/unit/test_moe_plan.cpp):
// - per choice (moe.h): every (token, choice) reads its expert's weights, fp32 activations, no grouping step;
// - grouped by expert (moe_fp8.h): every chosen expert is read once for all of its tokens, W8A8 on the tensor cores,
//   after a device-side grouping step.
// Grouping pays when the tokens share experts. With GLM-5.2's 256 experts and 8 choices per token, n tokens touch
// nearly n·8 distinct experts, and up to ~9 tokens the per-choice kernels read faster (H200, bench_gemm
// --moe-tokens, one layer, µs per choice / grouped: 1 token 86.5 / 107.3, 8 tokens 598 / 629, 10 tokens 743 / 718,
// 16 tokens 1181 / 1042; bench/results/cuda-h200-2026-12-01-d3e8f6e-moe-small-nostage-ab.txt). With 4 experts and 2
// choices (the glm52-shape preset) grouping wins from 3 tokens.
// The automatic rule below assumes uniform routing. Real batches can share experts far more: in bench_model's decode
// batches (identical sequences, so identical choices) with a 256-expert layer, per choice ran 0.973 / 1.309 ms at 4 /
// 8 sequences against 0.773 / 0.832 grouped (…-7d825de-bench_model-256e-moe-rule.txt). Losing 5-19% when tokens
// route apart is the smaller risk, so CudaOptions keeps the fixed threshold of 3 tokens and the rule is opt-in (0).
#pragma once

#include <cmath>
#include <cstdint>

namespace megactx::moe_plan {

// Expected distinct experts among n tokens' k choices each when routing is uniform: E · (1 − (1 − k/E)^n).
inline double expected_distinct_experts(int64_t n, int64_t k, int64_t n_exp) {
    if (n_exp <= 0 || k <= 0 || n <= 0) return 0.0;
    const double miss = 1.0 - static_cast<double>(k) / static_cast<double>(n_exp);
    return static_cast<double>(n_exp) * (1.0 - std::pow(miss < 0.0 ? 0.0 : miss, static_cast<double>(n)));
}

// min_tokens > 0: grouped from that many tokens on (CudaOptions::moe_fp8_min_tokens, a fixed threshold).
// min_tokens == 0 (automatic): grouped from 3 tokens on when the expected distinct experts are at most 88% of the
// n·k expert reads the per-choice kernels make. The measured crossover lies between 94% (8 tokens drew 60 experts:
// per choice 5% faster) and 86% (10 tokens, 69: grouped 3% faster); the grouped kernel streams ~3.6 against ~3.8
// TB/s at these sizes and adds its grouping step.
inline bool grouped_by_expert(int64_t n, int64_t k, int64_t n_exp, int min_tokens) {
    if (min_tokens > 0) return n >= min_tokens;
    if (n < 3) return false;
    return expected_distinct_experts(n, k, n_exp) <= 0.88 * static_cast<double>(n * k);
}

}  // namespace megactx::moe_plan
