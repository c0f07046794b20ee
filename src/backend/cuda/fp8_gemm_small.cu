// fp8_gemm_small kernel (contract: fp8_gemm_small.h). Swap-AB: the weight is the tensor cores' A operand (M = 16
// output rows per warp), the tokens are B (N = 8 per tile, NT tiles), K runs over the input columns.
//
// Fragments straight from global memory, no shared-memory staging: for mma.sync m16n8k32 e4m3 a lane (group g =
// lane / 4, quad q = lane % 4) holds A's rows g and g + 8 at logical k = 4q..4q+3 and 16+4q..16+4q+3, and B's
// token g at the same k. A dot product does not care in which order k runs, so logical k is mapped onto the
// physical columns such that each lane's share is contiguous: per 128-column block the lane loads 16 bytes of rows
// g and g + 8 at columns 16q and 64 + 16q (a warp's loads are whole 128-byte lines of 16 rows), and 16 bytes of its
// token's xq at the same columns; the four 32-column MMA steps of the block take the 4-byte words of those loads in
// order. A block's four steps accumulate into a fresh fp32 tile that is then scaled by s_w · xs and added to the
// running sums in fp32 (the tensor cores' FP8 accumulation is short, so it never runs longer than 128 columns).
//
// Work split: a warp owns 16 output rows and a contiguous range of 128-column blocks (its segment); a CTA is 8
// warps = (8 / S) row groups × S segments, S chosen so that the grid has about two CTAs per SM. The segments' sums
// meet in shared memory and add up in segment order: deterministic, no atomics. The weight is read once, 16 B per
// load past L1, two blocks (8 loads per lane) at a time. Launched under PDL behind act_quant: the first two blocks are
// fetched before griddepcontrol.wait.
#include "backend/cuda/fp8_gemm_small.h"

#include <cstdint>

#include "backend/cuda/launch_ex.cuh"

namespace megactx::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;  // output rows per warp (the MMA's M)

__device__ __forceinline__ uint4 load_stream16(const void* ptr) {  // the weight: read once, not kept in L1
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
}

// d += A · B for one m16n8k32 e4m3 tile: a0 / a2 = row g (k low / high), a1 / a3 = row g + 8; b0 / b1 = k low / high.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 128-column block: lo / hi = the lane's 16 bytes at columns 16q and 64 + 16q of rows g (r) and g + 8 (r8).
template <int NT>
__device__ __forceinline__ void block_mma(float (&acc)[NT][4], const Fp8GemmSmallParams& p, int64_t kb, float s_w,
                                          uint4 r_lo, uint4 r_hi, uint4 r8_lo, uint4 r8_hi, int g, int q) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* xr = p.xq + (nt * 8 + g) * p.in + kb * 128 + 16 * q;
        const uint4 x_lo = __ldg(reinterpret_cast<const uint4*>(xr));
        const uint4 x_hi = __ldg(reinterpret_cast<const uint4*>(xr + 64));
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        mma_e4m3(t, r_lo.x, r8_lo.x, r_lo.y, r8_lo.y, x_lo.x, x_lo.y);
        mma_e4m3(t, r_lo.z, r8_lo.z, r_lo.w, r8_lo.w, x_lo.z, x_lo.w);
        mma_e4m3(t, r_hi.x, r8_hi.x, r_hi.y, r8_hi.y, x_hi.x, x_hi.y);
        mma_e4m3(t, r_hi.z, r8_hi.z, r_hi.w, r8_hi.w, x_hi.z, x_hi.w);
        // t[0], t[1]: row g, tokens 2q, 2q + 1; t[2], t[3]: row g + 8, the same tokens.
        const float2 xs = *reinterpret_cast<const float2*>(p.xs + kb * p.n_pad + nt * 8 + 2 * q);
        const float s0 = s_w * xs.x, s1 = s_w * xs.y;
        acc[nt][0] += t[0] * s0;
        acc[nt][1] += t[1] * s1;
        acc[nt][2] += t[2] * s0;
        acc[nt][3] += t[3] * s1;
    }
}

// Two 128-column blocks of a lane's weight share: [block][row g lo, row g hi, row g+8 lo, row g+8 hi].
struct WPair {
    uint4 v[2][4];
};

__device__ __forceinline__ void load_pair(WPair& w, const uint8_t* wr, const uint8_t* wr8, int64_t kb, int64_t kb1) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
        if (kb + b < kb1) {
            const int64_t c = (kb + b) * 128;
            w.v[b][0] = load_stream16(wr + c);
            w.v[b][1] = load_stream16(wr + c + 64);
            w.v[b][2] = load_stream16(wr8 + c);
            w.v[b][3] = load_stream16(wr8 + c + 64);
        }
    }
}

