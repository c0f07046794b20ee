// Indexer scores for geometries outside the FP8 tensor-core kernels (indexer_logits.h), e.g. the demo model's
// 4 heads × 32 dims, with any KV format: the same scores as the reference kernel (attention_ref.h,
// IndexerScoresParams), bit for bit, in the same order of operations, but a block scores its 128 candidates
// against up to 64 query rows, holding each candidate's key in registers. The reference re-reads every key for
// every row, which made a 1M-token prefill read ~32 TB of keys per full layer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention_ref.h"

namespace megactx::cuda {

// Head dims with a kernel (32, 64) and a shared-memory need that fits.
bool indexer_scores_tiled_supported(int64_t n_head, int64_t dim);
cudaError_t launch_indexer_scores_tiled(const IndexerScoresParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
