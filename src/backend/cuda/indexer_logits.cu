// indexer_logits kernels (see indexer_logits.h for the contract).
//   q8 [n, 32, 128] e4m3, w8 [n, 32], pool [n_blocks, 64 × 132 B] → out [rows, out_stride] fp32
// Reference: model-spec §3.3 kernel form; CpuOps::indexer_topk computes the same scores in fp32 without FP8.
//
// Work item = (query group of ≤ 16 rows of one sequence, range of 64-token pages). A CTA stages the group's q8
// (≤ 64 KB) and weights in shared memory; each warp owns one page at a time: the 64 keys go straight from global
// memory into mma A fragments (64 registers, every key byte read once per group), then for every query and every
// 8-head tile the warp runs 4 k-steps × 4 key tiles of mma.sync.m16n8k32 e4m3 (M = keys, N = heads, K = dims),
// applies relu · w8 per head in registers, sums the heads across the quad and scales by the key's fp32 scale.
// The dot product is over dims in any order, so the dims are permuted so that each lane loads 2 × 16 contiguous
// bytes per key row (and the same 2 × 16 bytes per head row of q8): fully coalesced 64-byte row segments.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/indexer_logits.h"

namespace megactx {

using namespace cuda_indexer;

namespace {

constexpr int kGroup = 16;  // queries per group (MTP verification needs ≤ ~4; prefill amortises the key reads)
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSmemQ = kGroup * kHeads * kDim;  // bytes
constexpr int kSmemBytes = kSmemQ + kGroup * kHeads * 4 + kGroup * 4;

// ---- plan: group starts of runs of ≤ kGroup rows of one sequence --------------------------------------------
// plan[0] = n_groups, plan[1 + g] = first (absolute) row of group g, plan[1 + n_groups] = row_end.
constexpr int kPlanThreads = 1024;

struct MaxOp {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

__global__ void __launch_bounds__(kPlanThreads) indexer_plan_kernel(IndexerPlanParams p) {
    using Scan = cub::BlockScan<int, kPlanThreads>;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ int s_run_start, s_groups;
    const int i0 = static_cast<int>(p.row_begin), i1 = static_cast<int>(p.row_end);
    if (threadIdx.x == 0) {
        s_run_start = i0;
        s_groups = 0;
    }
    __syncthreads();
    for (int base = i0; base < i1; base += kPlanThreads) {
        const int i = base + static_cast<int>(threadIdx.x);
        const bool valid = i < i1;
        const int carry_start = s_run_start, carry_groups = s_groups;
        int start = -1;
        if (valid) {
            if (p.lengths) p.lengths[i - i0] = p.pos[i] + 1;
            if (i == i0 || p.seq[i] != p.seq[i - 1]) start = i;
        }
        int run_start, max_start;
        Scan(tmp).InclusiveScan(start, run_start, MaxOp(), max_start);
        __syncthreads();
        if (run_start < 0) run_start = carry_start;
        const int leader = valid && (i - run_start) % kGroup == 0 ? 1 : 0;
        int idx, total;
        Scan(tmp).ExclusiveSum(leader, idx, total);
        if (leader) p.plan[1 + carry_groups + idx] = i;
        __syncthreads();
        if (threadIdx.x == 0) {
            if (max_start >= 0) s_run_start = max_start;
            s_groups = carry_groups + total;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        p.plan[0] = s_groups;
        p.plan[1 + s_groups] = i1;
    }
}

// ---- logits -----------------------------------------------------------------------------------------------------

__device__ __forceinline__ uint4 ld_stream(const void* ptr) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
}

// d += A (16 keys × 32 dims, e4m3) · B (32 dims × 8 heads, e4m3), fp32 accumulate.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__global__ void __launch_bounds__(kThreads, 2) indexer_logits_kernel(IndexerLogitsParams p, int pages_per_item) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* s_q = smem;                                         // [kGroup, 32, 128] e4m3, 16-B chunks swizzled
    float* s_w = reinterpret_cast<float*>(smem + kSmemQ);        // [kGroup, 32]
    int* s_pos = reinterpret_cast<int*>(s_w + kGroup * kHeads);  // [kGroup]

    const int g_idx = static_cast<int>(blockIdx.y);
    if (g_idx >= p.plan[0]) return;
    const int r_a = p.plan[1 + g_idx], nq = p.plan[2 + g_idx] - r_a;
    const int seq = p.seq[r_a];
    // Tokens of a sequence are in order, but take the max anyway: the pages needed are those up to max pos.
    int max_pos = 0;
    for (int q = 0; q < nq; ++q) max_pos = max(max_pos, p.pos[r_a + q]);
    const int n_pages = max_pos / kBlock + 1;
    const int page0 = static_cast<int>(blockIdx.x) * pages_per_item;
    const int page1 = min(page0 + pages_per_item, n_pages);
    if (page0 >= page1) return;

    // Stage q8 (swizzled: chunk c of head h at c ^ 4·(h & 1), so the 8 lanes of a 128-bit load phase hit
    // distinct banks), weights and positions.
    for (int c = threadIdx.x; c < nq * kHeads * 8; c += kThreads) {
        const int row = c >> 3, chunk = c & 7, head = row & (kHeads - 1);
        const uint4 v =
            *reinterpret_cast<const uint4*>(p.q8 + (static_cast<int64_t>(r_a) * kHeads + row) * kDim + chunk * 16);
        *reinterpret_cast<uint4*>(s_q + row * kDim + ((chunk ^ ((head & 1) << 2)) * 16)) = v;
    }
    for (int c = threadIdx.x; c < nq * kHeads; c += kThreads) s_w[c] = p.w8[static_cast<int64_t>(r_a) * kHeads + c];
    if (threadIdx.x < nq) s_pos[threadIdx.x] = p.pos[r_a + threadIdx.x];
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int32_t* table = p.tables + p.table_offset[seq];
    // The two keys whose final score this lane writes (after the quad reduction): v = t and v = t + 4 of the
    // lane's 8 partial sums [mt][hh], key = mt·16 + hh·8 + g.
    const int key0 = (t >> 1) * 16 + (t & 1) * 8 + g, key1 = key0 + 32;
    const int sw = (g & 1) << 2;  // swizzle of this lane's head rows (head = nt·8 + g)

