// kv_tier.h: one thread per selection entry (resolve, split), one warp per fetched row, one block per moved range.
#include <algorithm>

#include "backend/cuda/kv_tier.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int32_t kBlock = 64;  // tokens per KV block (ops.h kBlockSize)

__device__ __forceinline__ int32_t host_frame(int32_t loc) { return loc < 0 ? -(loc + 1) : -1; }

__global__ void kv_resolve_kernel(KvResolveArgs a) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= a.n * a.k) return;
    const int32_t s = a.slots[t];
    a.fetch[t] = -1;
    const int32_t b = s < 0 ? -1 : s / kBlock;
    if (b < 0 || b >= a.n_blocks) {
        a.device_slots[t] = -1;
        return;
    }
    atomicAdd(a.hits + b, a.weight);
    const int32_t l = a.loc[b], h = host_frame(l);
    if (h < 0) {
        a.device_slots[t] = l * kBlock + s % kBlock;
    } else {
        const int64_t i = t / a.k, j = t % a.k;
        a.fetch[t] = h * kBlock + s % kBlock;
        a.device_slots[t] = static_cast<int32_t>(a.staging_base + (i % a.rows_per_pass) * a.k + j);
    }
}

__global__ void kv_split_kernel(const int32_t* slots, const int32_t* loc, int64_t n, int64_t n_blocks, int32_t* device,
                                int32_t* host) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t s = slots[i];
    int32_t d = -1, h = -1;
    if (s >= 0 && s / kBlock < n_blocks) {
        const int32_t l = loc[s / kBlock], f = host_frame(l);
        if (f < 0) {
            d = l * kBlock + s % kBlock;
        } else {
            h = f * kBlock + s % kBlock;
        }
    }
    device[i] = d;
    host[i] = h;
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void stall_begin_kernel(uint64_t* clock) { clock[0] = global_ns(); }

__global__ void stall_end_kernel(uint64_t* clock, uint64_t* host_sum) {
    const uint64_t now = global_ns(), t0 = clock[0];
    const uint64_t sum = clock[1] + (now > t0 ? now - t0 : 0);
    clock[1] = sum;
    *reinterpret_cast<volatile uint64_t*>(host_sum) = sum;
}

// A warp per row, striding over the rows when the grid is capped; Vec = uint4 (16 B) when every row start is 16-B
// aligned, else bytes.
template <typename Vec>
__global__ void kv_fetch_kernel(uint8_t* dst, const uint8_t* src, const int32_t* rows, int64_t m, int64_t n_src,
                                int64_t row_bytes) {
    const int lane = threadIdx.x % 32;
    const int64_t n_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
    const int64_t n_vec = row_bytes / static_cast<int64_t>(sizeof(Vec));
    for (int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < m; t += n_warps) {
        const int32_t r = rows[t];
        if (r < 0 || r >= n_src) continue;
        const auto* from = reinterpret_cast<const Vec*>(src + r * row_bytes);
        auto* to = reinterpret_cast<Vec*>(dst + t * row_bytes);
        for (int64_t v = lane; v < n_vec; v += 32) to[v] = from[v];
    }
}

template <typename Vec>
__global__ void copy_blocks_kernel(const DeviceBlockCopy* copies) {
    const DeviceBlockCopy c = copies[blockIdx.x];
    const auto* from = static_cast<const Vec*>(c.src);
    auto* to = static_cast<Vec*>(c.dst);
    const int64_t n_vec = c.bytes / static_cast<int64_t>(sizeof(Vec));
    for (int64_t v = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; v < n_vec;
         v += static_cast<int64_t>(gridDim.y) * blockDim.x)
        to[v] = from[v];
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t launch_kv_resolve(const KvResolveArgs& a, cudaStream_t stream) {
    if (a.n * a.k == 0) return cudaSuccess;
    if (a.rows_per_pass < 1) return cudaErrorInvalidValue;
    kv_resolve_kernel<<<grid_for(a.n * a.k), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launch_kv_split_slots(const int32_t* slots, const int32_t* loc, int64_t n, int64_t n_blocks,
                                  int32_t* device, int32_t* host, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    kv_split_kernel<<<grid_for(n), kThreads, 0, stream>>>(slots, loc, n, n_blocks, device, host);
    return cudaGetLastError();
}

cudaError_t launch_kv_fetch_rows(void* dst, const void* src, const int32_t* rows, int64_t m, int64_t n_src,
                                 int64_t row_bytes, cudaStream_t stream, int max_blocks) {
    if (m == 0 || row_bytes == 0) return cudaSuccess;
    unsigned grid = grid_for(m * 32);
    if (max_blocks > 0) grid = std::min(grid, static_cast<unsigned>(max_blocks));
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    if (row_bytes % 16 == 0 && aligned16(dst) && aligned16(src)) {
        kv_fetch_kernel<uint4><<<grid, kThreads, 0, stream>>>(d, s, rows, m, n_src, row_bytes);
    } else {
        kv_fetch_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(d, s, rows, m, n_src, row_bytes);
    }
    return cudaGetLastError();
}

cudaError_t launch_copy_blocks(const DeviceBlockCopy* copies, int64_t n, int64_t max_bytes, bool vec16,
                               cudaStream_t stream) {
    if (n == 0 || max_bytes == 0) return cudaSuccess;
    if (n > 2147483647) return cudaErrorInvalidValue;
    // One vector per thread, so every load of a copy is in flight at once (reads of mapped host memory are
    // latency-bound: 2 CTAs of a 64-row FP8 latent block, 41,984 B, looping 5 times each left the link idle).
    // A 41,984-B block is 11 CTAs of 256 × 16 B.
    const int64_t per_block = kThreads * (vec16 ? 16 : 1);
    const auto chunks = static_cast<unsigned>(std::min<int64_t>((max_bytes + per_block - 1) / per_block, 65535));
    const dim3 grid(static_cast<unsigned>(n), chunks);
    if (vec16) {
        copy_blocks_kernel<uint4><<<grid, kThreads, 0, stream>>>(copies);
    } else {
        copy_blocks_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(copies);
    }
    return cudaGetLastError();
}

cudaError_t launch_stall_begin(uint64_t* clock, cudaStream_t stream) {
    stall_begin_kernel<<<1, 1, 0, stream>>>(clock);
    return cudaGetLastError();
}

cudaError_t launch_stall_end(uint64_t* clock, uint64_t* host_sum, cudaStream_t stream) {
    stall_end_kernel<<<1, 1, 0, stream>>>(clock, host_sum);
    return cudaGetLastError();
}

}  // namespace megactx::cuda
