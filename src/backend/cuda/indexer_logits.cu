// indexer_logits kernels (see indexer_logits.h for the contract).
//   q8 [n, 32, 128] e4m3, w8 [n, 32], pool [n_blocks, 64 × 132 B] → out [rows, out_stride] fp32
// Reference: model-spec §3.3 kernel form; CpuOps::indexer_topk computes the same scores in fp32 without FP8.
//
// Three kernels behind one launch (IndexerLogitsParams::kernel): kernel 2 (wgmma, sm_90a, `namespace wg` below; the
// default for decode), kernel 3 (wgmma, warp-specialised with a TMA producer, sm_90a, after kernel 2; the default for
// prefill) and kernel 1 (mma.sync, any sm_89+), described here. H200 (bench/results/*-038676e-indexer.json,
// *-58bb8bc-indexer-prefill-*, *-65e5458-indexer.json): kernel 2 reaches 92–97% of the 4.23 TB/s copy at batch
// 64 (1 query/seq), 45% (128K) – 81% (1M) at batch 1 in a CUDA graph, ~660 TFLOP/s FP8 in prefill; kernel 3
// ~1000–1100 TFLOP/s in prefill; kernel 1: 67–70%, 33–52%, ~230 TFLOP/s.
//
// Kernel 1. Work item = (query group of ≤ 16 rows of one sequence, range of 64-token pages). A CTA stages the
// group's q8 (≤ 64 KB) and weights in shared memory; each warp owns one page at a time: the 64 keys go straight from
// global memory into mma A fragments (64 registers, every key byte read once per group), then for every query and every
// 8-head tile the warp runs 4 k-steps × 4 key tiles of mma.sync.m16n8k32 e4m3 (M = keys, N = heads, K = dims),
// applies relu · w8 per head in registers, sums the heads across the quad and scales by the key's fp32 scale.
// The dot product is over dims in any order, so the dims are permuted so that each lane loads 2 × 16 contiguous
// bytes per key row (and the same 2 × 16 bytes per head row of q8): fully coalesced 64-byte row segments.
#include <cuda.h>  // CUtensorMap (the driver entry point is looked up at run time: no libcuda link)
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cub/block/block_scan.cuh>
#include <mutex>

#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/indexer_grid.h"
#include "backend/cuda/indexer_logits.h"
#include "backend/cuda/launch_ex.cuh"
#include "backend/cuda/per_device.cuh"
#include "backend/cuda/sm90_async.cuh"
#include "backend/cuda/topk_plan.h"

namespace megactx {

using namespace cuda_indexer;
using cuda::kMaxDevices;
using cuda::per_device_once;

namespace {

constexpr int kGroup = 16;  // queries per group (MTP verification needs ≤ ~4; prefill amortises the key reads)
// Default: kernel 3 for groups of more than 8 queries (prefill) from one full group; else kernel 2. On the H200 at 1M
// keys (4119fe9, 2026-11-30, after the grid fixes of plan_groups and ws_chunks): 1010 vs 607 TFLOP/s at 16 rows,
// 1050 vs 606 at 31, 1108 vs 625 at 64.
constexpr int kWsMinQueries = 8;
constexpr int64_t kWsMinRows = kGroup;
// And kernel 3's page split for 3–4 queries per sequence (MTP verification), where kernel 2 pads to 4 (QT = 4): at 4
// queries it beats kernel 2 by 7–24% at batch 64 (1M: 3398 → 2778 µs) and by up to 34% at batch 1 (1M: 62.0 → 46.1
// µs). With 1 or 2 queries kernel 2 stays ahead: it streams at 77–97% of copy there, kernel 3 at 75–85% (H200,
// 590f647, 2026-11-30).
constexpr int64_t kWsPageSplitMin = 3;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSmemQ = kGroup * kHeads * kDim;  // bytes
constexpr int kSmemBytes = kSmemQ + kGroup * kHeads * 4 + kGroup * 4;

// ---- plan: group starts of runs of ≤ kGroup rows of one sequence --------------------------------------------
// plan[0] = n_groups, plan[1 + g] = first (absolute) row of group g, plan[1 + n_groups] = row_end;
// from plan[n_rows + 2]: per group g, [2g] = table_offset[seq] (−1 without table_offset), [2g + 1] = max pos.
constexpr int kPlanThreads = 1024;

struct MaxOp {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

__global__ void __launch_bounds__(kPlanThreads) indexer_plan_kernel(IndexerPlanParams p) {
    using Scan = cub::BlockScan<int, kPlanThreads>;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ int s_run_start, s_groups;
    // Launched with programmatic dependent launch right behind the query quantisation, which it does not read: it
    // runs while that kernel runs and waits for it only before exiting, so the logits kernel (which waits for this
    // grid) still sees both (launch_indexer_plan). The plan reads only pos / seq / table_offset, written before.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int i0 = static_cast<int>(p.row_begin), i1 = static_cast<int>(p.row_end);
    // The top-k's control words: every kernel before the query quantisation (launched plainly) has completed, so the
    // previous call's top-k is done with them; the logits kernel waits for this grid before it adds to them.
    for (int64_t j = threadIdx.x; j < p.zero_n; j += kPlanThreads) p.zero[j] = 0;
    if (threadIdx.x == 0) {
        s_run_start = i0;
        s_groups = 0;
    }
    __syncthreads();
    for (int base = i0; base < i1; base += kPlanThreads) {
        const int i = base + static_cast<int>(threadIdx.x);
        const bool valid = i < i1;
        const int carry_start = s_run_start, carry_groups = s_groups;
        int start = -1;
        if (valid) {
            if (p.lengths) p.lengths[i - i0] = p.pos[i] + 1;
            if (i == i0 || p.seq[i] != p.seq[i - 1]) start = i;
        }
        int run_start, max_start;
        Scan(tmp).InclusiveScan(start, run_start, MaxOp(), max_start);
        __syncthreads();
        if (run_start < 0) run_start = carry_start;
        const int leader = valid && (i - run_start) % kGroup == 0 ? 1 : 0;
        int idx, total;
        Scan(tmp).ExclusiveSum(leader, idx, total);
        if (leader) {
            const int gi = carry_groups + idx, s = p.seq[i];
            int max_pos = p.pos[i];
            for (int j = i + 1; j < i1 && j < i + kGroup && p.seq[j] == s; ++j) max_pos = max(max_pos, p.pos[j]);
            p.plan[1 + gi] = i;
            int32_t* ext = p.plan + (i1 - i0) + 2;
            ext[2 * gi] = p.table_offset ? p.table_offset[s] : -1;
            ext[2 * gi + 1] = max_pos;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (max_start >= 0) s_run_start = max_start;
            s_groups = carry_groups + total;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        p.plan[0] = s_groups;
        p.plan[1 + s_groups] = i1;
    }
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the previous grid (q quantisation) has completed
}

// ---- logits -----------------------------------------------------------------------------------------------------

__device__ __forceinline__ uint4 ld_stream(const void* ptr) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
}

// d += A (16 keys × 32 dims, e4m3) · B (32 dims × 8 heads, e4m3), fp32 accumulate.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__global__ void __launch_bounds__(kThreads, 2) indexer_logits_kernel(IndexerLogitsParams p, int pages_per_item) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* s_q = smem;                                         // [kGroup, 32, 128] e4m3, 16-B chunks swizzled
    float* s_w = reinterpret_cast<float*>(smem + kSmemQ);        // [kGroup, 32]
    int* s_pos = reinterpret_cast<int*>(s_w + kGroup * kHeads);  // [kGroup]

