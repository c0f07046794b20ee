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

#include <algorithm>
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

// The lane's view of one CTA's tokens (at most 8 NT): where its B-fragment token's activations start (xr), and the
// activation-scale rows of its two C-fragment tokens (2q, 2q + 1 of each tile).
template <int NT>
struct Tokens {
    const uint8_t* xr[NT];
    int32_t srow[NT][2];  // a row of xs's token index
};

// One 128-column block: lo / hi = the lane's 16 bytes at columns 16q and 64 + 16q of rows g (r) and g + 8 (r8).
// kContiguous: the tokens are rows 0.. of xq and columns 0.. of xs (a plain linear, xq / xs padded to 8 NT rows), so
// the C fragment's two scales are one 8-B load and srow is unused. (Two indexed loads instead, as the grouped MoE
// needs, made the 16-row linears 15-18% slower: o 44 -> 52 us, the LM head 327 -> 376 us.)
template <int NT, bool kContiguous>
__device__ __forceinline__ void block_mma(float (&acc)[NT][4], const Tokens<NT>& tk, const float* xs,
                                          int64_t xs_stride, int64_t kb, float s_w, uint4 r_lo, uint4 r_hi,
                                          uint4 r8_lo, uint4 r8_hi, int q, int64_t in) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* xr = (kContiguous ? tk.xr[0] + nt * 8 * in : tk.xr[nt]) + kb * 128;
        const uint4 x_lo = __ldg(reinterpret_cast<const uint4*>(xr));
        const uint4 x_hi = __ldg(reinterpret_cast<const uint4*>(xr + 64));
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        mma_e4m3(t, r_lo.x, r8_lo.x, r_lo.y, r8_lo.y, x_lo.x, x_lo.y);
        mma_e4m3(t, r_lo.z, r8_lo.z, r_lo.w, r8_lo.w, x_lo.z, x_lo.w);
        mma_e4m3(t, r_hi.x, r8_hi.x, r_hi.y, r8_hi.y, x_hi.x, x_hi.y);
        mma_e4m3(t, r_hi.z, r8_hi.z, r_hi.w, r8_hi.w, x_hi.z, x_hi.w);
        // t[0], t[1]: row g, tokens 2q, 2q + 1; t[2], t[3]: row g + 8, the same tokens.
        float s0, s1;
        if constexpr (kContiguous) {
            const float2 x2 = __ldg(reinterpret_cast<const float2*>(xs + kb * xs_stride + nt * 8 + 2 * q));
            s0 = s_w * x2.x;
            s1 = s_w * x2.y;
        } else {
            s0 = s_w * __ldg(xs + kb * xs_stride + tk.srow[nt][0]);
            s1 = s_w * __ldg(xs + kb * xs_stride + tk.srow[nt][1]);
        }
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

// Where a CTA's operands are. A map is built in the kernel from the launch's parameters (Params, passed by value:
// the kernel-parameter block stays within design.md's 128 bytes) and holds this CTA's state, which init() sets (a
// map passed as the parameter itself was 136 bytes for GroupMap, and writing its state made the kernel keep a local
// copy: 60 B of spills).
// Plain: one weight, tokens 0..n-1 are the rows of xq and y.
struct PlainMap {
    using Params = Fp8GemmSmallParams;
    static constexpr bool kContiguous = true;
    const Params p;
    int64_t count = 0;
    __device__ explicit PlainMap(const Params& params) : p(params) {}
    __device__ bool init() {
        count = p.n;
        return true;
    }
    __device__ int64_t out() const { return p.out; }
    __device__ int64_t in() const { return p.in; }
    __device__ const uint8_t* xq() const { return p.xq; }
    __device__ const float* xs() const { return p.xs; }
    __device__ int64_t xs_stride() const { return p.n_pad; }
    __device__ float* yrow(int64_t i) const { return p.y + i * p.out; }
    // Weight rows r .. r + 15 (one 16-row group): their codes, their scale row, and the row within that weight.
    __device__ const uint8_t* weight(int64_t) const { return p.w; }
    __device__ const float* scales(int64_t) const { return p.scales; }
    __device__ int64_t local(int64_t r) const { return r; }
};

