// Kernel launch through cudaLaunchKernelEx, with programmatic dependent launch (PDL) when `pdl`: the kernel's CTAs
// may then start while the previous kernel of the stream is still running, so the kernel must execute
// griddepcontrol.wait before it reads that kernel's results (griddepcontrol.launch_dependents in the previous
// kernel lets them start before it finishes). Returns the launch's error.
#pragma once

#include <cuda_runtime.h>

namespace megactx::cuda {

template <class... KArgs, class... Args>
cudaError_t launch_ex(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                      Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...);
}

}  // namespace megactx::cuda