    const int g_idx = static_cast<int>(blockIdx.y);
    if (g_idx >= p.plan[0]) return;
    const int r_a = p.plan[1 + g_idx], nq = p.plan[2 + g_idx] - r_a;
    const int seq = p.seq[r_a];
    // Tokens of a sequence are in order, but take the max anyway: the pages needed are those up to max pos.
    int max_pos = 0;
    for (int q = 0; q < nq; ++q) max_pos = max(max_pos, p.pos[r_a + q]);
    const int n_pages = max_pos / kBlock + 1;
    const int page0 = static_cast<int>(blockIdx.x) * pages_per_item;
    const int page1 = min(page0 + pages_per_item, n_pages);
    if (page0 >= page1) return;

    // Stage q8 (swizzled: chunk c of head h at c ^ 4·(h & 1), so the 8 lanes of a 128-bit load phase hit
    // distinct banks), weights and positions.
    for (int c = threadIdx.x; c < nq * kHeads * 8; c += kThreads) {
        const int row = c >> 3, chunk = c & 7, head = row & (kHeads - 1);
        const uint4 v =
            *reinterpret_cast<const uint4*>(p.q8 + (static_cast<int64_t>(r_a) * kHeads + row) * kDim + chunk * 16);
        *reinterpret_cast<uint4*>(s_q + row * kDim + ((chunk ^ ((head & 1) << 2)) * 16)) = v;
    }
    for (int c = threadIdx.x; c < nq * kHeads; c += kThreads) s_w[c] = p.w8[static_cast<int64_t>(r_a) * kHeads + c];
    if (threadIdx.x < nq) s_pos[threadIdx.x] = p.pos[r_a + threadIdx.x];
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int32_t* table = p.tables + p.table_offset[seq];
    // The two keys whose final score this lane writes (after the quad reduction): v = t and v = t + 4 of the
    // lane's 8 partial sums [mt][hh], key = mt·16 + hh·8 + g.
    const int key0 = (t >> 1) * 16 + (t & 1) * 8 + g, key1 = key0 + 32;
    const int sw = (g & 1) << 2;  // swizzle of this lane's head rows (head = nt·8 + g)

    for (int page = page0 + warp; page < page1; page += kWarps) {
        const uint8_t* pg = p.pool + static_cast<int64_t>(table[page]) * kBlockBytes;
        // A fragments: key row mt·16 + hh·8 + g, bytes [t·16, t·16 + 16) and [64 + t·16, 64 + t·16 + 16).
        uint4 a[4][2][2];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const uint8_t* row = pg + (mt * 16 + hh * 8 + g) * kDim + t * 16;
                a[mt][hh][0] = ld_stream(row);
                a[mt][hh][1] = ld_stream(row + 64);
            }
        }
        const float* scales = reinterpret_cast<const float*>(pg + kBlock * kDim);
        const float ks0 = scales[key0], ks1 = scales[key1];
        const int t0 = page * kBlock;

        for (int q = 0; q < nq; ++q) {
            const int qpos = s_pos[q];
            if (t0 > qpos) continue;
            float part[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) part[mt][0] = part[mt][1] = 0.0f;
#pragma unroll 1
            for (int nt = 0; nt < 4; ++nt) {
                const int head = nt * 8 + g;
                const uint8_t* qrow = s_q + (q * kHeads + head) * kDim;
                const uint4 b0 = *reinterpret_cast<const uint4*>(qrow + ((t ^ sw) * 16));
                const uint4 b1 = *reinterpret_cast<const uint4*>(qrow + (((4 + t) ^ sw) * 16));
                const float2 wv = *reinterpret_cast<const float2*>(s_w + q * kHeads + nt * 8 + 2 * t);
                float acc[4][4];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    // k-step s uses the lane's words 2s (logical chunk t) and 2s + 1 (logical chunk 4 + t).
                    const int half = s >> 1, j = (s & 1) * 2;
                    const uint32_t bw0 = word(half ? b1 : b0, j), bw1 = word(half ? b1 : b0, j + 1);
#pragma unroll
                    for (int mt = 0; mt < 4; ++mt) {
                        mma_e4m3(acc[mt], word(a[mt][0][half], j), word(a[mt][1][half], j), word(a[mt][0][half], j + 1),
                                 word(a[mt][1][half], j + 1), bw0, bw1);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    part[mt][0] += wv.x * fmaxf(acc[mt][0], 0.0f) + wv.y * fmaxf(acc[mt][1], 0.0f);
                    part[mt][1] += wv.x * fmaxf(acc[mt][2], 0.0f) + wv.y * fmaxf(acc[mt][3], 0.0f);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    part[mt][hh] += __shfl_xor_sync(0xffffffffu, part[mt][hh], 1);
                    part[mt][hh] += __shfl_xor_sync(0xffffffffu, part[mt][hh], 2);
                }
            }
            const float v0 = t == 0 ? part[0][0] : t == 1 ? part[0][1] : t == 2 ? part[1][0] : part[1][1];
            const float v1 = t == 0 ? part[2][0] : t == 1 ? part[2][1] : t == 2 ? part[3][0] : part[3][1];
            float* orow = p.out + (static_cast<int64_t>(r_a + q) - p.row_begin) * p.out_stride + t0;
            if (t0 + key0 <= qpos) orow[key0] = v0 * ks0;
            if (t0 + key1 <= qpos) orow[key1] = v1 * ks1;
        }
    }
}

