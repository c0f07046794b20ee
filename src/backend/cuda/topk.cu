// Exact batched top-k (DSA indexer selection, model-spec §3.2).
//   values  [n_rows, row_stride] fp32, row r valid on [0, lengths[r])
//   out_idx [n_rows, k] int32: the indices of the k largest values, ascending, ties at the k-th value to the
//           lowest indices; rows shorter than k: 0..len-1 then -1.
// Reference: std::nth_element on the row with ties to the lower index, sorted (tests/cuda/test_topk.cpp), the
// selection of CpuOps::indexer_topk.
//
// Floats become order-preserving uint32 keys (flip all bits of negatives, set the sign bit of the rest),
// and one CTA finds the exact k-th key by radix select over the key RANGE of its items: d = key - min,
// digits of up to 11 bits from the top bit of (max - min) down. Range-relative digits matter: the top
// 11 bits of a float key are sign, exponent and 2 mantissa bits, so e.g. the candidates of a normal row
// (all in [2.9, 5.5]) fall in 2-3 absolute bins and the shared-memory histogram atomics serialize.
// Selection kernels over candidate sets emit every item with key > T and (k - count_gt) items with key == T, with
// warp-aggregated slot allocation (one shared atomic per warp, not per item): an order, and a choice among more
// ties than needed, that depend on thread timing. topk_order_kernel then puts each long row in canonical order
// (ascending, ties to the lowest positions; ~4 us per call at batch 1 on the H200, see there), except the rows
// the chain's select kernel already wrote in order (emit_staged_sorted: no tie to resolve, rows <= 1M).
//
// Short rows (row_stride <= 32768): one CTA per row, the row's keys staged in shared memory; the emission walks the
// row in position order (emit_ordered), so it is canonical without the order kernel.
// Long rows: reading a 1M row 4 times from HBM would cost 4x the bandwidth floor, so:
//   1. sample kernel (CTA per row): 8192 samples (groups of 4 neighbours at 2048 stratified places) -> an
//      estimated threshold T_est, chosen so that about 2k row items are expected to be >= T_est (a radix on the
//      sample's key range with warp-found bins, stopped once the bin holds <= 4 samples: its floor);
//   2. filter kernel (1K..64K-element work items, many CTAs per row): one streaming pass with 16-B loads;
//      items > T_est gather in shared memory (one shared atomic per warp) and reach the per-row candidate
//      buffer with ONE global atomic per work item (H200, 64 x 1M with 4K work items: per-warp global
//      atomics 293 us, this 199 us); up to k indices of items == T_est go to a tie buffer (warp-aggregated,
//      stops once k are counted); a warp skips a batch with no item >= T_est. The pass still streams at only
//      ~1.5 TB/s, and worse with longer work items (16K: 311 us). Suspect: code size — this kernel's 16-B
//      body is 88 KB of SASS (8 unrolled slots x 4 inlined appends), so executing all 8 slots (work items
//      >= 8K) thrashes the instruction cache. The default is therefore filter_variant = 1 (mask, then a
//      compact append loop): 64 x 1M 198.6 -> 132.8 us, filter pass 1.54 -> 2.47 TB/s (H200, bbb7876);
//      variant 0 stays selectable (it is ~10 us faster when 99.9% of a row ties at the threshold);
//   3. select kernel (CTA per row): with c items > T_est and e items == T_est:
//      k <= c <= capacity: the k-th value is > T_est, so the top k lie among the candidates, staged in shared
//        memory: one radix level, then the chosen bin's few items ranked by comparison while the items above it
//        are picked (select_sorted); when no tie needs resolving the CTA also sorts the k by position and writes
//        the final row, and the order kernel skips it; else (or a crowded bin) radix levels (select_staged);
//      c < k <= c + e: the k-th value is T_est itself (e.g. ReLU zeros): all candidates + k - c ties;
//      otherwise (a sample that misrepresents the row): the exact radix select over the whole row from
//      global memory by this one CTA (correct, slower).
//   (An opt-in single-kernel variant ran one CTA cluster per row of 32K..128K over distributed shared memory; it
//   measured slower on the H200, 1 x 128K 24.4 vs 22.7 us and 64 x 128K 112 vs 57 us, and was removed in
//   8e82caf: the few-rows kernel below serves decode.)
//   The three are chained with programmatic dependent launch: the filter grid becomes resident while the
//   sample runs (prefetching its first bytes to L2, then griddepcontrol.wait), the select grid while the
//   filter drains; no launch gap between them.
// Few long rows (decode: batches of <= TopkTuning::few_max_rows = 4 rows of > 8K; few_rows = 1, default):
// the chain above costs ~19-24 us per call at batch 1, almost all fixed latency (sample 13 + filter 6-7.5 +
// select 11-12 us as separate launches). topk_few_grid_kernel does it in ONE kernel of G CTAs per row
// (G = min(stride / 2048, SMs / rows rounded down to a multiple of 8)): the row's CTAs, all resident at once,
// run one radix select together over their slices staged in shared memory, meeting at counter barriers, and each
// writes its slice's share of the canonical output (kernel comment below). A 1-CTA init kernel zeroes the row's
// control words first (the scratch may hold anything).
// History: from 434402f until 5d775bb, topk_few_local_kernel ran instead (per-CTA thresholds, then the row's last
// CTA selected alone among ~3.5K candidates, re-reading "hot" slices, then the order kernel). Its serial tail kept
// batch-1 top-k at 18-25 us, and hot windows (sinks and recent tokens, as real indexer scores have) cost ~14 us more.
// H200, 5bae905 (bench_topk, 1 call per graph, scores from HBM), last-CTA -> grid-wide kernel, us:
//   1 x 1M 24.7 -> 20.7, 1 x 1M hot windows 41.5 -> 19.5, 1 x 128K 22.3 -> 17.4, 1 x 128K hot windows 34.1 -> 16.4,
//   2 x 128K 22.1 -> 17.2, 2 x 256K hot windows 36.4 -> 17.5; the boundaries moved with it: rows of 8K-32K (were
//   one CTA each: 1 x 32K 30.6 -> 15.9) and batches of 3-4 rows (were the chain: MTP verification at batch 1).
//   Later tuning (warp-span counts, flagged chunks): 4 x 1M 35.3 -> 33.3 (chain 33.9).
// Batch-1 indexer scores + top-2048 in a CUDA graph (bench_indexer decode_topk_graph, kernel 2), us:
//   128K 26.4 -> 21.1, 256K 32.3 -> 26.5, 512K 42.7 -> 36.5, 1M 61.3 -> 55.6 (53.4 -> 58.9% of copy).
// Selects among staged candidates (this kernel, the chain's select kernel) find each radix level's bin with one
// warp (select_staged), not a block scan.

#include <algorithm>
#include <atomic>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/launch_ex.cuh"
#include "backend/cuda/per_device.cuh"
#include "backend/cuda/topk.h"
#include "backend/cuda/topk_plan.h"

