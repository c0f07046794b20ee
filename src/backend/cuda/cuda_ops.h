// CudaOps: the op table on one CUDA device (design.md §6). Host glue only: device memory comes from a caching
// allocator with a budget, checkpoint weights are uploaded once (lazily, keyed by their host pointer), GEMMs go
// to cuBLASLt (fp32 weights: fp32 GEMM, no TF32; bf16 weights: bf16 × bf16 → fp32; FP8 weights: the W8A8
// block-scaled FP8 GEMM, activations quantised per 1 × 128 group (act_quant.h), or for shapes cuBLASLt refuses a
// bf16 copy of the weight made on first use; one or two rows the FP8 GEMV, fp8_gemv.h; 3-16 rows the few-row W8A8
// kernel, fp8_gemm_small.h), every other op is a kernel family of this folder (one .h contract + .cu each).
// Activations are fp32, indices int32.
// KV pools may be F32, BF16 or FP8 (kv_format.h); the cache ops read and write all three; a host KV tier lives in
// pinned, mapped host memory (alloc_host). One stream; host transfers (upload_i32, upload, download) are
// synchronous.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "backend/cuda/cuda_backend.h"
#include "ops/ops.h"

namespace megactx::cuda {

struct DeviceBlockCopy;      // kv_tier.h
struct MoeFp8Params;         // moe_fp8.h
struct MoeSmallParams;       // moe.h
struct InvariantGemmParams;  // invariant_gemm.h

// Size-class caching allocator: freed blocks go to free lists and are reused; cudaMalloc only on a miss.
// Small requests round up to powers of two (≥ 512 B) and reuse exact classes; requests above 1 MiB round up to
// 2 MiB and reuse any cached block up to twice their size. Exceeding the budget first returns the cached blocks
// to the driver, then fails with an Error naming the request and the budget.
// Graph recording: between begin_record and end_record every block handed out is noted; end_record takes those
// blocks out of circulation (a released one never returns to the free lists) until unown gives them back.
class DeviceAllocator {
  public:
    DeviceAllocator(int device, int64_t budget_bytes, cudaStream_t stream);
    ~DeviceAllocator();
    void* allocate(size_t bytes, size_t* capacity);
    void release(void* p, size_t capacity);
    void begin_record();
    std::vector<std::pair<void*, size_t>> end_record();  // the recorded blocks, now owned by the caller's graph
    void unown(const std::vector<std::pair<void*, size_t>>& blocks);
    CudaMemoryStats stats() const;
    void add_weight_bytes(int64_t b) {
        std::lock_guard<std::mutex> lock(mu_);
        weight_bytes_ += b;
    }

  private:
    void trim_locked();

    int device_;
    int64_t budget_;
    cudaStream_t stream_;
    mutable std::mutex mu_;
    std::multimap<size_t, void*> free_;
    bool recording_ = false;
    std::map<void*, size_t> recorded_;               // blocks handed out while recording
    std::unordered_map<void*, size_t> graph_owned_;  // blocks a graph holds: not returned to free_ on release
    std::unordered_set<void*> parked_;               // graph-owned blocks already released: free_ once unowned
    int64_t reserved_ = 0, in_use_ = 0, weight_bytes_ = 0, n_malloc_ = 0;
};

class CudaOps final : public Ops {
  public:
    explicit CudaOps(const CudaOptions& options);
    ~CudaOps() override;

    CudaMemoryStats memory_stats() const { return alloc_->stats(); }
    void set_sync_each_op(bool on) { sync_each_op_ = on; }
    cudaStream_t stream() const { return stream_; }
    int device() const { return options_.device; }
    void bind_thread();  // makes this device current on the calling thread

    // CUDA graphs: stream capture (relaxed mode) of `body`; upload_i32 then copies from pinned host buffers the
    // graph keeps, refilled from OpsGraph::inputs at each replay.
    bool can_record() const override { return true; }
    std::unique_ptr<OpsGraph> record(const std::function<void()>& body) override;
    void replay(OpsGraph& g) override;

    Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
    Tensor upload_i32(const std::vector<int32_t>& v) override;
    void download(const Tensor& t, void* host) override;
    void upload(const void* host, Tensor& t) override;
    void zero(Tensor& t) override;

