// Contract of RoPE (rope.cu; ops/rope.h): in place on x[t, h, offset : offset + dim] for every head; pair i
// (dims 2i, 2i+1 interleaved, i and i + dim/2 half-split) rotates by pos[t] · inv_freq[i], cos and sin times
// `scale` (model-spec §2.3).   x [n, n_head, d_head] fp32, pos [n] int32, inv_freq [dim / 2] device memory,
// computed on the host in fp32 exactly as the CPU oracle does (the device powf may differ by an ulp, which at
// position 10^6 moves the angle by hundredths of a radian).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

cudaError_t launch_rope(float* x, int64_t n, int64_t n_head, int64_t d_head, int64_t offset, int64_t dim,
                        const int32_t* pos, const float* inv_freq, float scale, bool interleaved, cudaStream_t stream);

}  // namespace megactx::cuda
