// Device helpers shared by the RoPE kernels that must match the CPU oracle bit for bit (rope.cu, kv_write.cu,
// indexer_cache_write.cu).
#pragma once

#include <cuda_runtime.h>

namespace megactx::cuda {

// One RoPE pair as the CPU oracle rotates it (CpuOps::rope): cos and sin of the fp32 angle taken in double and
// rounded (glibc's correctly rounded cosf / sinf; the device's fp32 ones are off by an ulp at times and slow above
// |angle| ~ 1e5), times the scale, and the products and sums rounded one by one (no FMA contraction).
__device__ __forceinline__ void rope_cos_sin(float angle, float scale, float& c, float& s) {
    double sd, cd;
    sincos(static_cast<double>(angle), &sd, &cd);
    c = __fmul_rn(static_cast<float>(cd), scale);
    s = __fmul_rn(static_cast<float>(sd), scale);
}

__device__ __forceinline__ void rope_rotate_pair(float angle, float scale, float& x0, float& x1) {
    float c, s;
    rope_cos_sin(angle, scale, c, s);
    const float a = x0, b = x1;
    x0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    x1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

}  // namespace megactx::cuda