// ---- kernel 2: wgmma (sm_90a) ------------------------------------------------------------------------------------
// Work item = (query group, range of ≤ kMaxPages pages); one warpgroup (128 threads) per CTA, several CTAs per SM.
// The group's q8 is staged once per CTA in shared memory as the wgmma B operand: rows (query, head), 128 B each,
// K-major with the 128-B swizzle (16-B chunk c of row r at r·128 + (c ^ (r & 7))·16). The CTA's pages stream
// through a kStages-deep cp.async ring in the same layout (64 keys = the M = 64 of wgmma), with the 64 fp32 key
// scales beside them, so kStages − 1 pages (~25 KB) per CTA are always in flight while one is multiplied.
// Per page and sub-tile of QT queries: 4 × wgmma m64n(32·QT)k32 (M = 64 keys, N = QT·32 (query, head), K = 32
// dims); the accumulator of thread (warp w, lane 4g + t) holds keys 16w + g and 16w + g + 8 × heads 8j + 2t, +1,
// so relu · w8 · sum over the 32 heads is 8 multiply-adds and two quad shuffles per key and query, in registers.
// Groups of more than QT·SUB queries (possible when the host's queries-per-sequence estimate is low) are
// handled in chunks, re-streaming the pages (correct, slower).
namespace wg {

using namespace cuda::sm90;

constexpr int kStages = 4;
constexpr int kWgThreads = 128;
constexpr int kPageKeys = kBlock * kDim;  // 8192 B of e4m3 per page
constexpr int kMaxPages = 64;             // pages per work item (s_tab)

template <int QT, int SUB>
struct Cfg {
    static constexpr int kCap = QT * SUB;                      // queries staged at once
    static constexpr int kKeys = 0;                            // [kStages][64 × 128 B] swizzled
    static constexpr int kQ = kStages * kPageKeys;             // [kCap · 32 × 128 B] swizzled
    static constexpr int kScales = kQ + kCap * kHeads * kDim;  // [kStages][64] fp32
    static constexpr int kW = kScales + kStages * kBlock * 4;  // [kCap][32] fp32
    static constexpr int kTab = kW + kCap * kHeads * 4;        // [kMaxPages] int32
    static constexpr int kPos = kTab + kMaxPages * 4;          // [kCap] int32
    static constexpr int kUsed = kPos + kCap * 4;
    static constexpr int kSmem = kUsed + 1024;  // + slack for the 1024-B alignment the swizzle needs
};

__device__ __forceinline__ uint64_t desc(uint32_t addr) {  // K-major, 128-B swizzle, 8-row groups 1024 B apart
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The CTA's work item: query group blockIdx.y of the plan (rows r_a .. r_b − 1, block-table offset toff) and its
// pages page0 .. page0 + np − 1. False when there is none (a group past the plan's count, pages past its end).
__device__ __forceinline__ bool work_item(const IndexerLogitsParams& p, int pages_per_item, int& r_a, int& r_b,
                                          int& toff, int& page0, int& np) {
    const int g_idx = static_cast<int>(blockIdx.y);
    const int n_rows = static_cast<int>(p.row_end - p.row_begin);
    const int32_t* ext = p.plan + n_rows + 2;
    const int n_groups = p.plan[0];
    if (g_idx >= n_groups) return false;
    r_a = p.plan[1 + g_idx];
    r_b = p.plan[2 + g_idx];
    toff = ext[2 * g_idx];
    const int max_pos = ext[2 * g_idx + 1];
    if (toff < 0) toff = p.table_offset[p.seq[r_a]];
    const int n_pages = max_pos / kBlock + 1;
    page0 = static_cast<int>(blockIdx.x) * pages_per_item;
    np = min(page0 + pages_per_item, n_pages) - page0;
    return np > 0;
}

// The work item of a decode row (one row per sequence and per group, as the kHist launch requires) from the step's
// inputs alone, without the plan: what work_item reads from the plan the query quantisation writes (row r_a's own
// group, its table offset and position), so the kernel can find its pages before that kernel completes.
__device__ __forceinline__ bool decode_work_item(const IndexerLogitsParams& p, int pages_per_item, int& r_a, int& r_b,
                                                 int& toff, int& page0, int& np) {
    const int g_idx = static_cast<int>(blockIdx.y);
    if (g_idx >= static_cast<int>(p.row_end - p.row_begin)) return false;
    r_a = static_cast<int>(p.row_begin) + g_idx;
    r_b = r_a + 1;
    toff = p.table_offset[p.seq[r_a]];
    const int n_pages = p.pos[r_a] / kBlock + 1;
    page0 = static_cast<int>(blockIdx.x) * pages_per_item;
    np = min(page0 + pages_per_item, n_pages) - page0;
    return np > 0;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "backend/cuda/indexer_logits_wgmma.inc"

template <int QT>
__device__ __forceinline__ void wgmma_tile(float (&d)[QT * 16], uint64_t da, uint64_t db) {
    if constexpr (QT == 1)
        wgmma_e4m3_m64n32(d, da, db);
    else if constexpr (QT == 2)
        wgmma_e4m3_m64n64(d, da, db);
    else if constexpr (QT == 4)
        wgmma_e4m3_m64n128(d, da, db);
    else
        wgmma_e4m3_m64n256(d, da, db);
}
#endif

// kHist (decode, one row per group): each CTA also counts its row's scores into the top-k's round-0 bins
// (IndexerLogitsHist) in shared memory, then adds the non-empty ones to the row's global bins.
constexpr int kHistBins = 1 << topk_plan::kGridDigit0;
// U: 32-head units per query (1: GLM-5.x's 32 heads; 2: DeepSeek-V3.2's 64). A query of 64 heads is staged as two
// consecutive 32-head units (q8 [n, 64, 128] is [2n, 32, 128] in memory), each unit is multiplied and reduced over
// its 32 heads as a query of 32 heads is, and the two sums are added before the store: score = (heads 0–31) +
// (heads 32–63). QT and the chunk size kCap count units, so QT ≥ U keeps a query's units in one sub-tile.
template <int QT, int SUB, bool kHist, int U>
__global__ void __launch_bounds__(kWgThreads)
    logits_kernel(IndexerLogitsParams p, int pages_per_item, int* hist, int64_t hist_stride) {
    static_assert(QT % U == 0 && (QT * SUB) % U == 0, "a query's units share a sub-tile");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = Cfg<QT, SUB>;
    __shared__ int s_hist[kHist ? kHistBins : 1];
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t sb = (raw + 1023u) & ~1023u;
    uint8_t* sm = smem_raw + (sb - raw);
    const float* s_scales = reinterpret_cast<const float*>(sm + C::kScales);
    float* s_w = reinterpret_cast<float*>(sm + C::kW);
    int* s_tab = reinterpret_cast<int*>(sm + C::kTab);
    int* s_pos = reinterpret_cast<int*>(sm + C::kPos);

    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    auto issue = [&](int i) {  // page i of the item → ring stage i % kStages
        const int stage = i % kStages;
        const uint8_t* src = p.pool + static_cast<int64_t>(s_tab[i]) * kBlockBytes;
        for (int c = tid; c < kBlockBytes / 16; c += kWgThreads) {
            uint32_t dst;
            if (c < kPageKeys / 16) {
                const int r = c >> 3, k = c & 7;
                dst = sb + C::kKeys + stage * kPageKeys + r * 128 + ((k ^ (r & 7)) << 4);
            } else {
                dst = sb + C::kScales + stage * kBlock * 4 + (c - kPageKeys / 16) * 16;
            }
            cp_async16(dst, src + c * 16);
        }
    };
    // Programmatic dependent launch: let the next kernel's CTAs in; wait for the producers of q8 / plan / pool.
    // Decode (kHist): what the kernel reads before the wait (positions, tables, the pool's pages) is written before
    // the last plainly launched kernel of the stream, which has therefore completed: indexer_topk.cu launches the
    // query quantisation plainly, after the indexer cache write, right before this grid. The item's first
    // kStages − 1 pages go in flight while the quantisation runs; only q8, the weights and the plan wait for it.
    // (Their cp.async groups then precede q's, hence the full wait before page 0 below.)
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    int r_a, r_b, toff, page0, np;
    if constexpr (kHist) {
        if (!decode_work_item(p, pages_per_item, r_a, r_b, toff, page0, np)) return;
        for (int i = tid; i < np; i += kWgThreads) s_tab[i] = p.tables[toff + page0 + i];
        for (int b = tid; b < kHistBins; b += kWgThreads) s_hist[b] = 0;  // visible after the staging barrier
        // s_tab is read by every thread's copies
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kStages - 1; ++i) {
            if (i < np) issue(i);
            cp_async_commit();
        }
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
    } else {
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
        if (!work_item(p, pages_per_item, r_a, r_b, toff, page0, np)) return;
        for (int i = tid; i < np; i += kWgThreads) s_tab[i] = p.tables[toff + page0 + i];
    }
    const int key0 = 16 * warp + g, key1 = key0 + 8;

    for (int qc = r_a * U; qc < r_b * U; qc += C::kCap) {  // units qc .. qc + nq − 1 (U per query)
        const int nq = min(C::kCap, r_b * U - qc), nsub = (nq + QT - 1) / QT;
        // Stage the chunk's q8 (zero rows pad the last sub-tile), weights and positions.
        for (int c = tid; c < nsub * QT * kHeads * 8; c += kWgThreads) {
            const int row = c >> 3, chunk = c & 7;
            const uint32_t dst = sb + C::kQ + row * 128 + ((chunk ^ (row & 7)) << 4);
            if (row < nq * kHeads)
                cp_async16(dst, p.q8 + (static_cast<int64_t>(qc) * kHeads + row) * kDim + chunk * 16);
            else
                *reinterpret_cast<uint4*>(sm + (dst - sb)) = make_uint4(0, 0, 0, 0);
        }
        cp_async_commit();
        for (int c = tid; c < nq * kHeads; c += kWgThreads) s_w[c] = p.w8[static_cast<int64_t>(qc) * kHeads + c];
        if (tid < nq) s_pos[tid] = p.pos[(qc + tid) / U];
        __syncthreads();  // s_tab (and, for a later chunk, the end of the previous chunk's reads)

        if (!kHist) {  // (kHist: issued before the wait; one chunk, as a decode row is one query)
#pragma unroll
            for (int i = 0; i < kStages - 1; ++i) {
                if (i < np) issue(i);
                cp_async_commit();
            }
        }
        for (int i = 0; i < np; ++i) {
            if (kHist && i == 0)
                cp_async_wait<0>();  // q's group came after the first pages'
            else
                cp_async_wait<kStages - 2>();  // this thread's copies of q and of pages ≤ i have landed
            proxy_fence();                     // make them (and the zero rows) visible to the async proxy (wgmma)
            __syncthreads();                   // everyone's copies; every warp is done with page i − 1's stage
            if (i + kStages - 1 < np) issue(i + kStages - 1);
            cp_async_commit();

            const int stage = i % kStages;
            const uint32_t a_base = sb + C::kKeys + stage * kPageKeys;
            const float ks0 = s_scales[stage * kBlock + key0], ks1 = s_scales[stage * kBlock + key1];
            const int t0 = (page0 + i) * kBlock;
            for (int sub = 0; sub < nsub; ++sub) {
                float acc[QT * 16];
#pragma unroll
                for (int k = 0; k < QT * 16; ++k) acc[k] = 0.0f;
                reg_fence(acc);
                wg_fence();
                const uint32_t b_base = sb + C::kQ + sub * QT * kHeads * 128;
#pragma unroll
                for (int s = 0; s < 4; ++s) wgmma_tile<QT>(acc, desc(a_base + s * 32), desc(b_base + s * 32));
                wg_commit();
                wg_wait<0>();
                reg_fence(acc);
                float u0 = 0.0f, u1 = 0.0f;  // U = 2: the first unit's sums, added to the second's
#pragma unroll
                for (int qq = 0; qq < QT; ++qq) {
                    const int q = sub * QT + qq;
                    if (q >= nq) break;
                    // Two FFMA chains per key that start with an FMUL (see ws_epilogue: no 0 + x).
                    const float* d = acc + 16 * qq;
                    const float* ws = s_w + q * kHeads + 2 * t;
                    float2 w = *reinterpret_cast<const float2*>(ws);
                    float a0 = w.x * fmaxf(d[0], 0.0f), b0 = w.y * fmaxf(d[1], 0.0f);
                    float a1 = w.x * fmaxf(d[2], 0.0f), b1 = w.y * fmaxf(d[3], 0.0f);
#pragma unroll
                    for (int jj = 1; jj < 4; ++jj) {
                        w = *reinterpret_cast<const float2*>(ws + 8 * jj);
                        a0 = fmaf(w.x, fmaxf(d[4 * jj], 0.0f), a0);
                        b0 = fmaf(w.y, fmaxf(d[4 * jj + 1], 0.0f), b0);
                        a1 = fmaf(w.x, fmaxf(d[4 * jj + 2], 0.0f), a1);
                        b1 = fmaf(w.y, fmaxf(d[4 * jj + 3], 0.0f), b1);
                    }
                    float v0 = a0 + b0, v1 = a1 + b1;
                    v0 += __shfl_xor_sync(0xffffffffu, v0, 1);
                    v1 += __shfl_xor_sync(0xffffffffu, v1, 1);
                    v0 += __shfl_xor_sync(0xffffffffu, v0, 2);
                    v1 += __shfl_xor_sync(0xffffffffu, v1, 2);
                    if constexpr (U == 2) {
                        if ((qq & 1) == 0) {
                            u0 = v0;
                            u1 = v1;
                            continue;
                        }
                        v0 = u0 + v0;
                        v1 = u1 + v1;
                    }
                    const int qpos = s_pos[q];
                    float* orow = p.out + (static_cast<int64_t>((qc + q) / U) - p.row_begin) * p.out_stride + t0;
                    const bool w0 = t == 0 && t0 + key0 <= qpos, w1 = t == 1 && t0 + key1 <= qpos;
                    const float s0 = v0 * ks0, s1 = v1 * ks1;
                    if (w0) orow[key0] = s0;
                    if (w1) orow[key1] = s1;
                    if constexpr (kHist) {  // one row per CTA (the launch checks)
                        if (w0 || w1) atomicAdd(&s_hist[topk_plan::grid_bin0(topk_plan::float_key(w0 ? s0 : s1))], 1);
                    }
                }
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // before the next chunk restages q / weights / positions
    }
    if constexpr (kHist) {
        int* row_bins = hist + static_cast<int64_t>(r_a - p.row_begin) * hist_stride;
        for (int b = tid; b < kHistBins; b += kWgThreads)
            if (s_hist[b] != 0) atomicAdd(row_bins + b, s_hist[b]);
    }
#endif
}

// ---- kernel 3: warp-specialised wgmma for groups of many queries (prefill; sm_90a) --------------------------------
// Work item = (query group of ≤ 16 rows, range of ≤ kWsMaxPages pages); one CTA of three warpgroups per SM.
//   WG2, the producer: one thread streams the item's pages through a kWsStages-deep ring with the tensor memory
//     accelerator. The keys of a page are one 64 × 128-B box of the pool seen as rows of 128 B (66 rows per block;
//     the map's 128-B swizzle writes the wgmma layout of kernel 2), and the 64 scales one 256-B bulk copy, both
//     completing on the stage's `full` mbarrier. The producer waits on the stage's `empty` mbarrier before reuse.
//   WG0 and WG1, the math warpgroups: queries 0–7 and 8–15 of the group (zero rows pad a short group). Per page each
//     issues two banks of 4 queries (N = 128: 4 × m64n128k32 each) back to back, runs bank A's ReLU · weight ·
//     head-sum epilogue while bank B is on the tensor cores, releases the stage (one arrival per warp), and runs
//     bank B's epilogue while the other warpgroup's wgmma keep the tensor cores busy.
// The epilogue reduces a quad's 4 queries × 2 keys with three shuffles per key (a reduce-scatter), so lane t of the
// quad stores query t: a quarter of kernel 2's store instructions.
// Kernel 2 serialises all of this in one warpgroup per CTA (copy issue, CTA barrier, wgmma, wait, epilogue) and
// overlaps only across its two CTAs per SM.
constexpr int kWsStages = 16;
constexpr int kWsMaxPages = 256;
constexpr int kWsThreads = 384;
constexpr int kWsQ = 0;                                     // [16 · 32 rows × 128 B] swizzled
constexpr int kWsKeys = kWsQ + kGroup * kHeads * kDim;      // [kWsStages][64 × 128 B] swizzled
constexpr int kWsScales = kWsKeys + kWsStages * kPageKeys;  // [kWsStages][64] fp32
constexpr int kWsW = kWsScales + kWsStages * kBlock * 4;    // [16][32] fp32
constexpr int kWsTab = kWsW + kGroup * kHeads * 4;          // [kWsMaxPages] int32
constexpr int kWsPos = kWsTab + kWsMaxPages * 4;            // [16] int32 (−1: padding row)
constexpr int kWsBar = kWsPos + kGroup * 4;                 // full[kWsStages], empty[kWsStages]
constexpr int kWsSmem = kWsBar + 2 * kWsStages * 8 + 1024;  // + slack for the 1024-B alignment
constexpr int kWsRegs = 168;                                // ptxas's count under __launch_bounds__(384, 1)
constexpr int kWsProducerRegs = 40, kWsMathRegs = 232;      // setmaxnreg: 40 + 2 · 232 = 3 · 168
static_assert(kWsProducerRegs + 2 * kWsMathRegs == 3 * kWsRegs);
static_assert(kWsSmem <= 232448);
static_assert(sizeof(IndexerLogitsParams) <= 128, "kernel parameters over 128 B slowed kernel 3 (indexer_logits.h)");
constexpr int kQChunks = kGroup * kHeads * kDim / 16;  // 16-B chunks of the group's q8
constexpr int kQPer = (kQChunks + kWsThreads - 1) / kWsThreads;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Weights of one bank (queries qb .. qb + 3) for this thread, held in registers for the whole work item:
// w[qq · 8 + jj · 2 + e] = weight of query qb + qq, head 8 jj + 2 t + e (the heads of its accumulator columns).
__device__ __forceinline__ void ws_load_weights(float (&w)[32], const float* s_w, int qb, int t) {
#pragma unroll
    for (int qq = 0; qq < 4; ++qq)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const float2 ww = *reinterpret_cast<const float2*>(s_w + (qb + qq) * kHeads + 8 * jj + 2 * t);
            w[qq * 8 + jj * 2] = ww.x;
            w[qq * 8 + jj * 2 + 1] = ww.y;
        }
}

// ReLU · weight · head sum of one bank (4 queries) for keys key0 / key0 + 8 of this thread, reduced over the quad and
// stored by lane t for query qb + t: orow is that row at key0 of the page, lim = the query's position − the key's.
// The math warps are issue-bound here (the tensor cores alone would run at ~1650 TFLOP/s), so every instruction
// counts: two FFMA chains per (query, key) that start with an FMUL (a chain from 0.0f costs an FADD each: 0 + x
// cannot be folded, it turns −0 into +0), weights in registers, the row address and causal limit computed once per
// work item. This took the kernel from ~905 to ~1100 TFLOP/s at 4096 × 64K (H200, 65e5458, 2026-11-30).
__device__ __forceinline__ void ws_epilogue(const float (&acc)[64], const float (&w)[32], int t, float ks0, float ks1,
                                            float* orow, int lim) {
    float v0[4], v1[4];
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
        // accumulator column pair jj of query qq: acc[16 qq + 4 jj + {0, 1}] (key0), + {2, 3} (key0 + 8)
        const float* d = acc + 16 * qq;
        const float* ww = w + 8 * qq;
        float a0 = ww[0] * fmaxf(d[0], 0.0f), b0 = ww[1] * fmaxf(d[1], 0.0f);
        float a1 = ww[0] * fmaxf(d[2], 0.0f), b1 = ww[1] * fmaxf(d[3], 0.0f);
#pragma unroll
        for (int jj = 1; jj < 4; ++jj) {
            a0 = fmaf(ww[2 * jj], fmaxf(d[4 * jj], 0.0f), a0);
            b0 = fmaf(ww[2 * jj + 1], fmaxf(d[4 * jj + 1], 0.0f), b0);
            a1 = fmaf(ww[2 * jj], fmaxf(d[4 * jj + 2], 0.0f), a1);
            b1 = fmaf(ww[2 * jj + 1], fmaxf(d[4 * jj + 3], 0.0f), b1);
        }
        v0[qq] = a0 + b0;
        v1[qq] = a1 + b1;
    }
    // Reduce-scatter over the quad: after the xor-2 step lane t holds queries (t & 2), (t & 2) + 1 summed over two
    // lanes; after the xor-1 step it holds query t summed over four.
    const bool hi2 = (t & 2) != 0, hi1 = (t & 1) != 0;
    float k0a = hi2 ? v0[2] : v0[0], k0b = hi2 ? v0[3] : v0[1];
    float k1a = hi2 ? v1[2] : v1[0], k1b = hi2 ? v1[3] : v1[1];
    k0a += __shfl_xor_sync(0xffffffffu, hi2 ? v0[0] : v0[2], 2);
    k0b += __shfl_xor_sync(0xffffffffu, hi2 ? v0[1] : v0[3], 2);
    k1a += __shfl_xor_sync(0xffffffffu, hi2 ? v1[0] : v1[2], 2);
    k1b += __shfl_xor_sync(0xffffffffu, hi2 ? v1[1] : v1[3], 2);
    const float r0 = (hi1 ? k0b : k0a) + __shfl_xor_sync(0xffffffffu, hi1 ? k0a : k0b, 1);
    const float r1 = (hi1 ? k1b : k1a) + __shfl_xor_sync(0xffffffffu, hi1 ? k1a : k1b, 1);
    if (lim >= 0) orow[0] = r0 * ks0;
    if (lim >= 8) orow[8] = r1 * ks1;
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Bank A (the page's keys at shared address ka against the 4 queries at qa) and bank B (kb against qb), issued as two
// wgmma groups, so that wait<1> completes bank A and wait<0> bank B.
__device__ __forceinline__ void ws_issue(float (&acc_a)[64], float (&acc_b)[64], uint32_t ka, uint32_t qa, uint32_t kb,
                                         uint32_t qb) {
    reg_fence(acc_a);
    reg_fence(acc_b);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) wgmma_e4m3_m64n128(acc_a, desc(ka + k * 32), desc(qa + k * 32), k > 0);
    wg_commit();
#pragma unroll
    for (int k = 0; k < 4; ++k) wgmma_e4m3_m64n128(acc_b, desc(kb + k * 32), desc(qb + k * 32), k > 0);
    wg_commit();
}
#endif

// Groups of ≤ 4 queries (decode, MTP verification) split the pages instead of the queries: one bank of N = 128 holds
// the whole group, so WG w takes pages 4j + 2w and 4j + 2w + 1 of the item as its banks A and B (both against
// queries 0–3), and each stage is released by the four warps of the warpgroup that read it. That is a quarter of the
// tensor work per page of the 16-query layout, so the keys can stream at up to four times the rate. The choice is
// per work item (its group's size), so any plan is scored correctly.
__global__ void __launch_bounds__(kWsThreads, 1)
    ws_kernel(const __grid_constant__ CUtensorMap keys_map, IndexerLogitsParams p, int pages_per_item) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t sb = (raw + 1023u) & ~1023u;
    uint8_t* sm = smem_raw + (sb - raw);
    const float* s_scales = reinterpret_cast<const float*>(sm + kWsScales);
    float* s_w = reinterpret_cast<float*>(sm + kWsW);
    int* s_tab = reinterpret_cast<int*>(sm + kWsTab);
    int* s_pos = reinterpret_cast<int*>(sm + kWsPos);
    const uint32_t full = sb + kWsBar, empty = full + kWsStages * 8;  // + 8 · stage
    const int tid = static_cast<int>(threadIdx.x);

    // Programmatic dependent launch: wait for the producers of q8 / plan / pool, let the next kernel's CTAs in.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    int r_a, r_b, toff, page0, np;
    if (!work_item(p, pages_per_item, r_a, r_b, toff, page0, np)) return;
    const int nq = r_b - r_a;  // ≤ kGroup (the plan's groups)

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < kWsStages; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, nq <= 4 ? 4 : 8);  // lane 0 of each math warp that reads the stage
        }
    }
    for (int i = tid; i < np; i += kWsThreads) s_tab[i] = p.tables[toff + page0 + i];
    if (tid < kGroup) s_pos[tid] = tid < nq ? p.pos[r_a + tid] : -1;
    for (int c = tid; c < kGroup * kHeads; c += kWsThreads)
        s_w[c] = c < nq * kHeads ? p.w8[static_cast<int64_t>(r_a) * kHeads + c] : 0.0f;
    // The group's q8 as the wgmma B operand (rows (query, head) of 128 B, 128-B swizzle); every load in flight first.
    uint4 qv[kQPer];
