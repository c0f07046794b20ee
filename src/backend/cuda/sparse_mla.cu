// sparse_mla kernels (contract in sparse_mla.h; model-spec §2.5, FlashMLA "MQA mode" semantics).
// Computes, per token i and head h, out[i,h,:] = Σ_j softmax_j(scale · q[i,h,:]·K[s_j,:]) · K[s_j, 0:512] over the
// token's selected slots s_j = slots[i, j] (−1 = unused, skipped); shapes q [n, n_head, 576] fp32,
// cache BF16 [n_slots, 576] or FP8 [n_slots, 656 B], slots [n, topk] int32, out [n, n_head, 512] fp32.
//
// One CTA = one token × 64 heads × a contiguous range of 64-slot chunks (the split, planned on the host) × all 512
// value dims, or half of them (plan.v_split 2: two CTAs share the split's rows, Q·Kᵀ and softmax, and each runs P·V
// and the epilogue for its half; used at batch 1, where 32 splits fill a quarter of the SMs); the grid is 1-D with
// the value half, then the split fastest (a thread-block cluster is consecutive splits of one token).
// One sm_90a kernel, warp-specialised (three warpgroups and mbarriers; header above sparse_mla_ws_kernel), with Q
// and two K tiles in shared memory: bf16 for BF16 caches; for FP8 caches f16 latent dims (e4m3 → f16 and the pow2
// tile scale are exact, 2 instructions per 2 codes against 6 for bf16, which made the dequantisation the bound) and
// bf16 RoPE dims (k_pe is stored bf16), so Q·Kᵀ mixes f16 and bf16 k-steps into one fp32 accumulator.
// History (docs/benchmarks.md): a first mma.sync kernel, then a two-warpgroup wgmma kernel between CTA barriers (FP8
// b128 164 µs), both removed in d3418f5 (2026-11-29) when this one beat them in every case measured (FP8 b128 131 µs
// with bf16 K/V, 112 µs with f16; bench/results/cuda-h200-2026-11-29-{7dc0362,2fcc044}-sparse_mla*). 2fc1f7f: the
// FP8 codes staged by one bulk copy per row instead of 32 cp.async of 16 B (b64 69.5 → 63.2 µs, b128 113 → 109 µs);
// 6143d49: on two mbarriers per tile, rows 0..31 and 32..63, so the first half is dequantised while the second lands
// (b128 109 → 106 µs, prefill 374 → 383 TFLOP/s). 6a124f9 and 58abd7b: the bulk copies replaced by one cp.async per
// lane and row (a warp instruction per 512-B row; the per-lane bulk-copy issue loop was 26% of the producer), k_pe on
// the second half's barrier (b64 63.0 → 61.7 µs, b128 106.3 → 103.6 µs, prefill 383 → 398 TFLOP/s); then (3b4164e)
// rows 32..63 by bulk copy again, so two copy paths keep bytes in flight (b64 61.4 → 58.2 µs, b128 103.6 → 102.4 µs).
// Issuing chunk c+1 as soon as its tile is freed, during chunk c's dequantisation, measured slower (b128 112–119 µs),
// and so did a fetch warp beside three dequantising warps (157 µs) and WG1 issuing (116 µs);
// rows loaded into registers instead of staged measured slower (b128 137 µs; global loads land through L1, of which
// the full shared-memory carve-out leaves ~28 KB). 20a9e15: batch 1 with v_split 2 (12.4 → 11.9 µs); partials
// stored from the accumulators by st.global (b1 15.2 µs) or staged by stmatrix (no gain) measured worse.
// Softmax online in fp32 (exp2 domain), P stored as bf16 (f16 for FP8 caches) for the P·V product; unused slots are
// masked to −inf and chunks with no valid slot are skipped.
// One split (n_split = 1): the CTA converts its Q itself, and writes the normalised [64 heads × 512] fp32 rows,
// staged in shared memory, with one bulk async copy per head (cp.async.bulk; direct stores from the accumulator
// layout held the LSU queue full).
// Splits (n_split > 1), three launches: sparse_mla_q_prep_kernel converts each token's Q once into the Q tile's
// image (every split needs the same Q; converting it in each CTA was 4.9 µs of a 17.3-µs batch-1 step); the main
// kernel starts under programmatic dependent launch while that runs, gathers its first rows and then copies the
// image in with one bulk copy; each CTA writes its normalised partial and log2-sum-exp to scratch, or, in clusters
// (plan.cluster > 1), the CTAs of a cluster merge their partials through distributed shared memory first
// (cluster_merge); the combine kernel (PDL) merges what reached scratch.
// Globaltimer stamps per phase showed where a batch-1 step goes (H200, 2026-11-30,
// bench/results/cuda-h200-2026-11-30-sparse_mla-phases.txt): of 13.6 µs, Q ready at 2.0, rows dequantised at 2.8,
// Q·Kᵀ and softmax and P·V done at 5.0, partial staged at 6.3 and stored at 8.5 (128 KB per CTA: the SM's write
// path, ~32 B/clock, is the bound; the coalesced-store variant measured the same), combine done at 11.6.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cmath>

#include "backend/cuda/launch_ex.cuh"
#include "backend/cuda/per_device.cuh"
#include "backend/cuda/sm90_async.cuh"
#include "backend/cuda/sparse_mla.h"

namespace megactx::cuda {
namespace {

using namespace sm90;

constexpr int kD = 576, kDv = 512, kHeads = 64, kChunk = 64;
constexpr int kRowBytes = kD * 2;           // bf16 row in shared memory: 72 chunks of 16 B
constexpr int kRowChunks = kRowBytes / 16;  // 72
constexpr int kFp8RowBytes = 656;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Two e4m3 codes (low byte first) → f16x2 (exact), times a power-of-two scale in f16 (exact unless a product falls
// below f16's normal range, 2^-14: only in rows whose largest value is below ~2^-5).
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t codes16, __half2 s) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes16 & 0xffffu), __NV_E4M3);
    const __half2 v = __hmul2(*reinterpret_cast<__half2*>(&hr), s);
    return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
}

// One 16-B chunk of the Q tile from 8 query values (a, d) times m: f16 (the latent dims of FP8 caches) or bf16.
__device__ __forceinline__ uint4 q_chunk(const float4& a, const float4& d, float m, bool f16) {
    uint4 w;
    w.x = f16 ? pack_f16(a.x * m, a.y * m) : pack_bf16(a.x * m, a.y * m);
    w.y = f16 ? pack_f16(a.z * m, a.w * m) : pack_bf16(a.z * m, a.w * m);
    w.z = f16 ? pack_f16(d.x * m, d.y * m) : pack_bf16(d.x * m, d.y * m);
    w.w = f16 ? pack_f16(d.z * m, d.w * m) : pack_bf16(d.z * m, d.w * m);
    return w;
}
// For FP8 caches Q's latent dims are f16, which ends at 65504: when the largest |q| (amax) exceeds 2^15, Q is
// scaled by m = 2^-e (amax · m ≤ 2^15) and the softmax scale by inv = 2^e; otherwise both stay 1.
__device__ __forceinline__ void q_pow2(float amax, float& m, float& inv) {
    if (amax > 32768.f) {
        int e = 0;
        frexpf(amax / 32768.f, &e);  // amax / 2^15 <= 2^e
        e = min(e, 120);
        m = ldexpf(1.f, -e);
        inv = ldexpf(1.f, e);
    }
}

