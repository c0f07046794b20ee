// The CUDA device as the backend sees it (plain C++ header: no CUDA types).
#pragma once

#include <cstdint>
#include <string>

namespace megactx::cuda {

struct DeviceInfo {
    std::string name;
    int major = 0, minor = 0, n_sm = 0;
    int64_t l2_bytes = 0, smem_per_block_optin = 0, total_bytes = 0, free_bytes = 0;
};

// Properties and free/total memory of `device`; throws megactx::Error if there is none.
DeviceInfo device_info(int device = 0);
// Number of CUDA devices (0 when there is no driver or no GPU).
int device_count();

}  // namespace megactx::cuda
