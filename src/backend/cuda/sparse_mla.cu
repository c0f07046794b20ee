// sparse_mla kernels (contract in sparse_mla.h; model-spec §2.5, FlashMLA "MQA mode" semantics).
// Computes, per token i and head h, out[i,h,:] = Σ_j softmax_j(scale · q[i,h,:]·K[s_j,:]) · K[s_j, 0:512] over the
// token's selected slots s_j = slots[i, j] (−1 = unused, skipped); shapes q [n, n_head, 576] fp32,
// cache BF16 [n_slots, 576] or FP8 [n_slots, 656 B], slots [n, topk] int32, out [n, n_head, 512] fp32.
//
// One CTA = one token × 64 heads × a contiguous range of 64-slot chunks (the split, planned on the host); the grid
// is 1-D with the head group fastest (the two CTAs of a 128-head token gather the same rows together: L2 hits).
// One sm_90a kernel, warp-specialised (three warpgroups and mbarriers; header above sparse_mla_ws_kernel), with Q
// and two K tiles in shared memory: bf16 for BF16 caches; for FP8 caches f16 latent dims (e4m3 → f16 and the pow2
// tile scale are exact, 2 instructions per 2 codes against 6 for bf16, which made the dequantisation the bound) and
// bf16 RoPE dims (k_pe is stored bf16), so Q·Kᵀ mixes f16 and bf16 k-steps into one fp32 accumulator.
// History (docs/benchmarks.md): a first mma.sync kernel, then a two-warpgroup wgmma kernel between CTA barriers (FP8
// b128 164 µs), both removed in session 4 when this one beat them in every case measured (FP8 b128 131 µs with bf16
// K/V, 112 µs with f16; bench/results/cuda-h200-2026-11-29-{7dc0362,2fcc044}-sparse_mla*).
// The combine is launched with programmatic dependent launch; the main kernel executes griddepcontrol.wait before
// any global access (a no-op in its plain launch; PDL for it measured no better).
// Softmax online in fp32 (exp2 domain), P stored as bf16 (f16 for FP8 caches) for the P·V product; unused slots are
// masked to −inf and chunks with no valid slot are skipped.
// n_split > 1: each CTA writes its normalised partial output and log2-sum-exp to scratch; a combine kernel merges.
// Epilogue: the normalised [64 heads × 512] fp32 rows are staged in shared memory and leave with one bulk async
// copy per head (cp.async.bulk; in the two-warpgroup kernel it took b1 from 24.4 to 17.1 µs: direct stores from the
// accumulator layout held the LSU queue full).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "backend/cuda/launch_ex.cuh"
#include "backend/cuda/per_device.cuh"
#include "backend/cuda/sparse_mla.h"