// Grouped (few-token MoE): blockIdx.y is an active expert, blockIdx.z a pass of 8 NT of its slots; rows [0, out0)
// come from table column w0, [out0, out0 + out1) from w1.
template <int NT>
struct GroupMap {
    using Params = Fp8GemmGroupedParams;
    static constexpr bool kContiguous = false;
    const Params p;
    int64_t count = 0;
    const int32_t* slots = nullptr;  // this pass's slots
    int64_t expert = 0;
    __device__ explicit GroupMap(const Params& params) : p(params) {}
    __device__ bool init() {
        const int32_t* plan = p.plan;
        if (static_cast<int32_t>(blockIdx.y) >= plan[0]) return false;
        expert = plan[1 + 3 * blockIdx.y];
        const int64_t off = plan[2 + 3 * blockIdx.y], cnt = plan[3 + 3 * blockIdx.y];
        const int64_t first = static_cast<int64_t>(blockIdx.z) * 8 * NT;
        if (first >= cnt) return false;
        count = min(cnt - first, static_cast<int64_t>(8 * NT));
        slots = plan + 1 + 3 * p.max_groups + off + first;
        return true;
    }
    __device__ int64_t out() const { return p.out0 + p.out1; }
    __device__ int64_t in() const { return p.in; }
    __device__ const uint8_t* xq() const { return p.xq; }
    __device__ const float* xs() const { return p.xs; }
    __device__ int64_t xs_stride() const { return p.xs_stride; }
    __device__ int64_t brow(int64_t i) const { return p.by_token ? slots[i] / p.k : slots[i]; }
    __device__ float* yrow(int64_t i) const { return p.y + static_cast<int64_t>(slots[i]) * (p.out0 + p.out1); }
    __device__ const uint8_t* weight(int64_t r) const {
        return static_cast<const uint8_t*>(p.experts[6 * expert + (r < p.out0 ? p.w0 : p.w1)]);
    }
    __device__ const float* scales(int64_t r) const {
        return static_cast<const float*>(p.experts[6 * expert + 3 + (r < p.out0 ? p.w0 : p.w1)]);
    }
    __device__ int64_t local(int64_t r) const { return r < p.out0 ? r : r - p.out0; }
};

template <int NT, class Map>
__global__ void __launch_bounds__(kWarps * 32, 2) fp8_gemm_small_kernel(const typename Map::Params p, int segs) {
    static_assert(sizeof(typename Map::Params) + sizeof(int) <= 128, "kernel parameters within 128 bytes");
    __shared__ float s_part[kWarps][kRows][8 * NT];
    Map m(p);
    const bool active = m.init();  // uniform over the CTA
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int groups = kWarps / segs;  // row groups per CTA
    const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * groups + warp / segs) * kRows;
    const int seg = warp % segs;
    const int64_t kbs = m.in() / 128, per = (kbs + segs - 1) / segs;
    const int64_t kb0 = seg * per, kb1 = min(kbs, kb0 + per);
    const uint8_t* w = active && r0 < m.out() ? m.weight(r0) : nullptr;
    const bool live = w != nullptr;  // a null weight (an expert another rank holds) gives zeros
    // This group's rows as rows of their own weight matrix; rows past the end read the group's last row (their sums
    // are not written).
    const int64_t lr = live ? m.local(r0) : 0, lr_last = live ? m.local(min(r0 + kRows, m.out()) - 1) : 0;
    const uint8_t* wr = live ? w + min(lr + g, lr_last) * m.in() + 16 * q : nullptr;
    const uint8_t* wr8 = live ? w + min(lr + g + 8, lr_last) * m.in() + 16 * q : nullptr;
    // The first two blocks of weight do not depend on the previous kernel (act_quant, launched before this one under
    // PDL): fetch them before waiting for its activations. (Keeping the next pair in flight during each pair's MMAs
    // measured slower: 128 registers then spill at 16 rows, and o_proj / the LM head lost 8-10% even at 8.)
    WPair cur;
    if (live) load_pair(cur, wr, wr8, kb0, kb1);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    if (!active) return;
    float acc[NT][4] = {};
    if (live) {
        // Tokens past the count repeat the last one: their MMA columns are computed and dropped.
        Tokens<NT> tk;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if constexpr (Map::kContiguous) {  // tile nt's rows follow at 8 nt rows; padded rows are not clamped
                tk.xr[0] = m.xq() + g * m.in() + 16 * q;  // (their columns are dropped)
            } else {
                tk.xr[nt] = m.xq() + m.brow(min(static_cast<int64_t>(nt * 8 + g), m.count - 1)) * m.in() + 16 * q;
                tk.srow[nt][0] = static_cast<int32_t>(m.brow(min(static_cast<int64_t>(nt * 8 + 2 * q), m.count - 1)));
                tk.srow[nt][1] =
                    static_cast<int32_t>(m.brow(min(static_cast<int64_t>(nt * 8 + 2 * q + 1), m.count - 1)));
            }
        }
        const float* sw = m.scales(r0) + (lr / 128) * kbs;
        for (int64_t kb = kb0; kb < kb1; kb += 2) {
            if (kb != kb0) load_pair(cur, wr, wr8, kb, kb1);
            block_mma<NT, Map::kContiguous>(acc, tk, m.xs(), m.xs_stride(), kb, __ldg(sw + kb), cur.v[0][0],
                                            cur.v[0][1], cur.v[0][2], cur.v[0][3], q, m.in());
            if (kb + 1 < kb1)
                block_mma<NT, Map::kContiguous>(acc, tk, m.xs(), m.xs_stride(), kb + 1, __ldg(sw + kb + 1),
                                                cur.v[1][0], cur.v[1][1], cur.v[1][2], cur.v[1][3], q, m.in());
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
        if (o >= m.out() || t >= m.count) continue;
        float v = 0.f;
        for (int s = 0; s < segs; ++s) v += s_part[grp * segs + s][row][t];
        m.yrow(t)[o] = v;
    }
}