#pragma unroll
    for (int k = 0; k < kQPer; ++k) {
        const int c = tid + k * kWsThreads, row = c >> 3;
        qv[k] = make_uint4(0, 0, 0, 0);
        if (c < kQChunks && row < nq * kHeads)
            qv[k] = ld_stream(p.q8 + (static_cast<int64_t>(r_a) * kHeads + row) * kDim + (c & 7) * 16);
    }
#pragma unroll
    for (int k = 0; k < kQPer; ++k) {
        const int c = tid + k * kWsThreads, row = c >> 3;
        if (c < kQChunks) *reinterpret_cast<uint4*>(sm + kWsQ + row * 128 + (((c & 7) ^ (row & 7)) << 4)) = qv[k];
    }
    proxy_fence();    // Q (generic stores) → wgmma (async proxy)
    __syncthreads();  // Q, weights, positions, page table, barrier initialisation

    const int wgi = tid >> 7;
    if (wgi == 2) {  // producer
        setmaxnreg_dec<kWsProducerRegs>();
        if (tid == 2 * 128) {
            prefetch_tensormap(&keys_map);
            for (int i = 0; i < np; ++i) {
                const int s = i % kWsStages;
                if (i >= kWsStages) mbar_wait(empty + 8 * s, ((i / kWsStages) - 1) & 1);
                const int blk = s_tab[i];
                mbar_expect_tx(full + 8 * s, kPageKeys + kBlock * 4);
                tma_load_2d(sb + kWsKeys + s * kPageKeys, &keys_map, 0, blk * (kBlockBytes / 128), full + 8 * s);
                bulk_load(sb + kWsScales + s * kBlock * 4, p.pool + static_cast<int64_t>(blk) * kBlockBytes + kPageKeys,
                          kBlock * 4, full + 8 * s);
            }
        }
        return;
    }

    setmaxnreg_inc<kWsMathRegs>();
    const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int key0 = 16 * warp + g;
    const int qb = wgi * 8;  // this warpgroup's first query
    const uint32_t b_a = sb + kWsQ + qb * kHeads * 128, b_b = b_a + 4 * kHeads * 128;
    float* out_row0 = p.out + (static_cast<int64_t>(r_a) - p.row_begin) * p.out_stride;
    // Per thread for the whole item: its bank-A and bank-B weights, rows (queries qb + t, qb + 4 + t) and positions
    // (−1 for padding rows: nothing stored).
    float w_a[32], w_b[32];
    ws_load_weights(w_a, s_w, qb, t);
    ws_load_weights(w_b, s_w, qb + 4, t);
    const int pos_a = s_pos[qb + t], pos_b = s_pos[qb + 4 + t];
    float* row_a = out_row0 + static_cast<int64_t>(qb + t) * p.out_stride + key0;
    float* row_b = out_row0 + static_cast<int64_t>(qb + 4 + t) * p.out_stride + key0;
    float acc_a[64], acc_b[64];
    if (nq <= 4) {  // page split (uniform over the CTA)
        // A missing page pa + 1 (the item's last) is computed on pa's stage again and not stored, so the wgmma path
        // stays uniform.
        const uint32_t b_q = sb + kWsQ;
        const int pos_q = s_pos[t];
        float* row_q = out_row0 + static_cast<int64_t>(t) * p.out_stride + key0;
        float w_q[32];
        ws_load_weights(w_q, s_w, 0, t);
        for (int pa = 2 * wgi; pa < np; pa += 4) {
            const bool has_b = pa + 1 < np;
            const int pb = has_b ? pa + 1 : pa;
            const int sa = pa % kWsStages, sbs = pb % kWsStages;
            mbar_wait(full + 8 * sa, (pa / kWsStages) & 1);
            mbar_wait(full + 8 * sbs, (pb / kWsStages) & 1);
            ws_issue(acc_a, acc_b, sb + kWsKeys + sa * kPageKeys, b_q, sb + kWsKeys + sbs * kPageKeys, b_q);
            const float ka0 = s_scales[sa * kBlock + key0], ka1 = s_scales[sa * kBlock + key0 + 8];
            const float kb0 = s_scales[sbs * kBlock + key0], kb1 = s_scales[sbs * kBlock + key0 + 8];
            const int ta = (page0 + pa) * kBlock, tb = (page0 + pb) * kBlock;
            wg_wait<1>();
            reg_fence(acc_a);
            ws_epilogue(acc_a, w_q, t, ka0, ka1, row_q + ta, pos_q - ta - key0);
            wg_wait<0>();
            reg_fence(acc_b);
            if (lane == 0) {  // both banks have read their stages
                mbar_arrive(empty + 8 * sa);
                if (has_b) mbar_arrive(empty + 8 * sbs);
            }
            ws_epilogue(acc_b, w_q, t, kb0, kb1, row_q + tb, has_b ? pos_q - tb - key0 : -1);
        }
    } else {
        for (int i = 0; i < np; ++i) {
            const int s = i % kWsStages;
            mbar_wait(full + 8 * s, (i / kWsStages) & 1);
            const uint32_t a_base = sb + kWsKeys + s * kPageKeys;
            ws_issue(acc_a, acc_b, a_base, b_a, a_base, b_b);
            const float ks0 = s_scales[s * kBlock + key0], ks1 = s_scales[s * kBlock + key0 + 8];
            const int t0 = (page0 + i) * kBlock;
            wg_wait<1>();
            reg_fence(acc_a);
            ws_epilogue(acc_a, w_a, t, ks0, ks1, row_a + t0, pos_a - t0 - key0);
            wg_wait<0>();
            reg_fence(acc_b);
            if (lane == 0) mbar_arrive(empty + 8 * s);  // this warp's wgmma have read the stage
            ws_epilogue(acc_b, w_b, t, ks0, ks1, row_b + t0, pos_b - t0 - key0);
        }
    }
