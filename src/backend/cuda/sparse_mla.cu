// sparse_mla kernels (contract in sparse_mla.h; model-spec §2.5, FlashMLA "MQA mode" semantics).
// Computes, per token i and head h, out[i,h,:] = Σ_j softmax_j(scale · q[i,h,:]·K[s_j,:]) · K[s_j, 0:512] over the
// token's selected slots s_j = slots[i, j] (−1 = unused, skipped); shapes q [n, n_head, 576] fp32,
// cache BF16 [n_slots, 576] or FP8 [n_slots, 656 B], slots [n, topk] int32, out [n, n_head, 512] fp32.
//
// One CTA = one token × 64 heads × a contiguous range of 64-slot chunks (the split, planned on the host); the grid
// is 1-D with the head group fastest (the two CTAs of a 128-head token gather the same rows together: L2 hits).
// Two main kernels with the same contract, selected once per process by MEGACTX_SPARSE_MLA_IMPL (measurement
// switch; both pass tests/cuda/test_sparse_mla.cpp on the H200):
//   default  sparse_mla_wgmma2_kernel (sm_90a wgmma; warpgroup 0: QK m64n64 + softmax, warpgroup 1: gather +
//            FP8 dequant of the next chunk; both: PV m64n256 with V read MN-major from the same tile),
//   "m"      sparse_mla_kernel below (mma.sync, the first version).
// The combine is launched with programmatic dependent launch; the main kernels execute griddepcontrol.wait before
// any global access (a no-op in their plain launches; PDL for them measured no better). Measured (bench/results/cuda-h200-2026-11-29-ec813d3-sparse_mla.json): a
// cp.async ring variant for FP8 (dequant by all threads) was 3-7% slower and was removed: the FP8 → bf16
// conversions (cvt: 16/clk/SM on sm_90) cost about as much as the whole BF16 chunk, whichever threads do them.
// sparse_mla_kernel ("m"): 8 warps: warp w owns head rows 16·(w%4).. and, for QK, slot columns 32·(w/4).. of the 64×64 score tile; for PV,
// output columns 256·(w/4).. (128 fp32 accumulators per thread). Q is converted fp32 → bf16 into shared memory once
// per CTA (this is the query conversion: no pre-kernel). Both products use mma.sync m16n8k16 bf16 → fp32 with
// ldmatrix from XOR-swizzled shared memory; online softmax in fp32 (exp2 domain), row max exchanged between the two
// warps of a row through shared memory, P stored as bf16 for the PV product.
// BF16 cache: the next chunk's rows stream in with cp.async (double buffer) while the current one is computed.
// FP8 cache: the next chunk's raw 656-B rows stream in with cp.async into a staging buffer; each chunk is
// dequantised (e4m3 · pow2 tile scale is exact in bf16, k_pe copied) into the bf16 tile before its products.
// Unused slots are zero-filled and masked to −inf; chunks with no valid slot are skipped.
// n_split > 1: each CTA writes its normalised partial output and log2-sum-exp to scratch; a combine kernel merges.
// wgmma kernel epilogue: the normalised [64 heads × 512] fp32 rows are staged in shared memory and leave with one
// bulk async copy per head (cp.async.bulk): 24.4 → 17.1 µs at batch 1, 172 → 163 µs at 128 (FP8, h 64), BF16
// prefill 381 → 445 TFLOP/s. An L2 bulk prefetch of the FP8 rows two chunks ahead was measured and dropped (no
// gain at batch 1, 4-9% slower at 64-128). bench/results/cuda-h200-2026-11-29-*-sparse_mla-epilogue.txt.
#include "backend/cuda/sparse_mla.h"
#include "backend/cuda/per_device.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdlib>