template <int NT>
__global__ void __launch_bounds__(kWarps * 32, 2) fp8_gemm_small_kernel(Fp8GemmSmallParams p, int segs) {
    __shared__ float s_part[kWarps][kRows][8 * NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int groups = kWarps / segs;  // row groups per CTA
    const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * groups + warp / segs) * kRows;
    const int seg = warp % segs;
    const int64_t kbs = p.in / 128, per = (kbs + segs - 1) / segs;
    const int64_t kb0 = seg * per, kb1 = min(kbs, kb0 + per);
    const bool live = r0 < p.out;
    // Rows past the end read the last row (their sums are not written).
    const uint8_t* wr = p.w + min(r0 + g, p.out - 1) * p.in + 16 * q;
    const uint8_t* wr8 = p.w + min(r0 + g + 8, p.out - 1) * p.in + 16 * q;
    // The first two blocks of weight do not depend on the previous kernel (act_quant, launched before this one under
    // PDL): fetch them before waiting for its activations. (Keeping the next pair in flight during each pair's MMAs
    // measured slower: 128 registers then spill at 16 rows, and o_proj / the LM head lost 8-10% even at 8.)
    WPair cur;
    if (live) load_pair(cur, wr, wr8, kb0, kb1);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    float acc[NT][4] = {};
    if (live) {
        const float* sw = p.scales + (r0 / 128) * kbs;
        for (int64_t kb = kb0; kb < kb1; kb += 2) {
            if (kb != kb0) load_pair(cur, wr, wr8, kb, kb1);
            block_mma<NT>(acc, p, kb, __ldg(sw + kb), cur.v[0][0], cur.v[0][1], cur.v[0][2], cur.v[0][3], g, q);
            if (kb + 1 < kb1)
                block_mma<NT>(acc, p, kb + 1, __ldg(sw + kb + 1), cur.v[1][0], cur.v[1][1], cur.v[1][2], cur.v[1][3],
                              g, q);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        s_part[warp][g][nt * 8 + 2 * q] = acc[nt][0];
        s_part[warp][g][nt * 8 + 2 * q + 1] = acc[nt][1];
        s_part[warp][g + 8][nt * 8 + 2 * q] = acc[nt][2];
        s_part[warp][g + 8][nt * 8 + 2 * q + 1] = acc[nt][3];
    }
    __syncthreads();
    // y[t, o] = the row group's segment sums in segment order; consecutive threads take consecutive rows.
    constexpr int kTok = 8 * NT;
    for (int i = threadIdx.x; i < groups * kTok * kRows; i += kWarps * 32) {
        const int grp = i / (kTok * kRows), t = (i / kRows) % kTok, row = i % kRows;
        const int64_t o = (static_cast<int64_t>(blockIdx.x) * groups + grp) * kRows + row;
        if (o >= p.out || t >= p.n) continue;
        float v = 0.f;
        for (int s = 0; s < segs; ++s) v += s_part[grp * segs + s][row][t];
        p.y[t * p.out + o] = v;
    }
}

template <int NT>
cudaError_t launch_nt(const Fp8GemmSmallParams& p, int n_sm, cudaStream_t stream) {
    // Segments per row group: the fewest (1, 2, 4, 8) that give two CTAs' worth of warps per SM, and at least two
    // blocks per segment. (A wave-count cost model that put o_proj in one wave of 192 CTAs measured slower than 384
    // CTAs in 1.45 waves.)
    const int64_t groups_total = (p.out + kRows - 1) / kRows, kbs = p.in / 128;
    int segs = 1;
    while (segs < kWarps && 2 * segs <= kbs && groups_total * segs < int64_t{2} * kWarps * n_sm) segs *= 2;
    const int64_t per_cta = kWarps / segs;
    const int64_t grid = (groups_total + per_cta - 1) / per_cta;
    return launch_ex(fp8_gemm_small_kernel<NT>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32), 0, stream,
                     true, p, segs);
}

}  // namespace

int64_t fp8_gemm_small_pad(int64_t n) { return (n + 7) / 8 * 8; }

bool fp8_gemm_small_supported(int64_t n, int64_t out, int64_t in, int64_t block) {
    return n >= 1 && n <= kFp8GemmSmallMaxRows && out >= 1 && in >= 128 && in % 128 == 0 && block == 128;
}

cudaError_t launch_fp8_gemm_small(const Fp8GemmSmallParams& p, int n_sm, cudaStream_t stream) {
    if (!fp8_gemm_small_supported(p.n, p.out, p.in, 128) || p.n_pad != fp8_gemm_small_pad(p.n) || n_sm <= 0 ||
        (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 || (reinterpret_cast<uintptr_t>(p.xq) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(p.xs) & 7) != 0)
        return cudaErrorInvalidValue;
    return p.n_pad == 8 ? launch_nt<1>(p, n_sm, stream) : launch_nt<2>(p, n_sm, stream);
}

}  // namespace megactx::cuda
