// Tiled indexer scores (contract: indexer_scores.h). Grid: x over 128-candidate tiles, y over groups of R query
// rows. The block stages its rows' queries and gates in shared memory; each thread owns one candidate t, loads its
// key once per sequence into registers and scores it against every row of the group. The arithmetic is the
// reference kernel's (attention_ref.cu), term for term, so the scores are identical.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/indexer_scores.h"

namespace megactx::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxRows = 64;
constexpr int64_t kSmemBudget = 40 * 1024;

int64_t rows_per_block(int64_t n_head, int64_t dim) {
    const int64_t per_row = (n_head * dim + n_head) * 4;
    return std::min<int64_t>(kMaxRows, kSmemBudget / per_row);
}

template <int D>
__global__ void __launch_bounds__(kThreads) indexer_scores_tiled_kernel(IndexerScoresParams p, int rows) {
    extern __shared__ float smem[];
    const int H = static_cast<int>(p.n_head);
    float* sq = smem;                 // [rows, H, D]
    float* sg = smem + rows * H * D;  // [rows, H] gates · head_scale
    const int64_t r0 = p.i0 + static_cast<int64_t>(blockIdx.y) * rows;
    const int nr = static_cast<int>(min(p.i1 - r0, static_cast<int64_t>(rows)));
    for (int j = threadIdx.x; j < nr * H * D; j += kThreads) sq[j] = p.q[r0 * H * D + j];
    for (int j = threadIdx.x; j < nr * H; j += kThreads) sg[j] = p.w[r0 * H + j] * p.head_scale;
    __syncthreads();
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    if (t >= p.n_cand_max) return;
    float k[D];
    int32_t loaded_seq = -1;
    for (int r = 0; r < nr; ++r) {
        const int64_t i = r0 + r;
        float* out = p.scores + (i - p.i0) * p.n_cand_max + t;
        if (t > p.map.pos[i]) {
            *out = -INFINITY;
            continue;
        }
        const int32_t s = p.map.seq[i];
        if (s != loaded_seq) {  // rows of one sequence are adjacent: a key is loaded once per group and sequence
            const int32_t* table = p.map.tables + p.map.table_offset[s];
            const int64_t slot =
                static_cast<int64_t>(table[t / p.map.block_size]) * p.map.block_size + t % p.map.block_size;
#pragma unroll
            for (int c = 0; c < D; ++c) k[c] = indexer_load(p.keys, static_cast<Elem>(p.elem), slot, c, D);
            loaded_seq = s;
        }
        float score = 0.0f;
        for (int h = 0; h < H; ++h) {
            const float* qh = sq + (r * H + h) * D;
            float acc = 0.0f;
#pragma unroll
            for (int c = 0; c < D; ++c) acc += qh[c] * k[c];
            score += sg[r * H + h] * fmaxf(acc * p.softmax_scale, 0.0f);
        }
        *out = score;
    }
}

template <int D>
cudaError_t launch(const IndexerScoresParams& p, cudaStream_t stream) {
    const int rows = static_cast<int>(rows_per_block(p.n_head, D));
    const size_t smem = static_cast<size_t>(rows) * (p.n_head * D + p.n_head) * 4;
    const dim3 grid(static_cast<unsigned>((p.n_cand_max + kThreads - 1) / kThreads),
                    static_cast<unsigned>((p.i1 - p.i0 + rows - 1) / rows));
    indexer_scores_tiled_kernel<D><<<grid, kThreads, smem, stream>>>(p, rows);
    return cudaGetLastError();
}

}  // namespace

bool indexer_scores_tiled_supported(int64_t n_head, int64_t dim) {
    return (dim == 32 || dim == 64) && n_head >= 1 && rows_per_block(n_head, dim) >= 1;
}

cudaError_t launch_indexer_scores_tiled(const IndexerScoresParams& p, cudaStream_t stream) {
    if (p.i1 <= p.i0 || p.n_cand_max == 0) return cudaSuccess;
    if (!indexer_scores_tiled_supported(p.n_head, p.dim)) return cudaErrorInvalidValue;
    return p.dim == 32 ? launch<32>(p, stream) : launch<64>(p, stream);
}

}  // namespace megactx::cuda
