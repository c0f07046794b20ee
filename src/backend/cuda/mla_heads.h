// mla_heads: the absorbed MLA's per-head products for a few tokens (decode), reading kv_b as stored (model-spec
// §2.5). kv_b is [n_head · (d_nope + d_v), r] row-major: head h's rows h·(d_nope + d_v) + j are W_UK_h (j < d_nope)
// then W_UV_h (the d_v rows after them). FP8 weights are e4m3 with fp32 block scales s [ceil(rows / 128),
// ceil(r / 128)] (W[i, c] = e4m3(i, c) · s[i / 128, c / 128]); BF16 weights are read as they are. Activations and
// accumulation are fp32 (the cuBLAS path rounds both operands to bf16 first).
//   absorb:  y[t, h, c] = Σ_{j < d_nope} x[t, h, j] · W[h·(d_nope + d_v) + j, c]        c < r
//            y[t, h, r + e] = x[t, h, d_nope + e]                                        e < d_qk − d_nope (q_pe)
//            x [n, n_head, d_qk], y [n, n_head, r + d_qk − d_nope]
//   expand:  y[t, h·d_v + v] = Σ_{c < r} W[h·(d_nope + d_v) + d_nope + v, c] · x[t, h, c]
//            x [n, n_head, r], y [n, n_head · d_v]
// Decode at batch 1 reads W_UK and W_UV once (GLM-5.2: 6.3 + 8.4 MB in FP8); cuBLAS's batched GEMM over the bf16
// copy took 13.0 and 12.4 µs for them (bench_layer, H200); these kernels 7.7 and 7.7 (8.4 and 10.7 with one CTA per
// SM, whose warps each reduced 16 rows by 80 dependent shuffles). Supported: r = 512,
// n ≤ kMlaHeadsMaxTokens, d_nope ≤ 256, d_nope and d_v multiples of 8; one pass at batch 1, else four tokens per pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

constexpr int64_t kMlaHeadsMaxTokens = 16;

struct MlaHeadsParams {
    const float* x = nullptr;
    const void* w = nullptr;        // kv_b, e4m3 or bf16
    const float* scales = nullptr;  // FP8: block scales; null for BF16
    bool fp8 = true;
    float* y = nullptr;
    int64_t n = 0, n_head = 0, d_nope = 0, d_v = 0, r = 0;
    int64_t d_qk = 0;  // absorb: the query's per-head width (d_nope + rope)
};

bool mla_heads_supported(const MlaHeadsParams& p);
cudaError_t launch_mla_absorb(const MlaHeadsParams& p, cudaStream_t stream);
cudaError_t launch_mla_expand(const MlaHeadsParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
