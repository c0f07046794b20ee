// Device helpers shared by the indexer kernels (indexer_cache_write, indexer_q_quant, indexer_logits): the FP8
// numerical contract of src/kv/kv_format.h (ue8m0 power-of-two scales, e4m3 RNE satfinite) and warp reductions.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda_indexer {

constexpr int kDim = 128;                         // d_indexer
constexpr int kHeads = 32;                        // n_head_indexer
constexpr int kBlock = 64;                        // tokens per paged block
constexpr int kBlockBytes = kBlock * (kDim + 4);  // 8448: [64 × 128 B e4m3][64 × fp32 scale]

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// s = 2^ceil(log2(max(amax, 1e-4) / 448)), as kv_format.cpp's fp8_pow2_scale: the host takes log2 of the fp32
// quotient in float (correctly rounded in glibc), so the device rounds a double log2 to float before the ceil
// and gets the same power of two even when the quotient sits just above a power of two.
__device__ __forceinline__ float fp8_pow2_scale(float amax) {
    const float s = fmaxf(amax, 1e-4f) / 448.0f;
    const float l = static_cast<float>(log2(static_cast<double>(s)));
    return ldexpf(1.0f, static_cast<int>(ceilf(l)));
}

// fp32 → e4m3fn code, round to nearest even, saturating to ±448 (f32_to_fp8e4m3 in core/dtype.cpp).
__device__ __forceinline__ uint32_t fp8_code(float x) {
    return static_cast<uint32_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// x ← H · x, H the normalised 128 × 128 Walsh–Hadamard matrix, over a warp holding dims 4·lane .. 4·lane + 3 in
// x[0..3]: kv_format.cpp's hadamard_transform bit for bit (the same butterflies in the same order, each rounded
// once): strides 1 and 2 inside the lane, strides 4 … 64 across lanes (lane xor 1 … 16), then × scale
// (hadamard_scale(128) from the host).
__device__ __forceinline__ void warp_hadamard128(float (&x)[4], int lane, float scale) {
#pragma unroll
    for (int h = 1; h < 4; h *= 2) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if ((i & h) != 0) continue;
            const float a = x[i], b = x[i + h];
            x[i] = __fadd_rn(a, b);
            x[i + h] = __fsub_rn(a, b);
        }
    }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) {
        const bool high = (lane & m) != 0;  // this lane holds the pairs' second values
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float y = __shfl_xor_sync(0xffffffffu, x[j], m);
            x[j] = high ? __fsub_rn(y, x[j]) : __fadd_rn(x[j], y);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = __fmul_rn(x[j], scale);
}

// Four values → four e4m3 codes packed little-endian (element 0 in the low byte).
__device__ __forceinline__ uint32_t fp8_pack4(float a, float b, float c, float d, float inv_s) {
    return fp8_code(a * inv_s) | (fp8_code(b * inv_s) << 8) | (fp8_code(c * inv_s) << 16) | (fp8_code(d * inv_s) << 24);
}

}  // namespace megactx::cuda_indexer
