// The host KV tier's kernels (kv/kv_cache.h, ops.h KvResolveParams): a selection resolved to device-pool rows,
// write slots split between the pools, the selected host rows gathered into the staging rows, and KV blocks moved
// between the tiers. Host pools are pinned and mapped (cudaHostAllocMapped): the kernels read and write them
// through their unified addresses, so a gather of 2,048 scattered rows is one launch, not 2,048 copies.
// Plain C++ contract header (no CUDA device code).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct KvResolveArgs {
    const int32_t* slots = nullptr;  // [n, k] logical slots (block · 64 + offset), -1 = unused
    const int32_t* loc = nullptr;    // [n_blocks] d ≥ 0 device frame, −(h + 1) host frame
    int64_t n = 0, k = 0, n_blocks = 0;
    int64_t staging_base = 0, rows_per_pass = 1;
    int32_t weight = 1;
    int32_t* device_slots = nullptr;  // [n, k] out
    int32_t* fetch = nullptr;         // [n · k] out: host row to stage, or -1
    int32_t* hits = nullptr;          // [n_blocks] += weight per selected row (atomic)
};
// A slot past the last block reads as unused (-1): kernels cannot throw, and the CPU backend reports it.
cudaError_t launch_kv_resolve(const KvResolveArgs& a, cudaStream_t stream);

// device[i] / host[i] = slots[i]'s row in the pool its block lives in, -1 in the other (both -1 for slot -1).
cudaError_t launch_kv_split_slots(const int32_t* slots, const int32_t* loc, int64_t n, int64_t n_blocks,
                                  int32_t* device, int32_t* host, cudaStream_t stream);

// dst row t = src row rows[t] for rows[t] in [0, n_src), rows of row_bytes bytes (16-B vectors when aligned);
// src is typically mapped host memory, dst device memory. A warp per row; max_blocks > 0 caps the grid (blocks of
// 256 threads), so that a gather running beside compute leaves it the SMs.
cudaError_t launch_kv_fetch_rows(void* dst, const void* src, const int32_t* rows, int64_t m, int64_t n_src,
                                 int64_t row_bytes, cudaStream_t stream, int max_blocks = 0);

// copies[i] = {src, dst, bytes} (a device array): independent byte ranges, any mix of device and mapped host
// memory, one launch; vec16: every src, dst and byte count is a multiple of 16, copied as 16-B vectors.
struct DeviceBlockCopy {
    const void* src;
    void* dst;
    int64_t bytes;
};
cudaError_t launch_copy_blocks(const DeviceBlockCopy* copies, int64_t n, int64_t max_bytes, bool vec16,
                               cudaStream_t stream);

// The fetch stall (Ops::kv_fetch_stall_ns), one thread each on the compute stream: stall_begin stamps
// %globaltimer (ns) into clock[0]; stall_end adds the time since then to clock[1] and stores the sum into
// *host_sum (mapped host memory, which the host reads without a sync).
cudaError_t launch_stall_begin(uint64_t* clock, cudaStream_t stream);
cudaError_t launch_stall_end(uint64_t* clock, uint64_t* host_sum, cudaStream_t stream);

}  // namespace megactx::cuda