namespace megactx::cuda {
namespace {

constexpr int64_t kShortMaxStride = 32768;  // rows up to this stride run one CTA each in shared memory
// Few rows longer than this take the few-rows kernel. Its last-CTA form (434402f..5d775bb) lost to the one-CTA kernel
// on rows with hot windows (1 x 32K 32.6 vs 29.2 us), so the boundary sat at 32K; the grid-wide form takes hot rows
// at the cost of spread ones (H200, 5bae905: 1 x 32K 30.6 -> 15.9 us, with hot windows 29.8 -> 15.7).
constexpr int64_t kFewMinStride = 8192;
constexpr int kShortThreads = 512;
constexpr int kSampleThreads = 1024;
constexpr int kSampleSize = topk_plan::kSampleSize;
constexpr int kFilterThreads = 256;
constexpr int kFilterUnroll = 8;  // float4 loads in flight per thread
// Elements per filter work item: up to 64K, fewer when the batch is small (at most one wave of 4 CTAs per SM).
// Measured on the H200 (64 x 1M normal, whole call): with the unrolled-append body (b935d1e) 2K 214 us, 4K 199 us,
// 8K 291 us, 16K 311 us, longer work items streaming worse (instruction cache); with the mask body (c92312c) 4K
// 143 us, 8K 124 us, 16K 113 us (filter alone, ncu: 109 -> 79 us, 3.3 TB/s), and with the select's own ordering
// (and sample groups of 16, since reverted) 16K 103.8, 32K 99.4, 64K 98.8 us. 64 x 128K keeps 16K (one wave): 39.2 us,
// where 32K / 64K take 47.9 / 56.8.
constexpr int kFilterChunkMax = 65536;
constexpr int kFilterChunkMin = 1024;
constexpr int kFilterPrefetch = 2048;  // items of its first work item a filter CTA prefetches during the sample
constexpr int kSelectThreads = 1024;
constexpr int kStageCap = 16384;  // candidates staged in shared memory (8 B each)
constexpr int kMaxK = 16384;      // topk_supported
constexpr int kLocalCap = 2048;   // candidates a filter CTA gathers in shared memory per work item
constexpr int kStash = 4;         // keys of flagged items a filter thread keeps per batch (topk_filter_kernel)
constexpr int kCountStride = 32;  // per-row counters 128 B apart (different L2 lines/slices)
// Few long rows (decode, <= kFewMaxRows rows): one grid of G CTAs per row (G * rows <= SMs).
constexpr int kFewMaxRows = 4;
constexpr int kFewSliceMin = 2048;   // row elements per CTA at least (fewer CTAs for shorter rows)
constexpr int kFewSliceMax = 32768;  // at most: 128 KB of keys in shared memory
constexpr int kFewGMax = 512;        // CTAs per row at most (their counts: [2 * kFewGMax] per row)
// Canonical order (topk_order_kernel): a CTA per range of a long row (a multiple of kOrderRange positions, so that
// the grid is about two CTAs per SM), a bitmap of the range in shared memory (at most kOrderMaxRange positions).
constexpr int kOrderThreads = 256;
constexpr int kOrderRange = 32768;
constexpr int kOrderMaxRange = 1 << 20;  // 128 KB

TopkTuning g_tuning;

using topk_plan::float_key;  // order-preserving keys (topk_plan.h)

template <int NT>
struct SelectSmem {
    int hist[2048];
    typename cub::BlockScan<int, NT>::TempStorage scan;
    uint32_t red_lo[NT / 32], red_hi[NT / 32];
    int digit;
    int above;
    int n_gt;
    int n_eq;
    int bin_n;  // items in the bin chosen at the current level
};

// Item sources: key(i) and idx(i) for i in [0, n).
struct KeysLoader {  // keys (shared or global); thresholds only
    const uint32_t* keys;
    __device__ uint32_t key(int i) const { return keys[i]; }
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
    int n_all;     // how many items equal to key were examined (>= n_eq; every row item == key is among them)
};

// An emitted item equal to the k-th key. When more such items exist than belong to the top k (n_all > n_eq),
// which ones were emitted depends on thread timing: the entry is then marked -2 - index, and topk_order_kernel
// replaces the marked entries (always the row's last n_eq) by the lowest-positioned items equal to the key.
__device__ __forceinline__ int32_t tie_entry(int32_t idx, const Threshold& t) {
    return t.n_all > t.n_eq ? -2 - idx : idx;
}

// Min and max over the CTA of each thread's lo / hi (all threads get them).
template <int NT>
__device__ void block_min_max(uint32_t& lo, uint32_t& hi, SelectSmem<NT>& sm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if (lane == 0) {
        sm.red_lo[warp] = lo;
        sm.red_hi[warp] = hi;
    }
    __syncthreads();
    lo = __reduce_min_sync(0xffffffffu, lane < NT / 32 ? sm.red_lo[lane] : 0xffffffffu);
    hi = __reduce_max_sync(0xffffffffu, lane < NT / 32 ? sm.red_hi[lane] : 0u);
    __syncthreads();  // red_lo / red_hi may be reused
}

// Min and max key of the n items (all threads get them).
template <int NT, class L>
__device__ void key_range(const L& ld, int n, SelectSmem<NT>& sm, uint32_t& lo, uint32_t& hi) {
    lo = 0xffffffffu, hi = 0;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += NT) {
        const uint32_t key = ld.key(i);
        lo = min(lo, key);
        hi = max(hi, key);
    }
    block_min_max<NT>(lo, hi, sm);
}

// The exact k-th largest key among n items (1 <= k <= n). All NT threads of the CTA call it.
// kRange = false: absolute digits (11, 11, 10 bits) without the min/max pass — cheaper where the items
// spread over many binades (whole rows in the short path).
template <int NT, class L, bool kRange = true>
__device__ Threshold find_threshold(const L& ld, int n, int k, SelectSmem<NT>& sm) {
    uint32_t base = 0, top = 0xffffffffu;
    if constexpr (kRange) key_range<NT>(ld, n, sm, base, top);
    const uint32_t span = top - base;
    int rem = span ? 32 - __clz(static_cast<int>(span)) : 0;  // bits of d = key - base still undecided
    uint32_t prefix = 0;
    int kk = k;
    int n_all = n;
    int level = 0;
#pragma unroll 1
    while (rem > 0) {
        const int w = rem < 11 ? rem : 11;
        const int shift = rem - w;
        const int nb = 1 << w;
        for (int b = threadIdx.x; b < nb; b += NT) sm.hist[b] = 0;
        __syncthreads();
        if (level == 0) {
#pragma unroll 8
            for (int i = threadIdx.x; i < n; i += NT) atomicAdd(&sm.hist[(ld.key(i) - base) >> shift], 1);
        } else {
#pragma unroll 8
            for (int i = threadIdx.x; i < n; i += NT) {
                const uint32_t d = ld.key(i) - base;
                if ((static_cast<uint64_t>(d) >> rem) == prefix) atomicAdd(&sm.hist[(d >> shift) & (nb - 1)], 1);
            }
        }
        __syncthreads();
        // Thread t owns `per` bins going down from nb-1-t*per; an exclusive scan gives the count above them.
        const int per = (nb + NT - 1) / NT;
        const int tb = nb - 1 - static_cast<int>(threadIdx.x) * per;
        int local = 0;
        for (int j = 0; j < per; ++j)
            if (tb - j >= 0) local += sm.hist[tb - j];
        int acc = 0;
        cub::BlockScan<int, NT>(sm.scan).ExclusiveSum(local, acc);
        for (int j = 0; j < per; ++j) {
            if (tb - j < 0) break;
            const int h = sm.hist[tb - j];
            if (acc < kk && acc + h >= kk) {
                sm.digit = tb - j;
                sm.above = acc;
                sm.bin_n = h;
            }
            acc += h;
        }
        __syncthreads();
        prefix = (prefix << w) | static_cast<uint32_t>(sm.digit);
        kk -= sm.above;
        n_all = sm.bin_n;
        rem = shift;
        ++level;
        __syncthreads();  // sm.digit/above are rewritten by the next level
    }
    const uint32_t low = rem >= 32 ? 0u : (prefix << rem);
    return {base + low, kk, n_all};
}

// ---- exact select among keys staged in shared memory (candidate sets of up to ~16K) ----
// 11-bit range-relative digits like find_threshold, but each level's bin is found by ONE warp (two warp scans
// over the 2048 bins) instead of a block scan, and the next level's histogram is zeroed while this one fills:
// two barriers per level. (find_threshold's block scan cost ~2.5 us per level at 1024 threads.)
constexpr int kBinBits = 11;
constexpr int kBins = 1 << kBinBits;

struct StagedSmem {
    int hist[2][kBins];
    int digit, above, count;
};

// Run by warp 0 alone: the bin of h[kBins] that holds the kk-th largest item counting down from the top bin,
// how many items lie in the bins above it, and how many in it (1 <= kk <= the histogram's total).
__device__ __forceinline__ void warp_find_bin(const int* h, int kk, int* digit, int* above, int* count) {
    constexpr int kPer = kBins / 32;  // 64 bins per lane; lane 0 holds the top ones
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int b0 = kBins - kPer * (lane + 1);
    const int4* h4 = reinterpret_cast<const int4*>(h + b0);
    int s = 0;
#pragma unroll
    for (int j = 0; j < kPer / 4; ++j) {
        const int4 v = h4[(j + lane) & (kPer / 4 - 1)];  // rotated: the lanes' 256-B segments share banks
        s += v.x + v.y + v.z + v.w;
    }
    int incl = s;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, incl - s < kk && incl >= kk);
    const int hl = hit ? __ffs(hit) - 1 : 31;
    // The hit lane's 64 bins, two per lane, descending: a second scan.
    const int above0 = __shfl_sync(0xffffffffu, incl - s, hl);
    const int ba = kBins - kPer * hl - 1 - 2 * lane, bb = ba - 1;
    const int ca = h[ba], cb = h[bb];
    int incl2 = ca + cb;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl2, off);
        if (lane >= off) incl2 += v;
    }
    const int ex = above0 + incl2 - ca - cb;  // items above bin ba
    if (ex < kk && ex + ca >= kk) {
        *digit = ba;
        *above = ex;
        *count = ca;
    } else if (ex + ca < kk && ex + ca + cb >= kk) {
        *digit = bb;
        *above = ex + ca;
        *count = cb;
    }
}

// A radix level's bin, once every thread has added its items to h: zeroes `next` (the following level's histogram;
// h's previous reader, warp 0, passed its second barrier), then warp 0 finds the bin of h that holds the kk-th
// largest; all threads then read st.digit / above / count.
template <int NT>
__device__ __forceinline__ void level_bin(const int* h, int* next, int kk, StagedSmem& st) {
    for (int b = threadIdx.x; b < kBins; b += NT) next[b] = 0;
    __syncthreads();
    if (threadIdx.x < 32) warp_find_bin(h, kk, &st.digit, &st.above, &st.count);
    __syncthreads();
}

// The exact k-th largest of the n keys staged in shared memory (1 <= k <= n), all within [lo, hi]. All NT
// threads call it.
template <int NT>
__device__ Threshold select_staged(const uint32_t* keys, int n, int k, uint32_t lo, uint32_t hi, StagedSmem& st) {
    const uint32_t span = hi - lo;
    int rem = span ? 32 - __clz(static_cast<int>(span)) : 0;  // bits of d = key - lo still undecided
    uint32_t prefix = 0;
    int kk = k;
    int n_all = n;
    for (int b = threadIdx.x; b < kBins; b += NT) st.hist[0][b] = 0;
    __syncthreads();
#pragma unroll 1
    for (int level = 0; rem > 0; ++level) {
        const int w = rem < kBinBits ? rem : kBinBits;
        const int shift = rem - w;
        int* h = st.hist[level & 1];
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += NT) {
            const uint32_t d = keys[i] - lo;
            if ((static_cast<uint64_t>(d) >> rem) == prefix) atomicAdd(&h[(d >> shift) & (kBins - 1)], 1);
        }
        level_bin<NT>(h, st.hist[(level + 1) & 1], kk, st);
        prefix = (prefix << w) | static_cast<uint32_t>(st.digit);
        kk -= st.above;
        n_all = st.count;
        rem = shift;
    }
    return {lo + prefix, kk, n_all};
}

// Warp-aggregated slot allocation: returns this lane's slot (base + rank among the warp's set lanes).
// All 32 lanes call it.
__device__ __forceinline__ int warp_slot(bool pred, int* counter) {
    const unsigned ballot = __ballot_sync(0xffffffffu, pred);
    if (ballot == 0) return 0;
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(ballot) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(counter, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, leader);
    return base + __popc(ballot & ((1u << lane) - 1u));
}

// Slots for a thread's `count` items in one shared atomic per warp (all 32 lanes call it): returns the thread's
// first slot; its items take consecutive slots from there.
__device__ __forceinline__ int warp_slots(int count, int* counter) {
    const int lane = threadIdx.x & 31;
    int incl = count;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    int base = 0;
    if (lane == 31 && incl > 0) base = atomicAdd(counter, incl);
    return __shfl_sync(0xffffffffu, base, 31) + incl - count;
}

// emit_topk for keys and indices staged in shared memory: kU items per thread per round, one shared atomic per
// warp and round for each of the two counters.
template <int NT>
__device__ void emit_staged(const uint32_t* keys, const int32_t* ids, int n, int k, Threshold t, int32_t* out,
                            SelectSmem<NT>& sm) {
    constexpr int kU = 4;
    if (threadIdx.x == 0) {
        sm.n_gt = 0;
        sm.n_eq = 0;
    }
    __syncthreads();
    const int eq_base = k - t.n_eq;
    for (int i0 = 0; i0 < n; i0 += NT * kU) {  // uniform trip count
        uint32_t kv[kU];
        int n_gt = 0, n_eq = 0;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
            kv[u] = i < n ? keys[i] : 0u;
            n_gt += i < n && kv[u] > t.key;
            n_eq += i < n && kv[u] == t.key;
        }
        int sg = warp_slots(n_gt, &sm.n_gt);
        int se = warp_slots(n_eq, &sm.n_eq);
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
            if (i >= n) continue;
            if (kv[u] > t.key) {
                out[sg++] = ids[i];
            } else if (kv[u] == t.key) {
                if (se < t.n_eq) out[eq_base + se] = tie_entry(ids[i], t);
                ++se;
            }
        }
    }
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
    for (int i0 = 0; i0 < n; i0 += NT) {  // uniform trip count: whole warps take part in the ballots
        const int i = i0 + static_cast<int>(threadIdx.x);
        const bool ok = i < n;
        const uint32_t key = ok ? ld.key(i) : 0u;
        const bool gt = ok && key > t.key, eq = ok && key == t.key;
        const int sg = warp_slot(gt, &sm.n_gt);
        const int se = warp_slot(eq, &sm.n_eq);
        if (gt) out[sg] = ld.idx(i);
        if (eq && se < t.n_eq) out[eq_base + se] = tie_entry(ld.idx(i), t);
    }
}

// Row r's view of TopkSlotMap: position -> output index.
struct RowMap {
    const int32_t* table = nullptr;  // nullptr: identity
    int block = 1;
    __device__ int32_t operator()(int32_t i) const { return table ? table[i / block] * block + i % block : i; }
};
__device__ __forceinline__ RowMap row_map(const TopkSlotMap& m, int64_t r) {
    RowMap rm;
    if (m.tables != nullptr) {
        rm.table = m.tables + m.table_offset[m.seq[m.row_begin + r]];
        rm.block = m.block;
    }
    return rm;
}