namespace megactx::cuda {
namespace {

constexpr int kD = 576, kDv = 512, kHeads = 64, kChunk = 64, kThreads = 256;
constexpr int kRowBytes = kD * 2;          // bf16 row in shared memory: 72 chunks of 16 B
constexpr int kRowChunks = kRowBytes / 16; // 72
constexpr int kFp8RowBytes = 656, kFp8RowChunks = 41;
constexpr int kTileBytes = kChunk * kRowBytes;  // 73728: one 64-row bf16 tile (Q or K)
constexpr int kPBytes = kHeads * kChunk * 2;    // 8192

template <bool kFp8>
struct Smem {
    static constexpr int kKBufs = kFp8 ? 1 : 2;
    static constexpr int q = 0;
    static constexpr int k = q + kTileBytes;
    static constexpr int raw = k + kKBufs * kTileBytes;
    static constexpr int p = raw + (kFp8 ? kChunk * kFp8RowBytes : 0);
    static constexpr int idx = p + kPBytes;            // [2][64] int32
    static constexpr int red = idx + 2 * kChunk * 4;   // [2][64] fp32
    static constexpr int total = red + 2 * kHeads * 4;
};
static_assert(Smem<false>::total <= 232448 && Smem<true>::total <= 232448);

// Byte offset of 16-B chunk c of row r in a swizzled tile whose rows are `row_bytes` long (multiple of 128 B).
__device__ __forceinline__ uint32_t swz(int r, int c, int row_bytes) {
    return static_cast<uint32_t>(r * row_bytes + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Two e4m3 codes (low byte first) times a power-of-two scale → two bf16 (exact).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t codes, float s) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<__half2*>(&hr));
    return pack_bf16(f.x * s, f.y * s);
}

// Issues the cp.async loads of chunk `chunk` (64 rows) of token `tok`: bf16 rows into `dst_tile` (swizzled) or
// raw FP8 rows into `dst_raw` (plain), and stores the chunk's slot ids into sidx. Thread t: row t/4, part t%4.
template <bool kFp8>
__device__ __forceinline__ void issue_chunk(const SparseMlaRunParams& p, const int32_t* tok_slots, int chunk,
                                            uint8_t* smem, uint32_t dst, int32_t* sidx) {
    const int t = threadIdx.x, row = t >> 2, part = t & 3;
    const int32_t s = tok_slots[chunk * kChunk + row];
    if (part == 0) sidx[row] = s;
    const bool valid = s >= 0;
    if constexpr (kFp8) {
        const uint8_t* src = static_cast<const uint8_t*>(p.cache) + (valid ? static_cast<int64_t>(s) * kFp8RowBytes : 0);
        for (int c = part; c < kFp8RowChunks; c += 4) cp_async16(dst + row * kFp8RowBytes + c * 16, src + c * 16, valid);
    } else {
        const uint8_t* src = static_cast<const uint8_t*>(p.cache) + (valid ? static_cast<int64_t>(s) * kRowBytes : 0);
#pragma unroll
        for (int c = part; c < kRowChunks; c += 4) cp_async16(dst + swz(row, c, kRowBytes), src + c * 16, valid);
    }
    (void)smem;
    cp_async_commit();
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_kernel(const SparseMlaRunParams p, int chunks_per_split) {
    extern __shared__ __align__(128) uint8_t smem[];
    using L = Smem<kFp8>;
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // under PDL: the previous kernel's writes are visible
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int n_split = p.plan.n_split;
    const int n_hg = p.n_head / kHeads;  // head groups vary fastest: both 64-head CTAs of a token run together
    const int64_t i = blockIdx.x / (n_split * n_hg);
    const int split = (blockIdx.x / n_hg) % n_split, hg = blockIdx.x % n_hg;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, wr = warp & 3, wc = warp >> 2;
    const int g = lane >> 2, qd = lane & 3;
    const int n_chunks = p.topk / kChunk;
    const int c_begin = split * chunks_per_split;
    const int c_end = min(n_chunks, c_begin + chunks_per_split);
    const int32_t* tok_slots = p.slots + i * p.topk;
    const uint32_t sbase = smem_u32(smem);
    int32_t* sidx = reinterpret_cast<int32_t*>(smem + L::idx);
    float* sred = reinterpret_cast<float*>(smem + L::red);

    if (c_begin < c_end) {
        issue_chunk<kFp8>(p, tok_slots, c_begin, smem, sbase + (kFp8 ? L::raw : L::k), sidx);
    }
    // Q: fp32 → bf16, swizzled. Thread handles (row, chunk) pairs; a chunk is 8 values = two float4.
    {
        const float4* q = reinterpret_cast<const float4*>(p.q + (i * p.n_head + hg * kHeads) * kD);
        for (int e = t; e < kHeads * kRowChunks; e += kThreads) {
            const int r = e / kRowChunks, c = e % kRowChunks;
            const float4 a = q[r * (kD / 4) + 2 * c], b = q[r * (kD / 4) + 2 * c + 1];
            uint4 v;
            v.x = pack_bf16(a.x, a.y);
            v.y = pack_bf16(a.z, a.w);
            v.z = pack_bf16(b.x, b.y);
            v.w = pack_bf16(b.z, b.w);
            *reinterpret_cast<uint4*>(smem + L::q + swz(r, c, kRowBytes)) = v;
        }
    }

    const float scale_log2 = p.scale * 1.4426950408889634f;
    float o[32][4];
#pragma unroll
    for (int a = 0; a < 32; ++a) o[a][0] = o[a][1] = o[a][2] = o[a][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    for (int c = c_begin; c < c_end; ++c) {
        const int it = c - c_begin, buf = it & 1;
        const int32_t* cidx = sidx + buf * kChunk;
        uint32_t ktile;
        cp_async_wait_all();
        __syncthreads();  // chunk c landed; every warp is done with chunk c-1
        if constexpr (kFp8) {
            // Dequantise raw rows → bf16 tile. Thread: row t/4, tile `part` of c (+ 2 of the 8 k_pe chunks).
            const int row = t >> 2, part = t & 3;
            const uint8_t* raw = smem + L::raw + row * kFp8RowBytes;
            const float s = reinterpret_cast<const float*>(raw + 512)[part];
            uint8_t* ktl = smem + L::k;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const uint4 codes = *reinterpret_cast<const uint4*>(raw + part * 128 + j * 16);
                const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
                uint4 lo, hi;
                lo.x = fp8x2_to_bf16x2(static_cast<uint16_t>(w[0]), s);
                lo.y = fp8x2_to_bf16x2(static_cast<uint16_t>(w[0] >> 16), s);
                lo.z = fp8x2_to_bf16x2(static_cast<uint16_t>(w[1]), s);
                lo.w = fp8x2_to_bf16x2(static_cast<uint16_t>(w[1] >> 16), s);
                hi.x = fp8x2_to_bf16x2(static_cast<uint16_t>(w[2]), s);
                hi.y = fp8x2_to_bf16x2(static_cast<uint16_t>(w[2] >> 16), s);
                hi.z = fp8x2_to_bf16x2(static_cast<uint16_t>(w[3]), s);
                hi.w = fp8x2_to_bf16x2(static_cast<uint16_t>(w[3] >> 16), s);
                const int oc = part * 16 + 2 * j;
                *reinterpret_cast<uint4*>(ktl + swz(row, oc, kRowBytes)) = lo;
                *reinterpret_cast<uint4*>(ktl + swz(row, oc + 1, kRowBytes)) = hi;
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int pc = 2 * part + j;
                *reinterpret_cast<uint4*>(ktl + swz(row, 64 + pc, kRowBytes)) =
                    *reinterpret_cast<const uint4*>(raw + 528 + pc * 16);
            }
            __syncthreads();  // bf16 tile ready; raw staging free
            ktile = sbase + L::k;
            if (c + 1 < c_end)
                issue_chunk<kFp8>(p, tok_slots, c + 1, smem, sbase + L::raw, sidx + (buf ^ 1) * kChunk);
        } else {
            ktile = sbase + L::k + buf * kTileBytes;
            if (c + 1 < c_end)
                issue_chunk<kFp8>(p, tok_slots, c + 1, smem, sbase + L::k + (buf ^ 1) * kTileBytes,
                                  sidx + (buf ^ 1) * kChunk);
        }
        // Chunk with no valid slot: nothing to add (uniform over the CTA: every warp reads the same ids).
        const bool any = __any_sync(0xffffffffu, (cidx[lane] >= 0) || (cidx[lane + 32] >= 0));
        if (!any) continue;

        // S = Q · K^T for rows 16wr.., slot columns 32wc.. (4 n-tiles of 8).
        float sacc[4][4];
#pragma unroll
        for (int a = 0; a < 4; ++a) sacc[a][0] = sacc[a][1] = sacc[a][2] = sacc[a][3] = 0.f;
        const int qrow = 16 * wr + (lane & 15);
        const int krow0 = 32 * wc + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll 4
        for (int kk = 0; kk < kD / 16; ++kk) {
            uint32_t a0, a1, a2, a3;
            ldsm_x4(sbase + L::q + swz(qrow, 2 * kk + (lane >> 4), kRowBytes), a0, a1, a2, a3);
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(ktile + swz(krow0 + 16 * np, 2 * kk + ((lane >> 3) & 1), kRowBytes), b0, b1, b2, b3);
                mma_bf16(sacc[2 * np], a0, a1, a2, a3, b0, b1);
                mma_bf16(sacc[2 * np + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        // Mask unused slots, row max over this warp's 32 columns, exchange with the partner warp.
        float mloc[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const int col = 32 * wc + 8 * nt + 2 * qd;
            const bool v0 = cidx[col] >= 0, v1 = cidx[col + 1] >= 0;
            if (!v0) sacc[nt][0] = sacc[nt][2] = -INFINITY;
            if (!v1) sacc[nt][1] = sacc[nt][3] = -INFINITY;
            mloc[0] = fmaxf(mloc[0], fmaxf(sacc[nt][0], sacc[nt][1]));
            mloc[1] = fmaxf(mloc[1], fmaxf(sacc[nt][2], sacc[nt][3]));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mloc[r] = fmaxf(mloc[r], __shfl_xor_sync(0xffffffffu, mloc[r], 1));
            mloc[r] = fmaxf(mloc[r], __shfl_xor_sync(0xffffffffu, mloc[r], 2));
        }
        if (qd == 0) {
            sred[wc * kHeads + 16 * wr + g] = mloc[0];
            sred[wc * kHeads + 16 * wr + g + 8] = mloc[1];
        }
        __syncthreads();
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = 16 * wr + g + 8 * r;
            const float m_new = fmaxf(m_run[r], fmaxf(sred[row], sred[kHeads + row]));
            mref[r] = m_new == -INFINITY ? 0.f : m_new * scale_log2;
            alpha[r] = exp2f(m_run[r] * scale_log2 - mref[r]);  // m_run = −inf → 0
            m_run[r] = m_new;
        }
        // P = exp2(s·scale_log2 − m), row sums (thread-partial), P → shared memory as bf16.
        uint8_t* sp = smem + L::p;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const float p0 = exp2f(fmaf(sacc[nt][0], scale_log2, -mref[0]));
            const float p1 = exp2f(fmaf(sacc[nt][1], scale_log2, -mref[0]));
            const float p2 = exp2f(fmaf(sacc[nt][2], scale_log2, -mref[1]));
            const float p3 = exp2f(fmaf(sacc[nt][3], scale_log2, -mref[1]));
            l_run[0] = (nt == 0 ? l_run[0] * alpha[0] : l_run[0]) + p0 + p1;
            l_run[1] = (nt == 0 ? l_run[1] * alpha[1] : l_run[1]) + p2 + p3;
            const int ch = 4 * wc + nt;
            *reinterpret_cast<uint32_t*>(sp + swz(16 * wr + g, ch, 128) + 4 * qd) = pack_bf16(p0, p1);
            *reinterpret_cast<uint32_t*>(sp + swz(16 * wr + g + 8, ch, 128) + 4 * qd) = pack_bf16(p2, p3);
        }
#pragma unroll
        for (int a = 0; a < 32; ++a) {
            o[a][0] *= alpha[0];
            o[a][1] *= alpha[0];
            o[a][2] *= alpha[1];
            o[a][3] *= alpha[1];
        }
        __syncthreads();  // P complete
        // O[16wr.., 256wc..] += P[16wr.., 0:64] · V[0:64, 256wc..]
#pragma unroll
        for (int ks = 0; ks < kChunk / 16; ++ks) {
            uint32_t a0, a1, a2, a3;
            ldsm_x4(sbase + L::p + swz(16 * wr + (lane & 15), 2 * ks + (lane >> 4), 128), a0, a1, a2, a3);
            const int vrow = 16 * ks + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
            for (int np = 0; np < 16; ++np) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(ktile + swz(vrow, 32 * wc + 2 * np + (lane >> 4), kRowBytes), b0, b1, b2, b3);
                mma_bf16(o[2 * np], a0, a1, a2, a3, b0, b1);
                mma_bf16(o[2 * np + 1], a0, a1, a2, a3, b2, b3);
            }
        }
    }

    // Row sums: quad, then the partner warp.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    __syncthreads();
    if (qd == 0) {
        sred[wc * kHeads + 16 * wr + g] = l_run[0];
        sred[wc * kHeads + 16 * wr + g + 8] = l_run[1];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = 16 * wr + g + 8 * r;
        const float l = sred[row] + sred[kHeads + row];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int64_t h = static_cast<int64_t>(hg) * kHeads + row;
        float* dst;
        if (n_split == 1) {
            dst = p.out + (i * p.n_head + h) * kDv;
        } else {
            dst = static_cast<float*>(p.scratch) + ((i * n_split + split) * p.n_head + h) * kDv;
            if (wc == 0 && qd == 0) {
                float* lse = static_cast<float*>(p.scratch) + p.n * n_split * p.n_head * kDv;
                lse[(i * n_split + split) * p.n_head + h] =
                    l > 0.f ? m_run[r] * scale_log2 + log2f(l) : -INFINITY;
            }
        }
#pragma unroll
        for (int nt = 0; nt < 32; ++nt) {
            const int col = 256 * wc + 8 * nt + 2 * qd;
            *reinterpret_cast<float2*>(dst + col) = make_float2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
        }
    }
}

// ---- wgmma path (sm_90a) ------------------------------------------------------------------------------------------
// One CTA = one token × 64 heads × a range of 64-slot chunks, two warpgroups (256 threads). Shared tiles use the
// canonical 128-B swizzle: a [64 rows, 576] bf16 tile is 9 blocks of [64 rows × 128 B] (8 KB each, 1024-B aligned),
// 16-B chunk c of row r at r·128 + ((c ^ (r & 7)) << 4).
//   S = Q·Kᵀ: warpgroup 0 computes S[64 heads, 64 slots] with 36 × wgmma m64n64k16 (A = Q, B = K tile, both K-major
//   from shared memory) and the softmax (fp32, exp2 domain); P (bf16) goes to a shared [64 × 64] K-major tile and the
//   rescale factors through shared memory; O[64 heads, dims 256w..256w+255] += P · V with 4 × wgmma m64n256k16 per
//   warpgroup w (B = V read MN-major straight from the same K tile: no transposed copy).
namespace wg {
constexpr int kBlk = 8192;      // [64 rows × 128 B]
constexpr int kTile = 9 * kBlk; // [64 rows × 576] bf16
constexpr int kQ = 0, kK0 = kTile, kP = 3 * kTile, kIdx = kP + kBlk, kRed = kIdx + 2 * 64 * 4;
constexpr int kUsed = kRed + 2 * 64 * 4;
constexpr int kSmem = kUsed + 1024;  // + alignment slack (the tiles need a 1024-B aligned base)
static_assert(kSmem <= 232448);

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
__device__ __forceinline__ uint4 ldg_nc(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Output staging row stride (floats): 512 + 8, so the 8 rows a warp stores at once fall on different banks.
constexpr int kOutStride = kDv + 8;
static_assert(kHeads * kOutStride * 4 <= 3 * kTile);
// One bulk async copy shared → global (16-B aligned, size a multiple of 16), waited on before returning: the
// source shared memory stays valid, and the writes are complete before the grid ends.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
#include "backend/cuda/sparse_mla_wgmma.inc"

// FP8 row loader: thread (row, part) holds pieces part + 4k (k < 11, piece < 41) of its row's 656 B.
__device__ __forceinline__ void fp8_load(const uint8_t* cache, int32_t slot, int part, uint4 (&raw)[11]) {
    const uint8_t* src = cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kFp8RowBytes;
#pragma unroll
    for (int k = 0; k < 11; ++k) {
        const int pc = part + 4 * k;
        if (slot >= 0 && pc < kFp8RowChunks) raw[k] = ldg_nc(src + pc * 16);
        else raw[k] = make_uint4(0u, 0u, 0u, 0u);
    }
}
__device__ __forceinline__ uint32_t deq2(uint32_t w16, float s) { return fp8x2_to_bf16x2(static_cast<uint16_t>(w16), s); }
// Dequantises into the swizzled bf16 tile at `tile` (generic pointer). Every lane of the warp must call it.
__device__ __forceinline__ void fp8_store(uint8_t* tile, int row, int part, const uint4 (&raw)[11]) {
    const int lane = threadIdx.x & 31, src = lane & ~3;
    float sc[4];
    sc[0] = __shfl_sync(0xffffffffu, __uint_as_float(raw[8].x), src);
    sc[1] = __shfl_sync(0xffffffffu, __uint_as_float(raw[8].y), src);
    sc[2] = __shfl_sync(0xffffffffu, __uint_as_float(raw[8].z), src);
    sc[3] = __shfl_sync(0xffffffffu, __uint_as_float(raw[8].w), src);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int pc = part + 4 * k;  // codes 16pc..16pc+15 → bf16 chunks 2pc, 2pc+1
        const float s = sc[k >> 1];
        uint4 lo, hi;
        lo.x = deq2(raw[k].x, s);
        lo.y = deq2(raw[k].x >> 16, s);
        lo.z = deq2(raw[k].y, s);
        lo.w = deq2(raw[k].y >> 16, s);
        hi.x = deq2(raw[k].z, s);
        hi.y = deq2(raw[k].z >> 16, s);
        hi.z = deq2(raw[k].w, s);
        hi.w = deq2(raw[k].w >> 16, s);
        *reinterpret_cast<uint4*>(tile + tile_off(row, 2 * pc)) = lo;
        *reinterpret_cast<uint4*>(tile + tile_off(row, 2 * pc + 1)) = hi;
    }
#pragma unroll
    for (int k = 8; k < 11; ++k) {
        const int pc = part + 4 * k;  // 32 = scales (skip); 33..40 = k_pe bf16 chunks 64..71
        if (pc >= 33 && pc < kFp8RowChunks) *reinterpret_cast<uint4*>(tile + tile_off(row, 64 + pc - 33)) = raw[k];
    }
}
__device__ __forceinline__ void bf16_issue(const uint8_t* cache, int32_t slot, int row, int part, uint32_t tile) {
    const uint8_t* src = cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * kRowBytes;
#pragma unroll
    for (int k = 0; k < 18; ++k) {
        const int c = part + 4 * k;
        cp_async16(tile + tile_off(row, c), src + c * 16, slot >= 0);
    }
    cp_async_commit();
}

// Specialised variant: warpgroup 0 computes S = Q·Kᵀ for all 64 slots of the chunk (wgmma m64n64k16: A and B
// reads balance the tensor rate, where two m64n32 products re-read Q) and the softmax; warpgroup 1 meanwhile
// gathers the next chunk (BF16: cp.async one chunk ahead; FP8: raw rows loaded into registers — half of them a
// chunk earlier — and dequantised while warpgroup 0 multiplies). Both then do PV for their 256 output dims (P and the rescale factors
// through shared memory).
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_wgmma2_kernel(const SparseMlaRunParams p, int chunks_per_split, uint32_t v_lbo, uint32_t v_sbo) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const uint32_t sb = smem_u32(smem);
    const int n_split = p.plan.n_split;
    const int n_hg = p.n_head / kHeads;  // head groups vary fastest: both 64-head CTAs of a token run together
    const int64_t i = blockIdx.x / (n_split * n_hg);
    const int split = (blockIdx.x / n_hg) % n_split, hg = blockIdx.x % n_hg;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, wgi = warp >> 2, wi = warp & 3;
    const int g = lane >> 2, qd = lane & 3;
    const int ra = (t & 127) >> 2, rb = ra + 32, part = t & 3;  // warpgroup 1 loader rows
    const int n_chunks = p.topk / kChunk;
    const int c_begin = split * chunks_per_split;
    const int c_end = min(n_chunks, c_begin + chunks_per_split);
    const int32_t* tok_slots = p.slots + i * p.topk;
    const uint8_t* cache = static_cast<const uint8_t*>(p.cache);
    int32_t* sidx = reinterpret_cast<int32_t*>(smem + kIdx);
    float* salpha = reinterpret_cast<float*>(smem + kRed);        // [64]
    float* sl = reinterpret_cast<float*>(smem + kRed) + kHeads;  // [64]
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // under PDL: the previous kernel's writes are visible
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    const bool loader = wgi == 1;
    int32_t s1a = -1, s1b = -1, s2a = -1, s2b = -1;  // slots of chunks c+1 and c+2 (loader rows a, b)
    uint4 rawa[11];                                   // FP8: raw row a of chunk c+1
    uint4 rawb0[11];                                  // FP8 prologue: raw row b of the first chunk
    int first_valid = 0;
    if (loader && c_begin < c_end) {
        const int32_t s0a = tok_slots[c_begin * kChunk + ra], s0b = tok_slots[c_begin * kChunk + rb];
        if (c_begin + 1 < c_end) {
            s1a = tok_slots[(c_begin + 1) * kChunk + ra];
            s1b = tok_slots[(c_begin + 1) * kChunk + rb];
        }
        if (c_begin + 2 < c_end) {
            s2a = tok_slots[(c_begin + 2) * kChunk + ra];
            s2b = tok_slots[(c_begin + 2) * kChunk + rb];
        }
        if (part == 0) {
            sidx[ra] = s0a;
            sidx[rb] = s0b;
        }
        first_valid = s0a >= 0 || s0b >= 0;
        if constexpr (kFp8) {
            fp8_load(cache, s0a, part, rawa);  // stored after the Q conversion (its latency overlaps it)
            fp8_load(cache, s0b, part, rawb0);
        } else {
            bf16_issue(cache, s0a, ra, part, sb + kK0);
            bf16_issue(cache, s0b, rb, part, sb + kK0);
        }
    }
    {
        const float4* q = reinterpret_cast<const float4*>(p.q + (i * p.n_head + hg * kHeads) * kD);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            float4 v[18];
#pragma unroll
            for (int k = 0; k < 9; ++k) {
                const int e = t + kThreads * (9 * b + k), r = e / kRowChunks, c = e % kRowChunks;
                v[2 * k] = __ldg(q + r * (kD / 4) + 2 * c);
                v[2 * k + 1] = __ldg(q + r * (kD / 4) + 2 * c + 1);
            }
#pragma unroll
            for (int k = 0; k < 9; ++k) {
                const int e = t + kThreads * (9 * b + k), r = e / kRowChunks, c = e % kRowChunks;
                uint4 w;
                w.x = pack_bf16(v[2 * k].x, v[2 * k].y);
                w.y = pack_bf16(v[2 * k].z, v[2 * k].w);
                w.z = pack_bf16(v[2 * k + 1].x, v[2 * k + 1].y);
                w.w = pack_bf16(v[2 * k + 1].z, v[2 * k + 1].w);
                *reinterpret_cast<uint4*>(smem + kQ + tile_off(r, c)) = w;
            }
        }
    }
    if constexpr (kFp8) {
        if (loader && c_begin < c_end) {
            fp8_store(smem + kK0, ra, part, rawa);
            fp8_store(smem + kK0, rb, part, rawb0);
            if (c_begin + 1 < c_end) fp8_load(cache, s1a, part, rawa);
        }
    } else {
        cp_async_wait_all();
    }
    proxy_fence();
    int any = __syncthreads_or(first_valid);

    const float scale_log2 = p.scale * 1.4426950408889634f;
    float o[128];
#pragma unroll
    for (int a = 0; a < 128; ++a) o[a] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const int row0 = 16 * wi + g, row1 = row0 + 8;

    for (int c = c_begin; c < c_end; ++c) {
        const int buf = (c - c_begin) & 1;
        const uint32_t kt = sb + kK0 + buf * kTile, kt_next = sb + kK0 + (buf ^ 1) * kTile;
        const int32_t* cidx = sidx + buf * kChunk;
        int next_valid = 0;
        if (loader) {
            if (c + 1 < c_end) {  // chunk c+1 → the other buffer
                if constexpr (kFp8) {  // row a was loaded an iteration ago; row b now (bounded registers)
                    fp8_store(smem + kK0 + (buf ^ 1) * kTile, ra, part, rawa);
                    fp8_load(cache, s1b, part, rawa);
                    fp8_store(smem + kK0 + (buf ^ 1) * kTile, rb, part, rawa);
                } else {
                    bf16_issue(cache, s1a, ra, part, kt_next);
                    bf16_issue(cache, s1b, rb, part, kt_next);
                }
                if (part == 0) {
                    sidx[(buf ^ 1) * kChunk + ra] = s1a;
                    sidx[(buf ^ 1) * kChunk + rb] = s1b;
                }
                next_valid = s1a >= 0 || s1b >= 0;
            }
            s1a = s2a;
            s1b = s2b;
            if constexpr (kFp8) {
                if (c + 2 < c_end) fp8_load(cache, s1a, part, rawa);  // row a of chunk c+2, stored next iteration
            }
            s2a = s2b = -1;
            if (c + 3 < c_end) {
                s2a = tok_slots[(c + 3) * kChunk + ra];
                s2b = tok_slots[(c + 3) * kChunk + rb];
            }
        } else if (any) {
            float s[32];
#pragma unroll
            for (int a = 0; a < 32; ++a) s[a] = 0.f;
            reg_fence(s);
            fence();
#pragma unroll
            for (int kk = 0; kk < kD / 16; ++kk) {
                const uint32_t koff = (kk >> 2) * kBlk + (kk & 3) * 32;
                wgmma_m64n64_ss(s, desc(sb + kQ + koff, 16, 1024), desc(kt + koff, 16, 1024), 1);
            }
            commit();
            wait0();
            reg_fence(s);
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
            float alpha[2], mref[2];
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
            for (int j = 0; j < 8; ++j) {
                const float p0 = exp2f(fmaf(s[4 * j], scale_log2, -mref[0]));
                const float p1 = exp2f(fmaf(s[4 * j + 1], scale_log2, -mref[0]));
                const float p2 = exp2f(fmaf(s[4 * j + 2], scale_log2, -mref[1]));
                const float p3 = exp2f(fmaf(s[4 * j + 3], scale_log2, -mref[1]));
                l_run[0] += p0 + p1;
                l_run[1] += p2 + p3;
                *reinterpret_cast<uint32_t*>(smem + kP + row0 * 128 + ((j ^ (row0 & 7)) << 4) + 4 * qd) =
                    pack_bf16(p0, p1);
                *reinterpret_cast<uint32_t*>(smem + kP + row1 * 128 + ((j ^ (row1 & 7)) << 4) + 4 * qd) =
                    pack_bf16(p2, p3);
            }
            if (qd == 0) {
                salpha[row0] = alpha[0];
                salpha[row1] = alpha[1];
            }
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                o[4 * j] *= alpha[0];
                o[4 * j + 1] *= alpha[0];
                o[4 * j + 2] *= alpha[1];
                o[4 * j + 3] *= alpha[1];
            }
        }
        proxy_fence();
        __syncthreads();  // P, alpha complete; FP8: the next tile written
        if (any) {
            if (loader) {
                const float a0 = salpha[row0], a1 = salpha[row1];
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    o[4 * j] *= a0;
                    o[4 * j + 1] *= a0;
                    o[4 * j + 2] *= a1;
                    o[4 * j + 3] *= a1;
                }
            }
            reg_fence(o);
            fence();
#pragma unroll
            for (int ks = 0; ks < kChunk / 16; ++ks)
                wgmma_m64n256_ss_tb(o, desc(sb + kP + ks * 32, 16, 1024),
                                    desc(kt + wgi * 4 * kBlk + ks * 16 * 128, v_lbo, v_sbo), 1);
            commit();
            wait0();
            reg_fence(o);
        }
        if constexpr (!kFp8) cp_async_wait_all();
        proxy_fence();
        any = __syncthreads_or(next_valid);  // next tile landed; this chunk's tiles free
    }

    if (!loader) {
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
    __syncthreads();  // sl complete; every tile is free (the loop ended on a barrier after its last wgmma)
    // Epilogue: the normalised rows go to shared memory ([64 heads][kOutStride] fp32, over the Q and K tiles), then
    // each head's 2 KB row leaves with one bulk async copy. (Direct stores from the accumulator layout wrote 8 rows
    // × 32 B per warp instruction and held the LSU queue full: ~60% of a batch-1 CTA's time in ncu samples.)
    float* so = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? row1 : row0;
        const float l = sl[row];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        if (n_split > 1 && !loader && qd == 0) {
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
    proxy_fence();  // the generic-proxy stores above are visible to the bulk copies (async proxy)
    __syncthreads();
    if (t < kHeads) {
        const int64_t h = static_cast<int64_t>(hg) * kHeads + t;
        float* dst = n_split == 1 ? p.out + (i * p.n_head + h) * kDv
                                  : static_cast<float*>(p.scratch) + ((i * n_split + split) * p.n_head + h) * kDv;
        bulk_store(dst, smem_u32(so + t * kOutStride), kDv * 4);
    }
}
}  // namespace wg

