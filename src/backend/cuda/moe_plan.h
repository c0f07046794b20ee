// Which path runs a few tokens' FP8 routed experts (CudaOps::moe_experts), in plain C++ shared with a CPU unit test
// (tests/unit/test_moe_plan.cpp):
// - per choice (moe.h): every (token, choice) reads its expert's weights, fp32 activations, no grouping step;
// - grouped by expert (moe_fp8.h): every chosen expert is read once for all of its tokens, W8A8 on the tensor cores,
//   after a device-side grouping step.
// Grouping pays when the tokens share experts. On the H200 (bench_gemm --moe-tokens, one GLM-5.2 layer: 256 experts,
// 8 per token) the per-choice kernels take ~9.3 µs per (token, choice) and the grouped path ~10.3 µs per distinct
// expert, at 1 to 32 tokens: 8 tokens that drew 60 experts 598 / 629 µs, 10 tokens that drew 69 743 / 718, 16 tokens
// 1181 / 1042 (bench/results/cuda-h200-2026-12-01-d3e8f6e-moe-small-nostage-ab.txt). So per choice is faster when
// the distinct experts D exceed ~0.9 · n · k, which a uniform draw gives up to ~9 tokens, and which a batch whose
// tokens share experts never gives (bench_model's identical sequences with a 256-expert layer: per choice 0.973 /
// 1.309 ms at 4 / 8 sequences against 0.773 / 0.832 grouped, …-7d825de-bench_model-256e-moe-rule.txt).
// Only the device knows D (the ids come from the router kernel). With min_tokens 0, for 3 to kOnDeviceMaxTokens
// tokens both paths are launched: the grouped path's plan kernel counts D and either runs the grouped kernels or lets
// the per-choice ones run (the others return at once). The pick is right, but the skipped path still launches all of
// its CTAs, and empty CTAs are not free (H200, one GLM-5.2 layer, bench_gemm --moe-tokens, device against the faster
// path: 3 / 4 / 6 tokens routed apart 250 / 325 / 473 against 237 / 310 / 456 µs per choice; 8 / 10 tokens 623 / 726
// against 591 / 686 grouped; tokens sharing their 8 experts 134 / 138 / 157 / 175 against 121 / 122 / 129 / 140
// grouped at 3 / 4 / 8 / 10; bench/results/cuda-h200-2026-12-01-c60b964-moe-device-choice.txt). Against the default
// (grouped from 3 tokens) it wins 7-28 µs at 3-6 tokens routed apart and loses 13-35 µs elsewhere, so it is opt-in.
// Capped grids (CTAs looping over the choices or experts) cut the skipped path to ~5-7 µs but made the per-choice
// kernels 20-40 µs slower when they run (session 19 lab, bench/cuda/lab/moe_capped_grids.patch). What would make it
// the default: a skipped path that launches nothing, e.g. the two paths as the branches of a CUDA graph conditional
// node that the plan kernel sets (cudaGraphSetConditional), with both launched only outside graphs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace megactx::moe_plan {

enum class MoePath { kPerChoice, kGrouped, kOnDevice };

// Above this many tokens the device choice is not launched: a uniform draw of 11 tokens × 8 of 256 experts expects
// D = 0.86 · n · k, so the per-choice kernels would almost never run and their empty launches would only cost.
constexpr int64_t kOnDeviceMaxTokens = 10;

// Expected distinct experts among n tokens' k choices each when routing is uniform: E · (1 − (1 − k/E)^n).
inline double expected_distinct_experts(int64_t n, int64_t k, int64_t n_exp) {
    if (n_exp <= 0 || k <= 0 || n <= 0) return 0.0;
    const double miss = 1.0 - static_cast<double>(k) / static_cast<double>(n_exp);
    return static_cast<double>(n_exp) * (1.0 - std::pow(miss < 0.0 ? 0.0 : miss, static_cast<double>(n)));
}

// The most distinct experts for which n tokens' k choices run grouped: floor(0.9 · n · k).
inline int64_t grouped_max_active(int64_t n, int64_t k) { return 9 * n * k / 10; }

// min_tokens > 0: grouped from that many tokens on (CudaOptions::moe_fp8_min_tokens, a fixed threshold).
// min_tokens == 0: per choice for 1-2 tokens; grouped when even n · k distinct experts (or all E) would be within
// grouped_max_active, and above kOnDeviceMaxTokens; else chosen on the device.
inline MoePath moe_path(int64_t n, int64_t k, int64_t n_exp, int min_tokens) {
    if (min_tokens > 0) return n >= min_tokens ? MoePath::kGrouped : MoePath::kPerChoice;
    if (n < 3) return MoePath::kPerChoice;
    if (std::min(n * k, n_exp) <= grouped_max_active(n, k) || n > kOnDeviceMaxTokens) return MoePath::kGrouped;
    return MoePath::kOnDevice;
}

}  // namespace megactx::moe_plan
