// Reference DSA kernels (contract: attention_ref.h; model-spec §2.5, §3.2, §6). Clarity over speed: the indexer
// scores one (token, candidate) per thread, top-k selects the k-th largest score by a 32-step radix bisection and
// compacts the winners in candidate order, sparse MLA runs one block per (token, head) with the probabilities in
// shared memory. KV rows are dequantised on every read (cuda_common.cuh), like kv_format.cpp's unpackers.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/attention_ref.h"
#include "backend/cuda/cuda_common.cuh"

namespace megactx::cuda {

namespace {

constexpr int kScoreThreads = 128;
constexpr int kTopkThreads = 512;
constexpr int kMlaThreads = 256;

__device__ __forceinline__ int64_t slot_of(const IndexerMapView& m, int64_t i, int64_t t) {
    const int32_t* table = m.tables + m.table_offset[m.seq[i]];
    return static_cast<int64_t>(table[t / m.block_size]) * m.block_size + t % m.block_size;
}

__global__ void indexer_scores_kernel(IndexerScoresParams p) {
    extern __shared__ float smem[];
    float* sq = smem;                       // [n_head, dim]
    float* sg = smem + p.n_head * p.dim;    // [n_head] gates
    const int64_t i = p.i0 + blockIdx.y;
    for (int64_t j = threadIdx.x; j < p.n_head * p.dim; j += blockDim.x) sq[j] = p.q[i * p.n_head * p.dim + j];
    for (int64_t h = threadIdx.x; h < p.n_head; h += blockDim.x) sg[h] = p.w[i * p.n_head + h] * p.head_scale;
    __syncthreads();
    const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (t >= p.n_cand_max) return;
    float* out = p.scores + blockIdx.y * p.n_cand_max + t;
    if (t > p.map.pos[i]) {
        *out = -INFINITY;
        return;
    }
    const int64_t slot = slot_of(p.map, i, t);
    float score = 0.0f;
    for (int64_t h = 0; h < p.n_head; ++h) {
        const float* qh = sq + h * p.dim;
        float acc = 0.0f;
        for (int c = 0; c < p.dim; ++c) acc += qh[c] * indexer_load(p.keys, static_cast<Elem>(p.elem), slot, c, p.dim);
        score += sg[h] * fmaxf(acc * p.softmax_scale, 0.0f);
    }
    *out = score;
}

// Order-preserving map of fp32 to uint32 (larger float → larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void topk_rows_kernel(TopkRowsParams p) {
    using Scan = cub::BlockScan<int, kTopkThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ int count;
    const int64_t r = blockIdx.x, i = p.i0 + r;
    const int64_t n_cand = p.map.pos[i] + 1, k = p.topk;
    const float* s = p.scores + r * p.n_cand_max;
    int32_t* o = p.out + i * k;
    if (n_cand <= k) {
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
            o[j] = j < n_cand ? static_cast<int32_t>(slot_of(p.map, i, j)) : -1;
        }
        return;
    }
    auto count_ge = [&](uint32_t thr, bool strict) {
        __syncthreads();
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        int local = 0;
        for (int64_t t = threadIdx.x; t < n_cand; t += blockDim.x) {
            const uint32_t key = order_key(s[t]);
            local += strict ? (key > thr) : (key >= thr);
        }
        atomicAdd(&count, local);
        __syncthreads();
        return count;
    };
    // The k-th largest key, built bit by bit from the top: the largest value with ≥ k keys at or above it.
    uint32_t kth = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = kth | (1u << bit);
        if (count_ge(cand, false) >= k) kth = cand;
    }
    const int64_t need_eq = k - count_ge(kth, true);
    int64_t base_out = 0, base_eq = 0;
    for (int64_t start = 0; start < n_cand; start += blockDim.x) {
        const int64_t t = start + threadIdx.x;
        const uint32_t key = t < n_cand ? order_key(s[t]) : 0u;
        const bool valid = t < n_cand;
        const int eq = valid && key == kth;
        int eq_rank = 0, eq_total = 0;
        __syncthreads();
        Scan(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
        const int sel = valid && (key > kth || (eq && base_eq + eq_rank < need_eq));
        int sel_pos = 0, sel_total = 0;
        __syncthreads();
        Scan(scan_tmp).ExclusiveSum(sel, sel_pos, sel_total);
        if (sel) o[base_out + sel_pos] = static_cast<int32_t>(slot_of(p.map, i, t));
        base_out += sel_total;
        base_eq += eq_total;
    }
}