namespace megactx::cuda {
namespace {

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
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) asm volatile("" : "+f"(r[k])::"memory");
}
// Output staging row stride (floats): 512 + 8, so the 8 rows a warp stores at once fall on different banks.
constexpr int kOutStride = kDv + 8;
static_assert(kHeads * kOutStride * 4 <= 3 * kTile);
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
//   WG2 (producer): fills the two K tiles in turn, one chunk ahead: rows stream in with cp.async into the tile as
//       soon as both consumers released it (BF16: in place; FP8: staged codes in the tile's upper half, then
//       dequantised over the whole tile, stage_off below). It holds no accumulators, so setmaxnreg moves its
//       registers to the consumers: 168 at launch (384 threads), 120 for the producer, 192 for each consumer. The
//       CTA's register pool is fixed at launch, so what the consumers add must equal what the producer releases
//       ((168 - 120) = 2 · (192 - 168)); an unbalanced request never completes and the kernel hangs.
// Barriers: k_ready[b] (mbarrier, 128 producer arrivals, tile b and its slot ids written), k_free[b] (mbarrier, one
// arrival per consumer warp, 8), named barriers kBarP ready / free between WG0 and WG1 (256 threads). A chunk whose
// 64 slots are all unused is skipped by both consumers (per-warp valid flags from the producer).
constexpr int kWsThreads = 384;
constexpr int kWsFlags = kIdx + 2 * 64 * 4;   // [2 tiles][4 producer warps] int32
constexpr int kWsRed = kWsFlags + 2 * 4 * 4;  // alpha [64], l [64]
constexpr int kWsBar = kWsRed + 2 * 64 * 4;   // k_ready[2], k_free[2] (8 B each)
constexpr int kWsSmem = kWsBar + 4 * 8 + 1024;
static_assert(kWsSmem <= 232448);
constexpr int kBarPReady = 1, kBarPFree = 2, kBarEpilogue = 3;  // consumer named barriers (0: __syncthreads)

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// FP8 producer staging: chunk c's raw rows stream in with cp.async into tile c%2 itself, the e4m3 codes (512 B
// per row, 16-B pieces XOR-swizzled by row) over blocks 4..7 and k_pe straight to its place in block 8; the tile
// scales go to registers. Nothing waits in registers for a whole chunk, so the producer needs no large arrays.
__device__ __forceinline__ uint32_t stage_off(int row, int piece) {  // piece 0..31 of the codes of `row`
    return static_cast<uint32_t>(4 * kBlk + row * 512 + ((piece ^ (row & 7)) << 4));
}
__device__ __forceinline__ void fp8_stage_issue(const uint8_t* cache, int32_t slot, int row, int part, uint32_t tile) {
    const uint8_t* src = cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kFp8RowBytes;
#pragma unroll
    for (int j = 0; j < 8; ++j) cp_async16(tile + stage_off(row, part + 4 * j), src + (part + 4 * j) * 16, slot >= 0);
#pragma unroll
    for (int j = 0; j < 2; ++j)  // k_pe: bf16 chunks 64..71 of the tile row
        cp_async16(tile + tile_off(row, 64 + part + 4 * j), src + 528 + (part + 4 * j) * 16, slot >= 0);
}
__device__ __forceinline__ float4 fp8_scales(const uint8_t* cache, int32_t slot) {
    return __ldg(
        reinterpret_cast<const float4*>(cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kFp8RowBytes + 512));
}
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 4, 128;\n" ::: "memory"); }