// ---- the kernel (sm_90a) ----------------------------------------------------------------------------------------
// Shared tiles use the canonical 128-B swizzle: a [64 rows, 576] bf16 tile is 9 blocks of [64 rows × 128 B] (8 KB
// each, 1024-B aligned), 16-B chunk c of row r at r·128 + ((c ^ (r & 7)) << 4). S = Q·Kᵀ takes 36 × wgmma
// m64n64k16 (A = Q, B = K tile, both K-major from shared memory); O[64 heads, dims 256w..256w+255] += P · V takes
// 4 × wgmma m64n256k16 per consumer warpgroup w (B = V read MN-major straight from the same K tile: no transposed
// copy). Layout: Q tile, two K tiles, P [64 × 64] bf16, slot ids, flags, rescale factors, mbarriers.
namespace wg {
constexpr int kBlk = 8192;       // [64 rows × 128 B]
constexpr int kTile = 9 * kBlk;  // [64 rows × 576] bf16
constexpr int kQ = 0, kK0 = kTile, kP = 3 * kTile, kIdx = kP + kBlk;

__device__ __forceinline__ uint32_t tile_off(int r, int c) {  // 16-B chunk c (0..71) of row r
    return static_cast<uint32_t>((c >> 3) * kBlk + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
           (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// Output staging row stride (floats): 512 + 8, so the 8 rows a warp stores at once fall on different banks.
constexpr int kOutStride = kDv + 8;
static_assert(kHeads * kOutStride * 4 <= 3 * kTile);
// f16 partials (FP8 caches, n_split > 1): rows of 512 + 16 halves (1056 B, 16-B aligned for the bulk copy).
constexpr int kOutStrideH = kDv + 16;
// One bulk async copy shared → global (16-B aligned, size a multiple of 16), waited on only until the source
// shared memory has been read (as TMA-store epilogues do): the writes complete with the grid.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
#include "backend/cuda/sparse_mla_wgmma.inc"

__device__ __forceinline__ void bf16_issue(const uint8_t* cache, int32_t slot, int row, int part, uint32_t tile) {
    const uint8_t* src = cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kRowBytes;
#pragma unroll
    for (int k = 0; k < 18; ++k) {
        const int c = part + 4 * k;
        cp_async16(tile + tile_off(row, c), src + c * 16, slot >= 0);
    }
}

// Three warpgroups (384 threads) and mbarriers instead of CTA-wide barriers, so loading, Q·Kᵀ and P·V of different
// chunks overlap:
//   WG0 (softmax): waits for K tile b, S = Q·Kᵀ (36 × m64n64k16), masks and online softmax, writes P (bf16/f16) and the
//       row rescale factors to shared memory, then O[:, 0:256] += P·V (4 × m64n256k16) and releases tile b;
//   WG1: waits for P, rescales, O[:, 256:512] += P·V, releases P and tile b; while it multiplies, WG0 already runs
//       the next chunk's Q·Kᵀ on the other tile;
//   WG2 (producer): fills the two K tiles in turn, one chunk ahead: rows stream into the tile as soon as both
//       consumers released it (BF16: cp.async in place; FP8: codes staged in the tile's upper half, rows 0..31 by
//       cp.async and rows 32..63 by bulk copy, then dequantised over the whole tile, stage_off below). It holds no
//       accumulators, so setmaxnreg moves its registers to the consumers: 168 at launch (384 threads), 120 for the
//       producer, 192 for each consumer. The CTA's register pool is fixed at launch, so what the consumers add must
//       equal what the producer releases ((168 - 120) = 2 · (192 - 168)); an unbalanced request never completes and
//       the kernel hangs.
// Barriers: k_ready[b] (mbarrier, 128 producer arrivals, tile b and its slot ids written), k_free[b] (mbarrier, one
// arrival per consumer warp, 8), FP8 staged[h][b] (mbarriers per half chunk h: 128 producer arrivals, each when that
// thread's cp.async have landed, and for rows 32..63 also the 32 bulk copies' issuers and bytes), named barriers
// kBarP ready / free between WG0 and WG1 (256 threads). A chunk whose 64 slots are all unused is skipped by both
// consumers (per-warp valid flags from the producer).
constexpr int kWsThreads = 384;
constexpr int kWsFlags = kIdx + 2 * 64 * 4;     // [2 tiles][4 producer warps] int32
constexpr int kWsRed = kWsFlags + 2 * 4 * 4;    // alpha [64], l [64]
constexpr int kWsLse = kWsRed + 2 * 64 * 4;     // cluster merge: this CTA's log2-sum-exp per head [64]
constexpr int kWsBar = kWsLse + 64 * 4;         // k_ready[2], k_free[2] (8 B each)
constexpr int kWsSmem = kWsBar + 9 * 8 + 1024;  // + q_ready (prepared Q), FP8 staged[2][2]
static_assert(kWsSmem <= 232448);
constexpr int kBarPReady = 1, kBarPFree = 2, kBarEpilogue = 3;  // consumer named barriers (0: __syncthreads)

__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

// FP8 producer staging: chunk c's raw rows stream into tile c%2 itself: the e4m3 codes (512 B per row) over blocks
// 4..7, row r at byte r·512, and k_pe straight to its place in block 8 (fp8_stage_issue); the tile scales to
// registers.
// The thread of (row, part) reads the row's 16-B pieces part + 4j' with j' = j ^ (row & 1): the 8 rows of a warp
// are 512 B apart, so without the flip a warp's 32 reads would fall on 4 of the 8 16-B bank groups.
__device__ __forceinline__ uint32_t stage_off(int row, int piece) {  // piece 0..31 of the codes of `row`
    return static_cast<uint32_t>(4 * kBlk + row * 512 + piece * 16);
}
// The arrive-on of `bar` (.noinc: counted in its init count) fires once every cp.async this thread issued so far has
// landed.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Rows 0..31 and rows 32..63 go by two different copy paths, whose limits on bytes in flight add up (H200, 2026-11-30:
// one warp issues a 512-B cp.async row only every ~56 cycles, and an SM keeps ~14.5 B/clock of them in flight):
// - rows 0..31 (half a) by cp.async: producer warp pw copies rows 8pw..8pw+7, one row per instruction, lane l → 16-B
//   piece l, so each instruction reads 512 contiguous bytes and writes one staged row without bank conflicts; an
//   unused slot's row is zero-filled by the copy itself (0 × a NaN code would poison the P·V sum). The row's slot is
//   in lane 4k (thread (row, part 0)). Every producer thread arrives on half a's `staged` mbarrier once its copies
//   have landed (.noinc: 128 arrivals);
// - rows 32..63 (half b) by the TMA engine: thread (rb, part 0) issues one 512-B bulk copy (arriving with expect_tx:
//   32 more arrivals on half b's barrier); an unused slot's row is zeroed by the 4 threads that later read it.
// k_pe: this thread's 2 × 2 16-B chunks of rows a and b, by cp.async straight to their place in block 8, covered by
// half b's barrier (every thread arrives on it after all its cp.async).
// Measured (3b4164e, b64 / b128): all rows by cp.async 61.4 / 103.6 µs, this split 58.2 / 102.4 µs; 16 or 24 rows
// by bulk copy 60.2–61.0 / 105.3–105.6 µs, 16 rows of each half 62.9 / 109.5 µs.
__device__ __forceinline__ void fp8_stage_issue(const uint8_t* cache, int32_t slot_a, int32_t slot_b, int ra, int rb,
                                                int part, uint32_t tile_sa, uint32_t staged) {
    const int lane = threadIdx.x & 31, r0 = ra & ~7;
    const uint8_t* piece = cache + lane * 16;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int32_t s = __shfl_sync(0xffffffffu, slot_a, 4 * k);
        cp_async16(tile_sa + stage_off(r0 + k, lane), piece + static_cast<int64_t>(s < 0 ? 0 : s) * kFp8RowBytes,
                   s >= 0);
    }
    cp_async_arrive(staged);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int32_t slot = r ? slot_b : slot_a;
        const int row = r ? rb : ra;
        const uint8_t* src = cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kFp8RowBytes;
#pragma unroll
        for (int j = 0; j < 2; ++j)  // k_pe: bf16 chunks 64..71 of the tile row
            cp_async16(tile_sa + tile_off(row, 64 + part + 4 * j), src + 528 + (part + 4 * j) * 16, slot >= 0);
    }
    // (k_pe before the bulk copies: issued after them, b128 measured 102.4 -> 106.4 us)
    if (part == 0) {
        mbar_expect_tx(staged + 16, slot_b >= 0 ? 512u : 0u);
        if (slot_b >= 0)
            bulk_load(tile_sa + stage_off(rb, 0), cache + static_cast<int64_t>(slot_b) * kFp8RowBytes, 512,
                      staged + 16);
    }
    if (slot_b < 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(tile_sa + stage_off(rb, part + 4 * j)),
                         "r"(0)
                         : "memory");
    }
    cp_async_arrive(staged + 16);
}
__device__ __forceinline__ float4 fp8_scales(const uint8_t* cache, int32_t slot) {
    return __ldg(
        reinterpret_cast<const float4*>(cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kFp8RowBytes + 512));
}
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 4, 128;\n" ::: "memory"); }

// ---- cluster merge of the splits (plan.cluster = C > 1) ---------------------------------------------------------
// The C CTAs of a cluster are consecutive splits of one (token, 64-head group). Each has staged its normalised
// partial [64 heads × 512] fp32 in its own shared memory (kOutStride rows) and its per-head log2-sum-exp at kWsLse.
// After a cluster barrier, CTA rank r merges columns [r·512/C, (r+1)·512/C) of all C partials, read from the other
// CTAs' shared memory (ld.shared::cluster), with weights 2^(lse_s − max) in a fixed order (deterministic), and
// writes them: to out when the cluster covers all the token's splits (G = n_split / C = 1), else as group g's
// partial and log2-sum-exp in scratch for the combine kernel (which then merges G partials instead of n_split).
// A second cluster barrier keeps every CTA's shared memory alive until the others have read it. This replaces
// writing n_split partials of 128 KB per (token, head group) to global memory and reading them back in the combine:
// 8.1 of the 17.3 µs of a batch-1 step (globaltimer phases).
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t map_rank(uint32_t addr, uint32_t rank) {  // own shared address → rank's
    uint32_t d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(addr), "r"(rank));
    return d;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
constexpr int kMergeW = kHeads * kOutStride * 4;  // [C][64] split weights, then [64] 1/Σw (after the staged partial)
static_assert(kMergeW + 17 * kHeads * 4 <= 3 * kTile);

// What the merge needs of the run, by value (passing the kernel's parameter struct by reference made the kernel
// keep a local copy of it).
struct MergeArgs {
    float* out;
    float* scratch;
    int64_t n;
    int n_head, n_split, cluster;
    bool fp8;
};

template <int C>
__device__ __forceinline__ void cluster_merge_c(const MergeArgs& a, uint8_t* smem, int64_t i, int hg, int split,
                                                int t) {
    const uint32_t rank = cluster_rank();
    const int n_groups = a.n_split / C, group = split / C;
    float* sw = reinterpret_cast<float*>(smem + kMergeW);
    float* part = a.scratch;
    cluster_sync_all();  // every CTA's partial and log2-sum-exp are staged
    if (t < kHeads) {
        float l[C];
#pragma unroll
        for (int s = 0; s < C; ++s) l[s] = ld_cluster_f32(map_rank(smem_u32(smem + kWsLse) + 4 * t, s));
        float m = -INFINITY;
#pragma unroll
        for (int s = 0; s < C; ++s) m = fmaxf(m, l[s]);
        float wsum = 0.f;
#pragma unroll
        for (int s = 0; s < C; ++s) {
            const float w = m == -INFINITY ? 0.f : exp2f(l[s] - m);
            sw[s * kHeads + t] = w;
            wsum += w;
        }
        sw[C * kHeads + t] = wsum > 0.f ? 1.f / wsum : 0.f;
        if (n_groups > 1 && rank == 0) {
            float* lse_out = part + a.n * n_groups * a.n_head * kDv;
            lse_out[(i * n_groups + group) * a.n_head + hg * kHeads + t] = wsum > 0.f ? m + log2f(wsum) : -INFINITY;
        }
    }
    __syncthreads();
    // Column slice of this rank: W floats per head, as W/4 float4 tasks; U tasks per thread per round with all their
    // C·U loads in flight (16 per thread), two rounds in all for every C.
    constexpr int W = kDv / C, kTasks = kHeads * W / 4, U = 16 / C;
    const int64_t dst_row0 =
        n_groups == 1 ? i * a.n_head + hg * kHeads : (i * n_groups + group) * a.n_head + hg * kHeads;
    const bool half_out = n_groups > 1 && a.fp8;  // f16 partials (see load_partial)
    float* dst = (n_groups == 1 ? a.out : part) + dst_row0 * kDv;
    __half* dst_h = reinterpret_cast<__half*>(part) + dst_row0 * kDv;
    const uint32_t so = smem_u32(smem);
    for (int base = t; base < kTasks; base += U * kWsThreads) {
        float4 v[U][C];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int task = base + u * kWsThreads;
            if (task < kTasks) {
                const int h = task / (W / 4), col = static_cast<int>(rank) * W + 4 * (task % (W / 4));
#pragma unroll
                for (int s = 0; s < C; ++s) v[u][s] = ld_cluster_f4(map_rank(so + 4 * (h * kOutStride + col), s));
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int task = base + u * kWsThreads;
            if (task >= kTasks) continue;
            const int h = task / (W / 4), col = static_cast<int>(rank) * W + 4 * (task % (W / 4));
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int s = 0; s < C; ++s) {
                const float w = sw[s * kHeads + h];
                acc.x += w * v[u][s].x;
                acc.y += w * v[u][s].y;
                acc.z += w * v[u][s].z;
                acc.w += w * v[u][s].w;
            }
            const float inv = sw[C * kHeads + h];
            if (half_out) {
                __half2 lo = __floats2half2_rn(acc.x * inv, acc.y * inv),
                        hi = __floats2half2_rn(acc.z * inv, acc.w * inv);
                uint2 u;
                u.x = *reinterpret_cast<uint32_t*>(&lo);
                u.y = *reinterpret_cast<uint32_t*>(&hi);
                *reinterpret_cast<uint2*>(dst_h + h * kDv + col) = u;
            } else {
                *reinterpret_cast<float4*>(dst + h * kDv + col) =
                    make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
            }
        }
    }
    cluster_sync_all();  // no CTA leaves while another still reads its shared memory
}
__device__ __noinline__ void cluster_merge(const MergeArgs a, uint8_t* smem, int64_t i, int hg, int split, int t) {
    switch (a.cluster) {
        case 2:
            cluster_merge_c<2>(a, smem, i, hg, split, t);
            break;
        case 4:
            cluster_merge_c<4>(a, smem, i, hg, split, t);
            break;
        case 8:
            cluster_merge_c<8>(a, smem, i, hg, split, t);
            break;
        default:
            cluster_merge_c<16>(a, smem, i, hg, split, t);
            break;
    }
}