// Emission in position order from keys staged in shared memory (short rows): warp w owns positions
// [w * span, (w + 1) * span), read 32 at a time (lane = position mod 32: conflict-free). A first pass counts each
// warp's items > T and == T, and the second writes every item > T and the lowest-positioned n_eq items == T at
// out[(items > T before it) + min(items == T before it, n_eq)]: ascending, ties resolved like the CPU reference,
// no sort.
template <int NT>
__device__ void emit_ordered(const uint32_t* keys, int n, Threshold t, int32_t* out, RowMap map, SelectSmem<NT>& sm) {
    constexpr int kWarps = NT / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int span = ((n + kWarps - 1) / kWarps + 31) & ~31;
    const int b = warp * span, e = min(n, b + span);
    int gt = 0, eq = 0;
    for (int i = b + lane; i < e; i += 32) {
        const uint32_t key = keys[i];
        gt += key > t.key;
        eq += key == t.key;
    }
    gt = __reduce_add_sync(0xffffffffu, gt);
    eq = __reduce_add_sync(0xffffffffu, eq);
    if (lane == 0) {
        sm.red_lo[warp] = static_cast<uint32_t>(gt);
        sm.red_hi[warp] = static_cast<uint32_t>(eq);
    }
    __syncthreads();
    int o_gt = 0, o_eq = 0;  // items > T and == T before this warp's next 32
    for (int w = 0; w < warp; ++w) {
        o_gt += static_cast<int>(sm.red_lo[w]);
        o_eq += static_cast<int>(sm.red_hi[w]);
    }
    const unsigned below = (1u << lane) - 1u;
    for (int i0 = b; i0 < e; i0 += 32) {  // warp-uniform trip count
        const int i = i0 + lane;
        const uint32_t key = i < e ? keys[i] : 0u;
        const bool g = i < e && key > t.key, q = i < e && key == t.key;
        const unsigned bg = __ballot_sync(0xffffffffu, g), bq = __ballot_sync(0xffffffffu, q);
        const int rg = o_gt + __popc(bg & below), rq = o_eq + __popc(bq & below);
        if (g) out[rg + min(rq, t.n_eq)] = map(i);
        if (q && rq < t.n_eq) out[rg + rq] = map(i);
        o_gt += __popc(bg);
        o_eq += __popc(bq);
    }
    __syncthreads();  // red_lo / red_hi may be reused
}

template <int NT>
__device__ void write_all_padded(int len, int k, int32_t* out, RowMap map = {}) {
    for (int i = threadIdx.x; i < k; i += NT) out[i] = i < len ? map(i) : -1;
}

// ---- short rows: one CTA per row, keys staged in shared memory ----
template <int NT>
__global__ void __launch_bounds__(NT)
    topk_short_kernel(const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
                      int32_t* __restrict__ out_idx, TopkSlotMap slots) {
    __shared__ SelectSmem<NT> sm;
    extern __shared__ uint32_t keys[];  // [row_stride]
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    int32_t* out = out_idx + r * k;
    const RowMap map = row_map(slots, r);
    if (len <= k) {
        write_all_padded<NT>(len, k, out, map);
        return;
    }
    const float* row = values + r * row_stride;
#pragma unroll 4
    for (int i = threadIdx.x; i < len; i += NT) keys[i] = float_key(__ldg(row + i));
    __syncthreads();
    // (select_staged here, warp-found bins over the key range, measured slower on the H200: 1 x 32K 30.5 -> 34.0 us,
    // 1024 x 16K 82 -> 103 us; faster only at 4096 x 4K, 125 -> 112.)
    const Threshold t = find_threshold<NT, KeysLoader, false>(KeysLoader{keys}, len, k, sm);
    emit_ordered<NT>(keys, len, t, out, map, sm);
}

// ---- long rows, step 1: estimated threshold from a strided sample ----
// The sample's keys stay in registers; radix levels of 11-bit digits over the sample's key range [lo, hi], each
// level's bin found by one warp (warp_find_bin), until the bin that holds the m-th largest sample holds at most
// kSampleBinStop samples (T_est is then its floor: at most that many samples below the m-th largest) or, when the
// whole row is the sample, until the exact k-th key. Replaced find_threshold's absolute digits and block scans:
// 3.3-3.6 us of the sample's ~10 at 64 x 1M (globaltimer stamps, bench/results/...-topk-chain-stamps.txt).
constexpr int kSampleBinStop = 4;

__global__ void __launch_bounds__(kSampleThreads)
    topk_sample_kernel(const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
                       uint32_t* __restrict__ t_est, int* __restrict__ cand_count) {
    pdl_trigger();  // the filter grid may become resident now (it waits for this grid's results)
    __shared__ SelectSmem<kSampleThreads> sm;
    __shared__ StagedSmem st;
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    if (threadIdx.x == 0) {
        cand_count[kCountStride * r] = 0;
        cand_count[kCountStride * r + 1] = 0;
        cand_count[kCountStride * r + 2] = 0;  // set by the select kernel once the row's output is final
    }
    if (len <= k) return;
    const float* row = values + r * row_stride;
    const int s = topk_plan::sample_count(len);
    const bool approx = s < len;
    int kk = topk_plan::sample_rank(k, len);  // T_est: the m-th largest sample
    // All loads of a thread in flight at once: the sample is latency-bound gathers.
    constexpr int kPer = kSampleSize / kSampleThreads;
    float v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
        const int j = u * kSampleThreads + static_cast<int>(threadIdx.x);
        const int64_t pos = topk_plan::sample_position(j, len, r);  // groups of 4 neighbours (topk_plan.h)
        v[u] = j < s ? __ldg(row + pos) : 0.f;
    }
    for (int b = threadIdx.x; b < kBins; b += kSampleThreads) st.hist[0][b] = 0;  // while the gathers are in flight
    uint32_t key[kPer];
    uint32_t lo = 0xffffffffu, hi = 0;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
        key[u] = float_key(v[u]);
        if (u * kSampleThreads + static_cast<int>(threadIdx.x) < s) {
            lo = min(lo, key[u]);
            hi = max(hi, key[u]);
        }
    }
    block_min_max<kSampleThreads>(lo, hi, sm);  // its barriers also cover the zeroed histograms
    const uint32_t span = hi - lo;
    int rem = span ? 32 - __clz(static_cast<int>(span)) : 0;  // bits of d = key - lo still undecided
    uint32_t prefix = 0;
#pragma unroll 1
    for (int level = 0; rem > 0; ++level) {
        const int w = rem < kBinBits ? rem : kBinBits;
        const int shift = rem - w;
        int* h = st.hist[level & 1];
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
            const uint32_t d = key[u] - lo;
            if (u * kSampleThreads + static_cast<int>(threadIdx.x) < s && (static_cast<uint64_t>(d) >> rem) == prefix)
                atomicAdd(&h[(d >> shift) & (kBins - 1)], 1);
        }
        level_bin<kSampleThreads>(h, st.hist[(level + 1) & 1], kk, st);
        prefix = (prefix << w) | static_cast<uint32_t>(st.digit);
        kk -= st.above;
        rem = shift;
        const int bin_n = st.count;
        __syncthreads();  // st.digit / above / count are rewritten by the next level
        if (approx && bin_n <= kSampleBinStop) break;
    }
    if (threadIdx.x == 0) t_est[r] = lo + (rem >= 32 ? 0u : prefix << rem);
}

