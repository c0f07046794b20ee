// Error checks for CUDA runtime and cuBLASLt calls: a failure becomes a megactx::Error naming the call,
// the file and line, and the runtime's message. Host code only (.cpp); kernels report through their launch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define MEGACTX_CUDA_CHECK(call)                                                                             \
    do {                                                                                                     \
        cudaError_t megactx_err_ = (call);                                                                   \
        if (megactx_err_ != cudaSuccess)                                                                     \
            MEGACTX_FAIL("CUDA error {} ({}) at {}:{}: {}", cudaGetErrorName(megactx_err_),                  \
                         static_cast<int>(megactx_err_), __FILE__, __LINE__, cudaGetErrorString(megactx_err_)); \
    } while (0)

#define MEGACTX_CUBLAS_CHECK(call)                                                                           \
    do {                                                                                                     \
        cublasStatus_t megactx_st_ = (call);                                                                 \
        if (megactx_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
            MEGACTX_FAIL("cuBLASLt error {} at {}:{}: {}", static_cast<int>(megactx_st_), __FILE__, __LINE__, \
                         #call);                                                                             \
    } while (0)