#endif
}

}  // namespace wg

}  // namespace

int64_t indexer_plan_ints(int64_t n_rows) { return 3 * n_rows + 2; }

namespace {
int device_sms_and_major(int* major);
}  // namespace

bool indexer_logits_supported(int64_t n_head, int64_t d_indexer, int64_t block_size) {
    if (d_indexer != kDim || block_size != kBlock) return false;
    if (n_head == kHeads) return true;
    int major = 0;  // 64 heads: kernel 2 only, which needs sm_90a
    return n_head == 2 * kHeads && device_sms_and_major(&major) > 0 && major >= 9;
}

void launch_indexer_plan(const IndexerPlanParams& p, cudaStream_t stream) {
    cuda::launch_ex(indexer_plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, true, p);
}

namespace {

// Upper bound on the plan's groups (the grid's y): indexer_grid.h.
int64_t plan_groups(const IndexerLogitsParams& p) {
    return indexer_grid::max_groups(p.row_end - p.row_begin, p.n_seq, kGroup, p.max_seq_rows);
}

int device_sms_and_major(int* major) {
    int device = 0, n_sm = 132;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
    return n_sm;
}

void launch_mma_sync(const IndexerLogitsParams& p, cudaStream_t stream, int n_sm) {
    per_device_once([] {
        return cudaFuncSetAttribute(indexer_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    });
    // Groups: at most one per kGroup rows plus one extra per sequence boundary. Pages per work item: enough
    // items for ~8 CTAs per SM over the whole launch, in multiples of the warps of a CTA.
    const int64_t groups = plan_groups(p);
    const int64_t max_pages = (p.max_context + kBlock - 1) / kBlock;
    const int64_t target_items = 8LL * n_sm;
    int64_t per_item = (max_pages * groups + target_items - 1) / target_items;
    per_item = std::max<int64_t>(kWarps, (per_item + kWarps - 1) / kWarps * kWarps);
    const int64_t chunks = (max_pages + per_item - 1) / per_item;
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(groups));
    indexer_logits_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, static_cast<int>(per_item));
}