template <bool kFp8>
__global__ void __launch_bounds__(kWsThreads, 1)
    sparse_mla_ws_kernel(const SparseMlaRunParams p, int chunks_per_split, uint32_t v_lbo, uint32_t v_sbo) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const uint32_t sb = smem_u32(smem);
    const int n_split = p.plan.n_split;
    const int n_hg = p.n_head / kHeads;  // head groups vary fastest: both 64-head CTAs of a token run together
    const int64_t i = blockIdx.x / (n_split * n_hg);
    const int split = (blockIdx.x / n_hg) % n_split, hg = blockIdx.x % n_hg;
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
    if (t == 0) {
        mbar_init(bar_ready, 128);
        mbar_init(bar_ready + 8, 128);
        mbar_init(bar_free, 8);
        mbar_init(bar_free + 8, 8);
    }
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // under PDL: the previous kernel's writes are visible
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    // Producer state: rows a = pt/4 and b = a + 32 of each chunk, 16-B pieces part, part + 4, ... of each row.
    const int pt = t - 256, ra = (pt & 127) >> 2, rb = ra + 32, part = pt & 3, pw = warp & 3;
    int32_t sa = -1, sbb = -1;                                // slots of the chunk in flight
    int32_t na = -1, nb = -1;                                 // FP8: slots of the chunk after it (one more chunk ahead)
    float4 sca = make_float4(0.f, 0.f, 0.f, 0.f), scb = sca;  // FP8: tile scales of rows a, b of the chunk in flight
    if (wgi == 2 && c_begin < c_end) {
        sa = tok_slots[c_begin * kChunk + ra];
        sbb = tok_slots[c_begin * kChunk + rb];
        if constexpr (kFp8) {
            if (c_begin + 1 < c_end) {
                na = tok_slots[(c_begin + 1) * kChunk + ra];
                nb = tok_slots[(c_begin + 1) * kChunk + rb];
            }
            fp8_stage_issue(cache, sa, ra, part, sb + kK0);  // while the consumers convert Q
            fp8_stage_issue(cache, sbb, rb, part, sb + kK0);
            cp_async_commit();
            sca = fp8_scales(cache, sa);
            scb = fp8_scales(cache, sbb);
        } else {
            bf16_issue(cache, sa, ra, part, sb + kK0);
            bf16_issue(cache, sbb, rb, part, sb + kK0);
            cp_async_commit();
        }
    }
    // Q: fp32 → the swizzled Q tile by the consumers, 2 × 9 16-B chunks per thread. BF16 caches: bf16. FP8 caches:
    // the 512 latent dims in f16 (the dequantised K/V are f16: 2 instructions per 2 codes instead of 6 for bf16) and
    // the 64 RoPE dims in bf16 (k_pe is stored bf16), every value times q_pow2 = 2^-e, the power of two that keeps
    // the block's largest |q| at or below 2^15 (e = 0 unless it is larger; f16 ends at 65504); the softmax scale
    // takes 2^e back. The block's amax costs a second read of Q, ~0.8 µs at batch 1. Measured slower: flagging the
    // overflow during the conversion with a rare second conversion (registers: 120 against 112 µs at b128), and the
    // producer finding the amax meanwhile (18.7 against 17.3 µs at b1).
    float q_pow2_inv = 1.f;  // 2^e
    if (wgi < 2) {
        const float4* q = reinterpret_cast<const float4*>(p.q + (i * p.n_head + hg * kHeads) * kD);
        float q_pow2 = 1.f;
        if constexpr (kFp8) {
            float amax = 0.f;
#pragma unroll 6
            for (int k = 0; k < 36; ++k) {
                const float4 v = __ldg(q + t + 256 * k);
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
            }
            for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            if (lane == 0) sl[warp] = amax;  // sl is free until the epilogue
            named_sync(kBarEpilogue);
#pragma unroll
            for (int w = 0; w < 8; ++w) amax = fmaxf(amax, sl[w]);
            if (amax > 32768.f) {
                int e = 0;
                frexpf(amax / 32768.f, &e);  // amax / 2^15 <= 2^e
                e = min(e, 120);
                q_pow2 = ldexpf(1.f, -e);
                q_pow2_inv = ldexpf(1.f, e);
            }
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            float4 v[18];
#pragma unroll
            for (int k = 0; k < 9; ++k) {
                const int e = t + 256 * (9 * b + k), r = e / kRowChunks, c = e % kRowChunks;
                v[2 * k] = __ldg(q + r * (kD / 4) + 2 * c);
                v[2 * k + 1] = __ldg(q + r * (kD / 4) + 2 * c + 1);
            }
#pragma unroll
            for (int k = 0; k < 9; ++k) {
                const int e = t + 256 * (9 * b + k), r = e / kRowChunks, c = e % kRowChunks;
                const float4 a = v[2 * k], d = v[2 * k + 1];
                const float m = q_pow2;
                const bool f16 = kFp8 && c < 64;  // FP8 caches: latent dims (16-B chunks 0..63) in f16
                uint4 w;
                w.x = f16 ? pack_f16(a.x * m, a.y * m) : pack_bf16(a.x * m, a.y * m);
                w.y = f16 ? pack_f16(a.z * m, a.w * m) : pack_bf16(a.z * m, a.w * m);
                w.z = f16 ? pack_f16(d.x * m, d.y * m) : pack_bf16(d.x * m, d.y * m);
                w.w = f16 ? pack_f16(d.z * m, d.w * m) : pack_bf16(d.z * m, d.w * m);
                *reinterpret_cast<uint4*>(smem + kQ + tile_off(r, c)) = w;
            }
        }
    }
    proxy_fence();    // Q (generic stores) → wgmma (async proxy)
    __syncthreads();  // Q tile and barrier initialisation visible to all

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
                // Chunk c is in flight into tile buf (issued an iteration ago). Once every producer's pieces have
                // landed: the codes of dims 256..511 (pieces 16..31, staged over blocks 4..7) go to registers and
                // dims 0..255 are dequantised into blocks 0..3 straight from the staging; after a producer barrier
                // (no one reads the staging any more) the saved half goes to blocks 4..7.
                uint8_t* tile = smem + kK0 + buf * kTile;
                cp_async_wait_all();
                producer_sync();
                uint4 ha[4], hb[4];