// Appends (key, idx) for lanes with pred set; called by all 32 lanes of a warp. Returns the counter's
// value after this warp's items (0 when none), warp-uniform.
__device__ __forceinline__ int warp_append(bool pred, uint32_t key, int32_t idx, int* count, uint32_t* keys,
                                           int32_t* ids, int cap) {
    const unsigned ballot = __ballot_sync(0xffffffffu, pred);
    if (ballot == 0) return 0;
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
    return base + __popc(ballot);
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// ---- long rows, step 2: one streaming pass, candidates >= T_est into a compact buffer ----
// Work item w: row w / chunks_per_row, elements [c * chunk, (c + 1) * chunk) with c = w % chunks_per_row.
// kMask (the default, TopkTuning::filter_variant = 1): the unrolled part only builds a per-thread
// bit mask of the batch's items >= T_est; a compact loop then appends one flagged item per lane per step,
// re-reading its value. Keeps the hot code small (the inlined append path per slot is ~32 copies).
template <bool kVec, bool kMask>
__global__ void __launch_bounds__(kFilterThreads, 4)
    topk_filter_kernel(const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
                       const uint32_t* __restrict__ t_est, int* __restrict__ cand_count,
                       uint32_t* __restrict__ cand_keys, int32_t* __restrict__ cand_idx, int32_t* __restrict__ eq_idx,
                       int cap, int chunk, int chunks_per_row, int n_work, int prefetch) {
    // Before waiting for the sample grid: pull the first `prefetch` items of the first work item towards L2 (one
    // 128-B line per thread and step).
    if (static_cast<int>(blockIdx.x) < n_work) {
        const int64_t r = blockIdx.x / chunks_per_row;
        const int begin = static_cast<int>(blockIdx.x % chunks_per_row) * chunk;
        const int len = lengths[r];
        const int end = min(len, begin + min(chunk, prefetch));
        if (len > k)
            for (int i = begin + static_cast<int>(threadIdx.x) * 32; i < end; i += kFilterThreads * 32)
                prefetch_l2(values + r * row_stride + i);
    }
    __shared__ uint32_t s_keys[kLocalCap];
    __shared__ int32_t s_ids[kLocalCap];
    __shared__ int s_n, s_base;
    __shared__ uint32_t s_stash[kStash][kFilterThreads];  // a thread's column: keys of its flagged items
    // stash[q]: the thread's q-th entry, from a base pointer computed once. Indexing s_stash[q][threadIdx.x] in the
    // loop instead looks the same but made the filter 72 -> 76.5 us at 64 x 1M (aac8788, undone in 687d006;
    // bench/results/...-3b48524-topk-stash-index-ab.txt).
    uint32_t* const stash_base = &s_stash[0][threadIdx.x];
    struct Stash {
        uint32_t* p;
        __device__ uint32_t& operator[](int q) const { return p[q * kFilterThreads]; }
    } const stash{stash_base};
    pdl_wait();
#pragma unroll 1
    for (int w = blockIdx.x; w < n_work; w += gridDim.x) {
        const int64_t r = w / chunks_per_row;
        const int len = lengths[r];
        if (len <= k) continue;
        const int begin = (w % chunks_per_row) * chunk;  // chunk: a multiple of 1024
        if (begin >= len) continue;
        const int end = len - begin < chunk ? len : begin + chunk;
        const uint32_t thr = t_est[r];
        const float* row = values + r * row_stride;
        int* count = cand_count + kCountStride * r;  // [0]: items > T_est, [1]: items == T_est
        uint32_t* keys = cand_keys + r * cap;
        int32_t* ids = cand_idx + r * cap;
        int32_t* eq_ids = eq_idx + r * k;
        // Items > T_est gather in shared memory (a shared atomic per warp) and go out with one global atomic
        // per work item; past kLocalCap they append to the global buffer directly (per warp). Items == T_est
        // only need indices, at most k of them: once a warp sees k counted it stops appending ties (select
        // only needs count[1] >= k then; keeps a row of ReLU zeros from costing an atomic per warp per item).
        bool eq_full = false;  // warp-uniform
        if (threadIdx.x == 0) s_n = 0;
        __syncthreads();
        auto append = [&](bool ok, uint32_t key, int32_t i) {
            const bool gt = ok && key > thr;
            const unsigned ballot = __ballot_sync(0xffffffffu, gt);
            if (ballot != 0) {
                const int lane = threadIdx.x & 31;
                const int leader = __ffs(ballot) - 1;
                int b = 0;
                if (lane == leader) b = atomicAdd(&s_n, __popc(ballot));
                b = __shfl_sync(0xffffffffu, b, leader);
                const int pos = b + __popc(ballot & ((1u << lane) - 1u));
                if (gt && pos < kLocalCap) {
                    s_keys[pos] = key;
                    s_ids[pos] = i;
                }
                if (b + __popc(ballot) > kLocalCap) warp_append(gt && pos >= kLocalCap, key, i, count, keys, ids, cap);
            }
            if (!eq_full) eq_full = warp_append(ok && key == thr, key, i, count + 1, nullptr, eq_ids, k) >= k;
        };
        if constexpr (kVec) {
            const float4* row4 = reinterpret_cast<const float4*>(row);
            const int b4 = begin >> 2, e4 = end >> 2;
#pragma unroll 1
            for (int i0 = b4; i0 < e4; i0 += kFilterThreads * kFilterUnroll) {
                float4 v[kFilterUnroll];
#pragma unroll
                for (int u = 0; u < kFilterUnroll; ++u) {
                    const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                    v[u] = i < e4 ? __ldcs(row4 + i) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
                }
                if constexpr (kMask) {
                    // Bit 4u+e: element e of slot u is > T_est, or == T_est while ties are still wanted.
                    static_assert(kFilterUnroll * 4 <= 32, "mask bits");
                    // The keys of a thread's first kStash flagged items wait in its stash (flagged in bit order, the
                    // order the loop below takes them); later ones are re-read from global memory. Re-reading them
                    // all cost ~10 us at 64 x 1M (an L2 round trip in most warp batches before the next loads).
                    uint32_t mask = 0;
                    int n_flag = 0;
#pragma unroll
                    for (int u = 0; u < kFilterUnroll; ++u) {
                        const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                        if (i < e4) {
                            const uint32_t kx[4] = {float_key(v[u].x), float_key(v[u].y), float_key(v[u].z),
                                                    float_key(v[u].w)};
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (kx[e] > thr || (kx[e] == thr && !eq_full)) {
                                    mask |= 1u << (4 * u + e);
                                    if (n_flag < kStash) stash[n_flag] = kx[e];
                                    ++n_flag;
                                }
                        }
                    }
                    int taken = 0;
                    while (__any_sync(0xffffffffu, mask != 0)) {
                        const int b = mask ? __ffs(mask) - 1 : -1;
                        mask &= mask - 1;
                        int32_t idx = 0;
                        uint32_t key = 0;
                        if (b >= 0) {
                            const int i = i0 + (b >> 2) * kFilterThreads + static_cast<int>(threadIdx.x);
                            idx = 4 * i + (b & 3);
                            key = taken < kStash ? stash[taken] : float_key(row[idx]);
                            ++taken;
                        }
                        append(b >= 0, key, idx);
                    }
                } else {
#pragma unroll
                    for (int u = 0; u < kFilterUnroll; ++u) {
                        if (i0 + u * kFilterThreads >= e4) break;  // uniform
                        const int i = i0 + u * kFilterThreads + static_cast<int>(threadIdx.x);
                        const bool ok = i < e4;
                        const uint32_t k0 = float_key(v[u].x), k1 = float_key(v[u].y), k2 = float_key(v[u].z),
                                       k3 = float_key(v[u].w);
                        const bool any = ok && max(max(k0, k1), max(k2, k3)) >= thr;
                        if (!__any_sync(0xffffffffu, any)) continue;
                        append(ok, k0, 4 * i + 0);
                        append(ok, k1, 4 * i + 1);
                        append(ok, k2, 4 * i + 2);
                        append(ok, k3, 4 * i + 3);
                    }
                }
            }
            // Tail of the row (len % 4 items), in the work item that holds the row's end.
            if (end == len && (len & 3) != 0 && threadIdx.x < 32) {
                const int i = (e4 << 2) + static_cast<int>(threadIdx.x);
                const bool ok = i < len;
                const uint32_t key = ok ? float_key(row[i]) : 0u;
                append(ok, key, i);
            }
        } else {
            constexpr int kUnroll = 8;
#pragma unroll 1
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
                    const bool ok = i < end;
                    if (!__any_sync(0xffffffffu, ok && key >= thr)) continue;
                    append(ok, key, i);
                }
            }
        }
        // Flush the work item's gathered candidates: one global atomic reserves their slots.
        __syncthreads();
        const int n_local = min(s_n, kLocalCap);
        if (n_local > 0) {
            if (threadIdx.x == 0) s_base = atomicAdd(count, n_local);
            __syncthreads();
            const int gb = s_base;
            for (int j = threadIdx.x; j < n_local; j += kFilterThreads) {
                const int pos = gb + j;
                if (pos < cap) {
                    keys[pos] = s_keys[j];
                    ids[pos] = s_ids[j];
                }
            }
        }
        __syncthreads();  // s_n, s_keys are reused by the next work item
    }
    pdl_trigger();  // the select grid may become resident as this grid drains
}

// The top k of staged candidates, written ascending by position (the canonical order) by the selecting CTA, when
// every staged item equal to the k-th key belongs to the top k (no tie to resolve) and a bitmap of the row fits the
// stage (len <= 32 * 2 * kStageCap = 1M). The selected positions gather in `sel_s` (any order) and are counted per
// bucket of 2^shift positions (4096 buckets) and marked in the bitmap; after a scan of the bucket counts, an item's
// rank is its bucket's start plus the marked positions between the bucket's first position and it (at most 8 words
// at 1M). Every item costs about the same however the positions cluster. Saves the order kernel (~13 us at 64 x 1M,
// ncu). Tried and slower: one CTA walking the whole bitmap in position order (10-20 us: 32K words on one SM), a
// bitonic sort of the k positions (30 us: 66 CTA-wide steps), ranks by comparing within buckets (20 us when recent
// tokens fill a bucket).
constexpr int kSortedMaxLen = 32 * 2 * kStageCap;

template <int NT>
__device__ void emit_sorted_positions(uint32_t* stage, int k, int len, const int32_t* sel_s, int32_t* out, RowMap map,
                                      SelectSmem<NT>& sm, StagedSmem& st);

template <int NT>
__device__ void emit_staged_sorted(uint32_t* stage, int n, int k, uint32_t thr, int len, int32_t* sel_s, int32_t* out,
                                   RowMap map, SelectSmem<NT>& sm, StagedSmem& st) {
    const uint32_t* sk = stage;
    const int32_t* si = reinterpret_cast<const int32_t*>(stage + kStageCap);
    if (threadIdx.x == 0) sm.n_gt = 0;
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += NT) {  // uniform trip count
        const int i = i0 + static_cast<int>(threadIdx.x);
        const bool pick = i < n && sk[i] >= thr;
        const int slot = warp_slot(pick, &sm.n_gt);
        if (pick) sel_s[slot] = si[i];
    }
    __syncthreads();  // the stage is free: it becomes the bitmap
    emit_sorted_positions<NT>(stage, k, len, sel_s, out, map, sm, st);
}

// Writes the k positions of sel_s (any order) to out in ascending order, through map; `stage` (a bitmap of the row:
// len <= kSortedMaxLen) and `st` are free. Bucket counts + bitmap ranks (emit_staged_sorted above).
template <int NT>
__device__ void emit_sorted_positions(uint32_t* stage, int k, int len, const int32_t* sel_s, int32_t* out, RowMap map,
                                      SelectSmem<NT>& sm, StagedSmem& st) {
    constexpr int kBuckets = 2 * kBins;  // both histograms of `st`, 4 per thread
    static_assert(NT * 4 == kBuckets && sizeof(st.hist) == kBuckets * sizeof(int), "four buckets per thread");
    int* start = &st.hist[0][0];
    uint32_t* bits = stage;
    const int words4 = (len + 127) >> 7;
    for (int w = threadIdx.x; w < words4; w += NT) reinterpret_cast<uint4*>(bits)[w] = make_uint4(0, 0, 0, 0);
    for (int j = 0; j < 4; ++j) start[4 * threadIdx.x + j] = 0;
    __syncthreads();
    const int shift = len > kBuckets ? 32 - __clz(len - 1) - (kBinBits + 1) : 0;  // kBuckets << shift >= len
    for (int i = threadIdx.x; i < k; i += NT) {
        const int v = sel_s[i];
        atomicAdd(&start[v >> shift], 1);
        atomicOr(&bits[v >> 5], 1u << (v & 31));
    }
    __syncthreads();
    int c[4], sum = 0;
    for (int j = 0; j < 4; ++j) sum += (c[j] = start[4 * threadIdx.x + j]);
    int acc = 0;
    cub::BlockScan<int, NT>(sm.scan).ExclusiveSum(sum, acc);
    for (int j = 0; j < 4; ++j) {
        start[4 * threadIdx.x + j] = acc;
        acc += c[j];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < k; i += NT) {
        // rank = the bucket's start + the marked positions in [bucket start, v). A bucket narrower than a word lies
        // inside one word: the bits below its start are taken back.
        const int v = sel_s[i], b = v >> shift, p0 = b << shift;
        const int w0 = p0 >> 5, wv = v >> 5;
        int rank = start[b] + __popc(bits[wv] & ((1u << (v & 31)) - 1u)) - __popc(bits[w0] & ((1u << (p0 & 31)) - 1u));
        for (int w = w0; w < wv; ++w) rank += __popc(bits[w]);
        out[rank] = map(v);
    }
}

// The chain's usual case, in fewer passes than select_staged + emit_staged_sorted: one histogram level over the
// staged candidates' key range [lo, hi] (hist[0] zeroed by the caller), then ONE pass that sends every candidate
// above the chosen bin straight to sel_s and gathers the bin's own (usually a handful of) items, whose exact k-th key
// comes from ranks by comparison. The later radix levels (a 1M row's candidates span ~23 key bits: 3 levels) and
// the separate pick pass go. Returns 0 when it wrote the row in order (every item equal to the k-th key is in the
// top k); 1 when ties at the k-th key need resolving: t holds the exact threshold, nothing was written; 2 when the
// chosen bin holds more than kBinList items: nothing was decided.
constexpr int kBinList = kBins / 2;  // (key, id) pairs of the chosen bin, in hist[1]

