// Small memory-bound kernels of CudaOps (contract: elementwise.h). One thread per element (grid-stride),
// fp32 math; conversions round to nearest even like core/dtype.h.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/elementwise.h"

namespace megactx::cuda {

namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

#define MEGACTX_GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

__global__ void copy_2d_kernel(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                               int64_t cols) {
    MEGACTX_GRID_STRIDE(i, rows * cols) {
        const int64_t r = i / cols, c = i % cols;
        dst[r * dst_ld + c] = src[r * src_ld + c];
    }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
    MEGACTX_GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void gather_rows_kernel(float* out, const float* x, const int32_t* rows, int64_t m, int64_t d) {
    MEGACTX_GRID_STRIDE(i, m * d) {
        const int64_t j = i / d, c = i % d;
        out[i] = x[static_cast<int64_t>(rows[j]) * d + c];
    }
}

__global__ void embedding_kernel(float* out, const int32_t* ids, const void* table, int elem, const float* scale_inv,
                                 int64_t block, int64_t cols, int64_t n) {
    MEGACTX_GRID_STRIDE(i, n * cols) {
        const int64_t t = i / cols, c = i % cols, r = ids[t];
        float v;
        if (elem == 0) {
            v = static_cast<const float*>(table)[r * cols + c];
        } else if (elem == 1) {
            v = bf16_bits_to_f32(static_cast<const uint16_t*>(table)[r * cols + c]);
        } else {
            const int64_t n_col_blocks = (cols + block - 1) / block;
            v = fp8_to_f32(static_cast<const uint8_t*>(table)[r * cols + c]) *
                scale_inv[(r / block) * n_col_blocks + c / block];
        }
        out[i] = v;
    }
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
    MEGACTX_GRID_STRIDE(i, n) {
        const float x = g[i];
        g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

__global__ void f32_to_bf16_kernel(uint16_t* out, const float* x, int64_t n) {
    MEGACTX_GRID_STRIDE(i, n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

__global__ void fp8_weight_to_bf16_kernel(uint16_t* out, const uint8_t* w, const float* scale_inv, int64_t rows,
                                          int64_t cols, int64_t block) {
    const int64_t n_col_blocks = (cols + block - 1) / block;
    MEGACTX_GRID_STRIDE(i, rows * cols) {
        const int64_t r = i / cols, c = i % cols;
        const float v = fp8_to_f32(w[i]) * scale_inv[(r / block) * n_col_blocks + c / block];
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
}

__global__ void weight_to_f32_kernel(float* out, const void* w, int elem, const float* scale_inv, int64_t rows,
                                     int64_t cols, int64_t block) {
    const int64_t n_col_blocks = (cols + block - 1) / block;
    MEGACTX_GRID_STRIDE(i, rows * cols) {
        if (elem == 1) {
            out[i] = bf16_bits_to_f32(static_cast<const uint16_t*>(w)[i]);
        } else {
            const int64_t r = i / cols, c = i % cols;
            out[i] = fp8_to_f32(static_cast<const uint8_t*>(w)[i]) * scale_inv[(r / block) * n_col_blocks + c / block];
        }
    }
}

__global__ void moe_combine_kernel(float* y, const float* ys, const int32_t* inv, const float* w, int64_t n, int64_t k,
                                   int64_t d) {
    MEGACTX_GRID_STRIDE(i, n * d) {
        const int64_t t = i / d, c = i % d;
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) acc += w[t * k + j] * ys[static_cast<int64_t>(inv[t * k + j]) * d + c];
        y[i] = acc;
    }
}

__global__ void cache_copy_kernel(void* cache, int elem, const float* rows, const int32_t* slots, int64_t n,
                                  int64_t d) {
    MEGACTX_GRID_STRIDE(i, n * d) {
        const int64_t t = i / d, c = i % d, dst = static_cast<int64_t>(slots[t]) * d + c;
        if (slots[t] < 0) continue;  // slot -1: not written here
        if (elem == 0) {
            static_cast<float*>(cache)[dst] = rows[i];
        } else {
            static_cast<uint16_t*>(cache)[dst] = __bfloat16_as_ushort(__float2bfloat16_rn(rows[i]));
        }
    }
}

}  // namespace

cudaError_t launch_copy_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                           cudaStream_t stream) {
    if (rows * cols == 0) return cudaSuccess;
    copy_2d_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols);
    return cudaGetLastError();
}

cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
    return cudaGetLastError();
}

cudaError_t launch_gather_rows(float* out, const float* x, const int32_t* rows, int64_t m, int64_t d,
                               cudaStream_t stream) {
    if (m * d == 0) return cudaSuccess;
    gather_rows_kernel<<<blocks_for(m * d), kThreads, 0, stream>>>(out, x, rows, m, d);
    return cudaGetLastError();
}

// One block per row; each thread keeps its best (value, lowest index), then a shared-memory tree picks the larger
// value, the lower index on ties.
__global__ void argmax_rows_kernel(int32_t* out, const float* x, int64_t d) {
    constexpr int kT = 256;
    __shared__ float best_v[kT];
    __shared__ int32_t best_i[kT];
    const float* row = x + blockIdx.x * d;
    float v = -INFINITY;
    int32_t bi = -1;
    for (int64_t c = threadIdx.x; c < d; c += kT) {
        const float y = row[c];
        if (bi < 0 || y > v) {
            v = y;
            bi = static_cast<int32_t>(c);
        }
    }
    best_v[threadIdx.x] = v;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = kT / 2; s > 0; s /= 2) {
        if (static_cast<int>(threadIdx.x) < s) {
            const float ov = best_v[threadIdx.x + s];
            const int32_t oi = best_i[threadIdx.x + s];
            const int32_t mi = best_i[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] < 0 ? 0 : best_i[0];
}

// One block per masked row, its threads striding over the columns.
__global__ void mask_rows_kernel(float* x, int64_t n, int64_t d, const int32_t* rows, const uint32_t* bits, int64_t w) {
    const int32_t r = rows[blockIdx.x];
    if (r < 0 || r >= n) return;
    float* row = x + r * d;
    const uint32_t* words = bits + blockIdx.x * w;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
        if (c >= 32 * w || ((words[c / 32] >> (c % 32)) & 1u) == 0) row[c] = -INFINITY;
}

cudaError_t launch_mask_rows(float* x, int64_t n, int64_t d, const int32_t* rows, const uint32_t* bits, int64_t m,
                             int64_t w, cudaStream_t stream) {
    if (m == 0 || d == 0) return cudaSuccess;
    if (m > 2147483647) return cudaErrorInvalidValue;
    mask_rows_kernel<<<static_cast<unsigned>(m), 256, 0, stream>>>(x, n, d, rows, bits, w);
    return cudaGetLastError();
}

cudaError_t launch_argmax_rows(int32_t* out, const float* x, int64_t n, int64_t d, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    argmax_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(out, x, d);
    return cudaGetLastError();
}

cudaError_t launch_embedding(float* out, const int32_t* ids, const void* table, int elem, const float* scale_inv,
                             int64_t block, int64_t cols, int64_t n, cudaStream_t stream) {
    if (n * cols == 0) return cudaSuccess;
    embedding_kernel<<<blocks_for(n * cols), kThreads, 0, stream>>>(out, ids, table, elem, scale_inv, block, cols, n);
    return cudaGetLastError();
}

cudaError_t launch_silu_mul(float* g, const float* u, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, u, n);
    return cudaGetLastError();
}

cudaError_t launch_f32_to_bf16(uint16_t* out, const float* x, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, x, n);
    return cudaGetLastError();
}

cudaError_t launch_fp8_weight_to_bf16(uint16_t* out, const uint8_t* w, const float* scale_inv, int64_t rows,
                                      int64_t cols, int64_t block, cudaStream_t stream) {
    if (rows * cols == 0) return cudaSuccess;
    fp8_weight_to_bf16_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(out, w, scale_inv, rows, cols, block);
    return cudaGetLastError();
}

cudaError_t launch_weight_to_f32(float* out, const void* w, int elem, const float* scale_inv, int64_t rows,
                                 int64_t cols, int64_t block, cudaStream_t stream) {
    if (rows * cols == 0) return cudaSuccess;
    weight_to_f32_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(out, w, elem, scale_inv, rows, cols, block);
    return cudaGetLastError();
}

cudaError_t launch_moe_combine(float* y, const float* ys, const int32_t* inv, const float* w, int64_t n, int64_t k,
                               int64_t d, cudaStream_t stream) {
    if (n * d == 0) return cudaSuccess;
    moe_combine_kernel<<<blocks_for(n * d), kThreads, 0, stream>>>(y, ys, inv, w, n, k, d);
    return cudaGetLastError();
}

cudaError_t launch_cache_copy(void* cache, int elem, const float* rows, const int32_t* slots, int64_t n, int64_t d,
                              cudaStream_t stream) {
    if (n * d == 0) return cudaSuccess;
    cache_copy_kernel<<<blocks_for(n * d), kThreads, 0, stream>>>(cache, elem, rows, slots, n, d);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
