// Exact batched top-k over fp32 score rows (DSA indexer selection, model-spec §3.2): for each row, the
// indices of the k largest of its first lengths[r] values. Plain C++ contract; kernels in topk.cu.
// How (topk.cu has the details and the measurements behind each choice):
// - batches of at most 4 rows whose stride is above 8K (decode): one kernel whose CTAs, all resident at once, run one
//   radix select together over their slices (global histograms, counter barriers), each writing its slice's share
//   of the ordered row, so rows with hot windows cost no more than spread ones. Its launch is cooperative: a context
//   with fewer usable SMs than the device reports refuses it, and that device takes the paths below instead of
//   hanging;
// - other rows of a stride up to 32K: one CTA per row, the row staged in shared memory;
// - longer rows: three kernels chained by PDL, a stratified sample of 8192 → a one-pass filter that keeps the items
//   above the sample's estimate of the k-th value → a select among those candidates (one radix level, then the k-th
//   key's bin ranked by comparison) that also writes the row in position order, unless a tie at the k-th key needs
//   topk_order_kernel.
// The decode indexer prepares the few-rows select (TopkGridCtl below): no init kernel and no first grid barrier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

// Optional translation of the output indices through a paged block table (the DSA indexer: row positions → cache
// slots): index i of row r becomes table[i / block] * block + i % block, table = tables + table_offset[seq[row_begin
// + r]]; -1 padding stays -1. The order stays that of the positions.
struct TopkSlotMap {
    const int32_t* seq = nullptr;
    const int32_t* table_offset = nullptr;
    const int32_t* tables = nullptr;  // nullptr: the indices stay row positions
    int64_t row_begin = 0;
    int32_t block = 64;
};

struct TopkParams {
    // [n_rows, row_stride] scores; row r's candidates are values[r * row_stride + 0 .. lengths[r])
    const float* values = nullptr;
    const int32_t* lengths = nullptr;  // [n_rows] device, 0 <= length <= row_stride
    int64_t n_rows = 0, row_stride = 0;
    int64_t k = 0;               // e.g. 2048
    int32_t* out_idx = nullptr;  // [n_rows, k] device: indices into the row of the k largest values, ascending;
                                 // ties at the k-th value go to the lowest indices (the CPU reference's result,
                                 // bit for bit, whatever the thread timing); when length < k, 0 .. length-1
                                 // then -1 padding.
    TopkSlotMap slots;           // optional (see above)
    void* scratch = nullptr;     // >= topk_scratch_bytes(n_rows, row_stride, k) bytes, 256-B aligned
    size_t scratch_bytes = 0;
    // Prepared by the caller (topk_grid_ctl below), for the few-rows select only: 1: an earlier kernel of the stream
    // zeroed its control words; 2: and added up round 0's histogram of every row's first lengths[r] values.
    int grid_prepared = 0;
};

// The few-rows select's control words in p.scratch, for a caller that prepares them (the decode indexer: its plan
// kernel zeroes them and its scores kernel adds up round 0's histogram, which saves the select a launch and a
// grid-wide barrier). ctl == nullptr when launch_topk(p) will not run that select. Row r's round-0 histogram is
// hist0 + r · row_stride: 2^topk_plan::kGridDigit0 bins, bin topk_plan::grid_bin0(topk_plan::float_key(value)).
struct TopkGridCtl {
    int* ctl = nullptr;
    int64_t n_ints = 0;  // to zero, from ctl
    int* hist0 = nullptr;
    int64_t row_stride = 0;  // ints
};
TopkGridCtl topk_grid_ctl(const TopkParams& p);

// Scratch for launch_topk; 0 for short rows (row_stride <= 32768), which run one CTA per row in shared memory.
size_t topk_scratch_bytes(int64_t n_rows, int64_t row_stride, int64_t k);
// 1 <= k <= 16384, row_stride <= 1 << 24.
bool topk_supported(int64_t k, int64_t row_stride);
// No host sync, no allocation: CUDA-graph capturable (the first call sets kernel smem attributes; make it
// outside capture). Deterministic (see out_idx); NaN is not supported.
void launch_topk(const TopkParams& p, cudaStream_t stream);

// Benchmark/profiling knobs (bench/cuda/bench_topk.cu); production callers leave the defaults.
struct TopkTuning {
    int pdl = 1;                 // long rows: programmatic dependent launch between the three kernels
    int filter_chunk = 0;        // elements per filter work item (multiple of 1024); 0: automatic
    int filter_ctas_per_sm = 0;  // > 0: persistent filter grid of this many CTAs per SM; 0: one CTA per item
    int filter_variant = 1;      // 1: mask-then-compact-loop filter (16-B path); 0: the unrolled-append one
    int filter_prefetch = 0;  // items of its first work item a filter CTA prefetches to L2 during the sample; 0: 2048
    int order_range = 0;      // row positions per CTA of the order kernel (a multiple of 32768); 0: automatic
    // <= few_max_rows long rows: 1 one kernel of G CTAs per row (a radix select shared by the row's CTAs, which
    // meet at barriers); 0: the three kernels above.
    int few_rows = 1;
    int few_max_rows = 4;                       // few-rows kernel for batches of <= this many rows (at most 4)
    int few_threads = 0;                        // few-rows kernel: 512 or 1024 (0) threads per CTA
    int few_slice_min = 0;                      // few-rows kernel: row elements per CTA at least (sets G); 0: 2048
    unsigned long long* debug_times = nullptr;  // few-rows (CTA 0) and order kernels: device [16], globaltimer
                                                // stamps (topk.cu, bench_topk)
    cudaEvent_t* step_events = nullptr;  // long rows: when set, events [0..3] recorded around sample/filter/select
                                         // (PDL then off)
};
void topk_set_tuning(const TopkTuning& t);

}  // namespace megactx::cuda
