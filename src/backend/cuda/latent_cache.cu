// latent_cache_write kernel (contract in latent_cache.h; model-spec §2.2/§2.4/§2.7, FP8 row layout kv/kv_format.h).
// One CTA of 128 threads per token: thread t owns c[4t..4t+3]; warp w owns FP8 tile w (c[128w..128w+127]).
//   c    = w ⊙ (c_raw · 1/sqrt(mean(c_raw²) + eps))                 fp32, as CpuOps::rms_norm
//   k_pe = interleaved RoPE: pair (2j, 2j+1) rotates by pos · inv_freq[j] (fp32 angle, as CpuOps::rope; inv_freq
//          is the host's table (ops/rope.h) so the angles are the oracle's bit for bit; sin/cos in double, times
//          the rope scale)
//   BF16 row: [c | k_pe] as bf16 (RNE).  FP8 row: per tile s = 2^ceil(log2(max(amax,1e-4)/448)),
//   codes = e4m3 satfinite RNE of c/s, then the 4 fp32 scales, then k_pe as bf16 (= fp8_latent_pack).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "backend/cuda/latent_cache.h"
#include "backend/cuda/launch_ex.cuh"

namespace megactx::cuda {
namespace {

constexpr int kRank = 512, kRope = 64, kRow = kRank + kRope, kFp8RowBytes = 656;

// ue8m0 power-of-two scale; exact (frexp) instead of log2 so no rounding can pick the wrong power.
__device__ float pow2_scale(float amax) {
    const float s = fmaxf(amax, 1e-4f) / 448.0f;
    int e;
    const float m = frexpf(s, &e);  // s = m · 2^e, m in [0.5, 1)
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// inv_freq is the host's table (ops/rope.h, std::pow in fp32 as CpuOps::rope uses it): at positions ~1e6 one ulp of
// inv_freq moves the fp32 angle by whole ulps, so a device powf could not match the oracle.
struct RopeFreqs {
    float inv_freq[kRope / 2];
    float scale;  // cos and sin times this
};

__global__ void __launch_bounds__(128)
    latent_cache_write_kernel(const __grid_constant__ LatentCacheWriteParams p, const __grid_constant__ RopeFreqs f) {
    const int64_t i = blockIdx.x;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    // Launched under PDL: wait for the previous kernel before touching memory, and let the next one (the indexer
    // write, also under PDL) become resident at once, so the two one-token kernels' launches overlap.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    // Every global load is issued up front, before any of them is used: one memory round trip instead of a chain
    // of dependent ones (slot → row → norm weights → position), which is most of a one-token decode write.
    const int32_t slot = p.slots[i];
    const float* x = p.kv_raw + i * kRow;  // [576]
    float4 v = reinterpret_cast<const float4*>(x)[t];
    const float4 w = reinterpret_cast<const float4*>(p.norm_w)[t];
    float x0 = 0.f, x1 = 0.f, fpos = 0.f;
    if (warp == 0) {
        x0 = x[kRank + 2 * lane];
        x1 = x[kRank + 2 * lane + 1];
        fpos = static_cast<float>(p.pos[i]);
    }
    if (slot < 0) return;
    float ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ float red[4];
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    const float ms = (red[0] + red[1] + red[2] + red[3]) / static_cast<float>(kRank);
    const float r = 1.0f / sqrtf(ms + p.eps);
    v.x = w.x * (v.x * r);
    v.y = w.y * (v.y * r);
    v.z = w.z * (v.z * r);
    v.w = w.w * (v.w * r);

    // RoPE on k_pe: threads 0..31 each rotate one pair.
    float2 pe = make_float2(0.f, 0.f);
    if (warp == 0) {
        // sin and cos of the fp32 angle in double, rounded to fp32 (glibc's sinf/cosf are correctly rounded; the
        // fp32 sincosf takes its slow reduction path above |angle| ~ 1e5, i.e. from position ~100K on).
        const float angle = fpos * f.inv_freq[lane];
        double sd, cd;
        sincos(static_cast<double>(angle), &sd, &cd);
        const float sn = static_cast<float>(sd) * f.scale, cs = static_cast<float>(cd) * f.scale;
        pe = make_float2(x0 * cs - x1 * sn, x1 * cs + x0 * sn);
    }

    if (p.format == LatentCacheFormat::BF16) {
        __nv_bfloat16* row = static_cast<__nv_bfloat16*>(p.cache) + static_cast<int64_t>(slot) * kRow;
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        reinterpret_cast<__nv_bfloat162*>(row)[2 * t] = lo;
        reinterpret_cast<__nv_bfloat162*>(row)[2 * t + 1] = hi;
        if (warp == 0) reinterpret_cast<__nv_bfloat162*>(row + kRank)[lane] = __floats2bfloat162_rn(pe.x, pe.y);
        return;
    }
    uint8_t* row = static_cast<uint8_t*>(p.cache) + static_cast<int64_t>(slot) * kFp8RowBytes;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = pow2_scale(amax);
    // x / s with a power-of-two s is exact, so the codes match the host pack bit for bit on equal inputs.
    const uint32_t c0 = __nv_cvt_float_to_fp8(v.x / s, __NV_SATFINITE, __NV_E4M3);
    const uint32_t c1 = __nv_cvt_float_to_fp8(v.y / s, __NV_SATFINITE, __NV_E4M3);
    const uint32_t c2 = __nv_cvt_float_to_fp8(v.z / s, __NV_SATFINITE, __NV_E4M3);
    const uint32_t c3 = __nv_cvt_float_to_fp8(v.w / s, __NV_SATFINITE, __NV_E4M3);
    reinterpret_cast<uint32_t*>(row)[t] = c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
    if (lane == 0) reinterpret_cast<float*>(row + kRank)[warp] = s;
    if (warp == 0) reinterpret_cast<__nv_bfloat162*>(row + kRank + 16)[lane] = __floats2bfloat162_rn(pe.x, pe.y);
}

}  // namespace

bool latent_cache_write_supported(const LatentCacheWriteParams& p) {
    return p.kv_raw && p.norm_w && p.pos && p.slots && p.cache && p.inv_freq && p.n >= 0 && p.n <= 0x7fffffff;
}

cudaError_t launch_latent_cache_write(const LatentCacheWriteParams& p, cudaStream_t stream) {
    if (!latent_cache_write_supported(p)) return cudaErrorInvalidValue;
    if (p.n == 0) return cudaSuccess;
    RopeFreqs f;
    for (int j = 0; j < kRope / 2; ++j) f.inv_freq[j] = p.inv_freq[j];
    f.scale = p.rope_scale;
    return launch_ex(latent_cache_write_kernel, dim3(static_cast<unsigned>(p.n)), dim3(128), 0, stream, true, p, f);
}

}  // namespace megactx::cuda