// Segments per row group: the fewest (1, 2, 4, 8) that give two CTAs' worth of warps per SM, and at least two
// blocks per segment. (A wave-count cost model that put o_proj in one wave of 192 CTAs measured slower than 384
// CTAs in 1.45 waves.) `copies`: how many such GEMMs run side by side in the grid (the MoE's experts).
int pick_segs(int64_t out, int64_t in, int64_t copies, int n_sm) {
    const int64_t groups_total = (out + kRows - 1) / kRows * copies, kbs = in / 128;
    int segs = 1;
    while (segs < kWarps && 2 * segs <= kbs && groups_total * segs < int64_t{2} * kWarps * n_sm) segs *= 2;
    return segs;
}

template <int NT>
cudaError_t launch_nt(const Fp8GemmSmallParams& p, int n_sm, cudaStream_t stream) {
    const int segs = pick_segs(p.out, p.in, 1, n_sm);
    const int64_t per_cta = kWarps / segs, grid = ((p.out + kRows - 1) / kRows + per_cta - 1) / per_cta;
    return launch_ex(fp8_gemm_small_kernel<NT, PlainMap>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32), 0,
                     stream, true, p, segs);
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

namespace megactx::cuda {

bool fp8_gemm_grouped_supported(int64_t out0, int64_t out1, int64_t in) {
    return out0 >= 16 && out0 % 16 == 0 && out1 >= 0 && out1 % 16 == 0 && in >= 128 && in % 128 == 0;
}

cudaError_t launch_fp8_gemm_grouped(const Fp8GemmGroupedParams& p, int n_sm, cudaStream_t stream) {
    if (!fp8_gemm_grouped_supported(p.out0, p.out1, p.in) || p.max_groups <= 0 || p.max_count <= 0 || p.k <= 0 ||
        n_sm <= 0 || p.w0 < 0 || p.w0 > 2 || p.w1 > 2 || (p.out1 > 0 && p.w1 < 0) ||
        (reinterpret_cast<uintptr_t>(p.xq) & 15) != 0 || p.xs_stride <= 0)
        return cudaErrorInvalidValue;
    constexpr int NT = 2;  // passes of 16 slots (an expert that more than 16 tokens chose reads its weight again)
    const int64_t out = p.out0 + p.out1;
    // The experts a step touches are unknown on the host; size the split as if half the groups were active.
    const int segs = pick_segs(out, p.in, std::max<int64_t>(1, p.max_groups / 2), n_sm);
    const int64_t per_cta = kWarps / segs, grid = ((out + kRows - 1) / kRows + per_cta - 1) / per_cta;
    const int64_t passes = (p.max_count + 8 * NT - 1) / (8 * NT);
    return launch_ex(fp8_gemm_small_kernel<NT, GroupMap<NT>>,
                     dim3(static_cast<unsigned>(grid), static_cast<unsigned>(p.max_groups),
                          static_cast<unsigned>(passes)),
                     dim3(kWarps * 32), 0, stream, true, p, segs);
}

}  // namespace megactx::cuda