// O[64 heads, the warpgroup's value dims] += P · V over one 64-slot chunk: 4 k-steps of m64nNk16 (N = 256 / kVs:
// half of the CTA's 512 / kVs dims), V read MN-major from the K tile at v_tile.
template <bool kFp8, int kVs>
__device__ __forceinline__ void pv_chunk(float (&o)[128 / kVs], uint32_t p_tile, uint32_t v_tile, uint32_t v_lbo,
                                         uint32_t v_sbo) {
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks) {
        const uint64_t da = desc(p_tile + ks * 32, 16, 1024), db = desc(v_tile + ks * 16 * 128, v_lbo, v_sbo);
        if constexpr (kVs == 1) {
            if constexpr (kFp8) wgmma_m64n256_ss_tb_f16(o, da, db, 1);
            else wgmma_m64n256_ss_tb(o, da, db, 1);
        } else {
            if constexpr (kFp8) wgmma_m64n128_ss_tb_f16(o, da, db, 1);
            else wgmma_m64n128_ss_tb(o, da, db, 1);
        }
    }
}

template <bool kFp8, bool kClustered, int kVs>
__global__ void __launch_bounds__(kWsThreads, 1)
    sparse_mla_ws_kernel(const SparseMlaRunParams p, int chunks_per_split, uint32_t v_lbo, uint32_t v_sbo,
                         const uint8_t* q_img, const float* q_inv) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const uint32_t sb = smem_u32(smem);
    const int n_split = p.plan.n_split;
    static_assert(kVs == 1 || kVs == 2);
    static_assert(kVs == 1 || !kClustered);
    constexpr int kO = 128 / kVs;          // accumulator floats per consumer thread: m64nN, N = 256 / kVs
    constexpr int kN = 256 / kVs;          // value dims per consumer warpgroup
    constexpr int kW = kDv / kVs;          // value dims of this CTA: [v·kW, (v+1)·kW)
    const int n_hg = p.n_head / kHeads;  // v, then the splits vary fastest: a cluster is consecutive splits of one token
    const int v = kVs == 1 ? 0 : static_cast<int>(blockIdx.x % kVs);
    const int cta = static_cast<int>(blockIdx.x / kVs);
    const int64_t i = cta / (n_split * n_hg);
    const int split = cta % n_split, hg = (cta / n_split) % n_hg;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, wgi = warp >> 2, wi = warp & 3;
    const int g = lane >> 2, qd = lane & 3;
    const int n_chunks = p.topk / kChunk;
    const int c_begin = split * chunks_per_split;
    const int c_end = min(n_chunks, c_begin + chunks_per_split);
    const int32_t* tok_slots = p.slots + i * p.topk;
    const uint8_t* cache = static_cast<const uint8_t*>(p.cache);
    int32_t* sidx = reinterpret_cast<int32_t*>(smem + kIdx);              // [2][64]
    int32_t* sflags = reinterpret_cast<int32_t*>(smem + kWsFlags);        // [2][4]
    float* salpha = reinterpret_cast<float*>(smem + kWsRed);              // [64]
    float* sl = salpha + kHeads;                                          // [64]
    const uint32_t bar_ready = sb + kWsBar, bar_free = sb + kWsBar + 16;  // + 8·b
    const uint32_t bar_q = sb + kWsBar + 32;                              // prepared Q: its bulk copy has landed
    // FP8: + 8·b, tile b's staged codes of rows 0..31 have landed (32 arrivals); + 16 + 8·b, rows 32..63
    const uint32_t bar_staged = sb + kWsBar + 40;
    if (t == 0) {
        mbar_init(bar_ready, 128);
        mbar_init(bar_ready + 8, 128);
        mbar_init(bar_free, 8);
        mbar_init(bar_free + 8, 8);
        mbar_init(bar_q, 1);
    }
    // Without prepared Q the kernel is launched plainly and this wait is a no-op. With it (q_img), the kernel is
    // launched under PDL behind the Q preparation kernel, which was launched plainly: everything before that is
    // complete, so slot ids and cache rows may be read at once, and only the threads that read the prepared Q wait.
    if (q_img == nullptr) asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    // Producer state: rows a = pt/4 and b = a + 32 of each chunk, 16-B pieces part, part + 4, ... of each row.
    const int pt = t - 256, ra = (pt & 127) >> 2, rb = ra + 32, part = pt & 3, pw = warp & 3;
    int32_t sa = -1, sbb = -1;                                // slots of the chunk in flight
    int32_t na = -1, nb = -1;                                 // FP8: slots of the chunk after it (one more chunk ahead)
    float4 sca = make_float4(0.f, 0.f, 0.f, 0.f), scb = sca;  // FP8: tile scales of rows a, b of the chunk in flight
    const auto issue_first = [&] {  // the producer's first chunk: slot ids, then its rows into tile 0
        if (wgi == 2 && c_begin < c_end) {
            sa = tok_slots[c_begin * kChunk + ra];
            sbb = tok_slots[c_begin * kChunk + rb];
            if constexpr (kFp8) {
                if (c_begin + 1 < c_end) {
                    na = tok_slots[(c_begin + 1) * kChunk + ra];
                    nb = tok_slots[(c_begin + 1) * kChunk + rb];
                }
                if (pt == 0) {  // the producer's own barriers, initialised before its first copies
                    mbar_init(bar_staged, 128);  // rows 0..31: the cp.async arrivals
                    mbar_init(bar_staged + 8, 128);
                    mbar_init(bar_staged + 16, 160);  // rows 32..63: + the 32 bulk-copy issuers
                    mbar_init(bar_staged + 24, 160);
                    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
                }
                producer_sync();
                fp8_stage_issue(cache, sa, sbb, ra, rb, part, sb + kK0, bar_staged);
                sca = fp8_scales(cache, sa);
                scb = fp8_scales(cache, sbb);
            } else {
                bf16_issue(cache, sa, ra, part, sb + kK0);
                bf16_issue(cache, sbb, rb, part, sb + kK0);
                cp_async_commit();
            }
        }
    };
    // Q: fp32 → the swizzled Q tile, in one pass by all 384 threads: each thread loads its 12 16-B output chunks (24
    // float4, one round of loads) before converting any. BF16 caches: bf16. FP8 caches: the 512 latent dims in f16 (the
    // dequantised K/V are f16: 2 instructions per 2 codes instead of 6 for bf16) and the 64 RoPE dims in bf16 (k_pe is
    // stored bf16), every value times q_pow2 = 2^-e, the power of two that keeps the block's largest |q| at or below
    // 2^15 (e = 0 unless it is larger; f16 ends at 65504); the softmax scale takes 2^e back. At batch 1 every split's
    // CTA converts the same Q, so its latency is on the critical path: the earlier two passes (amax, then convert) by
    // the consumers alone took 4.9 µs of a 17.3-µs step (globaltimer phases,
    // bench/results/cuda-h200-2026-11-30-sparse_mla-phases.txt). With n_split > 1 the Q tile comes prepared instead
    // (q_img: sparse_mla_q_prep_kernel converted each token's Q once), with one bulk copy after the first barrier.
    float q_pow2_inv = 1.f;  // 2^e
    issue_first();  // before the loads of Q: issued after them, the slot ids waited behind Q (b128 +2%, b1 +0.3 µs)
    if (q_img == nullptr) {
        constexpr int kPer = kHeads * kRowChunks / kWsThreads;  // 12 output chunks per thread
        static_assert(kPer * kWsThreads == kHeads * kRowChunks);
        const float4* q = reinterpret_cast<const float4*>(p.q + (i * p.n_head + hg * kHeads) * kD);
        float4 v[2 * kPer];
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int e = t + kWsThreads * k, r = e / kRowChunks, c = e % kRowChunks;
            v[2 * k] = __ldg(q + r * (kD / 4) + 2 * c);
            v[2 * k + 1] = __ldg(q + r * (kD / 4) + 2 * c + 1);
        }
        float q_m = 1.f;
        if constexpr (kFp8) {
            float amax = 0.f;
#pragma unroll
            for (int k = 0; k < 2 * kPer; ++k)
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
            for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            if (lane == 0) sl[warp] = amax;  // sl is free until the epilogue
            __syncthreads();
#pragma unroll
            for (int w = 0; w < kWsThreads / 32; ++w) amax = fmaxf(amax, sl[w]);
            q_pow2(amax, q_m, q_pow2_inv);
        }
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int e = t + kWsThreads * k, r = e / kRowChunks, c = e % kRowChunks;
            // FP8 caches: latent dims (16-B chunks 0..63) in f16
            *reinterpret_cast<uint4*>(smem + kQ + tile_off(r, c)) =
                q_chunk(v[2 * k], v[2 * k + 1], q_m, kFp8 && c < 64);
        }
    }
    proxy_fence();                     // Q (generic stores) → wgmma (async proxy)
    __syncthreads();                   // Q tile and barrier initialisation visible to all
    if (q_img != nullptr && t == 0) {  // prepared Q: one bulk copy of its tile image once the preparation is done
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
        mbar_expect_tx(bar_q, kTile);
        bulk_load(sb + kQ, q_img + (i * n_hg + hg) * kTile, kTile, bar_q);
    }

    if (wgi == 2) {  // the producer's part ends here: it holds no output, and the consumers wait on its tiles
        setmaxnreg_dec<120>();
        for (int c = c_begin; c < c_end; ++c) {
            const int it = c - c_begin, buf = it & 1;
            // Chunk c's slot ids for the consumers, and whether this warp's rows have any valid slot.
            const auto publish = [&] {
                if (part == 0) {
                    sidx[buf * kChunk + ra] = sa;
                    sidx[buf * kChunk + rb] = sbb;
                }
                const unsigned any = __ballot_sync(0xffffffffu, sa >= 0 || sbb >= 0);
                if (lane == 0) sflags[buf * 4 + pw] = any != 0;
            };
            if constexpr (kFp8) {
                // Chunk c is in flight into tile buf (issued an iteration ago). Row a (0..31) then row b (32..63),
                // each once its half's codes have landed (staged mbarriers): the codes of dims 256..511 (pieces
                // 16..31, staged over blocks 4..7) go to registers and dims 0..255 are dequantised into blocks 0..3
                // straight from the staging; after a producer barrier (no one reads the staging any more) the saved
                // halves go to blocks 4..7. Piece order j' = j ^ (row & 1), see stage_off. The k_pe copies complete
                // on the barrier of rows 32..63.
                uint8_t* tile = smem + kK0 + buf * kTile;
                mbar_wait(bar_staged + 8 * buf, (it >> 1) & 1);  // rows 0..31 (rows 32..63 still land meanwhile)
                const int fa = ra & 1, fb = rb & 1;
                uint4 ha[4], hb[4];
#pragma unroll
                for (int j = 4; j < 8; ++j)
                    ha[j - 4] = *reinterpret_cast<const uint4*>(tile + stage_off(ra, part + 4 * (j ^ fa)));
                // piece pc = part + 4j: codes 16pc.. → bf16 chunks 2pc, 2pc+1 of the row; its scale is tile j/2
                auto put = [&](int row, int pc, const uint4& w, float scale) {
                    const __half2 sc = __float2half2_rn(scale);  // a power of two: exact in f16
                    uint4 lo, hi;
                    lo.x = fp8x2_to_f16x2(w.x, sc), lo.y = fp8x2_to_f16x2(w.x >> 16, sc);
                    lo.z = fp8x2_to_f16x2(w.y, sc), lo.w = fp8x2_to_f16x2(w.y >> 16, sc);
                    hi.x = fp8x2_to_f16x2(w.z, sc), hi.y = fp8x2_to_f16x2(w.z >> 16, sc);
                    hi.z = fp8x2_to_f16x2(w.w, sc), hi.w = fp8x2_to_f16x2(w.w >> 16, sc);
                    *reinterpret_cast<uint4*>(tile + tile_off(row, 2 * pc)) = lo;
                    *reinterpret_cast<uint4*>(tile + tile_off(row, 2 * pc + 1)) = hi;
                };
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int pa = part + 4 * (j ^ fa);
                    put(ra, pa, *reinterpret_cast<const uint4*>(tile + stage_off(ra, pa)),
                        (j ^ fa) < 2 ? sca.x : sca.y);
                }
                mbar_wait(bar_staged + 16 + 8 * buf, (it >> 1) & 1);  // rows 32..63 and k_pe
#pragma unroll
                for (int j = 4; j < 8; ++j)
                    hb[j - 4] = *reinterpret_cast<const uint4*>(tile + stage_off(rb, part + 4 * (j ^ fb)));
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int pb = part + 4 * (j ^ fb);
                    put(rb, pb, *reinterpret_cast<const uint4*>(tile + stage_off(rb, pb)),
                        (j ^ fb) < 2 ? scb.x : scb.y);
                }
                producer_sync();
#pragma unroll
                for (int j = 4; j < 8; ++j) {
                    put(ra, part + 4 * (j ^ fa), ha[j - 4], (j ^ fa) < 6 ? sca.z : sca.w);
                    put(rb, part + 4 * (j ^ fb), hb[j - 4], (j ^ fb) < 6 ? scb.z : scb.w);
                }
                publish();
                proxy_fence();
                mbar_arrive(bar_ready + 8 * buf);
                if (c + 1 < c_end) {  // chunk c+1 into the other tile once chunk c-1 has released it
                    if (it >= 1) mbar_wait(bar_free + 8 * (buf ^ 1), ((it - 1) >> 1) & 1);
                    sa = na;
                    sbb = nb;
                    fp8_stage_issue(cache, sa, sbb, ra, rb, part, sb + kK0 + (buf ^ 1) * kTile,
                                    bar_staged + 8 * (buf ^ 1));
                    sca = fp8_scales(cache, sa);
                    scb = fp8_scales(cache, sbb);
                    na = nb = -1;
                    if (c + 2 < c_end) {
                        na = tok_slots[(c + 2) * kChunk + ra];
                        nb = tok_slots[(c + 2) * kChunk + rb];
                    }
                }
            } else {
                // Chunk c is in flight into tile buf (issued an iteration ago): publish it, then issue chunk c+1
                // into the other tile once chunk c-1 has released it.
                publish();
                cp_async_wait_all();
                proxy_fence();
                mbar_arrive(bar_ready + 8 * buf);
                if (c + 1 < c_end) {
                    if (it >= 1) mbar_wait(bar_free + 8 * (buf ^ 1), ((it - 1) >> 1) & 1);
                    sa = tok_slots[(c + 1) * kChunk + ra];
                    sbb = tok_slots[(c + 1) * kChunk + rb];
                    const uint32_t nt = sb + kK0 + (buf ^ 1) * kTile;
                    bf16_issue(cache, sa, ra, part, nt);
                    bf16_issue(cache, sbb, rb, part, nt);
                    cp_async_commit();
                }
            }
        }
        if constexpr (kClustered) {  // the producer takes part in the cluster merge, with the pool's even share
            setmaxnreg_inc<168>();
            cluster_merge(
                MergeArgs{p.out, static_cast<float*>(p.scratch), p.n, p.n_head, n_split, p.plan.cluster, kFp8}, smem, i,
                hg, split, t);
        }
        return;
    }
    setmaxnreg_inc<192>();  // both consumers the same count: they share one code path (ptxas allocates per region)
    const int row0 = 16 * wi + g, row1 = row0 + 8;
    // Softmax scale (log2 domain) of rows row0 and row1, times the power of two Q was scaled by: one per 64-head block
    // when converted here, one per head when prepared (only WG0 runs the softmax).
    float scale_log2[2] = {p.scale * 1.4426950408889634f * q_pow2_inv, p.scale * 1.4426950408889634f * q_pow2_inv};
    if (q_img != nullptr && wgi == 0) {
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
        const float* qi = q_inv + i * p.n_head + hg * kHeads;
        scale_log2[0] = p.scale * 1.4426950408889634f * qi[row0];
        scale_log2[1] = p.scale * 1.4426950408889634f * qi[row1];
        mbar_wait(bar_q, 0);
    }
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float o[kO];
    {
#pragma unroll
        for (int a = 0; a < kO; ++a) o[a] = 0.f;
        for (int c = c_begin; c < c_end; ++c) {
            const int it = c - c_begin, buf = it & 1;
            const uint32_t kt = sb + kK0 + buf * kTile;
            mbar_wait(bar_ready + 8 * buf, (it >> 1) & 1);
            const int32_t* fl = sflags + buf * 4;
            const bool any = (fl[0] | fl[1] | fl[2] | fl[3]) != 0;
            if (wgi == 0) {
                float s[32];
                float alpha[2] = {1.f, 1.f};
                if (any) {
#pragma unroll
                    for (int a = 0; a < 32; ++a) s[a] = 0.f;
                    reg_fence(s);
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < kD / 16; ++kk) {
                        const uint32_t koff = (kk >> 2) * kBlk + (kk & 3) * 32;
                        if (kFp8 && kk < 32)  // latent dims in f16; the RoPE dims (kk 32..35) in bf16
                            wgmma_m64n64_ss_f16(s, desc(sb + kQ + koff, 16, 1024), desc(kt + koff, 16, 1024), 1);
                        else
                            wgmma_m64n64_ss(s, desc(sb + kQ + koff, 16, 1024), desc(kt + koff, 16, 1024), 1);
                    }
                    wg_commit();
                    wg_wait<0>();
                    reg_fence(s);
                    const int32_t* cidx = sidx + buf * kChunk;
                    float mloc[2] = {-INFINITY, -INFINITY};
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int col = 8 * j + 2 * qd;
                        const bool v0 = cidx[col] >= 0, v1 = cidx[col + 1] >= 0;
                        if (!v0) s[4 * j] = s[4 * j + 2] = -INFINITY;
                        if (!v1) s[4 * j + 1] = s[4 * j + 3] = -INFINITY;
                        mloc[0] = fmaxf(mloc[0], fmaxf(s[4 * j], s[4 * j + 1]));
                        mloc[1] = fmaxf(mloc[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
                    }
                    float mref[2];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        mloc[r] = fmaxf(mloc[r], __shfl_xor_sync(0xffffffffu, mloc[r], 1));
                        mloc[r] = fmaxf(mloc[r], __shfl_xor_sync(0xffffffffu, mloc[r], 2));
                        const float m_new = fmaxf(m_run[r], mloc[r]);
                        mref[r] = m_new == -INFINITY ? 0.f : m_new * scale_log2[r];
                        alpha[r] = exp2f(m_run[r] * scale_log2[r] - mref[r]);
                        m_run[r] = m_new;
                        l_run[r] *= alpha[r];
                    }
#pragma unroll
                    for (int j = 0; j < 32; ++j) {
                        s[j] = exp2f(fmaf(s[j], scale_log2[(j >> 1) & 1], -mref[(j >> 1) & 1]));
                        l_run[(j >> 1) & 1] += s[j];
                    }
                }
                if (it > 0) named_sync(kBarPFree);  // WG1 is done with the previous chunk's P and alpha
                if (any) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        *reinterpret_cast<uint32_t*>(smem + kP + row0 * 128 + ((j ^ (row0 & 7)) << 4) + 4 * qd) =
                            kFp8 ? pack_f16(s[4 * j], s[4 * j + 1]) : pack_bf16(s[4 * j], s[4 * j + 1]);
                        *reinterpret_cast<uint32_t*>(smem + kP + row1 * 128 + ((j ^ (row1 & 7)) << 4) + 4 * qd) =
                            kFp8 ? pack_f16(s[4 * j + 2], s[4 * j + 3]) : pack_bf16(s[4 * j + 2], s[4 * j + 3]);
                    }
                    if (qd == 0) {
                        salpha[row0] = alpha[0];
                        salpha[row1] = alpha[1];
                    }
                    proxy_fence();
                }
                named_arrive(kBarPReady);
                if (any) {
#pragma unroll
                    for (int j = 0; j < kO / 4; ++j) {
                        o[4 * j] *= alpha[0];
                        o[4 * j + 1] *= alpha[0];
                        o[4 * j + 2] *= alpha[1];
                        o[4 * j + 3] *= alpha[1];
                    }
                }
            } else {
                named_sync(kBarPReady);
                if (any) {
                    const float a0 = salpha[row0], a1 = salpha[row1];
#pragma unroll
                    for (int j = 0; j < kO / 4; ++j) {
                        o[4 * j] *= a0;
                        o[4 * j + 1] *= a0;
                        o[4 * j + 2] *= a1;
                        o[4 * j + 3] *= a1;
                    }
                }
            }
            if (any) {
                reg_fence(o);
                wg_fence();
                pv_chunk<kFp8, kVs>(o, sb + kP, kt + (v * (8 / kVs) + wgi * (4 / kVs)) * kBlk, v_lbo, v_sbo);
                wg_commit();
                wg_wait<0>();
                reg_fence(o);
            }
            if (wgi == 1 && c + 1 < c_end) named_arrive(kBarPFree);
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_free + 8 * buf);
        }
        if (wgi == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
                l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
            }
            if (qd == 0) {
                sl[row0] = l_run[0];
                sl[row1] = l_run[1];
            }
        }
    }
    named_sync(kBarEpilogue);  // sl complete; the tiles are free (every wgmma waited on, the producer is done)
    // Partials through scratch are f16 for FP8 caches (see load_partial), fp32 otherwise; outputs are fp32.
    // (These two tests of p.plan.cluster stay run-time checks: folded into kClustered, the non-clustered FP8 kernel
    // measured 3% slower at b128, 116.7 against 113.0 µs, with the same register count and no spills.)
    const bool half_partial = kFp8 && n_split > 1 && p.plan.cluster == 1;
    {
        float* so = reinterpret_cast<float*>(smem);  // [64 heads][kOutStride] fp32 over the Q and K tiles
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r ? row1 : row0;
            const float l = sl[row];
            const float inv = l > 0.f ? 1.f / l : 0.f;
            if (n_split > 1 && wgi == 0 && qd == 0 && v == 0) {  // every v computes the same sum
                const float lse = l > 0.f ? m_run[r] * scale_log2[r] + log2f(l) : -INFINITY;
                if (p.plan.cluster > 1) {
                    reinterpret_cast<float*>(smem + kWsLse)[row] = lse;
                } else {
                    const int64_t h = static_cast<int64_t>(hg) * kHeads + row;
                    float* lse_out = static_cast<float*>(p.scratch) + p.n * n_split * p.n_head * kDv;
                    lse_out[(i * n_split + split) * p.n_head + h] = lse;
                }
            }
            // Columns of the CTA's kW value dims.
            if (half_partial) {
                __half* soh = reinterpret_cast<__half*>(smem);  // [64 heads][kOutStrideH] f16
#pragma unroll
                for (int j = 0; j < kO / 4; ++j) {
                    const int col = kN * wgi + 8 * j + 2 * qd;
                    *reinterpret_cast<__half2*>(soh + row * kOutStrideH + col) =
                        __floats2half2_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
                }
            } else {
#pragma unroll
                for (int j = 0; j < kO / 4; ++j) {
                    const int col = kN * wgi + 8 * j + 2 * qd;
                    *reinterpret_cast<float2*>(so + row * kOutStride + col) =
                        make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
                }
            }
        }
        proxy_fence();
    }
    if constexpr (kClustered) {  // o[] is dead: back to the even share of the register pool for the merge
        setmaxnreg_dec<168>();
        cluster_merge(MergeArgs{p.out, static_cast<float*>(p.scratch), p.n, p.n_head, n_split, p.plan.cluster, kFp8},
                      smem, i, hg, split, t);
        return;
    }
    named_sync(kBarEpilogue);
    if (t < kHeads) {
        const int64_t h = static_cast<int64_t>(hg) * kHeads + t, row = (i * n_split + split) * p.n_head + h;
        const int col0 = v * kW;
        if (half_partial)
            bulk_store(static_cast<__half*>(p.scratch) + row * kDv + col0,
                       smem_u32(reinterpret_cast<__half*>(smem) + t * kOutStrideH), kW * 2);
        else
            bulk_store((n_split == 1 ? p.out + (i * p.n_head + h) * kDv : static_cast<float*>(p.scratch) + row * kDv) +
                           col0,
                       smem_u32(reinterpret_cast<float*>(smem) + t * kOutStride), kW * 4);
    }
}
}  // namespace wg

