// indexer_cache_write kernel: one warp per token, 4 consecutive dims per lane.
//   k_raw [n, 128] fp32 → LayerNorm → interleaved RoPE on dims [0, 64) → (optionally) Hadamard → e4m3 codes + fp32
//   pow2 scale at slots[i]
// Reference: CpuOps::layer_norm + CpuOps::rope + hadamard_transform + fp8_indexer_pack (kv_format.cpp). The LayerNorm
// sums run in a different order (warp tree), so a code can differ by one step in rare rounding ties. inv_freq comes
// from the host, computed with std::pow exactly as CpuOps::rope does; sin and cos of the fp32 angle are computed in
// double (one sincos) and rounded to fp32, matching glibc's correctly rounded float functions. (Until c008da4: pow, sin
// and cos each in double on the device were a serial chain in this one-token kernel; with the latent write's sin/cos
// change the two writes went from 10.2 to 7.3 µs in bench_layer.)
#include <cmath>

#include "backend/cuda/indexer_cache_write.h"
#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/launch_ex.cuh"
#include "backend/cuda/rope_pair.cuh"

namespace megactx {

using namespace cuda_indexer;

namespace {

// The frequencies of the pairs j of the rotated dims (d_rope ≤ 128: at most 64 pairs), from the host's table.
struct RopeFreqs {
    float inv_freq[kDim / 2];
    float scale;  // cos and sin times this
    int half;     // 0: interleaved pairs; else half-split pairs (j, j + half), half = d_rope / 2
};

__global__ void __launch_bounds__(256)
    indexer_cache_write_kernel(const __grid_constant__ IndexerCacheWriteParams p, const __grid_constant__ RopeFreqs f) {
    // Launched under PDL (behind the latent write): wait for the previous kernel before touching memory.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int lane = threadIdx.x & 31;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (i >= p.n) return;
    // All global loads first (one memory round trip for a one-token decode write, not a dependent chain).
    const float4 x4 = reinterpret_cast<const float4*>(p.k_raw + i * kDim)[lane];
    const float4 w4 = reinterpret_cast<const float4*>(p.ln_w)[lane];
    const float4 b4 = reinterpret_cast<const float4*>(p.ln_b)[lane];
    const int64_t slot = p.slots[i];
    const float fp = static_cast<float>(p.pos[i]);
    float x[4] = {x4.x, x4.y, x4.z, x4.w};
    // LayerNorm: mean, then the mean of squared deviations, as the CPU reference (two passes, fp32).
    const float mean = warp_sum((x[0] + x[1]) + (x[2] + x[3])) / static_cast<float>(kDim);
    float d2 = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) d2 = __fadd_rn(d2, __fmul_rn(x[j] - mean, x[j] - mean));
    const float var = warp_sum(d2) / static_cast<float>(kDim);
    const float r = 1.0f / sqrtf(var + p.eps);
    const float w[4] = {w4.x, w4.y, w4.z, w4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = __fadd_rn(__fmul_rn(__fmul_rn(x[j] - mean, r), w[j]), b[j]);
    if (f.half == 0) {
        // Interleaved RoPE: this lane holds pairs j0 = 2·lane and j0 + 1 (dims 4·lane .. 4·lane + 3).
        if (4 * lane < p.d_rope) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float c, s;
                cuda::rope_cos_sin(__fmul_rn(fp, f.inv_freq[2 * lane + h]), f.scale, c, s);
                const float x0 = x[2 * h], x1 = x[2 * h + 1];
                x[2 * h] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
                x[2 * h + 1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
            }
        }
    } else {
        // Half-split RoPE: dim k < half pairs with k + half, held by the lane half / 4 further on.
        const bool rotated = 4 * lane < p.d_rope, low = 4 * lane < f.half;
        const int partner = !rotated ? lane : low ? lane + f.half / 4 : lane - f.half / 4;
        float y[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) y[j] = __shfl_sync(0xffffffffu, x[j], partner);
        if (rotated) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = 4 * lane + j;
                float c, s;
                cuda::rope_cos_sin(__fmul_rn(fp, f.inv_freq[low ? k : k - f.half]), f.scale, c, s);
                // low: x1·c − x2·s with x2 the partner; high: x2·c + x1·s with x1 the partner
                x[j] = low ? __fsub_rn(__fmul_rn(x[j], c), __fmul_rn(y[j], s))
                           : __fadd_rn(__fmul_rn(x[j], c), __fmul_rn(y[j], s));
            }
        }
    }
    if (p.hadamard_scale > 0.0f) warp_hadamard128(x, lane, p.hadamard_scale);
    const float amax = warp_max(fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3]))));
    const float scale = fp8_pow2_scale(amax);
    uint8_t* block = p.pool + (slot / kBlock) * kBlockBytes;
    const int64_t off = slot % kBlock;
    reinterpret_cast<uint32_t*>(block + off * kDim)[lane] = fp8_pack4(x[0], x[1], x[2], x[3], 1.0f / scale);
    if (lane == 0) reinterpret_cast<float*>(block + kBlock * kDim)[off] = scale;
}

}  // namespace

bool indexer_cache_write_supported(int64_t d_indexer, int64_t d_rope) {
    return d_indexer == kDim && d_rope > 0 && d_rope <= kDim && d_rope % 8 == 0;
}

void launch_indexer_cache_write(const IndexerCacheWriteParams& p, cudaStream_t stream) {
    if (p.n <= 0) return;
    constexpr int kWarps = 8;
    const auto grid = static_cast<unsigned>((p.n + kWarps - 1) / kWarps);
    RopeFreqs f{};
    for (int64_t j = 0; j < p.d_rope / 2; ++j) f.inv_freq[j] = p.inv_freq[j];
    f.scale = p.rope_scale;
    f.half = p.interleaved ? 0 : static_cast<int>(p.d_rope / 2);
    cuda::launch_ex(indexer_cache_write_kernel, dim3(grid), dim3(kWarps * 32), 0, stream, true, p, f);
}

}  // namespace megactx