    for (int page = page0 + warp; page < page1; page += kWarps) {
        const uint8_t* pg = p.pool + static_cast<int64_t>(table[page]) * kBlockBytes;
        // A fragments: key row mt·16 + hh·8 + g, bytes [t·16, t·16 + 16) and [64 + t·16, 64 + t·16 + 16).
        uint4 a[4][2][2];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const uint8_t* row = pg + (mt * 16 + hh * 8 + g) * kDim + t * 16;
                a[mt][hh][0] = ld_stream(row);
                a[mt][hh][1] = ld_stream(row + 64);
            }
        }
        const float* scales = reinterpret_cast<const float*>(pg + kBlock * kDim);
        const float ks0 = scales[key0], ks1 = scales[key1];
        const int t0 = page * kBlock;

        for (int q = 0; q < nq; ++q) {
            const int qpos = s_pos[q];
            if (t0 > qpos) continue;
            float part[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) part[mt][0] = part[mt][1] = 0.0f;
#pragma unroll 1
            for (int nt = 0; nt < 4; ++nt) {
                const int head = nt * 8 + g;
                const uint8_t* qrow = s_q + (q * kHeads + head) * kDim;
                const uint4 b0 = *reinterpret_cast<const uint4*>(qrow + ((t ^ sw) * 16));
                const uint4 b1 = *reinterpret_cast<const uint4*>(qrow + (((4 + t) ^ sw) * 16));
                const float2 wv = *reinterpret_cast<const float2*>(s_w + q * kHeads + nt * 8 + 2 * t);
                float acc[4][4];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    // k-step s uses the lane's words 2s (logical chunk t) and 2s + 1 (logical chunk 4 + t).
                    const int half = s >> 1, j = (s & 1) * 2;
                    const uint32_t bw0 = word(half ? b1 : b0, j), bw1 = word(half ? b1 : b0, j + 1);
#pragma unroll
                    for (int mt = 0; mt < 4; ++mt) {
                        mma_e4m3(acc[mt], word(a[mt][0][half], j), word(a[mt][1][half], j), word(a[mt][0][half], j + 1),
                                 word(a[mt][1][half], j + 1), bw0, bw1);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    part[mt][0] += wv.x * fmaxf(acc[mt][0], 0.0f) + wv.y * fmaxf(acc[mt][1], 0.0f);
                    part[mt][1] += wv.x * fmaxf(acc[mt][2], 0.0f) + wv.y * fmaxf(acc[mt][3], 0.0f);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    part[mt][hh] += __shfl_xor_sync(0xffffffffu, part[mt][hh], 1);
                    part[mt][hh] += __shfl_xor_sync(0xffffffffu, part[mt][hh], 2);
                }
            }
            const float v0 = t == 0 ? part[0][0] : t == 1 ? part[0][1] : t == 2 ? part[1][0] : part[1][1];
            const float v1 = t == 0 ? part[2][0] : t == 1 ? part[2][1] : t == 2 ? part[3][0] : part[3][1];
            float* orow = p.out + (static_cast<int64_t>(r_a + q) - p.row_begin) * p.out_stride + t0;
            if (t0 + key0 <= qpos) orow[key0] = v0 * ks0;
            if (t0 + key1 <= qpos) orow[key1] = v1 * ks1;
        }
    }
}

}  // namespace

int64_t indexer_plan_ints(int64_t n_rows) { return n_rows + 2; }

bool indexer_logits_supported(int64_t n_head, int64_t d_indexer, int64_t block_size) {
    return n_head == kHeads && d_indexer == kDim && block_size == kBlock;
}

void launch_indexer_plan(const IndexerPlanParams& p, cudaStream_t stream) {
    indexer_plan_kernel<<<1, kPlanThreads, 0, stream>>>(p);
}

void launch_indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream) {
    const int64_t n_rows = p.row_end - p.row_begin;
    if (n_rows <= 0 || p.max_context <= 0) return;
    static bool configured = false;
    if (!configured) {
        cudaFuncSetAttribute(indexer_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
        configured = true;
    }
    // Groups: at most one per kGroup rows plus one extra per sequence boundary. Pages per work item: enough
    // items for ~8 CTAs per SM over the whole launch, in multiples of the warps of a CTA.
    const int64_t groups = std::min<int64_t>(n_rows, (n_rows + kGroup - 1) / kGroup + p.n_seq);
    const int64_t max_pages = (p.max_context + kBlock - 1) / kBlock;
    int device = 0, n_sm = 132;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
    const int64_t target_items = 8LL * n_sm;
    int64_t per_item = (max_pages * groups + target_items - 1) / target_items;
    per_item = std::max<int64_t>(kWarps, (per_item + kWarps - 1) / kWarps * kWarps);
    const int64_t chunks = (max_pages + per_item - 1) / per_item;
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(groups));
    indexer_logits_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, static_cast<int>(per_item));
}

}  // namespace megactx