// Q preparation for split runs (n_split > 1, where every split's CTA needs the same Q tile): one warp per (token,
// head) converts the fp32 row into the main kernel's swizzled shared-memory tile image (q_img, one 73,728-B image per
// token × 64-head block, copied by the main kernel with one bulk copy) and scales it by the power of two that keeps
// the row's largest |q| at or below 2^15 for f16 (FP8 caches), recording 2^e in q_inv for the softmax. Launched
// plainly; it lets the main kernel (under PDL) start at once and gather its rows meanwhile.
template <bool kFp8>
__global__ void __launch_bounds__(256)
    sparse_mla_q_prep_kernel(const float* q, int64_t n_rows, uint8_t* q_img, float* q_inv) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);  // i · n_head + head
    if (row >= n_rows) return;
    const float4* src = reinterpret_cast<const float4*>(q + row * kD);
    float4 v[6];  // 16-B output chunks lane, lane + 32 and (lanes 0..7) lane + 64, 2 float4 each
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        const int c = lane + 32 * k;
        v[2 * k] = c < kRowChunks ? __ldg(src + 2 * c) : make_float4(0.f, 0.f, 0.f, 0.f);
        v[2 * k + 1] = c < kRowChunks ? __ldg(src + 2 * c + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = 1.f, inv = 1.f;
    if constexpr (kFp8) {
        float amax = 0.f;
#pragma unroll
        for (int k = 0; k < 6; ++k)
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        q_pow2(amax, m, inv);
    }
    uint8_t* dst = q_img + (row / kHeads) * wg::kTile;
    const int r = static_cast<int>(row % kHeads);
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        const int c = lane + 32 * k;
        if (c >= kRowChunks) continue;
        *reinterpret_cast<uint4*>(dst + wg::tile_off(r, c)) = q_chunk(v[2 * k], v[2 * k + 1], m, kFp8 && c < 64);
    }
    if (lane == 0) q_inv[row] = inv;
}

