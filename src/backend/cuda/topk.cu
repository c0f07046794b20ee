// Exact batched top-k (DSA indexer selection, model-spec §3.2).
//   values  [n_rows, row_stride] fp32, row r valid on [0, lengths[r])
//   out_idx [n_rows, k] int32: the indices of the k largest values (any order; ties at the k-th value
//           resolved in any order), rows shorter than k: 0..len-1 then -1.
// Reference: std::nth_element on the row (tests/cuda/test_topk.cpp).
//
// Floats become order-preserving uint32 keys (flip all bits of negatives, set the sign bit of the rest),
// and one CTA finds the exact k-th key by radix select: digits of 11, 11 and 10 bits, each a shared-memory
// histogram over the items whose higher digits match, then a block scan from the top bin. Emission writes
// every item with key > T and the first (k - count_gt) items with key == T.
//
// Short rows (row_stride <= 32768): one CTA per row, the row's keys staged in shared memory.
// Long rows: reading a 1M row 4 times from HBM would cost 4x the bandwidth floor, so:
//   1. sample kernel (CTA per row): 8192 strided samples -> an estimated threshold T_est, chosen so that
//      about 2k row items are expected to be >= T_est;
//   2. filter kernel (4K..16K-element chunks, many CTAs per row): one streaming pass, appends (key, index)
//      of every item > T_est to a per-row candidate buffer and the indices of up to k items == T_est to a
//      tie buffer (warp-aggregated atomics);
//   3. select kernel (CTA per row): with c items > T_est and e items == T_est:
//      k <= c <= capacity: the k-th value is > T_est, so the top k lie among the candidates: radix select
//        there, staged in shared memory;
//      c < k <= c + e: the k-th value is T_est itself (e.g. ReLU zeros): all candidates + k - c ties;
//      otherwise (a sample that misrepresents the row): the exact radix select over the whole row from
//      global memory by this one CTA (correct, slower).
#include "backend/cuda/topk.h"

#include <cub/block/block_scan.cuh>

