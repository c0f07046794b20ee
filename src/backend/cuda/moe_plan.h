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
// Only the device knows D (the ids come from the router kernel). So, with min_tokens 0 (the default), for 3 to
// kOnDeviceMaxTokens tokens inside a CUDA graph (decode), the grouped path's plan kernel counts D and sets a
// conditional graph node whose two branches are the paths: the skipped one launches nothing. Outside a graph the
// grouped path runs. Measured on the H200 (bench_gemm --moe-tokens, one GLM-5.2 layer, graphs; the node and, for per
// choice, the plan kernel cost ~6-12 µs;
// bench/results/cuda-h200-2026-12-01-d35a79c-moe-device-choice-graph-node.txt):
// - 3 / 4 / 6 tokens routed apart: 250.6 / 325.5 / 472.3 µs, against 266.6 / 334.8 / 506.2 grouped (per choice alone
//   238.6 / 312.9 / 460.6);
// - tokens sharing their 8 experts: 129.0 / 129.5 µs at 3 / 4 (135.6 at 8, above today's bound), against 121.6 /
//   123.0 (129.6) grouped;
// - 8 / 10 tokens routed apart: the device picks grouped and loses the node's cost, 613-622 / 711-731 against
//   603-604 / 702-718, which is why the choice stops at 6 tokens.
// Tried first: both paths launched, the skipped one's kernels returning at once; their grids, sized on the host for
// the worst case, cost 13-35 µs of empty CTAs. Capped grids (CTAs looping over the choices or experts) cut that to
// ~5-7 µs but made the per-choice kernels 20-40 µs slower when they run (commit 3b8cb10,
// bench/cuda/lab/moe_capped_grids.patch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace megactx::moe_plan {

enum class MoePath { kPerChoice, kGrouped, kOnDevice };

// Above this many tokens the choice is not made: a uniform draw of 8 tokens × 8 of 256 experts expects D = 0.90 · n · k,
// so per choice would win about half the time, and by less than the node costs the other half.
constexpr int64_t kOnDeviceMaxTokens = 6;

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
// grouped_max_active, and above kOnDeviceMaxTokens; else chosen on the device (inside a CUDA graph; grouped outside).
inline MoePath moe_path(int64_t n, int64_t k, int64_t n_exp, int min_tokens) {
    if (min_tokens > 0) return n >= min_tokens ? MoePath::kGrouped : MoePath::kPerChoice;
    if (n < 3) return MoePath::kPerChoice;
    if (std::min(n * k, n_exp) <= grouped_max_active(n, k) || n > kOnDeviceMaxTokens) return MoePath::kGrouped;
    return MoePath::kOnDevice;
}

}  // namespace megactx::moe_plan