template <int NT>
__device__ int select_sorted(uint32_t* stage, int n, int k, uint32_t lo, uint32_t hi, int len, int32_t* sel_s,
                             int32_t* out, RowMap map, SelectSmem<NT>& sm, StagedSmem& st, Threshold& t) {
    static_assert(NT >= kBinList, "a thread per item of the bin");
    const uint32_t* sk = stage;
    const int32_t* si = reinterpret_cast<const int32_t*>(stage + kStageCap);
    const uint32_t span = hi - lo;
    const int rem = span ? 32 - __clz(static_cast<int>(span)) : 0;
    const int w = rem < kBinBits ? rem : kBinBits;
    const int shift = rem - w;
    if (threadIdx.x == 0) {
        sm.n_gt = 0;  // sel_s entries
        sm.n_eq = 0;  // bin list entries
    }
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += NT) atomicAdd(&st.hist[0][(sk[i] - lo) >> shift], 1);
    level_bin<NT>(st.hist[0], st.hist[1], k, st);
    const uint32_t bin = static_cast<uint32_t>(st.digit);
    const int kk = k - st.above, bin_n = st.count;
    if (bin_n > kBinList) return 2;
    uint32_t* bin_keys = reinterpret_cast<uint32_t*>(st.hist[1]);
    int32_t* bin_ids = st.hist[1] + kBinList;
    for (int i0 = 0; i0 < n; i0 += NT) {  // uniform trip count
        const int i = i0 + static_cast<int>(threadIdx.x);
        const uint32_t b = i < n ? (sk[i] - lo) >> shift : 0u;
        const bool above = i < n && b > bin, in = i < n && b == bin;
        const int sa = warp_slot(above, &sm.n_gt);
        const int sb = warp_slot(in, &sm.n_eq);
        if (above) sel_s[sa] = si[i];
        if (in) {
            bin_keys[sb] = sk[i];
            bin_ids[sb] = si[i];
        }
    }
    __syncthreads();
    // The kk-th largest of the bin's items: the item with gt items above it and eq equal to it, gt < kk <= gt + eq.
    const int j = static_cast<int>(threadIdx.x);
    const uint32_t key = j < bin_n ? bin_keys[j] : 0u;
    if (j < bin_n) {
        int gt = 0, eq = 0;
        for (int q = 0; q < bin_n; ++q) {
            const uint32_t o = bin_keys[q];
            gt += o > key;
            eq += o == key;
        }
        if (gt < kk && kk <= gt + eq) {  // every thread holding the k-th key writes the same values
            st.digit = static_cast<int>(key);
            st.above = kk - gt;  // n_eq
            st.count = eq;       // n_all
        }
    }
    __syncthreads();
    t = {static_cast<uint32_t>(st.digit), st.above, st.count};
    if (t.n_eq != t.n_all) return 1;
    const bool pick = j < bin_n && key >= t.key;
    const int slot = warp_slot(pick, &sm.n_gt);
    if (pick) sel_s[slot] = bin_ids[j];
    __syncthreads();  // sel_s holds the k positions; the stage is free: it becomes the bitmap
    emit_sorted_positions<NT>(stage, k, len, sel_s, out, map, sm, st);
    return 0;
}