namespace megactx::cuda {
namespace {

constexpr int64_t kShortMaxStride = 32768;  // rows up to this stride run one CTA each in shared memory
constexpr int kShortThreads = 512;
constexpr int kSampleThreads = 512;
constexpr int kSampleSize = 8192;
constexpr int kFilterThreads = 256;
constexpr int kFilterChunkMax = 16384;       // elements per filter CTA: 16K, fewer when the batch is small
constexpr int kFilterChunkMin = 4096;
constexpr int kSelectThreads = 1024;
constexpr int kStageCap = 16384;             // candidates staged in shared memory (8 B each)

__device__ __forceinline__ uint32_t float_key(float f) {
    uint32_t u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;  // -0 == +0: one key, so ReLU zeros of either sign tie
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int NT>
struct SelectSmem {
    int hist[2048];
    typename cub::BlockScan<int, NT>::TempStorage scan;
    int digit;
    int above;
    int n_gt;
    int n_eq;
};

// Item sources: key(i) and idx(i) for i in [0, n).
struct KeysLoader {  // keys (shared or global), index = position
    const uint32_t* keys;
    __device__ uint32_t key(int i) const { return keys[i]; }
    __device__ int32_t idx(int i) const { return i; }
};
struct KeysIdxLoader {  // keys + indices (shared or global)
    const uint32_t* keys;
    const int32_t* ids;
    __device__ uint32_t key(int i) const { return keys[i]; }
    __device__ int32_t idx(int i) const { return ids[i]; }
};
struct RowLoader {  // the fp32 row in global memory
    const float* row;
    __device__ uint32_t key(int i) const { return float_key(__ldg(row + i)); }
    __device__ int32_t idx(int i) const { return i; }
};

struct Threshold {
    uint32_t key;  // the k-th largest key
    int n_eq;      // how many items equal to key belong to the top k (>= 1)
};

// The exact k-th largest key among n items (1 <= k <= n). All NT threads of the CTA call it.
template <int NT, class L>
__device__ Threshold find_threshold(const L& ld, int n, int k, SelectSmem<NT>& sm) {
    uint32_t prefix = 0;
    int kk = k;
#pragma unroll 1
    for (int level = 0; level < 3; ++level) {
        // Digits: bits 31..21, 20..10, 9..0.
        const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
        const int nb = level == 2 ? 1024 : 2048;
        const int hi_shift = shift + (level == 2 ? 10 : 11);  // items must match the prefix above the digit
        for (int b = threadIdx.x; b < nb; b += NT) sm.hist[b] = 0;
        __syncthreads();
        if (level == 0) {
#pragma unroll 8
            for (int i = threadIdx.x; i < n; i += NT) atomicAdd(&sm.hist[ld.key(i) >> 21], 1);
        } else {
#pragma unroll 8
            for (int i = threadIdx.x; i < n; i += NT) {
                const uint32_t key = ld.key(i);
                if ((key >> hi_shift) == prefix) atomicAdd(&sm.hist[(key >> shift) & (nb - 1)], 1);
            }
        }
        __syncthreads();
        // Thread t owns `per` bins going down from nb-1-t*per; an exclusive scan gives the count above them.
        const int per = nb / NT;
        const int top = nb - 1 - static_cast<int>(threadIdx.x) * per;
        int local = 0;
        for (int j = 0; j < per; ++j) local += sm.hist[top - j];
        int acc = 0;
        cub::BlockScan<int, NT>(sm.scan).ExclusiveSum(local, acc);
        for (int j = 0; j < per; ++j) {
            const int h = sm.hist[top - j];
            if (acc < kk && acc + h >= kk) {
                sm.digit = top - j;
                sm.above = acc;
            }
            acc += h;
        }
        __syncthreads();
        prefix = (prefix << (level == 2 ? 10 : 11)) | static_cast<uint32_t>(sm.digit);
        kk -= sm.above;
        __syncthreads();  // sm.digit/above are rewritten by the next level
    }
    return {prefix, kk};
}

// Writes the indices of the top k (threshold t) to out[0, k).
template <int NT, class L>
__device__ void emit_topk(const L& ld, int n, int k, Threshold t, int32_t* out, SelectSmem<NT>& sm) {
    if (threadIdx.x == 0) {
        sm.n_gt = 0;
        sm.n_eq = 0;
    }
    __syncthreads();
    const int eq_base = k - t.n_eq;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += NT) {
        const uint32_t key = ld.key(i);
        if (key > t.key) {
            out[atomicAdd(&sm.n_gt, 1)] = ld.idx(i);
        } else if (key == t.key) {
            const int e = atomicAdd(&sm.n_eq, 1);
            if (e < t.n_eq) out[eq_base + e] = ld.idx(i);
        }
    }
}

template <int NT>
__device__ void write_all_padded(int len, int k, int32_t* out) {
    for (int i = threadIdx.x; i < k; i += NT) out[i] = i < len ? i : -1;
}

// ---- short rows: one CTA per row, keys staged in shared memory ----
__global__ void __launch_bounds__(kShortThreads) topk_short_kernel(const float* __restrict__ values,
                                                                  const int32_t* __restrict__ lengths,
                                                                  int64_t row_stride, int k,
                                                                  int32_t* __restrict__ out_idx) {
    __shared__ SelectSmem<kShortThreads> sm;
    extern __shared__ uint32_t keys[];  // [row_stride]
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    int32_t* out = out_idx + r * k;
    if (len <= k) {
        write_all_padded<kShortThreads>(len, k, out);
        return;
    }
    const float* row = values + r * row_stride;
    for (int i = threadIdx.x; i < len; i += kShortThreads) keys[i] = float_key(__ldg(row + i));
    __syncthreads();
    const KeysLoader ld{keys};
    const Threshold t = find_threshold<kShortThreads>(ld, len, k, sm);
    emit_topk<kShortThreads>(ld, len, k, t, out, sm);
}

// ---- long rows, step 1: estimated threshold from a strided sample ----
__global__ void __launch_bounds__(kSampleThreads) topk_sample_kernel(const float* __restrict__ values,
                                                                    const int32_t* __restrict__ lengths,
                                                                    int64_t row_stride, int k,
                                                                    uint32_t* __restrict__ t_est,
                                                                    int* __restrict__ cand_count) {
    __shared__ SelectSmem<kSampleThreads> sm;
    __shared__ uint32_t keys[kSampleSize];
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    if (threadIdx.x == 0) {
        cand_count[2 * r] = 0;
        cand_count[2 * r + 1] = 0;
    }
    if (len <= k) return;
    const float* row = values + r * row_stride;
    const int s = len < kSampleSize ? len : kSampleSize;
    // Whole row sampled: the exact k-th value. Otherwise aim at ~2k row items (+16 samples of margin).
    int m = k;
    if (s < len) {
        const int64_t want = (2 * static_cast<int64_t>(k) * s + len - 1) / len + 16;
        m = want < s ? static_cast<int>(want) : s;
    }
    // All loads of a thread in flight at once: the sample is latency-bound gathers.
    constexpr int kPer = kSampleSize / kSampleThreads;
    float v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
        const int j = u * kSampleThreads + static_cast<int>(threadIdx.x);
        v[u] = j < s ? __ldg(row + static_cast<int64_t>(j) * len / s) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
        const int j = u * kSampleThreads + static_cast<int>(threadIdx.x);
        if (j < s) keys[j] = float_key(v[u]);
    }
    __syncthreads();
    const Threshold t = find_threshold<kSampleThreads>(KeysLoader{keys}, s, m, sm);
    if (threadIdx.x == 0) t_est[r] = t.key;
}

// Appends (key, idx) for lanes with pred set; called by all 32 lanes of a warp.
__device__ __forceinline__ void warp_append(bool pred, uint32_t key, int32_t idx, int* count, uint32_t* keys,
                                            int32_t* ids, int cap) {
    const unsigned ballot = __ballot_sync(0xffffffffu, pred);
    if (ballot == 0) return;
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(ballot) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(count, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, leader);
    if (pred) {
        const int pos = base + __popc(ballot & ((1u << lane) - 1u));
        if (pos < cap) {
            if (keys) keys[pos] = key;
            ids[pos] = idx;
        }
    }
}

// ---- long rows, step 2: one streaming pass, candidates >= T_est into a compact buffer ----
template <bool kVec>
__global__ void __launch_bounds__(kFilterThreads) topk_filter_kernel(
    const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
    const uint32_t* __restrict__ t_est, int* __restrict__ cand_count, uint32_t* __restrict__ cand_keys,
    int32_t* __restrict__ cand_idx, int32_t* __restrict__ eq_idx, int cap, int chunk) {
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    if (len <= k) return;
    const int begin = static_cast<int>(blockIdx.y) * chunk;  // chunk: a multiple of 4
    if (begin >= len) return;
    const int end = len - begin < chunk ? len : begin + chunk;
    const uint32_t thr = t_est[r];
    const float* row = values + r * row_stride;
    int* count = cand_count + 2 * r;  // [0]: items > T_est, [1]: items == T_est
    uint32_t* keys = cand_keys + r * cap;
    int32_t* ids = cand_idx + r * cap;
    int32_t* eq_ids = eq_idx + r * k;
    // Items > T_est go to the candidate buffer; items == T_est only need indices, at most k of them.
    auto append = [&](bool ok, uint32_t key, int32_t i) {
        warp_append(ok && key > thr, key, i, count, keys, ids, cap);
        warp_append(ok && key == thr, key, i, count + 1, nullptr, eq_ids, k);
    };
    if constexpr (kVec) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        const int b4 = begin >> 2, e4 = end >> 2;
        constexpr int kUnroll = 4;
        for (int i0 = b4; i0 < e4; i0 += kFilterThreads * kUnroll) {
            float4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                v[u] = i < e4 ? __ldcs(row4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                const bool ok = i < e4;
                const uint32_t k0 = float_key(v[u].x), k1 = float_key(v[u].y), k2 = float_key(v[u].z),
                               k3 = float_key(v[u].w);
                const bool any = ok && (k0 >= thr || k1 >= thr || k2 >= thr || k3 >= thr);
                if (!__any_sync(0xffffffffu, any)) continue;
                append(ok, k0, 4 * i + 0);
                append(ok, k1, 4 * i + 1);
                append(ok, k2, 4 * i + 2);
                append(ok, k3, 4 * i + 3);
            }
        }
        // Tail of the row (len % 4 items), in the chunk that holds the row's end.
        if (end == len && (len & 3) != 0 && threadIdx.x < 32) {
            const int i = (e4 << 2) + static_cast<int>(threadIdx.x);
            const bool ok = i < len;
            const uint32_t key = ok ? float_key(row[i]) : 0u;
            append(ok, key, i);
        }
    } else {
        constexpr int kUnroll = 8;
        for (int i0 = begin; i0 < end; i0 += kFilterThreads * kUnroll) {
            float v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                v[u] = i < end ? __ldcs(row + i) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                const uint32_t key = float_key(v[u]);
                append(i < end, key, i);
            }
        }
    }
}

