// The batch-invariant mode's GEMM (contract: invariant_gemm.h) on the CUDA cores. Two kernels, one per weight
// orientation; nothing in either's arithmetic for an output depends on the row count, so the launch shape may.
// Its cost against the default paths: docs/benchmarks.md (cuda.sh's `invariant` stage).
#include "backend/cuda/invariant_gemm.h"

#include "backend/cuda/cuda_common.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace megactx::cuda {
namespace {

// InvariantGemmParams as the kernel takes it: 32-bit sizes, 88 bytes (design.md §6: parameter structs passed by value
// stay within 128 bytes). Offsets are formed in 64 bits in the kernel.
struct Args {
    const float* x;
    const void* w;
    const float* scales;
    float* y;
    int32_t ldx, x_bstride, scale_ld, block, w_ld, w_row0, w_batch_rows, ldy, y_bstride, n, out, in;
    int32_t wtype;
    bool o_rows;
    bool w_vec;  // lane-split kernel: W read in 16-B pieces (invariant_gemm.h: fixed by the weight alone)
    bool x_vec;  // lane-split kernel: x read as float4 (the same values either way)
};
static_assert(sizeof(Args) <= 128, "kernel parameters within 128 bytes");

// ---- W stored as [in, out] (o_rows = false: MLA's q · W_UK per head, k = d_nope, a few hundred) ----
// A thread per output, kRows rows: W's row k is contiguous over outputs, so a warp's loads are adjacent; each output
// one fp32 accumulator over k = 0, 1, ..., in - 1 in order (fmaf of x and the widened weight).
template <int kType, int kRows>
__global__ void __launch_bounds__(128) invariant_cols_kernel(Args p) {
    const int32_t o = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
    if (o >= p.out) return;
    const int32_t t0 = static_cast<int32_t>(blockIdx.y) * kRows;
    const int nr = min(kRows, p.n - t0);
    const int64_t b = blockIdx.z;
    const float* x = p.x + b * p.x_bstride + static_cast<int64_t>(t0) * p.ldx;
    int64_t r = static_cast<int64_t>(p.w_row0) + b * p.w_batch_rows;  // W's stored row of k = 0
    // e4m3: the scale row of stored row r, stepped with r (no division per element)
    int32_t rb = kType == 2 ? static_cast<int32_t>(r / p.block) : 0, rin = kType == 2 ? static_cast<int32_t>(r % p.block) : 0;
    const float* sc = kType == 2 ? p.scales + o / p.block : nullptr;
    float acc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = 0.0f;
#pragma unroll 4
    for (int32_t k = 0; k < p.in; ++k, ++r) {
        const int64_t i = r * p.w_ld + o;
        float w;
        if constexpr (kType == 0) {
            w = static_cast<const float*>(p.w)[i];
        } else if constexpr (kType == 1) {
            w = bf16_bits_to_f32(static_cast<const uint16_t*>(p.w)[i]);
        } else {
            w = fp8_to_f32(static_cast<const uint8_t*>(p.w)[i]) * sc[static_cast<int64_t>(rb) * p.scale_ld];
            if (++rin == p.block) rin = 0, ++rb;
        }
#pragma unroll
        for (int t = 0; t < kRows; ++t)
            if (t < nr) acc[t] = fmaf(x[static_cast<int64_t>(t) * p.ldx + k], w, acc[t]);
    }
    float* y = p.y + b * p.y_bstride + static_cast<int64_t>(t0) * p.ldy + o;
#pragma unroll
    for (int t = 0; t < kRows; ++t)
        if (t < nr) y[static_cast<int64_t>(t) * p.ldy] = acc[t];
}

template <int kType>
void launch_cols_for(const Args& a, int64_t n, int64_t batch, cudaStream_t stream) {
    const auto launch = [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        const dim3 grid(static_cast<unsigned>((a.out + 127) / 128), static_cast<unsigned>((n + kRows - 1) / kRows),
                        static_cast<unsigned>(batch));
        invariant_cols_kernel<kType, kRows><<<grid, 128, 0, stream>>>(a);
    };
    if (n <= 3)
        launch(std::integral_constant<int, 1>{});
    else
        launch(std::integral_constant<int, 8>{});
}

// ---- W stored as [out, in] (o_rows = true: every linear, MLA's latent · W_UVᵀ) ----
// Each output is one warp's dot product split over its 32 lanes (invariant_gemm.h gives the order), as a GEMV
// reads a weight: the decode row streams W in 16-B pieces with kU pieces per output in flight, where a tiled kernel
// walks k as a chain of dependent steps (27.5 ms a glm52-shape decode step at 8c57d4f). A warp takes kOuts outputs
// × kRows rows, so one W piece in registers serves kRows rows; CTAs of kWarps warps side by side over outputs.

template <int kType>
struct Elem16 {  // weight elements per 16-B piece and their storage type
    using T = std::conditional_t<kType == 0, float, std::conditional_t<kType == 1, uint16_t, uint8_t>>;
    static constexpr int kPer = 16 / static_cast<int>(sizeof(T));
};

// The kPer weights of a 16-B piece, widened exactly (e4m3 without its block scale: that multiplies the piece's sum).
template <int kType>
__device__ __forceinline__ void widen16(const uint4& raw, float (&w)[Elem16<kType>::kPer]) {
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (kType == 0) {
            w[i] = __uint_as_float(u[i]);
        } else if constexpr (kType == 1) {
            w[2 * i] = __uint_as_float(u[i] << 16);
            w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        } else {
            const float4 f = e4m3x4_to_float4(u[i]);
            w[4 * i] = f.x, w[4 * i + 1] = f.y, w[4 * i + 2] = f.z, w[4 * i + 3] = f.w;
        }
    }
}