#pragma unroll
                for (int j = 4; j < 8; ++j) {
                    ha[j - 4] = *reinterpret_cast<const uint4*>(tile + stage_off(ra, part + 4 * j));
                    hb[j - 4] = *reinterpret_cast<const uint4*>(tile + stage_off(rb, part + 4 * j));
                }
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
                    const int pc = part + 4 * j;
                    put(ra, pc, *reinterpret_cast<const uint4*>(tile + stage_off(ra, pc)), j < 2 ? sca.x : sca.y);
                    put(rb, pc, *reinterpret_cast<const uint4*>(tile + stage_off(rb, pc)), j < 2 ? scb.x : scb.y);
                }
                producer_sync();
#pragma unroll
                for (int j = 4; j < 8; ++j) {
                    put(ra, part + 4 * j, ha[j - 4], j < 6 ? sca.z : sca.w);
                    put(rb, part + 4 * j, hb[j - 4], j < 6 ? scb.z : scb.w);
                }
                publish();
                proxy_fence();
                mbar_arrive(bar_ready + 8 * buf);
                if (c + 1 < c_end) {  // chunk c+1 into the other tile once chunk c-1 has released it
                    if (it >= 1) mbar_wait(bar_free + 8 * (buf ^ 1), ((it - 1) >> 1) & 1);
                    sa = na;
                    sbb = nb;
                    const uint32_t nt = sb + kK0 + (buf ^ 1) * kTile;
                    fp8_stage_issue(cache, sa, ra, part, nt);
                    fp8_stage_issue(cache, sbb, rb, part, nt);
                    cp_async_commit();
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
        return;
    }
    setmaxnreg_inc<192>();  // both consumers the same count: they share one code path (ptxas allocates per region)
    const float scale_log2 = p.scale * 1.4426950408889634f * q_pow2_inv;
    const int row0 = 16 * wi + g, row1 = row0 + 8;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float o[128];
    {
#pragma unroll
        for (int a = 0; a < 128; ++a) o[a] = 0.f;
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
                    fence();
#pragma unroll
                    for (int kk = 0; kk < kD / 16; ++kk) {
                        const uint32_t koff = (kk >> 2) * kBlk + (kk & 3) * 32;
                        if (kFp8 && kk < 32)  // latent dims in f16; the RoPE dims (kk 32..35) in bf16
                            wgmma_m64n64_ss_f16(s, desc(sb + kQ + koff, 16, 1024), desc(kt + koff, 16, 1024), 1);
                        else
                            wgmma_m64n64_ss(s, desc(sb + kQ + koff, 16, 1024), desc(kt + koff, 16, 1024), 1);
                    }
                    commit();
                    wait0();
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
                        mref[r] = m_new == -INFINITY ? 0.f : m_new * scale_log2;
                        alpha[r] = exp2f(m_run[r] * scale_log2 - mref[r]);
                        m_run[r] = m_new;
                        l_run[r] *= alpha[r];
                    }