// ---- long rows, step 3: exact select among the candidates, or over the whole row as fallback ----
__global__ void __launch_bounds__(kSelectThreads) topk_select_kernel(
    const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
    int32_t* __restrict__ out_idx, const int* __restrict__ cand_count, const uint32_t* __restrict__ cand_keys,
    const int32_t* __restrict__ cand_idx, const int32_t* __restrict__ eq_idx, int cap) {
    __shared__ SelectSmem<kSelectThreads> sm;
    extern __shared__ uint32_t stage[];  // [kStageCap] keys then [kStageCap] indices
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    int32_t* out = out_idx + r * k;
    if (len <= k) {
        write_all_padded<kSelectThreads>(len, k, out);
        return;
    }
    const int c = cand_count[2 * r];       // items > T_est
    const int c_eq = cand_count[2 * r + 1];  // items == T_est
    if (c < k && c + c_eq >= k) {
        // The k-th value is T_est itself: every item > T_est, then any k - c of the ties.
        const int32_t* gi = cand_idx + r * cap;
        const int32_t* ge = eq_idx + r * k;
        for (int i = threadIdx.x; i < k; i += kSelectThreads) out[i] = i < c ? gi[i] : ge[i - c];
    } else if (c >= k && c <= cap) {
        // The k-th value is > T_est: the top k lie among the candidates.
        const uint32_t* gk = cand_keys + r * cap;
        const int32_t* gi = cand_idx + r * cap;
        if (c <= kStageCap) {
            uint32_t* sk = stage;
            int32_t* si = reinterpret_cast<int32_t*>(stage + kStageCap);
            for (int i = threadIdx.x; i < c; i += kSelectThreads) {
                sk[i] = gk[i];
                si[i] = gi[i];
            }
            __syncthreads();
            const KeysIdxLoader ld{sk, si};
            const Threshold t = find_threshold<kSelectThreads>(ld, c, k, sm);
            emit_topk<kSelectThreads>(ld, c, k, t, out, sm);
        } else {
            const KeysIdxLoader ld{gk, gi};
            const Threshold t = find_threshold<kSelectThreads>(ld, c, k, sm);
            emit_topk<kSelectThreads>(ld, c, k, t, out, sm);
        }
    } else {
        const RowLoader ld{values + r * row_stride};
        const Threshold t = find_threshold<kSelectThreads>(ld, len, k, sm);
        emit_topk<kSelectThreads>(ld, len, k, t, out, sm);
    }
}