template <int kType, int kRows, int kOuts, int kU, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) invariant_rows_kernel(Args p) {
    using T = typename Elem16<kType>::T;
    constexpr int kPer = Elem16<kType>::kPer;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int32_t ob = (static_cast<int32_t>(blockIdx.x) * kWarps + static_cast<int32_t>(threadIdx.x >> 5)) * kOuts;
    if (ob >= p.out) return;  // (no barriers below)
    const int32_t t0 = static_cast<int32_t>(blockIdx.y) * kRows;
    const int nr = min(kRows, p.n - t0);  // rows of this tile that exist: a decode row pays for one
    const int64_t b = blockIdx.z;
    const float* x = p.x + b * p.x_bstride + static_cast<int64_t>(t0) * p.ldx;
    const int64_t wr0 = static_cast<int64_t>(p.w_row0) + b * p.w_batch_rows;
    const T* wrow[kOuts];
    const float* srow[kOuts];
#pragma unroll
    for (int q = 0; q < kOuts; ++q) {
        const int64_t r = wr0 + min(ob + q, p.out - 1);  // a past-the-end output reads the last row, unwritten
        wrow[q] = static_cast<const T*>(p.w) + r * p.w_ld;
        srow[q] = kType == 2 ? p.scales + (r / p.block) * p.scale_ld : nullptr;
    }
    float acc[kRows][kOuts];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int q = 0; q < kOuts; ++q) acc[r][q] = 0.0f;
    if (p.w_vec) {
        // Lane l sums the pieces at k = kPer · (l + 32 j), j = 0, 1, ... in order; a piece's kPer products go into
        // their own sum first, which then joins the lane's (times the e4m3 block scale).
        constexpr int kStep = 32 * kPer;
        for (int32_t c0 = lane * kPer; c0 < p.in; c0 += kU * kStep) {
            uint4 raw[kU][kOuts];
#pragma unroll
            for (int u = 0; u < kU; ++u)
#pragma unroll
                for (int q = 0; q < kOuts; ++q)
                    raw[u][q] = c0 + u * kStep < p.in ? load_weights16(wrow[q] + c0 + u * kStep) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                const int32_t c = c0 + u * kStep;
                if (c >= p.in) break;
                float xa[kRows][kPer];
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                    if (r >= nr) break;
                    const float* xr = x + static_cast<int64_t>(r) * p.ldx + c;
                    if (p.x_vec) {
#pragma unroll
                        for (int e = 0; e < kPer; e += 4) {
                            const float4 v = *reinterpret_cast<const float4*>(xr + e);
                            xa[r][e] = v.x, xa[r][e + 1] = v.y, xa[r][e + 2] = v.z, xa[r][e + 3] = v.w;
                        }
                    } else {
#pragma unroll
                        for (int e = 0; e < kPer; ++e) xa[r][e] = xr[e];
                    }
                }
                const int32_t cb = kType == 2 ? c / p.block : 0;
#pragma unroll
                for (int q = 0; q < kOuts; ++q) {
                    float w[kPer];
                    widen16<kType>(raw[u][q], w);
                    const float s = kType == 2 ? srow[q][cb] : 1.0f;
#pragma unroll
                    for (int r = 0; r < kRows; ++r) {
                        if (r >= nr) break;
                        float part = 0.0f;
#pragma unroll
                        for (int e = 0; e < kPer; ++e) part = fmaf(xa[r][e], w[e], part);
                        acc[r][q] = kType == 2 ? fmaf(s, part, acc[r][q]) : acc[r][q] + part;
                    }
                }
            }
        }
    } else {
        // Lane l sums k = l + 32 j, j = 0, 1, ... in order, one product at a time.
        for (int32_t c = lane; c < p.in; c += 32) {
#pragma unroll
            for (int q = 0; q < kOuts; ++q) {
                float w;
                if constexpr (kType == 0)
                    w = wrow[q][c];
                else if constexpr (kType == 1)
                    w = bf16_bits_to_f32(wrow[q][c]);
                else
                    w = fp8_to_f32(wrow[q][c]) * srow[q][c / p.block];
#pragma unroll
                for (int r = 0; r < kRows; ++r)
                    if (r < nr) acc[r][q] = fmaf(x[static_cast<int64_t>(r) * p.ldx + c], w, acc[r][q]);
            }
        }
    }
    // The lanes' sums by the butterfly: after each exchange lanes l and l ^ off hold the same value (a + b = b + a),
    // so every lane ends with the same bits.
    float* y = p.y + b * p.y_bstride + static_cast<int64_t>(t0) * p.ldy;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        if (r >= nr) break;
