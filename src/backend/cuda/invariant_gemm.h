// invariant_gemm: the GEMM of the batch-invariant mode (CudaOptions::batch_invariant). Each output y[t, o] is an
// fp32 sum of x[t, k] · W(o, k), with W widened exactly from its stored type (fp32, bf16, or e4m3 and its block
// scale), in an order fixed by the weight alone. Nothing in that sum depends on how many rows x has or on what the
// other rows hold, so a token's row gives the same bits alone, as one of a verification step's K + 1 rows, or inside
// a prefill chunk: the property the default paths give up (cuBLASLt picks its kernel, tiling and split-K per row
// count; fp8_gemv, fp8_gemm_small and cuBLASLt round activations differently). CUDA cores, not tensor cores.
//
// The order. o_rows = true (a linear): W's row o is read in 16-B pieces (P = 4 fp32, 8 bf16 or 16 e4m3 values) when
// W's rows allow it (16-B aligned, `in` a multiple of P, an e4m3 block a multiple of P); lane l of 32 takes the pieces
// at k = P · (l + 32 j), j = 0, 1, ... in order; a piece's P products are summed on their own (fmaf, k ascending)
// and then added to the lane's sum (e4m3: the piece's sum times its block scale, by fmaf); the 32 lane sums are added
// by a butterfly (exchange with lane l ^ 16, ^ 8, ^ 4, ^ 2, ^ 1). Otherwise lane l sums k = l + 32 j one product at a
// time, then the same butterfly. o_rows = false: one fp32 accumulator per output, k ascending.
// Within 1e-5 of the CPU's plain sum (relative to the largest output; CudaOpsTest.BatchInvariantRowsDoNotDependOnTheBatch).
//
// Layout: W is stored row-major with `w_ld` values a row; element (o, k) of batch b sits at stored row
// w_row0 + b · w_batch_rows + (o_rows ? o : k) and column (o_rows ? k : o). o_rows = true is a linear layer
// (y = x · Wᵀ, W [out, in]); false reads W as [in, out] (MLA's q · W_UK per head). e4m3: the scale of stored
// (r, c) is scales[(r / block) · scale_ld + c / block].
//   x [batch][n rows, ldx apart] fp32, y likewise with ldy; batch strides x_bstride / y_bstride (values).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct InvariantGemmParams {
    const float* x = nullptr;
    int64_t ldx = 0, x_bstride = 0;
    const void* w = nullptr;
    int wtype = 0;  // 0 fp32, 1 bf16, 2 e4m3 with block scales
    const float* scales = nullptr;
    int64_t scale_ld = 0, block = 128;
    int64_t w_ld = 0, w_row0 = 0, w_batch_rows = 0;
    bool o_rows = true;
    float* y = nullptr;
    int64_t ldy = 0, y_bstride = 0;
    int64_t n = 0, out = 0, in = 0, batch = 1;
};

cudaError_t launch_invariant_gemm(const InvariantGemmParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
