// Device helpers shared by the reference kernels: element loads from F32 / BF16 / FP8 storage, the FP8 KV
// quantisation that matches kv_format.cpp bit for bit (power-of-two scale, RNE satfinite e4m3), block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// Storage kinds of KV pools and weights, as the kernels see them.
enum class Elem : int { F32 = 0, BF16 = 1, FP8 = 2 };

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ float fp8_to_f32(uint8_t v) {
    __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
    return __half2float(__half(hr));
}

// Four e4m3 codes packed little-endian in a 32-bit word → float4 (two cvt.e4m3x2 → f16x2), exact.
__device__ __forceinline__ float4 e4m3x4_to_float4(uint32_t v) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ uint8_t f32_to_fp8(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// kv_format.cpp fp8_pow2_scale: 2^ceil(log2(max(amax, 1e-4) / 448)), same fp32 operations.
__device__ __forceinline__ float fp8_pow2_scale_dev(float amax) {
    const float s = fmaxf(amax, 1e-4f) / 448.0f;
    return exp2f(ceilf(log2f(s)));
}

// A 16-B piece of a weight row, read once: through the non-coherent path without allocating in L1 (moe.cu's staged
// activation row shares L1's storage). With plain loads moe.cu's per-choice kernels streamed 2.55 TB/s at one token
// (256 experts, 8 per token; 118.5 µs per layer), with these 3.08 TB/s (98.1 µs; bench_gemm --moe-tokens, H200,
// bench/results/cuda-h200-2026-12-01-950c0b7-moe-small-loads-ab.txt). That needs the kernels' explicit launch
// bounds: with them ptxas gives the FP8 kernels 121 (gate/up) and 128 (down) registers, 2 CTAs per SM, and keeps
// every row's steps of loads in flight; with its default heuristic it picks 70 registers (3 CTAs per SM) and runs
// 113 µs. Capping the grid at 32 or 64 CTAs per choice, each looping over its rows, measured 105 / 115 µs.
__device__ __forceinline__ uint4 load_weights16(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the block; `red` is shared scratch of 32 floats. All threads get the result.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warp = (blockDim.x + 31) >> 5;
    v = kMax ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = kMax ? -INFINITY : 0.0f;
    for (int w = 0; w < n_warp; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

// Element c of the latent row at `slot` of a pool in format `e` (rank, rope: the row geometry).
__device__ __forceinline__ float latent_load(const void* pool, Elem e, int64_t slot, int c, int rank, int rope) {
    const int d = rank + rope;
    if (e == Elem::F32) return static_cast<const float*>(pool)[slot * d + c];
    if (e == Elem::BF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(pool)[slot * d + c]);
    const int tile = rank % 128 == 0 ? 128 : rank, n_tile = rank / tile;
    const int64_t row_bytes = rank + 4 * n_tile + 2 * rope;
    const uint8_t* row = static_cast<const uint8_t*>(pool) + slot * row_bytes;
    if (c < rank) {
        float s;
        memcpy(&s, row + rank + 4 * (c / tile), 4);
        return fp8_to_f32(row[c]) * s;
    }
    uint16_t h;
    memcpy(&h, row + rank + 4 * n_tile + 2 * (c - rank), 2);
    return bf16_bits_to_f32(h);
}

// Element c of the indexer key at `slot` (dim values per key; FP8: the paged 64-token blocks).
__device__ __forceinline__ float indexer_load(const void* pool, Elem e, int64_t slot, int c, int dim) {
    if (e == Elem::F32) return static_cast<const float*>(pool)[slot * dim + c];
    if (e == Elem::BF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(pool)[slot * dim + c]);
    const uint8_t* block = static_cast<const uint8_t*>(pool) + (slot / 64) * int64_t{64} * (dim + 4);
    const int64_t off = slot % 64;
    float s;
    memcpy(&s, block + 64 * dim + 4 * off, 4);
    return fp8_to_f32(block[off * dim + c]) * s;
}

}  // namespace megactx::cuda
