// Contract of the reference DSA kernels (attention_ref.cu): simple, correct for any geometry, reading F32, BF16
// or FP8 KV pools (dequantised on read exactly like kv_format.cpp). The fast kernels live elsewhere.
//   indexer scores: score[i, t] = Σ_h (w[i, h] · head_scale) · ReLU(q[i, h] · k_t · softmax_scale) for the
//                   candidates t ≤ pos[i] of token i's sequence (model-spec §3.2)
//   top-k rows:     per token the topk candidates by (score desc, index asc), written as slots in ascending
//                   candidate order, −1 padded (the CPU oracle's topk_indices)
//   sparse MLA:     out[i, h] = softmax_j(q[i, h] · row_j · scale) · row_j[:d_v] over the selected slots
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct IndexerMapView {
    const int32_t* pos = nullptr;           // [n]
    const int32_t* seq = nullptr;           // [n]
    const int32_t* table_offset = nullptr;  // [n_seq]
    const int32_t* tables = nullptr;        // concatenated block tables
    int64_t block_size = 64;
};

struct IndexerScoresParams {
    const float* q = nullptr;        // [n, n_head, dim]
    const float* w = nullptr;        // [n, n_head]
    const void* keys = nullptr;      // indexer pool
    int elem = 0;                    // 0 f32, 1 bf16, 2 fp8 (paged)
    IndexerMapView map;
    int64_t n_head = 0, dim = 0;
    int64_t i0 = 0, i1 = 0;          // token range scored in this launch
    int64_t n_cand_max = 0;          // row stride of `scores` (≥ max pos + 1 over the range)
    float softmax_scale = 0, head_scale = 0;
    float* scores = nullptr;         // [i1 − i0, n_cand_max]
};

struct TopkRowsParams {
    const float* scores = nullptr;   // [i1 − i0, n_cand_max]
    IndexerMapView map;
    int64_t i0 = 0, i1 = 0, n_cand_max = 0, topk = 0;
    int32_t* out = nullptr;          // [n, topk], rows i0..i1 written
};

struct SparseMlaRefParams {
    const float* q = nullptr;        // [n, n_head, d]
    const void* cache = nullptr;     // latent pool
    int elem = 0;                    // 0 f32, 1 bf16, 2 fp8 (656-B-style rows)
    const int32_t* slots = nullptr;  // [n, topk]
    int64_t n = 0, n_head = 0, d = 0, d_v = 0, topk = 0;
    float scale = 0;
    float* out = nullptr;            // [n, n_head, d_v]
};

// Dynamic shared memory the scores kernel needs; callers check it against the device's opt-in limit.
int64_t indexer_scores_smem_bytes(int64_t n_head, int64_t dim);
cudaError_t launch_indexer_scores(const IndexerScoresParams& p, cudaStream_t stream);
cudaError_t launch_topk_rows(const TopkRowsParams& p, cudaStream_t stream);
int64_t sparse_mla_ref_smem_bytes(int64_t d, int64_t topk);
cudaError_t launch_sparse_mla_ref(const SparseMlaRefParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
