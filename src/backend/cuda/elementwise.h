// Contract of the small memory-bound kernels behind CudaOps (elementwise.cu): copies, adds, gathers, the
// embedding lookup, SwiGLU's silu(g)·u, dtype conversions for the GEMM inputs and the MoE combine.
// All tensors are row-major device buffers; counts are elements. Each launch returns cudaGetLastError().
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// dst[r · dst_ld + c] = src[r · src_ld + c] for r < rows, c < cols (fp32).
cudaError_t launch_copy_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                           cudaStream_t stream);
// y[i] += x[i], i < n.
cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t stream);
// out[j, :] = x[rows[j], :]     x [*, d], out [m, d]
cudaError_t launch_gather_rows(float* out, const float* x, const int32_t* rows, int64_t m, int64_t d,
                               cudaStream_t stream);
// out[i] = argmax_c x[i, c], the lowest c on ties        x [n, d], out [n]
// x[rows[j], c] = -inf where bit c of mask j (w 32-bit words) is clear or c >= 32·w (Ops::mask_rows); rows out of
// [0, n) are skipped.
cudaError_t launch_mask_rows(float* x, int64_t n, int64_t d, const int32_t* rows, const uint32_t* bits, int64_t m,
                             int64_t w, cudaStream_t stream);
cudaError_t launch_argmax_rows(int32_t* out, const float* x, int64_t n, int64_t d, cudaStream_t stream);
// out[i, :] = table[ids[i], :] dequantised: elem 0 = f32, 1 = bf16, 2 = fp8 e4m3 × scale_inv[r / block, c / block]
//   ids [n], table [vocab, cols], scale_inv [ceil(vocab / block), ceil(cols / block)], out [n, cols]
cudaError_t launch_embedding(float* out, const int32_t* ids, const void* table, int elem, const float* scale_inv,
                             int64_t block, int64_t cols, int64_t n, cudaStream_t stream);
// g[i] = silu(g[i]) · u[i]
cudaError_t launch_silu_mul(float* g, const float* u, int64_t n, cudaStream_t stream);
// out[i] = bf16(x[i]) (round to nearest even)
cudaError_t launch_f32_to_bf16(uint16_t* out, const float* x, int64_t n, cudaStream_t stream);
// out[r, c] = bf16(fp8(w[r, c]) · scale_inv[r / block, c / block])     w, out [rows, cols]
cudaError_t launch_fp8_weight_to_bf16(uint16_t* out, const uint8_t* w, const float* scale_inv, int64_t rows,
                                      int64_t cols, int64_t block, cudaStream_t stream);
// out[r, c] = w[r, c] as fp32: elem 1 = bf16, 2 = fp8 e4m3 × scale_inv[r / block, c / block]
cudaError_t launch_weight_to_f32(float* out, const void* w, int elem, const float* scale_inv, int64_t rows,
                                 int64_t cols, int64_t block, cudaStream_t stream);
// y[i, :] = Σ_j w[i, j] · ys[inv[i · k + j], :] in j order      ys [n · k, d], inv/w [n, k], y [n, d]
cudaError_t launch_moe_combine(float* y, const float* ys, const int32_t* inv, const float* w, int64_t n, int64_t k,
                               int64_t d, cudaStream_t stream);
// cache[slots[i], :] = rows[i, :] stored as elem 0 = f32 or 1 = bf16      rows [n, d], cache [n_slots, d]
cudaError_t launch_cache_copy(void* cache, int elem, const float* rows, const int32_t* slots, int64_t n, int64_t d,
                              cudaStream_t stream);

}  // namespace megactx::cuda
