// Per-device one-time setup for kernel launchers. Function attributes such as the dynamic shared-memory limit
// belong to (function, device): a `static` set-once flag makes the first device work and every other device's
// launch fail with cudaErrorInvalidValue (tensor parallel runs the same kernels on several GPUs of one process).
// Each call site (each lambda type) gets its own state per device; a race on one device only repeats an
// idempotent setup.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace megactx::cuda {

constexpr int kMaxDevices = 64;

// Runs setup() (returning cudaError_t) once per current device; returns its result on every call.
template <typename F>
cudaError_t per_device_once(F setup) {
    static std::atomic<int> state[kMaxDevices] = {};  // 0: not yet, 1: ok, e + 2: cudaError_t e
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
    int s = state[dev].load(std::memory_order_acquire);
    if (s == 0) {
        const cudaError_t e = setup();
        s = e == cudaSuccess ? 1 : static_cast<int>(e) + 2;
        state[dev].store(s, std::memory_order_release);
    }
    return s == 1 ? cudaSuccess : static_cast<cudaError_t>(s - 2);
}

// SMs of the current device, read once per device (132 on an H200; 132 if the query fails).
inline int device_sm_count() {
    static std::atomic<int> n[kMaxDevices] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 132;
    int v = n[dev].load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) v = 132;
        n[dev].store(v, std::memory_order_relaxed);
    }
    return v;
}

}  // namespace megactx::cuda