// Merges the n_split normalised partials of each (token, head) by their log2-sum-exp. 128 threads × 4 columns.
// The split weights are computed once into shared memory ([n_split] floats, dynamic) and the partial rows are read
// with unrolled independent loads (the loop is latency-bound otherwise).
__global__ void __launch_bounds__(128) sparse_mla_combine_kernel(const SparseMlaRunParams p) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // launched early (PDL): wait for the partials
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the next step's main kernel may start
    extern __shared__ float sw[];  // [n_split]
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

// Kernel switch read once per process (measurement): MEGACTX_SPARSE_MLA_IMPL unset: the wgmma2 kernel; "m": the
// mma.sync kernel.
bool mma_sync_impl() {
    static const bool v = [] {
        const char* e = std::getenv("MEGACTX_SPARSE_MLA_IMPL");
        return e && e[0] == 'm';
    }();
    return v;
}

// Launches plainly, or with programmatic dependent launch when `pdl` (the combine: its CTAs may become resident
// while the main kernel runs; it executes griddepcontrol.wait before reading the partials).
template <class... KArgs, class... Args>
cudaError_t launch_kernel(void (*kern)(KArgs...), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                          bool pdl, Args... args) {
    if (!pdl) {
        kern<<<grid, threads, smem, stream>>>(args...);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kern, args...) == cudaSuccess) return cudaSuccess;
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
        cudaError_t e = cudaFuncSetAttribute(sparse_mla_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             Smem<true>::total);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(sparse_mla_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Smem<false>::total);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wg::sparse_mla_wgmma2_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     wg::kSmem);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wg::sparse_mla_wgmma2_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     wg::kSmem);
        return e;
    });
    if (cfg_err != cudaSuccess) return cfg_err;
    // Main kernels: plain launches. PDL on them (measured at ec813d3) saved 0.4 us at b1 but cost 0.2-0.9 us at
    // b16-b128 and ~6% in BF16 prefill; the maximum shared carveout changed nothing.
    if (mma_sync_impl())
        return fp8 ? launch_kernel(sparse_mla_kernel<true>, grid, kThreads, Smem<true>::total, stream, false, p, cps)
                   : launch_kernel(sparse_mla_kernel<false>, grid, kThreads, Smem<false>::total, stream, false, p, cps);
    return fp8 ? launch_kernel(wg::sparse_mla_wgmma2_kernel<true>, grid, kThreads, wg::kSmem, stream, false, p, cps,
                               lbo, sbo)
               : launch_kernel(wg::sparse_mla_wgmma2_kernel<false>, grid, kThreads, wg::kSmem, stream, false, p, cps,
                               lbo, sbo);
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