// ---- long rows, step 3: exact select among the candidates, or over the whole row as fallback ----
__global__ void __launch_bounds__(kSelectThreads)
    topk_select_kernel(const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
                       int32_t* __restrict__ out_idx, const int* __restrict__ cand_count,
                       const uint32_t* __restrict__ cand_keys, const int32_t* __restrict__ cand_idx,
                       const int32_t* __restrict__ eq_idx, int cap, int32_t* __restrict__ final_idx, TopkSlotMap slots,
                       int* __restrict__ ordered) {  // ordered: [kCountStride * row]
    __shared__ SelectSmem<kSelectThreads> sm;
    __shared__ StagedSmem st;
    extern __shared__ uint32_t stage[];  // [kStageCap] keys then [kStageCap] indices
    const int64_t r = blockIdx.x;
    const int len = lengths[r];
    int32_t* out = out_idx + r * k;
    pdl_wait();
    if (len <= k) {
        write_all_padded<kSelectThreads>(len, k, out);
        return;
    }
    const int c = cand_count[kCountStride * r];         // items > T_est
    const int c_eq = cand_count[kCountStride * r + 1];  // items == T_est
    if (c < k && c + c_eq >= k) {
        // The k-th value is T_est itself: every item > T_est, then k - c of the ties, marked (tie_entry) when
        // there may be more: c_eq is exact below k (no warp stopped appending ties).
        const int32_t* gi = cand_idx + r * cap;
        const int32_t* ge = eq_idx + r * k;
        const bool more = c_eq >= k || c_eq > k - c;
        for (int i = threadIdx.x; i < k; i += kSelectThreads)
            out[i] = i < c ? gi[i] : (more ? -2 - ge[i - c] : ge[i - c]);
    } else if (c >= k && c <= cap) {
        // The k-th value is > T_est: the top k lie among the candidates.
        const uint32_t* gk = cand_keys + r * cap;
        const int32_t* gi = cand_idx + r * cap;
        if (c <= kStageCap) {
            uint32_t* sk = stage;
            int32_t* si = reinterpret_cast<int32_t*>(stage + kStageCap);
            uint32_t lo = 0xffffffffu, hi = 0;
            for (int b = threadIdx.x; b < kBins; b += kSelectThreads) st.hist[0][b] = 0;  // for select_sorted
            // Batches of 8 predicated loads per thread: a loop unrolled by the compiler runs its remainder one load
            // at a time, and a row's ~5K candidates are ~5 per thread (all in its remainder).
            constexpr int kU = 8;
            for (int i0 = 0; i0 < c; i0 += kU * kSelectThreads) {
                uint32_t kx[kU];
                int32_t ix[kU];
#pragma unroll
                for (int u = 0; u < kU; ++u) {
                    const int i = i0 + u * kSelectThreads + static_cast<int>(threadIdx.x);
                    if (i < c) {
                        kx[u] = gk[i];
                        ix[u] = gi[i];
                    }
                }
#pragma unroll
                for (int u = 0; u < kU; ++u) {
                    const int i = i0 + u * kSelectThreads + static_cast<int>(threadIdx.x);
                    if (i < c) {
                        sk[i] = kx[u];
                        si[i] = ix[u];
                        lo = min(lo, kx[u]);
                        hi = max(hi, kx[u]);
                    }
                }
            }
            block_min_max<kSelectThreads>(lo, hi, sm);
            int32_t* sel_s = reinterpret_cast<int32_t*>(stage + 2 * kStageCap);
            Threshold t{};
            const int how = len <= kSortedMaxLen
                                ? select_sorted<kSelectThreads>(stage, c, k, lo, hi, len, sel_s, final_idx + r * k,
                                                                row_map(slots, r), sm, st, t)
                                : 2;
            if (how == 0) {
                if (threadIdx.x == 0) ordered[kCountStride * r] = 1;  // the order kernel skips this row
                return;
            }
            if (how == 2) t = select_staged<kSelectThreads>(sk, c, k, lo, hi, st);
            if (t.n_all == t.n_eq && len <= kSortedMaxLen) {
                emit_staged_sorted<kSelectThreads>(stage, c, k, t.key, len, sel_s, final_idx + r * k,
                                                   row_map(slots, r), sm, st);
                if (threadIdx.x == 0) ordered[kCountStride * r] = 1;  // the order kernel skips this row
                return;
            }
            emit_staged<kSelectThreads>(sk, si, c, k, t, out, sm);
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

// ---- few long rows (decode): one kernel over a grid of G co-resident CTAs per row ----
// Zeroes the per-row control words (barrier arrivals, histograms, counts) once the previous kernel of the
// stream has finished (a previous call may still be using the same scratch), and lets the main kernel's
// CTAs become resident meanwhile.
__global__ void topk_few_init_kernel(int* __restrict__ ctl, int n) {
    pdl_trigger();
    pdl_wait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) ctl[i] = 0;
}

// Profiling (TopkTuning::debug_times): globaltimer (ns) into dbg[i] by thread 0 of the calling CTA.
__device__ __forceinline__ void stamp(unsigned long long* dbg, int i) {
    if (dbg != nullptr && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        dbg[i] = t;
    }
}

// ---- few long rows (decode): one exact radix select shared by the row's CTAs ----
// The G CTAs of a row (G * rows <= SMs, one CTA per SM: all co-resident, so they can wait for each other) run the
// radix select together, each over its slice staged in shared memory, and meet at a counter barrier after each
// step (~1.3 us each on the H200):
//   1. stage the slice's keys;
//   2. rounds of key digits from the top (11 bits: sign, exponent, 2 mantissa bits; then 8 bits): each CTA
//      histograms its keys that carry the digits chosen so far in shared memory and adds the non-empty bins to the
//      row's global histogram;                                                             barrier
//      every CTA reads the global histogram and finds the same bin, the one holding the k-th largest key; the
//      rounds end once that bin holds at most kGridCand keys (one round on spread rows: 1/8 of a binade) or is a
//      single key value;
//   3. each CTA counts its keys above the bin and in it (published per CTA; also per warp, over the spans it will
//      emit from), flags its 32-key chunks that hold a key >= the bin, and appends the keys in the bin to the row's
//      candidate list (kGridCand at most);                                                 barrier
//   4. every CTA stages the candidates and finds the exact k-th key T among them (select_staged; the same answer
//      in every CTA), and counts the items > T and == T in the slices before its own (the published counts plus the
//      candidates below its first position) and in each warp's span;
//   5. each warp writes its span's items > T and its share of the lowest-positioned items == T straight into the
//      row's final place in position order, reading only the flagged chunks.
// The row's output is canonical (ascending, ties to the lowest positions) without the order kernel, hot slices
// and heavy ties cost no more than spread rows (no fallback), and no CTA does the others' work.
// Why the barriers cannot deadlock: the grid has G * rows <= SMs CTAs and each SM can hold one, whatever else is
// resident, once the kernels before it drain (the init kernel waits for them; they do not wait for this one), and
// this grid lets a dependent grid launch (griddepcontrol.launch_dependents) only after its last barrier, when all
// of its CTAs are resident. The launch is cooperative, so a context with fewer usable SMs than the device reports
// (MPS, green contexts) gets an error instead of a hang, and launch_topk then takes the other kernels.
// The digit rounds, bins and slices: topk_plan.h (shared with a CPU model of this kernel, tests/unit).
using topk_plan::few_slice;
using topk_plan::kGridCand;
using topk_plan::kGridDigit0;
using topk_plan::kGridRounds;
constexpr int kGridBins0 = 1 << kGridDigit0;  // round 0's bins (kBins)
constexpr int kGridBins = 1 << topk_plan::kGridDigit;
// Per-row control words: [0] barrier arrivals, [3] candidates, [kGridHist ..) round 0's histogram (kGridBins0), then
// the later rounds' (kGridBins each), [kGridCnt + c] CTA c's keys above the final bin, [kGridCnt + kFewGMax + c] in it.
using topk_plan::kGridHist;
constexpr int kGridCnt = kGridHist + kGridBins0 + (kGridRounds - 1) * kGridBins;
constexpr int kGridCtl = kGridCnt + 2 * kFewGMax;
constexpr int kGridChunkWords = kFewSliceMax / 32 / 32;

// All G CTAs of a row: arrive, then wait until `target` arrivals (G per barrier so far) are counted. The arrival is
// an acq_rel fence then a relaxed add (the CTA's writes, ordered before thread 0 by the CTA barrier, are released
// with it); the wait an acquiring load. __threadfence() (a sequentially consistent fence) in its place cost
// ~0.1-0.2 us more per barrier (H200, 1 x 1M: 15.6-15.9 -> 15.4 us from the kernel's start to its end).
__device__ __forceinline__ void grid_row_barrier(int* counter, int target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
        int v;
        do {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

// Sums a and b over the CTA (all threads get them).
template <int NT>
__device__ __forceinline__ void block_sum2(int& a, int& b, SelectSmem<NT>& sm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    a = __reduce_add_sync(0xffffffffu, a);
    b = __reduce_add_sync(0xffffffffu, b);
    if (lane == 0) {
        sm.red_lo[warp] = static_cast<uint32_t>(a);
        sm.red_hi[warp] = static_cast<uint32_t>(b);
    }
    __syncthreads();
    a = __reduce_add_sync(0xffffffffu, lane < NT / 32 ? static_cast<int>(sm.red_lo[lane]) : 0);
    b = __reduce_add_sync(0xffffffffu, lane < NT / 32 ? static_cast<int>(sm.red_hi[lane]) : 0);
    __syncthreads();  // red_lo / red_hi may be reused
}

template <int NT>
__global__ void __launch_bounds__(NT, 1)
    topk_few_grid_kernel(const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride,
                         int k, int ctas_per_row, int* __restrict__ ctl_all, uint32_t* __restrict__ cand_keys,
                         int32_t* __restrict__ cand_idx, int32_t* __restrict__ out_idx, TopkSlotMap slots,
                         bool hist0_ready, unsigned long long* dbg) {
    __shared__ SelectSmem<NT> sm;
    __shared__ StagedSmem st;
    __shared__ uint32_t s_chunks[kGridChunkWords];  // a bit per 32-key chunk of the slice: a key >= the final bin
    __shared__ int s_above[NT / 32], s_in[NT / 32], s_gt[NT / 32], s_eq[NT / 32];  // per warp's span
    extern __shared__ uint32_t dyn[];  // [per] keys, then kGridCand candidate keys, then their indices
    const int G = ctas_per_row;
    const int r = static_cast<int>(blockIdx.x) / G, c = static_cast<int>(blockIdx.x) % G;
    static_assert(kFewGMax <= NT, "one count pair per thread (step 4)");
    const int lane = threadIdx.x & 31;
    unsigned long long* dbg0 = blockIdx.x == 0 ? dbg : nullptr;
    pdl_wait();
    stamp(dbg0, 0);
    const int len = lengths[r];
    int32_t* out = out_idx + static_cast<int64_t>(r) * k;
    const RowMap map = row_map(slots, r);
    if (len <= k) {  // uniform over the row's CTAs: none of them reaches a barrier
        if (c == 0) write_all_padded<NT>(len, k, out, map);
        return;
    }
    int* ctl = ctl_all + static_cast<int64_t>(r) * kGridCtl;
    uint32_t* ckeys = cand_keys + static_cast<int64_t>(r) * kGridCand;
    int32_t* cids = cand_idx + static_cast<int64_t>(r) * kGridCand;
    const int per = static_cast<int>(few_slice(len, G));
    const int b0 = c * per;
    const int n = max(0, min(len - b0, per));
    uint32_t* keys = dyn;
    uint32_t* sk = dyn + per;
    int32_t* si = reinterpret_cast<int32_t*>(sk + kGridCand);
    int arrivals = 0;

    // 1. the slice's keys and their histogram by the keys' top 11 bits (sign, exponent, 2 mantissa bits)
    // 2. rounds: the global histogram of this round's digit over the keys that carry the digits chosen so far;
    //    every CTA finds the same bin, the one holding the need-th largest key. Digits of 11 bits, then 8.
    const float* row = values + static_cast<int64_t>(r) * row_stride;
    // 16-B loads where the slice is 16-B aligned (a row stride that is a multiple of 4): the large slices of 2-4 rows
    // need that many bytes in flight.
    const float* src = row + b0;
    int head = 0;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        head = n & ~3;
        const float4* src4 = reinterpret_cast<const float4*>(src);
        uint4* keys4 = reinterpret_cast<uint4*>(keys);
#pragma unroll 4
        for (int i = threadIdx.x; i < (head >> 2); i += NT) {
            const float4 v = __ldg(src4 + i);
            keys4[i] = make_uint4(float_key(v.x), float_key(v.y), float_key(v.z), float_key(v.w));
        }
    }
#pragma unroll 8
    for (int i = head + static_cast<int>(threadIdx.x); i < n; i += NT) keys[i] = float_key(__ldg(src + i));
    int rem = 32;  // low key bits still undecided
    uint32_t prefix = 0;
    int need = k, bin_n = len, round = 0;
#pragma unroll 1
    while (topk_plan::grid_more_rounds(round, rem, bin_n)) {  // uniform: every CTA reads the same histograms
        const int w = topk_plan::grid_digit_bits(round, rem);
        const int shift = rem - w;
        int* gh = ctl + kGridHist + (round == 0 ? 0 : kGridBins0 + (round - 1) * kGridBins);
        if (round > 0 || !hist0_ready) {  // (else the scores' kernel added up round 0's histogram: no barrier)
            int* h = st.hist[0];
            for (int b = threadIdx.x; b < (1 << w); b += NT) h[b] = 0;
            __syncthreads();
            for (int i0 = 0; i0 < n; i0 += NT) {  // uniform trip count: whole warps vote
                const int i = i0 + static_cast<int>(threadIdx.x);
                int bin = -1;
                if (i < n) {  // a thread reads back the keys it stored
                    const uint32_t key = keys[i];
                    if ((static_cast<uint64_t>(key) >> rem) == prefix)
                        bin = static_cast<int>((key >> shift) & ((1u << w) - 1));
                }
                // Clustered keys (ties, a narrow bin) would serialise on one shared counter: a warp whose 32 keys share
                // a bin adds once.
                const int b_first = __shfl_sync(0xffffffffu, bin, 0);
                if (__all_sync(0xffffffffu, bin == b_first)) {
                    if (lane == 0 && bin >= 0) atomicAdd(&h[bin], 32);
                } else if (bin >= 0) {
                    atomicAdd(&h[bin], 1);
                }
            }
            __syncthreads();
            if (round == 0) stamp(dbg0, 1);
            for (int b = threadIdx.x; b < (1 << w); b += NT)
                if (h[b] != 0) atomicAdd(gh + b, h[b]);
            grid_row_barrier(ctl, arrivals += G);
        }
        if (round == 0) stamp(dbg0, 2);
        // The global histogram into shared memory (zero-padded to kBins), then warp 0 finds the bin.
        int* gs = st.hist[1];
        for (int b = threadIdx.x; b < kBins; b += NT) gs[b] = b < (1 << w) ? __ldcg(gh + b) : 0;
        __syncthreads();
        if (threadIdx.x < 32) warp_find_bin(gs, need, &st.digit, &st.above, &st.count);
        __syncthreads();
        prefix = (prefix << w) | static_cast<uint32_t>(st.digit);
        need -= st.above;
        bin_n = st.count;
        rem = shift;
        ++round;
    }
    stamp(dbg0, 3);
    // The bin [bl, bh] holds the need-th largest key of the row (need >= 1) among its bin_n keys.
    const uint32_t bl = topk_plan::grid_bin_lo(prefix, rem);
    const uint32_t bh = topk_plan::grid_bin_hi(bl, rem);
    const bool cands = bin_n <= kGridCand;  // else a single key value (rem == 0): all of the bin ties

    // 3. this slice's keys above the bin and in it, counted per warp over the spans that step 5 emits from (warp w:
    //    keys [w·span, (w+1)·span)); the 32-key chunks holding a key >= the bin are flagged; the keys in the bin
    //    join the row's candidates (gathered in shared memory, then one global atomic per CTA for their place)
    constexpr int kWarps = NT / 32;
    const int warp = threadIdx.x >> 5;
    const int span = ((n + kWarps - 1) / kWarps + 31) & ~31;
    const int wb = warp * span, we = min(n, wb + span);
    for (int j = threadIdx.x; j < kGridChunkWords; j += NT) s_chunks[j] = 0;
    if (threadIdx.x == 0) sm.n_gt = 0;
    __syncthreads();
    int w_above = 0, w_in = 0;
    for (int i0 = wb; i0 < we; i0 += 32) {  // warp-uniform trip count
        const int i = i0 + lane;
        const uint32_t key = i < we ? keys[i] : 0u;
        const bool up = i < we && key >= bl;
        w_above += up && key > bh;
        const unsigned b_up = __ballot_sync(0xffffffffu, up);
        if (b_up == 0) continue;  // most chunks
        if (lane == 0) atomicOr(&s_chunks[i0 >> 10], 1u << ((i0 >> 5) & 31));
        const bool in = up && key <= bh;
        w_in += in;
        const unsigned b_in = __ballot_sync(0xffffffffu, in);
        if (cands && b_in != 0) {
            int base = 0;
            if (lane == 0) base = atomicAdd(&sm.n_gt, __popc(b_in));
            base = __shfl_sync(0xffffffffu, base, 0);
            if (in) {
                const int slot = base + __popc(b_in & ((1u << lane) - 1u));
                sk[slot] = key;
                si[slot] = b0 + i;
            }
        }
    }
    w_above = __reduce_add_sync(0xffffffffu, w_above);
    w_in = __reduce_add_sync(0xffffffffu, w_in);
    if (lane == 0) {
        s_above[warp] = w_above;
        s_in[warp] = w_in;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n_above = 0, n_in = 0;
        for (int w = 0; w < kWarps; ++w) {
            n_above += s_above[w];
            n_in += s_in[w];
        }
        ctl[kGridCnt + c] = n_above;
        ctl[kGridCnt + kFewGMax + c] = n_in;
        sm.n_eq = cands && n_in > 0 ? atomicAdd(ctl + 3, n_in) : 0;
        sm.bin_n = n_in;
    }
    __syncthreads();
    if (cands) {
        const int base = sm.n_eq, n_in = sm.bin_n;
        for (int j = threadIdx.x; j < n_in; j += NT) {
            ckeys[base + j] = sk[j];
            cids[base + j] = si[j];
        }
    }
    grid_row_barrier(ctl, arrivals += G);
    stamp(dbg0, 4);
    pdl_trigger();  // every CTA of the grid is resident: a dependent grid may take the SMs that free up

    // 4. the exact k-th key T; the items > T and == T before this slice and in each warp's span
    // The slices' counts and the candidates are loaded together (G <= kFewGMax <= NT: one count pair per thread).
    const bool counts = static_cast<int>(threadIdx.x) < c;
    int gt_before = counts ? __ldcg(ctl + kGridCnt + threadIdx.x) : 0;
    int eq_before = counts ? __ldcg(ctl + kGridCnt + kFewGMax + threadIdx.x) : 0;
    if (cands) {
#pragma unroll 4
        for (int i = threadIdx.x; i < bin_n; i += NT) {
            sk[i] = __ldcg(ckeys + i);
            si[i] = __ldcg(cids + i);
        }
    }
    if (static_cast<int>(threadIdx.x) < kWarps) {  // a warp's keys above the bin are > T; without candidates, the
        s_gt[threadIdx.x] = s_above[threadIdx.x];  // bin is T's single value
        s_eq[threadIdx.x] = cands ? 0 : s_in[threadIdx.x];
    }
    block_sum2<NT>(gt_before, eq_before, sm);  // also orders the staging before the select
    Threshold t{bl, need, bin_n};
    if (cands) {  // uniform
        t = select_staged<NT>(sk, bin_n, need, bl, bh, st);
        // Candidates before this slice: those > T join the keys above the bin (the ties are only candidates);
        // candidates inside it: the counts of their warps.
        int g = 0, e = 0;
        for (int i = threadIdx.x; i < bin_n; i += NT) {
            const int p = si[i] - b0;
            const uint32_t key = sk[i];
            if (p < 0) {
                g += key > t.key;
                e += key == t.key;
            } else if (p < n) {
                if (key > t.key) atomicAdd(&s_gt[p / span], 1);
                if (key == t.key) atomicAdd(&s_eq[p / span], 1);
            }
        }
        block_sum2<NT>(g, e, sm);  // also completes the warps' counts
        eq_before = e;
        gt_before += g;
    }
    stamp(dbg0, 5);

    // 5. each warp writes its span's items > T, and the ties among the row's lowest-positioned t.n_eq, at
    //    (items > T before it) + min(ties before it, t.n_eq): position order, ties as the CPU reference resolves
    //    them. Only the flagged chunks can hold any.
    int o_gt = gt_before, o_eq = eq_before;
    for (int w = 0; w < warp; ++w) {
        o_gt += s_gt[w];
        o_eq += s_eq[w];
    }
    const unsigned below = (1u << lane) - 1u;
    const int c1 = (we + 31) >> 5;
    for (int ci = wb >> 5; ci < c1;) {  // warp-uniform: the flagged chunks of this warp's span
        const uint32_t word = s_chunks[ci >> 5] >> (ci & 31);
        if (word == 0) {
            ci = (ci | 31) + 1;
            continue;
        }
        ci += __ffs(word) - 1;
        if (ci >= c1) break;
        const int i = (ci << 5) + lane;
        const uint32_t key = i < we ? keys[i] : 0u;
        const bool g = i < we && key > t.key, q = i < we && key == t.key;
        const unsigned bg = __ballot_sync(0xffffffffu, g), bq = __ballot_sync(0xffffffffu, q);
        const int rg = o_gt + __popc(bg & below), rq = o_eq + __popc(bq & below);
        if (g) out[rg + min(rq, t.n_eq)] = map(b0 + i);
        if (q && rq < t.n_eq) out[rg + rq] = map(b0 + i);
        o_gt += __popc(bg);
        o_eq += __popc(bq);
        ++ci;
    }
    if (dbg0 != nullptr) {
        __syncthreads();
        stamp(dbg0, 6);
        if (threadIdx.x == 0)
            dbg0[7] = static_cast<unsigned long long>(round) | static_cast<unsigned long long>(bin_n) << 32;
    }
}

// ---- long rows, last: canonical order ----
// The kernels above emit a long row's top k (into the scratch `sel`) in an order that depends on thread timing
// (atomics), and the sparse attention that reads them sums in that order: GPU decode would not be reproducible
// run to run. This kernel writes each row ascending by position, ties at the k-th key resolved to the lowest
// positions: the CPU reference's result (CpuOps::indexer_topk). CTA (c, r) owns positions [c·R, (c+1)·R) of row r
// (R = 32K for one row of 1M: 32 CTAs; more per CTA when there are many rows, so that each row's k entries are not
// read by more CTAs than fill the GPU), and none waits for another:
//   1. it reads the row's k entries (L2), counts those before its range and sets a bit per entry inside it;
//   2. entries marked by tie_entry (more items equal the k-th key than belong to the top k: the row's last n_eq
//      entries) stand for the lowest-positioned items equal to that key: it finds them by scanning the row in
//      position order up to its range's end, until n_eq are found (rare: exact ties at the k-th value);
//   3. an ordered pass over its bitmap (warp w owns a contiguous run of words, lanes interleaved) writes its
//      positions at out[(entries before its range) + rank].
// (A first version ordered each row in one CTA, a bitmap over the whole row: 12 us at 1M, serial on one SM.)
template <int NT>
__global__ void __launch_bounds__(NT)
    topk_order_kernel(const float* __restrict__ values, const int32_t* __restrict__ lengths, int64_t row_stride, int k,
                      const int32_t* __restrict__ sel_all, int32_t* __restrict__ out_idx, TopkSlotMap slots, int range,
                      const int* __restrict__ ordered, unsigned long long* dbg) {
    constexpr int kWarps = NT / 32;
    extern __shared__ uint32_t bits[];  // [range / 32]
    const int n_words = range / 32;
    __shared__ typename cub::BlockScan<int, NT>::TempStorage scan;
    __shared__ int s_warp[kWarps], s_a[kWarps], s_b[kWarps], s_c[kWarps];
    const int64_t r = blockIdx.y;
    const int begin = static_cast<int>(blockIdx.x) * range;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned long long* dbgr = r == 0 && blockIdx.x == 0 ? dbg : nullptr;
    pdl_wait();
    stamp(dbgr, 12);
    if (ordered != nullptr && ordered[kCountStride * r] != 0) return;  // the select kernel wrote it in order
    const int len = lengths[r];
    int32_t* out = out_idx + r * k;
    const RowMap map = row_map(slots, r);
    if (len <= k) {
        if (blockIdx.x == 0) write_all_padded<NT>(len, k, out, map);
        return;
    }
    if (begin >= len) return;
    const int end = min(len, begin + range);
    const int32_t* sel = sel_all + r * k;
    for (int i = threadIdx.x; i < n_words; i += NT) bits[i] = 0;
    __syncthreads();
    int before = 0, marked = 0, tie_idx = -1;
    constexpr int kLoads = 8;  // entries per thread in flight (one L2 round trip for k = 2048)
    for (int i0 = 0; i0 < k; i0 += NT * kLoads) {
        int32_t v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
            v[u] = i < k ? sel[i] : -1;
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            if (v[u] >= begin && v[u] < end) {
                atomicOr(&bits[(v[u] - begin) >> 5], 1u << ((v[u] - begin) & 31));
            } else if (v[u] >= 0) {
                before += v[u] < begin;
            } else if (v[u] <= -2) {
                ++marked;
                tie_idx = -2 - v[u];
            }
        }
    }
    before = __reduce_add_sync(0xffffffffu, before);
    marked = __reduce_add_sync(0xffffffffu, marked);
    tie_idx = __reduce_max_sync(0xffffffffu, tie_idx);
    if (lane == 0) {
        s_a[warp] = before;
        s_b[warp] = marked;
        s_c[warp] = tie_idx;
    }
    __syncthreads();
    before = 0, marked = 0, tie_idx = -1;
    for (int w = 0; w < kWarps; ++w) {
        before += s_a[w];
        marked += s_b[w];
        tie_idx = max(tie_idx, s_c[w]);
    }
    if (marked > 0) {  // uniform
        const float* row = values + r * row_stride;
        const uint32_t tie = float_key(row[tie_idx]);
        constexpr int kPer = 16;         // consecutive positions per thread: the block's ranks follow position order
        int found = 0, ties_before = 0;  // found: uniform
        for (int i0 = 0; i0 < end && found < marked; i0 += NT * kPer) {
            const int b = i0 + static_cast<int>(threadIdx.x) * kPer;
            uint32_t mask = 0;
#pragma unroll
            for (int u = 0; u < kPer; ++u)
                if (b + u < end && float_key(__ldg(row + b + u)) == tie) mask |= 1u << u;
            int rank = 0, total = 0;
            cub::BlockScan<int, NT>(scan).ExclusiveSum(__popc(mask), rank, total);
            for (rank += found; mask != 0 && rank < marked; ++rank) {
                const int q = b + __ffs(mask) - 1;
                mask &= mask - 1;
                if (q < begin)
                    ++ties_before;
                else
                    atomicOr(&bits[(q - begin) >> 5], 1u << ((q - begin) & 31));
            }
            found += total;
            __syncthreads();  // scan storage is reused
        }
        ties_before = __reduce_add_sync(0xffffffffu, ties_before);
        if (lane == 0) s_a[warp] = ties_before;
        __syncthreads();
        for (int w = 0; w < kWarps; ++w) before += s_a[w];
    }
    __syncthreads();  // every bit is set
    stamp(dbgr, 13);
    const int words = (end - begin + 31) >> 5;
    const int span = n_words / kWarps;  // range: a multiple of 32 · 32 · kWarps
    const int wb = warp * span, we = min(words, wb + span);
    int c = 0;
    for (int i = wb + lane; i < we; i += 32) c += __popc(bits[i]);
    c = __reduce_add_sync(0xffffffffu, c);
    if (lane == 0) s_warp[warp] = c;
    __syncthreads();
    int o = before;
    for (int w = 0; w < warp; ++w) o += s_warp[w];
    for (int i0 = wb; i0 < we; i0 += 32) {  // warp-uniform trip count
        const int i = i0 + lane;
        uint32_t x = i < we ? bits[i] : 0u;
        const int pc = __popc(x);
        int incl = pc;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += v;
        }
        int p = o + incl - pc;
        while (x != 0) {
            out[p++] = map(begin + i * 32 + __ffs(x) - 1);
            x &= x - 1;
        }
        o += __shfl_sync(0xffffffffu, incl, 31);
    }
    stamp(dbgr, 14);
    if (dbgr != nullptr && threadIdx.x == 0) dbgr[15] = static_cast<unsigned long long>(marked);
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
    l.keys = l.count + align256(kCountStride * n * sizeof(int));
    l.ids = l.keys + align256(n * cap * sizeof(uint32_t));
    l.eq_ids = l.ids + align256(n * cap * sizeof(int32_t));
    l.total = l.eq_ids + align256(n * static_cast<size_t>(k) * sizeof(int32_t));
    return l;
}

struct FewLayout {
    size_t ctl = 0, keys = 0, ids = 0, total = 0;
};

FewLayout few_layout(int64_t n_rows) {
    const size_t n = static_cast<size_t>(n_rows);
    FewLayout l;
    l.keys = align256(n * kGridCtl * sizeof(int));
    l.ids = l.keys + align256(n * kGridCand * sizeof(uint32_t));
    l.total = l.ids + align256(n * kGridCand * sizeof(int32_t));
    return l;
}

// Long rows: the selection kernels' rows (before topk_order_kernel) at the start of the scratch.
size_t sel_bytes(int64_t n_rows, int64_t k) { return align256(static_cast<size_t>(n_rows * k) * sizeof(int32_t)); }

// Writes out_idx in canonical order from the rows the selection kernels left in `sel` (topk_order_kernel).
// ordered: nullptr, or per-row flags ([kCountStride * row]) of rows whose output is already final.
void launch_order(const TopkParams& p, const int32_t* sel, const int* ordered, cudaStream_t stream, bool pdl) {
    per_device_once([] {
        return cudaFuncSetAttribute(topk_order_kernel<kOrderThreads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kOrderMaxRange / 8);
    });
    // Ranges per row: about two CTAs per SM over all rows, each a multiple of kOrderRange positions.
    const int64_t units = (p.row_stride + kOrderRange - 1) / kOrderRange;
    const int64_t want = std::max<int64_t>(1, (2 * device_sm_count() + p.n_rows - 1) / p.n_rows);
    int64_t per = (units + std::min(want, units) - 1) / std::min(want, units);  // kOrderRange units per CTA
    per = std::min<int64_t>(per, kOrderMaxRange / kOrderRange);
    if (g_tuning.order_range > 0)
        per = std::clamp<int64_t>(g_tuning.order_range / kOrderRange, 1, kOrderMaxRange / kOrderRange);
    const int range = static_cast<int>(per * kOrderRange);
    const unsigned ranges = static_cast<unsigned>((p.row_stride + range - 1) / range);
    launch_ex(topk_order_kernel<kOrderThreads>, dim3(ranges, static_cast<unsigned>(p.n_rows)), dim3(kOrderThreads),
              static_cast<size_t>(range / 8), stream, pdl, p.values, p.lengths, p.row_stride, static_cast<int>(p.k),
              sel, p.out_idx, p.slots, range, ordered, g_tuning.debug_times);
}

}  // namespace

