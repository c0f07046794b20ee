// Contract of interleaved RoPE (rope.cu): in place on x[t, h, offset : offset + dim] for every head; pairs
// (2i, 2i+1) rotate by pos[t] · inv_freq[i] (model-spec §2.3).   x [n, n_head, d_head] fp32, pos [n] int32,
// inv_freq [dim / 2] = 1 / theta^(2i/dim), computed on the host in fp32 exactly as the CPU oracle does (the device
// powf may differ by an ulp, which at position 10^6 moves the angle by hundredths of a radian).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

cudaError_t launch_rope(float* x, int64_t n, int64_t n_head, int64_t d_head, int64_t offset, int64_t dim,
                        const int32_t* pos, const float* inv_freq, cudaStream_t stream);

}  // namespace megactx::cuda
