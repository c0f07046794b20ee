// indexer_q_quant: FP8 form of the indexer queries (model-spec §3.3).
//   q8[i, h, :] = e4m3(q[i, h, :] / s_ih),  s_ih = ue8m0 scale of the head vector (amax/448 floored at 1e-4/448,
//   rounded up to a power of two);  w8[i, h] = gates[i, h] · head_scale · softmax_scale · s_ih
//   (with hadamard_scale > 0, q[i, h, :] is first rotated to H · q[i, h, :], H the normalised Walsh–Hadamard matrix)
// so that the logits kernel computes k_scale(t) · Σ_h w8_h · relu(q8_h · k8(t)).  GLM-5.2: 32 heads × 128 dims;
// DeepSeek-V3.2: 64 heads × 128 dims.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx {

struct IndexerQQuantParams {
    const float* q = nullptr;      // [n, n_head, 128] fp32, RoPE applied
    const float* gates = nullptr;  // [n, n_head] weights_proj output
    int64_t n = 0;
    int64_t n_head = 32;      // 32 or 64
    float head_scale = 0;     // n_head_indexer^-0.5
    float softmax_scale = 0;  // d_indexer^-0.5
    uint8_t* q8 = nullptr;    // [n, n_head, 128] e4m3
    float* w8 = nullptr;      // [n, n_head] folded per-head weights
    // > 0: each head vector is rotated by the normalised Hadamard matrix first (keys stored so too;
    // kv_format.h hadamard_transform), this being hadamard_scale(128).
    float hadamard_scale = 0;
    // Optional (plan != nullptr), for rows of which no two share a sequence (decode: CacheMap::max_seq_rows 1): also
    // write what launch_indexer_plan would for rows row_begin .. row_begin + n (every row its own group) with the
    // top-k row lengths (pos + 1), and zero zero_n ints at zero (the top-k's control words), so no plan kernel runs.
    // Launched plainly, the kernel starts after every earlier kernel of the stream has completed, so those words are
    // no longer in use.
    const int32_t* pos = nullptr;           // [batch rows]
    const int32_t* seq = nullptr;           // [batch rows]
    const int32_t* table_offset = nullptr;  // [n_seq]
    int64_t row_begin = 0;
    int32_t* plan = nullptr;  // [indexer_plan_ints(n)]
    int32_t* lengths = nullptr;
    int* zero = nullptr;
    int64_t zero_n = 0;
};

bool indexer_q_quant_supported(int64_t n_head, int64_t d_indexer);
void launch_indexer_q_quant(const IndexerQQuantParams& p, cudaStream_t stream);

}  // namespace megactx