#pragma unroll
                    for (int j = 0; j < 32; ++j) {
                        s[j] = exp2f(fmaf(s[j], scale_log2, -mref[(j >> 1) & 1]));
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
                    for (int j = 0; j < 32; ++j) {
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
                    for (int j = 0; j < 32; ++j) {
                        o[4 * j] *= a0;
                        o[4 * j + 1] *= a0;
                        o[4 * j + 2] *= a1;
                        o[4 * j + 3] *= a1;
                    }
                }
            }
            if (any) {
                reg_fence(o);
                fence();
#pragma unroll
                for (int ks = 0; ks < kChunk / 16; ++ks)
                    if constexpr (kFp8)
                        wgmma_m64n256_ss_tb_f16(o, desc(sb + kP + ks * 32, 16, 1024),
                                                desc(kt + wgi * 4 * kBlk + ks * 16 * 128, v_lbo, v_sbo), 1);
                    else
                        wgmma_m64n256_ss_tb(o, desc(sb + kP + ks * 32, 16, 1024),
                                            desc(kt + wgi * 4 * kBlk + ks * 16 * 128, v_lbo, v_sbo), 1);
                commit();
                wait0();
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
    {
        float* so = reinterpret_cast<float*>(smem);  // [64 heads][kOutStride] fp32 over the Q and K tiles
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r ? row1 : row0;
            const float l = sl[row];
            const float inv = l > 0.f ? 1.f / l : 0.f;
            if (n_split > 1 && wgi == 0 && qd == 0) {
                const int64_t h = static_cast<int64_t>(hg) * kHeads + row;
                float* lse = static_cast<float*>(p.scratch) + p.n * n_split * p.n_head * kDv;
                lse[(i * n_split + split) * p.n_head + h] = l > 0.f ? m_run[r] * scale_log2 + log2f(l) : -INFINITY;
            }
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const int col = 256 * wgi + 8 * j + 2 * qd;
                *reinterpret_cast<float2*>(so + row * kOutStride + col) =
                    make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
            }
        }
        proxy_fence();
    }
    named_sync(kBarEpilogue);
    if (t < kHeads) {
        const int64_t h = static_cast<int64_t>(hg) * kHeads + t;
        float* dst = n_split == 1 ? p.out + (i * p.n_head + h) * kDv
                                  : static_cast<float*>(p.scratch) + ((i * n_split + split) * p.n_head + h) * kDv;
        bulk_store(dst, smem_u32(reinterpret_cast<float*>(smem) + t * kOutStride), kDv * 4);
    }
}
}  // namespace wg