template <int QT, int SUB, bool kHist = false, int U = 1>
void launch_wgmma(const IndexerLogitsParams& p, cudaStream_t stream, int n_sm, int* hist = nullptr,
                  int64_t hist_stride = 0) {
    using C = wg::Cfg<QT, SUB>;
    static std::atomic<int> occupancy[kMaxDevices] = {};  // CTAs per SM, per device (after its attributes)
    int dev = 0;
    cudaGetDevice(&dev);
    per_device_once([&] {
        cudaFuncSetAttribute(wg::logits_kernel<QT, SUB, kHist, U>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             C::kSmem);
        cudaFuncSetAttribute(wg::logits_kernel<QT, SUB, kHist, U>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
        int c = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, wg::logits_kernel<QT, SUB, kHist, U>,
                                                                            wg::kWgThreads, C::kSmem);
        occupancy[dev].store(std::max(c, 1));
        return e;
    });
    const int ctas_per_sm = std::max(occupancy[dev].load(), 1);
    const int64_t groups = plan_groups(p);
    const int64_t max_pages = (p.max_context + kBlock - 1) / kBlock;
    // Work items of ≤ kMaxPages pages, balanced over whole waves of CTAs (a short tail wave of long items costs
    // as much as a full one).
    const int64_t slots = static_cast<int64_t>(n_sm) * ctas_per_sm, total = max_pages * groups;
    const int64_t waves = std::max<int64_t>(1, (total + slots * 32 - 1) / (slots * 32));
    int64_t per_item = (total + slots * waves - 1) / (slots * waves);
    per_item = std::min<int64_t>(std::max<int64_t>(per_item, 1), wg::kMaxPages);
    const int64_t chunks = (max_pages + per_item - 1) / per_item;
    cuda::launch_ex(wg::logits_kernel<QT, SUB, kHist, U>,
                    dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(groups)), dim3(wg::kWgThreads), C::kSmem,
                    stream, true, p, static_cast<int>(per_item), hist, hist_stride);
}