// Merges the n_split normalised partials of each (token, head) by their log2-sum-exp. Two CTAs per (token, head), of
// 64 threads × 4 columns (at batch 1 that spreads the 4 MB of partials over 128 SMs instead of 64). Each
// thread reads the split weights itself (the same 4-B values across the CTA: L1 broadcasts) and merges 16 splits
// per round (kRound: 16, or 4 when n_split ≤ 4, which keeps the registers low and the occupancy high for the many
// CTAs of large batches) with all their loads in flight, so the kernel costs two dependent loads for 32 splits and
// no CTA barrier. (The first version staged the weights in shared memory behind two barriers and read 16 partials
// per round after them: 4.2 µs at batch 1 of a 17-µs step.)
// Partials are f16 for FP8 caches (the kernel's V and P are f16 there already, and |partial| ≤ max |V| fits f16; it
// halves the 128 KB each CTA writes, which the SM's write path bounds: 2.2 µs at batch 1) and fp32 for BF16 caches
// (bf16 V may exceed f16's range).
__device__ __forceinline__ float4 load_partial(const float* part, int64_t k) {  // float4 k
    return reinterpret_cast<const float4*>(part)[k];
}
__device__ __forceinline__ float4 load_partial(const __half* part, int64_t k) {
    const uint2 u = reinterpret_cast<const uint2*>(part)[k];
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

template <int kRound, typename PartialT>
__global__ void __launch_bounds__(64) sparse_mla_combine_kernel(const SparseMlaRunParams p) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");               // launched early (PDL): wait for the partials
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the next step's main kernel may start
    const int64_t ih = blockIdx.x / 2, i = ih / p.n_head, h = ih % p.n_head;
    const int n_split = p.plan.n_split, t = (blockIdx.x % 2) * 64 + threadIdx.x;  // float4 column of the row
    // The log2-sum-exps follow the partials' region, which is sized for fp32 partials either way.
    const float* lse =
        static_cast<const float*>(p.scratch) + p.n * n_split * p.n_head * kDv + i * n_split * p.n_head + h;
    const PartialT* part = static_cast<const PartialT*>(p.scratch);
    const int64_t src = (i * n_split * p.n_head + h) * (kDv / 4) + t;   // float4 index of split 0
    const int64_t stride = static_cast<int64_t>(p.n_head) * (kDv / 4);  // float4s between splits
    float m = -INFINITY, wsum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < n_split; s0 += kRound) {
        float l[kRound];
        float4 v[kRound];
#pragma unroll
        for (int k = 0; k < kRound; ++k) {
            const bool in = s0 + k < n_split;
            l[k] = in ? lse[(s0 + k) * p.n_head] : -INFINITY;
            v[k] = in ? load_partial(part, src + (s0 + k) * stride) : make_float4(0.f, 0.f, 0.f, 0.f);  // all written
        }
        float mc = m;
#pragma unroll
        for (int k = 0; k < kRound; ++k) mc = fmaxf(mc, l[k]);
        if (mc == -INFINITY) continue;  // no valid slot in any split so far
        const float r = exp2f(m - mc);  // 0 while m is −inf
        acc = make_float4(acc.x * r, acc.y * r, acc.z * r, acc.w * r);
        wsum *= r;
#pragma unroll
        for (int k = 0; k < kRound; ++k) {
            const float w = exp2f(l[k] - mc);
            acc.x += w * v[k].x;
            acc.y += w * v[k].y;
            acc.z += w * v[k].z;
            acc.w += w * v[k].w;
            wsum += w;
        }
        m = mc;
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    reinterpret_cast<float4*>(p.out + ih * kDv)[t] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

// The kernel's setmaxnreg split assumes ptxas gave it 168 registers (see its header); with any other count the
// consumers' request would never be granted and the kernel would hang, so it is refused instead.
bool registers_as_planned() {
    static const bool ok = [] {
        cudaFuncAttributes a{};
        for (auto kern : {wg::sparse_mla_ws_kernel<true, false, 1>, wg::sparse_mla_ws_kernel<false, false, 1>,
                          wg::sparse_mla_ws_kernel<true, true, 1>, wg::sparse_mla_ws_kernel<false, true, 1>,
                          wg::sparse_mla_ws_kernel<true, false, 2>, wg::sparse_mla_ws_kernel<false, false, 2>})
            if (cudaFuncGetAttributes(&a, kern) != cudaSuccess || a.numRegs != 168) return false;
        return true;
    }();
    return ok;
}

// Launches plainly, or with programmatic dependent launch when `pdl` (the combine: its CTAs may become resident
// while the main kernel runs; it executes griddepcontrol.wait before reading the partials).
template <class... KArgs, class... Args>
cudaError_t launch_kernel(void (*kern)(KArgs...), dim3 grid, int threads, size_t smem, cudaStream_t stream, bool pdl,
                          Args... args) {
    if (!pdl) {
        kern<<<grid, threads, smem, stream>>>(args...);
        return cudaGetLastError();
    }
    if (launch_ex(kern, grid, dim3(threads), smem, stream, true, args...) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();  // PDL refused: plain launch
    kern<<<grid, threads, smem, stream>>>(args...);
    return cudaGetLastError();
}

// The main kernel's attributes (dynamic shared memory, non-portable cluster sizes) are per (function, device): set
// once per device, before the cluster query and the first launch (not a stream operation: not captured in graphs).
cudaError_t configure_for_device() {
    return per_device_once([] {
        cudaError_t e = cudaSuccess;
        for (auto kern : {wg::sparse_mla_ws_kernel<true, false, 1>, wg::sparse_mla_ws_kernel<false, false, 1>,
                          wg::sparse_mla_ws_kernel<true, true, 1>, wg::sparse_mla_ws_kernel<false, true, 1>,
                          wg::sparse_mla_ws_kernel<true, false, 2>, wg::sparse_mla_ws_kernel<false, false, 2>}) {
            if (e == cudaSuccess)
                e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::kWsSmem);
            if (e == cudaSuccess) e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        }
        return e;
    });
}

// How many clusters of c CTAs (2, 4, 8, 16) of the main kernel the device holds at once (0 if it cannot run them):
// cluster 16 is non-portable (Hopper allows it), and a GPC must hold c CTAs of ~226 KB shared memory each.
int max_active_clusters(int c) {
    static std::atomic<int> cached[kMaxDevices][4] = {};  // per device, c = 2^(k+1); stored + 1 (0: not yet asked)
    int dev = 0, k = 0;
    while ((2 << k) < c) ++k;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices || k > 3) return 0;
    int v = cached[dev][k].load(std::memory_order_acquire);
    if (v != 0) return v - 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(c));
    cfg.blockDim = dim3(wg::kWsThreads);
    cfg.dynamicSmemBytes = wg::kWsSmem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(c);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, wg::sparse_mla_ws_kernel<true, true, 1>, &cfg) != cudaSuccess) n = 0;
    (void)cudaGetLastError();
    cached[dev][k].store(n + 1, std::memory_order_release);
    return n;
}