void topk_set_tuning(const TopkTuning& t) { g_tuning = t; }

size_t topk_scratch_bytes(int64_t n_rows, int64_t row_stride, int64_t k) {
    if (n_rows <= 0 || row_stride <= kFewMinStride) return 0;
    const size_t sel = sel_bytes(n_rows, k);
    if (row_stride <= kShortMaxStride) return n_rows <= kFewMaxRows ? sel + few_layout(n_rows).total : 0;
    const size_t chain = long_layout(n_rows, row_stride, k).total;
    if (n_rows > kFewMaxRows) return sel + chain;
    const size_t few = few_layout(n_rows).total;
    return sel + (few > chain ? few : chain);
}

bool topk_supported(int64_t k, int64_t row_stride) {
    return k >= 1 && k <= kMaxK && row_stride >= 0 && row_stride <= (int64_t{1} << 24);
}

namespace {
// Whether the current device refused the few-rows kernel's cooperative launch (set: record that it did).
bool few_refused(bool set) {
    static std::atomic<bool> refused[kMaxDevices] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return true;
    if (set) refused[dev].store(true, std::memory_order_relaxed);
    return refused[dev].load(std::memory_order_relaxed);
}
}  // namespace

namespace {
// Whether launch_topk runs the few-rows grid kernel on p (unless the driver refuses its launch), and its shape.
struct FewPlan {
    bool run = false;
    int G = 0;            // CTAs per row
    int64_t per_max = 0;  // row elements per CTA at most
};
FewPlan few_plan(const TopkParams& p) {
    const TopkTuning& tu = g_tuning;
    FewPlan f;
    // Few long rows (decode): the single grid-wide kernel, when every row's CTAs fit on the GPU at once.
    const int64_t few_max_rows = tu.few_max_rows < kFewMaxRows ? tu.few_max_rows : kFewMaxRows;
    if (tu.few_rows == 0 || tu.step_events != nullptr || few_refused(false) || p.n_rows > few_max_rows ||
        p.n_rows > device_sm_count() || p.row_stride <= kFewMinStride ||
        p.scratch_bytes < topk_scratch_bytes(p.n_rows, p.row_stride, p.k))
        return f;
    const int64_t slice_min = tu.few_slice_min > 0 ? tu.few_slice_min : kFewSliceMin;
    const int64_t want = (p.row_stride + slice_min - 1) / slice_min;
    // CTAs per row: at most the SMs per row, rounded down to a multiple of 8 (132 -> 128: a few SMs stay free
    // for the init kernel and the previous kernel's tail; 1 x 1M: 23.1 us at G = 128, 25.9 at G = 132).
    int64_t g_max =
        std::min<int64_t>(device_sm_count() / p.n_rows, std::min(kFewGMax, tu.few_threads == 512 ? 512 : 1024));
    if (g_max >= 16) g_max &= ~int64_t{7};
    f.G = static_cast<int>(want < g_max ? want : g_max);
    f.per_max = few_slice(p.row_stride, f.G);
    f.run = f.per_max <= kFewSliceMax;
    return f;
}
}  // namespace