#pragma unroll
        for (int q = 0; q < kOuts; ++q) {
            float v = acc[r][q];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == r * kOuts + q && ob + q < p.out) y[static_cast<int64_t>(r) * p.ldy + ob + q] = v;
        }
    }
}

template <int kType, int kRows, int kOuts, int kU, int kWarps>
void launch_rows(const Args& a, int64_t n, int64_t batch, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>((a.out + kWarps * kOuts - 1) / (kWarps * kOuts)),
                    static_cast<unsigned>((n + kRows - 1) / kRows), static_cast<unsigned>(batch));
    invariant_rows_kernel<kType, kRows, kOuts, kU, kWarps><<<grid, kWarps * 32, 0, stream>>>(a);
}

// Up to 3 rows (decode, a short verification): one row a warp, 4 pieces of each of its 4 outputs in flight (e4m3:
// 8 KB a warp), CTAs of 4 warps so that a weight of 2,048 outputs spreads over 128 SMs (ptxas: 128 registers, 4 CTAs
// an SM). More rows: 4 rows a warp, each W piece used 4 times, CTAs of 8 warps reading the same x rows through L1.
template <int kType>
void launch_rows_for(const Args& a, int64_t n, int64_t batch, cudaStream_t stream) {
    if (n <= 3)
        launch_rows<kType, 1, 4, 4, 4>(a, n, batch, stream);
    else
        launch_rows<kType, 4, 4, 1, 8>(a, n, batch, stream);
}

}  // namespace

cudaError_t launch_invariant_gemm(const InvariantGemmParams& p, cudaStream_t stream) {
    if (p.n == 0 || p.out == 0 || p.batch == 0) return cudaSuccess;
    const int64_t sizes[] = {p.ldx, p.x_bstride, p.scale_ld, p.block, p.w_ld, p.w_row0, p.w_batch_rows,
                             p.ldy, p.y_bstride, p.n, p.out, p.in, p.batch};
    for (const int64_t v : sizes)
        if (v < 0 || v > INT32_MAX) return cudaErrorInvalidValue;
    if (p.w_row0 + p.batch * p.w_batch_rows + std::max(p.out, p.in) > INT32_MAX) return cudaErrorInvalidValue;
    if (p.wtype < 0 || p.wtype > 2 || (p.wtype == 2 && (p.scales == nullptr || p.block <= 0)))
        return cudaErrorInvalidValue;
    if (p.batch > 65535 || (p.n + 3) / 4 > 65535) return cudaErrorInvalidValue;  // grid.z; grid.y of 4-row tiles
    Args a{p.x,
           p.w,
           p.scales,
           p.y,
           static_cast<int32_t>(p.ldx),
           static_cast<int32_t>(p.x_bstride),
           static_cast<int32_t>(p.scale_ld),
           static_cast<int32_t>(p.block),
           static_cast<int32_t>(p.w_ld),
           static_cast<int32_t>(p.w_row0),
           static_cast<int32_t>(p.w_batch_rows),
           static_cast<int32_t>(p.ldy),
           static_cast<int32_t>(p.y_bstride),
           static_cast<int32_t>(p.n),
           static_cast<int32_t>(p.out),
           static_cast<int32_t>(p.in),
           p.wtype,
           p.o_rows,
           false,
           false};
    const auto by_type = [&](auto launch) {  // launch(std::integral_constant<int, wtype>)
        if (p.wtype == 0)
            launch(std::integral_constant<int, 0>{});
        else if (p.wtype == 1)
            launch(std::integral_constant<int, 1>{});
        else
            launch(std::integral_constant<int, 2>{});
    };
    if (p.o_rows) {
        const int64_t size = p.wtype == 0 ? 4 : p.wtype == 1 ? 2 : 1, per = 16 / size;
        a.w_vec = (reinterpret_cast<uintptr_t>(p.w) & 15) == 0 && (p.w_ld * size) % 16 == 0 && p.in % per == 0 &&
                  (p.wtype != 2 || p.block % per == 0);
        a.x_vec = (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 && p.ldx % 4 == 0 && p.x_bstride % 4 == 0;
        by_type([&](auto t) { launch_rows_for<decltype(t)::value>(a, p.n, p.batch, stream); });
    } else {
        by_type([&](auto t) { launch_cols_for<decltype(t)::value>(a, p.n, p.batch, stream); });
    }
    return cudaGetLastError();
}

}  // namespace megactx::cuda