// Merges the n_split normalised partials of each (token, head) by their log2-sum-exp. 128 threads × 4 columns.
// The split weights are computed once into shared memory ([n_split] floats, dynamic) and the partial rows are read
// with unrolled independent loads (the loop is latency-bound otherwise).
__global__ void __launch_bounds__(128) sparse_mla_combine_kernel(const SparseMlaRunParams p) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");               // launched early (PDL): wait for the partials
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the next step's main kernel may start
    extern __shared__ float sw[];                                      // [n_split]
    __shared__ float sred[4];
    const int64_t ih = blockIdx.x, i = ih / p.n_head, h = ih % p.n_head;
    const int n_split = p.plan.n_split, t = threadIdx.x;
    const float* part = static_cast<const float*>(p.scratch);
    const float* lse = part + p.n * n_split * p.n_head * kDv;
    float m = -INFINITY;
    for (int s = t; s < n_split; s += 128) {
        const float v = lse[(i * n_split + s) * p.n_head + h];
        sw[s] = v;
        m = fmaxf(m, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((t & 31) == 0) sred[t >> 5] = m;
    __syncthreads();
    m = fmaxf(fmaxf(sred[0], sred[1]), fmaxf(sred[2], sred[3]));
    for (int s = t; s < n_split; s += 128) sw[s] = m == -INFINITY ? 0.f : exp2f(sw[s] - m);
    __syncthreads();
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    const float4* src = reinterpret_cast<const float4*>(part + (i * n_split * p.n_head + h) * kDv) + t;
    const int64_t stride = static_cast<int64_t>(p.n_head) * (kDv / 4);  // float4s between splits
#pragma unroll 16
    for (int s = 0; s < n_split; ++s) {
        const float w = sw[s];
        const float4 v = src[s * stride];  // written by every split (zeros when it had no valid slot)
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
        wsum += w;
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    reinterpret_cast<float4*>(p.out + ih * kDv)[t] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

// The kernel's setmaxnreg split assumes ptxas gave it 168 registers (see its header); with any other count the
// consumers' request would never be granted and the kernel would hang, so it is refused instead.
bool registers_as_planned() {
    static const bool ok = [] {
        cudaFuncAttributes a{}, b{};
        return cudaFuncGetAttributes(&a, wg::sparse_mla_ws_kernel<true>) == cudaSuccess &&
               cudaFuncGetAttributes(&b, wg::sparse_mla_ws_kernel<false>) == cudaSuccess && a.numRegs == 168 &&
               b.numRegs == 168;
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

cudaError_t launch_main(const SparseMlaRunParams& p, cudaStream_t stream) {
    const int n_chunks = p.topk / kChunk;
    const int cps = (n_chunks + p.plan.n_split - 1) / p.plan.n_split;
    // One CTA per (token, split, 64-head group), the head group fastest: the two CTAs of a 128-head token gather
    // the same rows at the same time, so the second read hits L2.
    const dim3 grid(static_cast<unsigned>(p.n * p.plan.n_split * (p.n_head / kHeads)));
    const bool fp8 = p.format == MlaCacheFormat::FP8;
    const uint32_t lbo = 8192u, sbo = 1024u;  // V (MN-major) descriptor: 8-KB blocks of 64 dims, 8-row groups
    // The attribute is per (function, device); set once per device (not a stream operation: not captured in graphs).
    const cudaError_t cfg_err = per_device_once([] {
        cudaError_t e = cudaFuncSetAttribute(wg::sparse_mla_ws_kernel<true>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, wg::kWsSmem);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wg::sparse_mla_ws_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     wg::kWsSmem);
        return e;
    });
    if (cfg_err != cudaSuccess) return cfg_err;
    if (!registers_as_planned()) return cudaErrorInvalidConfiguration;
    // Plain launch. PDL on the main kernel (measured at ec813d3) saved 0.4 us at b1 but cost 0.2-0.9 us at b16-b128
    // and ~6% in BF16 prefill; the maximum shared carveout changed nothing.
    return fp8 ? launch_kernel(wg::sparse_mla_ws_kernel<true>, grid, wg::kWsThreads, wg::kWsSmem, stream, false, p, cps,
                               lbo, sbo)
               : launch_kernel(wg::sparse_mla_ws_kernel<false>, grid, wg::kWsThreads, wg::kWsSmem, stream, false, p,
                               cps, lbo, sbo);
}

}  // namespace

bool sparse_mla_supported(int n_head, int topk) {
    return (n_head == 64 || n_head == 128) && topk > 0 && topk % kChunk == 0;
}

SparseMlaPlan sparse_mla_plan(int64_t n, int n_head, int topk, int n_sm) {
    SparseMlaPlan plan;
    const int64_t base = n * (n_head / kHeads);
    const int n_chunks = topk / kChunk;
    if (base <= 0 || n_chunks <= 0 || base * 2 > n_sm) return plan;
    int want = static_cast<int>(n_sm / base);
    if (want > n_chunks) want = n_chunks;
    const int cps = (n_chunks + want - 1) / want;
    plan.n_split = (n_chunks + cps - 1) / cps;  // no empty splits
    return plan;
}

size_t sparse_mla_scratch_bytes(int64_t n, int n_head, const SparseMlaPlan& plan) {
    if (plan.n_split <= 1) return 0;
    return static_cast<size_t>(n) * plan.n_split * n_head * (kDv + 1) * sizeof(float);
}

cudaError_t launch_sparse_mla(const SparseMlaRunParams& p, cudaStream_t stream) {
    if (!sparse_mla_supported(p.n_head, p.topk) || p.n < 0 || p.plan.n_split < 1 || !p.q || !p.cache || !p.slots ||
        !p.out || (p.plan.n_split > 1 && !p.scratch))
        return cudaErrorInvalidValue;
    if (p.n == 0) return cudaSuccess;
    const cudaError_t e = launch_main(p, stream);
    if (e != cudaSuccess || p.plan.n_split == 1) return e;
    // The combine's CTAs start while the main kernel runs and wait on it (griddepcontrol.wait), which takes the
    // second launch's latency off the critical path (kept in CUDA graphs).
    return launch_kernel(sparse_mla_combine_kernel, dim3(static_cast<unsigned>(p.n * p.n_head)), 128,
                         static_cast<size_t>(p.plan.n_split) * sizeof(float), stream, true, p);
}

}  // namespace megactx::cuda
