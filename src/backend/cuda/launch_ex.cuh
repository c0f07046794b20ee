// Kernel launch through cudaLaunchKernelEx, with programmatic dependent launch (PDL) when `pdl`: the kernel's CTAs
// may then start while the previous kernel of the stream is still running, so the kernel must execute
// griddepcontrol.wait before it reads that kernel's results (griddepcontrol.launch_dependents in the previous
// kernel lets them start before it finishes). Returns the launch's error.
// Used where a kernel has work to do before its inputs exist: the indexer's plan and logits (its pages), the sparse
// MLA main kernel and combine, the cache writes, the top-k chain, the few-row FP8 GEMM (its first weight blocks) and
// the MoE per-choice down and sum kernels. Not on the chain of FP8 GEMVs, norms and elementwise kernels (fp8_gemv.h
// says why).
#pragma once

#include <cuda_runtime.h>

namespace megactx::cuda {

// The kernel side of PDL: wait for the previous grid's results (a no-op when launched plainly), and let the next
// grid's CTAs start.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// launch_ex and launch_coop below: PDL when `pdl`, cooperative when `coop`.
template <class... KArgs, class... Args>
cudaError_t launch_attrs(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                         bool coop, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (coop) {
        attr[n].id = cudaLaunchAttributeCooperative;
        attr[n++].val.cooperative = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...);
}

template <class... KArgs, class... Args>
cudaError_t launch_ex(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                      Args... args) {
    return launch_attrs(kern, grid, block, smem, stream, pdl, false, args...);
}

// launch_ex for a kernel whose CTAs wait for each other: a cooperative launch, which the driver refuses
// (cudaErrorCooperativeLaunchTooLarge) unless every CTA can be resident at once on the SMs this context may use
// (under MPS or green contexts, fewer than the device has).
template <class... KArgs, class... Args>
cudaError_t launch_coop(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                        Args... args) {
    return launch_attrs(kern, grid, block, smem, stream, pdl, true, args...);
}

}  // namespace megactx::cuda
