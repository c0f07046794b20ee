// What the CUDA runtime reports about the current device; `megactx` prints it when --device cuda starts.
#include "backend/cuda/device_info.h"

#include "backend/cuda/cuda_check.h"

namespace megactx::cuda {

DeviceInfo device_info(int device) {
    cudaDeviceProp prop{};
    MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    size_t free_bytes = 0, total_bytes = 0;
    MEGACTX_CUDA_CHECK(cudaSetDevice(device));
    MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    DeviceInfo info;
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    info.n_sm = prop.multiProcessorCount;
    info.l2_bytes = prop.l2CacheSize;
    info.smem_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
    info.total_bytes = static_cast<int64_t>(total_bytes);
    info.free_bytes = static_cast<int64_t>(free_bytes);
    return info;
}

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

}  // namespace megactx::cuda