// The cluster size a launch of n_ctas CTAs uses: the plan's, halved until the device holds all of the grid's
// clusters at once (a second wave of clusters measured 1.6–1.7× slower: b16 at cluster 8, h128 b16 at cluster 4).
int effective_cluster(int cluster, int64_t n_ctas) {
    while (cluster > 1 && static_cast<int64_t>(max_active_clusters(cluster)) * cluster < n_ctas) cluster /= 2;
    return cluster;
}

// Scratch of a split run: the partials [n][n_split][n_head][512] and their log2-sum-exp [n][n_split][n_head] (fp32),
// then the prepared Q tile images [n][n_head / 64][73,728 B] and their per-head powers of two [n][n_head].
struct ScratchLayout {
    size_t img = 0, inv = 0, total = 0;  // byte offsets of the Q images and of q_inv; total size
};
ScratchLayout scratch_layout(int64_t n, int n_head, const SparseMlaPlan& plan) {
    ScratchLayout l;
    if (plan.n_split <= 1) return l;
    const size_t partials = static_cast<size_t>(n) * plan.n_split * n_head * (kDv + 1) * sizeof(float);
    l.img = (partials + 127) / 128 * 128;
    l.inv = l.img + static_cast<size_t>(n) * (n_head / kHeads) * wg::kTile;
    l.total = l.inv + static_cast<size_t>(n) * n_head * sizeof(float);
    return l;
}