TopkGridCtl topk_grid_ctl(const TopkParams& p) {
    TopkGridCtl c;
    if (p.n_rows <= 0 || p.k <= 0 || !few_plan(p).run) return c;
    char* rest = static_cast<char*>(p.scratch) + sel_bytes(p.n_rows, p.k);
    c.ctl = reinterpret_cast<int*>(rest + few_layout(p.n_rows).ctl);
    c.n_ints = p.n_rows * kGridCtl;
    c.row_stride = kGridCtl;
    c.hist0 = c.ctl + kGridHist;
    return c;
}

void launch_topk(const TopkParams& p, cudaStream_t stream) {
    if (p.n_rows <= 0 || p.k <= 0) return;
    const int k = static_cast<int>(p.k);
    const unsigned rows = static_cast<unsigned>(p.n_rows);
    const TopkTuning& tu = g_tuning;
    cudaEvent_t* ev = tu.step_events;
    const FewPlan fp = few_plan(p);
    const bool few = fp.run;
    const auto launch_short = [&] {
        per_device_once([] {
            const int bytes = static_cast<int>(kShortMaxStride * sizeof(uint32_t));
            return cudaFuncSetAttribute(topk_short_kernel<kShortThreads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        bytes);
        });
        const size_t smem = static_cast<size_t>(p.row_stride > 0 ? p.row_stride : 1) * sizeof(uint32_t);
        topk_short_kernel<kShortThreads>
            <<<rows, kShortThreads, smem, stream>>>(p.values, p.lengths, p.row_stride, k, p.out_idx, p.slots);
    };
    if (p.row_stride <= kShortMaxStride && !few) return launch_short();
    auto* sel = static_cast<int32_t*>(p.scratch);
    char* const rest = static_cast<char*>(p.scratch) + sel_bytes(p.n_rows, p.k);
    const bool pdl = tu.pdl != 0 && ev == nullptr;
    if (few) {
        const bool half = tu.few_threads == 512;
        const int G = fp.G;
        const int64_t per_max = fp.per_max;
        {
            per_device_once([] {
                const int bytes = static_cast<int>((kFewSliceMax + 2 * kGridCand) * sizeof(uint32_t));
                const cudaError_t e = cudaFuncSetAttribute(topk_few_grid_kernel<1024>,
                                                           cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
                return e != cudaSuccess ? e
                                        : cudaFuncSetAttribute(topk_few_grid_kernel<512>,
                                                               cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
            });
            const FewLayout fl = few_layout(p.n_rows);
            auto* ctl = reinterpret_cast<int*>(rest + fl.ctl);
            if (p.grid_prepared == 0)  // else an earlier kernel of the stream zeroed them (topk_grid_ctl)
                launch_ex(topk_few_init_kernel, dim3(1), dim3(256), 0, stream, pdl, ctl,
                          static_cast<int>(p.n_rows * kGridCtl));
            const size_t smem = static_cast<size_t>(per_max + 2 * kGridCand) * sizeof(uint32_t);
            // Cooperative: the driver refuses the grid unless all of its CTAs fit at once (they wait for each other).
            // Refused (MPS or a green context with fewer SMs than the device), this device takes the other paths.
            const cudaError_t e = launch_coop(
                half ? topk_few_grid_kernel<512> : topk_few_grid_kernel<1024>, dim3(rows * static_cast<unsigned>(G)),
                dim3(half ? 512 : 1024), smem, stream, pdl, p.values, p.lengths, p.row_stride, k, G, ctl,
                reinterpret_cast<uint32_t*>(rest + fl.keys), reinterpret_cast<int32_t*>(rest + fl.ids), p.out_idx,
                p.slots, p.grid_prepared == 2, tu.debug_times);
            if (e == cudaSuccess) return;
            (void)cudaGetLastError();
            few_refused(true);
        }
    }
    if (p.row_stride <= kShortMaxStride) return launch_short();
    per_device_once([] {
        return cudaFuncSetAttribute(topk_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>((2 * kStageCap + kMaxK) * sizeof(uint32_t)));
    });
    const LongLayout l = long_layout(p.n_rows, p.row_stride, p.k);
    const int cap = static_cast<int>(candidate_cap(p.row_stride, p.k));
    char* base = rest;
    auto* t_est = reinterpret_cast<uint32_t*>(base + l.t_est);
    auto* count = reinterpret_cast<int*>(base + l.count);
    auto* keys = reinterpret_cast<uint32_t*>(base + l.keys);
    auto* ids = reinterpret_cast<int32_t*>(base + l.ids);
    auto* eq_ids = reinterpret_cast<int32_t*>(base + l.eq_ids);

    if (ev) cudaEventRecord(ev[0], stream);
    topk_sample_kernel<<<rows, kSampleThreads, 0, stream>>>(p.values, p.lengths, p.row_stride, k, t_est, count);
    if (ev) cudaEventRecord(ev[1], stream);
    // Work items: the smallest of 1K..64K elements that gives at most one wave (4 CTAs/SM), 64K for big batches
    // (topk_plan::filter_chunk).
    const int chunk_max = tu.filter_variant == 1 ? kFilterChunkMax : 4096;  // the append body streams worse past 4K
    int chunk = topk_plan::filter_chunk(p.n_rows, p.row_stride, device_sm_count(), kFilterChunkMin, chunk_max);
    if (tu.filter_chunk >= kFilterChunkMin && tu.filter_chunk % kFilterChunkMin == 0) chunk = tu.filter_chunk;
    const int chunks_per_row = static_cast<int>((p.row_stride + chunk - 1) / chunk);
    const int64_t n_work64 = p.n_rows * chunks_per_row;
    const int n_work = static_cast<int>(n_work64);
    int grid = n_work;
    if (tu.filter_ctas_per_sm > 0) {
        const int64_t g = static_cast<int64_t>(tu.filter_ctas_per_sm) * device_sm_count();
        grid = static_cast<int>(g < n_work64 ? g : n_work64);
    }
    // Items of its first work item each resident filter CTA pulls towards L2 while the sample runs. Deeper prefetches
    // compete with the sample's gathers: 64 x 1M 100.9 us at 8192 items, 100.0-100.2 at 2048, 102.7 at 16384, 105 at
    // 24576; 64 x 128K 40.2 -> 39.2 (H200, bench/results/cuda-h200-2026-11-30-*-topk-filter-prefetch.txt).
    const int prefetch = tu.filter_prefetch > 0 ? tu.filter_prefetch : kFilterPrefetch;
    const bool vec = (reinterpret_cast<uintptr_t>(p.values) & 15) == 0 && (p.row_stride & 3) == 0;
    if (vec && tu.filter_variant == 1)
        launch_ex(topk_filter_kernel<true, true>, dim3(grid), dim3(kFilterThreads), 0, stream, pdl, p.values, p.lengths,
                  p.row_stride, k, static_cast<const uint32_t*>(t_est), count, keys, ids, eq_ids, cap, chunk,
                  chunks_per_row, n_work, prefetch);
    else if (vec)
        launch_ex(topk_filter_kernel<true, false>, dim3(grid), dim3(kFilterThreads), 0, stream, pdl, p.values,
                  p.lengths, p.row_stride, k, static_cast<const uint32_t*>(t_est), count, keys, ids, eq_ids, cap, chunk,
                  chunks_per_row, n_work, prefetch);
    else
        launch_ex(topk_filter_kernel<false, false>, dim3(grid), dim3(kFilterThreads), 0, stream, pdl, p.values,
                  p.lengths, p.row_stride, k, static_cast<const uint32_t*>(t_est), count, keys, ids, eq_ids, cap, chunk,
                  chunks_per_row, n_work, prefetch);
    if (ev) cudaEventRecord(ev[2], stream);
    launch_ex(topk_select_kernel, dim3(rows), dim3(kSelectThreads), (2 * kStageCap + k) * sizeof(uint32_t), stream, pdl,
              p.values, p.lengths, p.row_stride, k, sel, static_cast<const int*>(count),
              static_cast<const uint32_t*>(keys), static_cast<const int32_t*>(ids), static_cast<const int32_t*>(eq_ids),
              cap, p.out_idx, p.slots, count + 2);
    launch_order(p, sel, count + 2, stream, pdl);
    if (ev) cudaEventRecord(ev[3], stream);
}

}  // namespace megactx::cuda