int64_t candidate_cap(int64_t row_stride, int64_t k) {
    const int64_t want = 4 * k > 32768 ? 4 * k : 32768;
    return row_stride < want ? row_stride : want;
}

size_t align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

struct LongLayout {
    size_t t_est = 0, count = 0, keys = 0, ids = 0, eq_ids = 0, total = 0;
};

LongLayout long_layout(int64_t n_rows, int64_t row_stride, int64_t k) {
    const size_t cap = static_cast<size_t>(candidate_cap(row_stride, k));
    const size_t n = static_cast<size_t>(n_rows);
    LongLayout l;
    l.t_est = 0;
    l.count = align256(n * sizeof(uint32_t));
    l.keys = l.count + align256(2 * n * sizeof(int));
    l.ids = l.keys + align256(n * cap * sizeof(uint32_t));
    l.eq_ids = l.ids + align256(n * cap * sizeof(int32_t));
    l.total = l.eq_ids + align256(n * static_cast<size_t>(k) * sizeof(int32_t));
    return l;
}

}  // namespace

size_t topk_scratch_bytes(int64_t n_rows, int64_t row_stride, int64_t k) {
    if (row_stride <= kShortMaxStride || n_rows <= 0) return 0;
    return long_layout(n_rows, row_stride, k).total;
}