// Kernel 3's tensor map: the pool as rows of 128 B (66 per block: 64 key rows, then the 256 B of scales), boxes of
// 64 rows with the 128-B swizzle. Encoded per launch (a host call of ~1 µs, against launches of milliseconds).
bool encode_keys_map(CUtensorMap* map, const uint8_t* pool, int64_t pool_blocks) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            fn = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    if (encode == nullptr) return false;
    // Without the pool's size the map spans 2^31 rows: the boxes read are the blocks the tables name, never beyond.
    const cuuint64_t rows = pool_blocks > 0 ? static_cast<cuuint64_t>(pool_blocks) * (kBlockBytes / 128) : (1ull << 31);
    const cuuint64_t dims[2] = {128, rows};
    const cuuint64_t strides[1] = {128};
    const cuuint32_t box[2] = {128, kBlock};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(pool), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Kernel 3 when its register split holds (ptxas gave it kWsRegs) and the map encodes; false: use kernel 2.
bool launch_ws(const IndexerLogitsParams& p, cudaStream_t stream, int n_sm) {
    // Once per device: the register plan holds and the shared-memory limit is set (else kernel 2 every time).
    const cudaError_t ready = per_device_once([] {
        cudaFuncAttributes a{};
        cudaError_t e = cudaFuncGetAttributes(&a, wg::ws_kernel);
        if (e == cudaSuccess && a.numRegs != wg::kWsRegs) e = cudaErrorInvalidConfiguration;
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wg::ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::kWsSmem);
        if (e != cudaSuccess) (void)cudaGetLastError();
        return e;
    });
    if (ready != cudaSuccess) return false;
    CUtensorMap map;
    if (!encode_keys_map(&map, p.pool, p.pool_blocks)) return false;
    const int64_t groups = plan_groups(p);
    const int64_t max_pages = (p.max_context + kBlock - 1) / kBlock;
    const int64_t chunks = indexer_grid::ws_chunks(max_pages, groups, n_sm, wg::kWsMaxPages);
    const int64_t per_item = (max_pages + chunks - 1) / chunks;
    return cuda::launch_ex(wg::ws_kernel, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(groups)),
                           dim3(wg::kWsThreads), wg::kWsSmem, stream, true, map, p,
                           static_cast<int>(per_item)) == cudaSuccess;
}
}  // namespace