template <bool kFp8>
cudaError_t launch_ws(const SparseMlaRunParams& p, unsigned grid, int cps, const uint8_t* q_img, const float* q_inv,
                      cudaStream_t stream) {
    const uint32_t lbo = 8192u, sbo = 1024u;  // V (MN-major) descriptor: 8-KB blocks of 64 dims, 8-row groups
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(wg::kWsThreads);
    cfg.dynamicSmemBytes = wg::kWsSmem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    cfg.attrs = attr;
    if (p.plan.cluster > 1) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[cfg.numAttrs].val.clusterDim.x = static_cast<unsigned>(p.plan.cluster);
        attr[cfg.numAttrs].val.clusterDim.y = 1;
        attr[cfg.numAttrs].val.clusterDim.z = 1;
        ++cfg.numAttrs;
    }
    if (q_img != nullptr) {  // behind the Q preparation (see the kernel's griddepcontrol.wait)
        attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
        ++cfg.numAttrs;
    }
    // The merge lives in its own instantiation: its call cost the other one 4% (FP8) and 10% (BF16) at b128 and in
    // prefill (register allocation around the call; A/B in bench/results/cuda-h200-2026-11-30-sparse_mla-ab.txt).
    if (p.plan.cluster > 1)
        return cudaLaunchKernelEx(&cfg, wg::sparse_mla_ws_kernel<kFp8, true, 1>, p, cps, lbo, sbo, q_img, q_inv);
    if (p.plan.v_split == 2)
        return cudaLaunchKernelEx(&cfg, wg::sparse_mla_ws_kernel<kFp8, false, 2>, p, cps, lbo, sbo, q_img, q_inv);
    return cudaLaunchKernelEx(&cfg, wg::sparse_mla_ws_kernel<kFp8, false, 1>, p, cps, lbo, sbo, q_img, q_inv);
}