bool topk_supported(int64_t k, int64_t row_stride) {
    return k >= 1 && k <= 16384 && row_stride >= 0 && row_stride <= (int64_t{1} << 24);
}

void launch_topk(const TopkParams& p, cudaStream_t stream) {
    if (p.n_rows <= 0 || p.k <= 0) return;
    const int k = static_cast<int>(p.k);
    const unsigned rows = static_cast<unsigned>(p.n_rows);
    if (p.row_stride <= kShortMaxStride) {
        static const bool attr_short = [] {
            cudaFuncSetAttribute(topk_short_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kShortMaxStride * sizeof(uint32_t)));
            return true;
        }();
        (void)attr_short;
        const size_t smem = static_cast<size_t>(p.row_stride > 0 ? p.row_stride : 1) * sizeof(uint32_t);
        topk_short_kernel<<<rows, kShortThreads, smem, stream>>>(p.values, p.lengths, p.row_stride, k, p.out_idx);
        return;
    }
    static const bool attr_select = [] {
        cudaFuncSetAttribute(topk_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(2 * kStageCap * sizeof(uint32_t)));
        return true;
    }();
    (void)attr_select;
    const LongLayout l = long_layout(p.n_rows, p.row_stride, p.k);
    const int cap = static_cast<int>(candidate_cap(p.row_stride, p.k));
    char* base = static_cast<char*>(p.scratch);
    auto* t_est = reinterpret_cast<uint32_t*>(base + l.t_est);
    auto* count = reinterpret_cast<int*>(base + l.count);
    auto* keys = reinterpret_cast<uint32_t*>(base + l.keys);
    auto* ids = reinterpret_cast<int32_t*>(base + l.ids);
    auto* eq_ids = reinterpret_cast<int32_t*>(base + l.eq_ids);

    topk_sample_kernel<<<rows, kSampleThreads, 0, stream>>>(p.values, p.lengths, p.row_stride, k, t_est, count);
    // Enough CTAs to fill the GPU (~8 per SM of 132) also for one row; 16K elements each for big batches.
    int chunk = kFilterChunkMin;
    while (chunk < kFilterChunkMax && p.n_rows * p.row_stride / (2 * chunk) >= 1056) chunk *= 2;
    const dim3 grid(rows, static_cast<unsigned>((p.row_stride + chunk - 1) / chunk));
    const bool vec = (reinterpret_cast<uintptr_t>(p.values) & 15) == 0 && (p.row_stride & 3) == 0;
    if (vec)
        topk_filter_kernel<true><<<grid, kFilterThreads, 0, stream>>>(p.values, p.lengths, p.row_stride, k, t_est,
                                                                      count, keys, ids, eq_ids, cap, chunk);
    else
        topk_filter_kernel<false><<<grid, kFilterThreads, 0, stream>>>(p.values, p.lengths, p.row_stride, k, t_est,
                                                                       count, keys, ids, eq_ids, cap, chunk);
    topk_select_kernel<<<rows, kSelectThreads, 2 * kStageCap * sizeof(uint32_t), stream>>>(
        p.values, p.lengths, p.row_stride, k, p.out_idx, count, keys, ids, eq_ids, cap);
}

}  // namespace megactx::cuda