namespace {

// 64 heads (two 32-head units per query): kernel 2 at every shape, QT units per sub-tile covering the estimated
// queries of a group (a 16-query prefill group in one chunk of 32 units: 170 KB of shared memory, one CTA per SM).
// An explicit kernel 2 (the batch-invariant mode) takes that widest tile for every shape, so that no row's sums
// depend on how many queries share its group.
int launch_64_heads(const IndexerLogitsParams& p, cudaStream_t stream, int n_sm, int64_t est,
                    const IndexerLogitsHist* hist, bool* hist_done) {
    if (p.kernel == 2)
        launch_wgmma<8, 4, false, 2>(p, stream, n_sm);
    else if (est <= 1 && hist != nullptr && hist->bins != nullptr && p.max_seq_rows == 1) {
        launch_wgmma<2, 1, true, 2>(p, stream, n_sm, hist->bins, hist->row_stride);
        if (hist_done) *hist_done = true;
    } else if (est <= 1)
        launch_wgmma<2, 1, false, 2>(p, stream, n_sm);
    else if (est <= 2)
        launch_wgmma<4, 1, false, 2>(p, stream, n_sm);
    else if (est <= 4)
        launch_wgmma<8, 1, false, 2>(p, stream, n_sm);
    else
        launch_wgmma<8, 4, false, 2>(p, stream, n_sm);
    return 2;
}

}  // namespace

int launch_indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream, const IndexerLogitsHist* hist,
                          bool* hist_done) {
    if (hist_done) *hist_done = false;
    const int64_t n_rows = p.row_end - p.row_begin;
    if (n_rows <= 0 || p.max_context <= 0) return 0;
    int major = 0;
    const int n_sm = device_sms_and_major(&major);
    // Queries per group, estimated from rows per sequence (exact for decode and prefill); more is still correct.
    const int64_t est =
        std::min<int64_t>(kGroup, (n_rows + std::max<int64_t>(p.n_seq, 1) - 1) / std::max<int64_t>(p.n_seq, 1));
    if (p.n_head == 2 * kHeads) return launch_64_heads(p, stream, n_sm, est, hist, hist_done);
    int kernel = p.kernel;
    if (kernel == 0) {
        const char* env = std::getenv("MEGACTX_INDEXER_LOGITS_KERNEL");
        const bool prefill_rows = est > kWsMinQueries && n_rows >= kWsMinRows;
        const bool verify_rows = est >= kWsPageSplitMin && est <= 4;  // kernel 3's page split
        kernel = env && *env ? std::atoi(env) : prefill_rows || verify_rows ? 3 : 2;
    }
    if (kernel != 1 && major < 9) kernel = 1;
    if (kernel == 1) {
        launch_mma_sync(p, stream, n_sm);
        return 1;
    }
    if (kernel == 3) {
        if (launch_ws(p, stream, n_sm)) return 3;
        static std::once_flag warned;  // a silent fallback would hide a 25-35% slower prefill
        std::call_once(warned, [] {
            std::fprintf(stderr,
                         "megactx: indexer logits kernel 3 cannot run here (register plan or tensor map refused); "
                         "prefill scores take kernel 2\n");
        });
    }
    // The histogram needs one row per group: at most one row per sequence (est is only an estimate).
    if (est <= 1 && hist != nullptr && hist->bins != nullptr && p.max_seq_rows == 1) {
        launch_wgmma<1, 1, true>(p, stream, n_sm, hist->bins, hist->row_stride);
        if (hist_done) *hist_done = true;
    } else if (est <= 1)
        launch_wgmma<1, 1>(p, stream, n_sm);
    else if (est <= 2)
        launch_wgmma<2, 1>(p, stream, n_sm);
    else if (est <= 4)
        launch_wgmma<4, 1>(p, stream, n_sm);
    else if (est <= 8)
        launch_wgmma<8, 1>(p, stream, n_sm);
    else
        launch_wgmma<8, 2>(p, stream, n_sm);
    return 2;
}

}  // namespace megactx