// p.plan.cluster is the effective cluster size here (launch_sparse_mla reduced it to the device's).
cudaError_t launch_main(const SparseMlaRunParams& p, cudaStream_t stream) {
    const int n_chunks = p.topk / kChunk;
    const int cps = (n_chunks + p.plan.n_split - 1) / p.plan.n_split;
    // One CTA per (token, 64-head group, split, value slice), the slice then the split fastest (a cluster is
    // consecutive CTAs).
    const unsigned grid = static_cast<unsigned>(p.n * p.plan.n_split * (p.n_head / kHeads) * p.plan.v_split);
    if (!registers_as_planned()) return cudaErrorInvalidConfiguration;
    const bool fp8 = p.format == MlaCacheFormat::FP8;
    // One split: the kernel converts its Q itself, and is launched plainly (PDL behind whatever kernel came before,
    // measured at ec813d3, saved 0.4 us at b1 but cost 0.2-0.9 us at b16-b128 and ~6% in BF16 prefill).
    if (p.plan.n_split == 1)
        return fp8 ? launch_ws<true>(p, grid, cps, nullptr, nullptr, stream)
                   : launch_ws<false>(p, grid, cps, nullptr, nullptr, stream);
    // Splits: each token's Q is prepared once, and the main kernel starts under PDL while that runs.
    const ScratchLayout l = scratch_layout(p.n, p.n_head, p.plan);
    uint8_t* q_img = static_cast<uint8_t*>(p.scratch) + l.img;
    float* q_inv = reinterpret_cast<float*>(static_cast<uint8_t*>(p.scratch) + l.inv);
    const int64_t rows = p.n * p.n_head;
    const dim3 prep_grid(static_cast<unsigned>((rows + 7) / 8));
    if (fp8)
        sparse_mla_q_prep_kernel<true><<<prep_grid, 256, 0, stream>>>(p.q, rows, q_img, q_inv);
    else
        sparse_mla_q_prep_kernel<false><<<prep_grid, 256, 0, stream>>>(p.q, rows, q_img, q_inv);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return fp8 ? launch_ws<true>(p, grid, cps, q_img, q_inv, stream)
               : launch_ws<false>(p, grid, cps, q_img, q_inv, stream);
}

}  // namespace

bool sparse_mla_supported(int n_head, int topk) {
    return (n_head == 64 || n_head == 128) && topk > 0 && topk % kChunk == 0;
}

// Cluster merges pay only for two long splits: the merge reads the partner's 64 KB from its shared memory at
// ~25 GB/s (distributed shared memory is slow for bulk data: 3.5 µs at batch 1), which beats the combine kernel's
// trip through global memory at n_split 2 (b64: 69.4 against 73.6 µs), not at 8 (b16: 28.8 against 27.8) nor 32
// (b1: 14.6 against 12.7); clusters of 4–16 measured slower still (bench_sparse_mla sweep at fa55455, with f16
// partials: `bench/results/cuda-h200-2026-11-30-fa55455-sparse_mla-sweep.txt`).
constexpr int kPlanMaxSplitClustered = 2;

SparseMlaPlan sparse_mla_plan(int64_t n, int n_head, int topk, int n_sm) {
    SparseMlaPlan plan;
    const int64_t base = n * (n_head / kHeads);
    const int n_chunks = topk / kChunk;
    if (base <= 0 || n_chunks <= 0 || base * 2 > n_sm) return plan;
    int want = static_cast<int>(n_sm / base);
    if (want > n_chunks) want = n_chunks;
    const int cps = (n_chunks + want - 1) / want;
    plan.n_split = (n_chunks + cps - 1) / cps;  // no empty splits
    if (plan.n_split % 2 == 0 && plan.n_split <= kPlanMaxSplitClustered) plan.cluster = 2;
    // A split grid filling at most a quarter of the SMs (batch 1, 64 heads: 32 CTAs) divides the value dims over two
    // CTAs per split. Measured (20a9e15, FP8, bench_sparse_mla "vsplit" rows): b1 h 64 12.4 → 11.8-11.9 µs with
    // 2, 13.4 with 4; grids of 64 CTAs slower with 2 (b2 h 64 13.0 → 14.1, b1 h 128 12.8 → 13.9).
    if (plan.cluster == 1 && base * plan.n_split * 4 <= n_sm) plan.v_split = 2;
    return plan;
}

int sparse_mla_launch_cluster(int64_t n, int n_head, const SparseMlaPlan& plan) {
    if (configure_for_device() != cudaSuccess) return 1;
    return effective_cluster(plan.cluster, n * plan.n_split * (n_head / kHeads));
}

size_t sparse_mla_scratch_bytes(int64_t n, int n_head, const SparseMlaPlan& plan) {
    return scratch_layout(n, n_head, plan).total;
}

cudaError_t launch_sparse_mla(const SparseMlaRunParams& p, cudaStream_t stream) {
    if (!sparse_mla_supported(p.n_head, p.topk) || p.n < 0 || p.plan.n_split < 1 || !p.q || !p.cache || !p.slots ||
        !p.out || (p.plan.n_split > 1 && !p.scratch))
        return cudaErrorInvalidValue;
    if (p.n == 0) return cudaSuccess;
    const int c = p.plan.cluster;
    if (c < 1 || c > 16 || (c & (c - 1)) != 0 || p.plan.n_split % c != 0) return cudaErrorInvalidValue;
    const int vs = p.plan.v_split;
    if ((vs != 1 && vs != 2) || (vs > 1 && c > 1)) return cudaErrorInvalidValue;
    const cudaError_t cfg_err = configure_for_device();
    if (cfg_err != cudaSuccess) return cfg_err;
    SparseMlaRunParams q = p;
    q.plan.cluster = effective_cluster(p.plan.cluster, p.n * p.plan.n_split * (p.n_head / kHeads));
    const cudaError_t e = launch_main(q, stream);
    if (e != cudaSuccess || q.plan.n_split == q.plan.cluster) return e;
    q.plan.n_split /= q.plan.cluster;  // the combine merges the clusters' partials
    q.plan.cluster = 1;
    // The combine's CTAs start while the main kernel runs and wait on it (griddepcontrol.wait), which takes the
    // second launch's latency off the critical path (kept in CUDA graphs).
    const dim3 grid(static_cast<unsigned>(q.n * q.n_head * 2));
    if (q.format == MlaCacheFormat::FP8)
        return q.plan.n_split <= 4 ? launch_kernel(sparse_mla_combine_kernel<4, __half>, grid, 64, 0, stream, true, q)
                                   : launch_kernel(sparse_mla_combine_kernel<16, __half>, grid, 64, 0, stream, true, q);
    return q.plan.n_split <= 4 ? launch_kernel(sparse_mla_combine_kernel<4, float>, grid, 64, 0, stream, true, q)
                               : launch_kernel(sparse_mla_combine_kernel<16, float>, grid, 64, 0, stream, true, q);
}

}  // namespace megactx::cuda