__global__ void sparse_mla_ref_kernel(SparseMlaRefParams p) {
    extern __shared__ float smem[];
    float* sq = smem;          // [d]
    float* prob = smem + p.d;  // [topk]
    __shared__ float red[32];
    const int64_t i = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    const int rank = static_cast<int>(p.d_v), rope = static_cast<int>(p.d - p.d_v);
    const Elem e = static_cast<Elem>(p.elem);
    for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) sq[c] = p.q[(i * p.n_head + h) * p.d + c];
    __syncthreads();
    const int32_t* si = p.slots + i * p.topk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warp = blockDim.x >> 5;
    for (int64_t j = warp; j < p.topk; j += n_warp) {
        const int32_t slot = si[j];
        float acc = 0.0f;
        if (slot >= 0) {
            for (int c = lane; c < p.d; c += 32) acc += sq[c] * latent_load(p.cache, e, slot, c, rank, rope);
        }
        acc = warp_sum(acc);
        if (lane == 0) prob[j] = slot >= 0 ? acc * p.scale : -INFINITY;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < p.topk; j += blockDim.x) mx = fmaxf(mx, prob[j]);
    mx = block_reduce<true>(mx, red);
    float* out = p.out + (i * p.n_head + h) * p.d_v;
    if (mx == -INFINITY) {  // no selected slot: the CPU oracle leaves zeros
        for (int64_t c = threadIdx.x; c < p.d_v; c += blockDim.x) out[c] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < p.topk; j += blockDim.x) {
        const float v = si[j] >= 0 ? expf(prob[j] - mx) : 0.0f;
        prob[j] = v;
        sum += v;
    }
    sum = block_reduce<false>(sum, red);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < p.d_v; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < p.topk; ++j) {
            const int32_t slot = si[j];
            if (slot < 0) continue;
            acc += (prob[j] / sum) * latent_load(p.cache, e, slot, static_cast<int>(c), rank, rope);
        }
        out[c] = acc;
    }
}

}  // namespace

int64_t indexer_scores_smem_bytes(int64_t n_head, int64_t dim) { return (n_head * dim + n_head) * 4; }

cudaError_t launch_indexer_scores(const IndexerScoresParams& p, cudaStream_t stream) {
    if (p.i1 <= p.i0 || p.n_cand_max == 0) return cudaSuccess;
    const int64_t smem = indexer_scores_smem_bytes(p.n_head, p.dim);
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return e;
    }
    const dim3 grid(static_cast<unsigned>((p.n_cand_max + kScoreThreads - 1) / kScoreThreads),
                    static_cast<unsigned>(p.i1 - p.i0));
    indexer_scores_kernel<<<grid, kScoreThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t launch_topk_rows(const TopkRowsParams& p, cudaStream_t stream) {
    if (p.i1 <= p.i0) return cudaSuccess;
    topk_rows_kernel<<<static_cast<unsigned>(p.i1 - p.i0), kTopkThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

int64_t sparse_mla_ref_smem_bytes(int64_t d, int64_t topk) { return (d + topk) * 4; }

cudaError_t launch_sparse_mla_ref(const SparseMlaRefParams& p, cudaStream_t stream) {
    if (p.n * p.n_head == 0) return cudaSuccess;
    const int64_t smem = sparse_mla_ref_smem_bytes(p.d, p.topk);
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(sparse_mla_ref_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return e;
    }
    sparse_mla_ref_kernel<<<static_cast<unsigned>(p.n * p.n_head), kMlaThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