    void embedding(const Tensor& tokens, const Weight& table, Tensor& out) override;
    void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor& y) override;
    void add_rms_norm(Tensor& x, const Tensor& delta, const std::vector<float>& w, float eps, Tensor& y) override;
    void layer_norm(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, float eps,
                    Tensor& y) override;
    void linear(const Tensor& x, const Weight& w, Tensor& y) override;
    void rope(Tensor& x, int64_t offset, const Tensor& pos, const Rope& rope) override;
    void cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) override;
    void latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                            const Rope& rope, const Tensor& slots, Tensor& cache) override;
    void indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w, const std::vector<float>& ln_b,
                             float eps, const Tensor& pos, const Rope& rope, const Tensor& slots, Tensor& cache,
                             bool hadamard) override;
    void indexer_topk(const IndexerTopkParams& p) override;
    void mla_absorb_q(const Tensor& q, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& q_out) override;
    void sparse_mla(const SparseMlaParams& p) override;
    void mla_expand_v(const Tensor& lat, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& out) override;
    void swiglu_mlp(const Tensor& x, const MlpWeights& w, Tensor& y) override;
    void moe_route(const Tensor& x, const Weight& gate, const std::vector<float>& bias, const MoeRouteParams& p,
                   Tensor& ids, Tensor& weights) override;
    void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                     Tensor& y) override;
    void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
    // The host KV tier (kv_tier.h): host pools pinned and mapped, read and written by the kernels in place.
    void kv_resolve(const KvResolveParams& p) override;
    void kv_split_slots(const Tensor& slots, const Tensor& loc, Tensor& device, Tensor& host) override;
    void kv_fetch_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override;
    int64_t kv_fetch_rows_async(const Tensor& src, const Tensor& rows, Tensor& dst) override;
    void kv_fetch_wait(int64_t ticket) override;
    int64_t kv_fetch_stall_ns() override;
    void copy_blocks(const std::vector<BlockCopy>& copies) override;
    Tensor alloc_host(DType dtype, std::vector<int64_t> shape) override;
    void argmax_rows(const Tensor& x, Tensor& out) override;
    void mask_rows(Tensor& x, const Tensor& rows, const Tensor& bits) override;
    void add(Tensor& y, const Tensor& x) override;
    void slice_cols(const Tensor& x, int64_t c0, Tensor& out) override;
    void concat_cols(const Tensor& a, const Tensor& b, Tensor& out) override;

  private:
    // A checkpoint weight on the device: fp32, bf16 or e4m3 (+ fp32 block scales [ceil(rows/128), ceil(cols/128)];
    // lt_scales: the same with each row padded to a multiple of 4 floats, as cuBLASLt's BLK128x128_32F mode reads
    // them, made on first use when the padding is needed; bf16 / f32: copies for the GEMMs that need them).
    struct DeviceWeight {
        DType dtype = DType::F32;  // F32, BF16 or F8_E4M3 (F16 checkpoints are widened to F32)
        Tensor data, scales, lt_scales, bf16, f32;
        int64_t rows = 0, cols = 0, block = 128;
    };
    // One GEMM in cuBLASLt's column-major terms: C[m, n] = op(A)[m, k] · B[k, n], batched with strides.
    struct Gemm {
        bool trans_a = false;
        int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
        int64_t stride_a = 0, stride_b = 0, stride_c = 0, batch = 1;
        bool bf16 = false;  // A and B bf16 (else fp32); C always fp32
        // A and B e4m3 with block scales (trans_a, batch 1 only): A scaled per 128 × 128 block (a_scale
        // [ceil(m/128)][roundup(ceil(k/128), 4)]), B per 128 values along k (b_scale [ceil(k/128)][n]).
        bool fp8 = false;
        const float* a_scale = nullptr;
        const float* b_scale = nullptr;
        const void* a = nullptr;
        const void* b = nullptr;
        float* c = nullptr;
    };
    struct GemmPlan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulAlgo_t algo{};
        bool ok = true;  // false: cuBLASLt has no algorithm for this FP8 GEMM (remembered, the caller falls back)
    };

    // One MoE layer's experts as a device table of weight pointers (moe.h MoeSmallParams), built on first use.
    struct ExpertTable {
        Tensor ptrs;
        std::vector<const void*> host;  // the host weights it was built from (gate, up, down per expert)
        int64_t ff = 0, d = 0;
        int wtype = 0;        // MoeSmallParams::wtype: 0 fp32, 1 bf16, 2 e4m3 (+ block scales)
        bool usable = false;  // every held expert has operands of one type
    };
    // Decode batches up to this many tokens take the few-token expert kernels (no host sync).
    static constexpr int64_t kMoeSmallMaxTokens = 32;
    // Up to this many tokens the few-token expert paths run in passes of kMoeSmallMaxTokens (no host sync, so the
    // step can be a CUDA graph: GraphedForward::kMaxTokens); more take the host-sorted path of per-expert GEMMs.
    static constexpr int64_t kMoeGraphMaxTokens = 128;
    // --batch-invariant sparse MLA: splits of every token's selection (a decode row's CTAs per 64-head group), and
    // the rows of a launch (its partials: 8 splits × 64 heads × 513 floats, 1 MiB a row).
    static constexpr int64_t kInvariantSplits = 8;
    static constexpr int64_t kInvariantPassRows = 64;

    DeviceWeight& weight(const Weight& w);
    const ExpertTable& expert_table(const std::vector<MlpWeights>& experts);
    // The weight as a GEMM operand: fp32 or bf16 data (FP8: its bf16 copy, made on first use).
    const Tensor& gemm_operand(DeviceWeight& dw);
    // The absorb / expand products over kv_b as stored (mla_heads.h) when the shapes and dtype allow; false: not run.
    bool mla_heads(const Tensor& x, DeviceWeight& dw, int64_t d_nope, int64_t d_v, Tensor& y, bool absorb);
    // The weight as fp32 (an fp32 copy of bf16 / FP8 weights, made once).
    const Tensor& f32_operand(DeviceWeight& dw);
    // y = x · Wᵀ in fp32 whatever the weight's dtype (an fp32 copy is made once): the MoE router, whose choices
    // must not move with bf16 rounding of its inputs.
    void linear_f32(const Tensor& x, const Weight& w, Tensor& y);
    static Gemm linear_gemm(int64_t out, int64_t n, int64_t in);  // the shape of y [n, out] = x [n, in] · Wᵀ
    const float* vec(const std::vector<float>& v);
    // A RoPE table's frequencies [dim / 2] in device memory, uploaded once per distinct table.
    const float* inv_freq(const Rope& rope);
    // The cached cuBLASLt plan for g's shape and alignments (made on first use; ok = false for an FP8 GEMM that
    // cuBLASLt has no algorithm for, any other failure throws). gemm runs g; false when its plan is not ok.
    const GemmPlan& gemm_plan(const Gemm& g);
    bool gemm(const Gemm& g);
    // y = x · Wᵀ through the W8A8 FP8 GEMM; false (nothing launched) when cuBLASLt refuses the shape.
    bool linear_fp8(const Tensor& x, DeviceWeight& dw, Tensor& y);
    // The batch-invariant mode's linear (invariant_gemm.h), y = x · Wᵀ for any weight type.
    void invariant_linear(const Tensor& x, DeviceWeight& dw, Tensor& y);
    InvariantGemmParams invariant_weight(const DeviceWeight& dw, int64_t n, int64_t batch) const;
    Tensor to_bf16(const Tensor& x);
    void after_op(const char* name);
    void moe_device_choice(const MoeFp8Params& gp, const MoeSmallParams& sp);

    struct Graph;

    CudaOptions options_;
    cudaStream_t stream_ = nullptr;
    cudaStream_t branch_stream_ = nullptr;  // captures the branches of conditional nodes (moe_device_choice)
    // The host tier's gathers (kv_fetch_rows_async): a copy stream forked from stream_ by fork_, joined back by
    // the ticket's event of a ring (a step waits for each of its fetches before it issues many more).
    cudaStream_t copy_stream_ = nullptr;
    cudaEvent_t fork_ = nullptr;
    std::vector<cudaEvent_t> fetched_;
    int64_t n_fetches_ = 0;
    bool tier_overlap_ = true;
    // copy_blocks' copy lists: pinned host slots used in turn, each with the event of its last upload.
    struct CopyListSlot {
        DeviceBlockCopy* list = nullptr;
        size_t capacity = 0;
        cudaEvent_t uploaded = nullptr;
    };
    std::array<CopyListSlot, 4> copy_lists_{};
    int64_t n_copy_lists_ = 0;
    // The copy stream's gather grid (MEGACTX_TIER_FETCH_BLOCKS; 0: a warp per row). A full grid of a batch-8
    // gather (16K rows, 2,048 CTAs) crowds out the GEMMs beside it: bench_model host-tier overlap A/B.
    int tier_fetch_blocks_ = 64;
    // The fetch stall (kv_fetch_stall_ns): the device's stamp and running sum, and the sum's mapped host copy;
    // made by the first alloc_host (a host tier), before any graph records a gather. MEGACTX_TIER_STALL=0 leaves
    // the stamps out (their cost: two one-thread kernels per gather wait).
    bool tier_stall_ = true;
    uint64_t* stall_clock_ = nullptr;
    uint64_t* stall_host_ = nullptr;
    void stall_stamp(bool begin);
    Graph* recording_ = nullptr;  // the graph being recorded, if any
    cublasLtHandle_t lt_ = nullptr;
    std::shared_ptr<DeviceAllocator> alloc_;
    Tensor workspace_;
    bool sync_each_op_ = false;
    int64_t smem_optin_ = 0;
    int n_sm_ = 0;
    // The fast DSA kernels (latent_cache, indexer_*, sparse_mla .cu) where the shapes are GLM-5.2's; false
    // (MEGACTX_CUDA_REFERENCE=1) keeps the reference kernels everywhere, for A/B tests.
    bool fast_ = true;
    std::unordered_map<const void*, DeviceWeight> weights_;
    std::unordered_map<const float*, std::pair<size_t, Tensor>> vectors_;
    std::map<std::string, GemmPlan> plans_;
    std::map<std::vector<float>, Tensor> inv_freq_;
    std::unordered_map<const void*, ExpertTable> expert_tables_;  // keyed by the experts vector's data()
};

}  // namespace megactx::cuda
