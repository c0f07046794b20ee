#include "backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/attention_ref.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/fp8_gemm_small.h"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/indexer_cache_write.h"
#include "backend/cuda/indexer_logits.h"
#include "backend/cuda/indexer_scores.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/cuda/invariant_gemm.h"
#include "backend/cuda/kv_tier.h"
#include "backend/cuda/kv_write.h"
#include "backend/cuda/latent_cache.h"
#include "backend/cuda/mla_heads.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_fp8.h"
#include "backend/cuda/moe_plan.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/sparse_mla.h"
#include "backend/cuda/topk.h"
#include "kv/kv_format.h"

namespace megactx {

namespace cuda {

namespace {

constexpr size_t kSmallMax = size_t{1} << 20, kLargeGranule = size_t{2} << 20;
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;
constexpr int64_t kIndexerScratchBytes = int64_t{256} << 20;

size_t round_size(size_t bytes) {
    if (bytes <= kSmallMax) {
        size_t c = 512;
        while (c < bytes) c <<= 1;
        return c;
    }
    return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

int64_t rows_of(const Tensor& t) { return t.shape.empty() ? 1 : t.numel() / t.shape.back(); }

// KV pool element kind from its dtype (kv_cache.h).
int kv_elem(const Tensor& pool, const char* op) {
    switch (pool.dtype) {
        case DType::F32:
            return 0;
        case DType::BF16:
            return 1;
        case DType::F8_E4M3:
            return 2;
        default:
            MEGACTX_FAIL("{}: KV pool of dtype {} is not F32, BF16 or FP8", op, dtype_name(pool.dtype));
    }
}

uint32_t ptr_alignment(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t al = 256;
    while (al > 1 && a % al != 0) al >>= 1;
    return al;
}

}  // namespace

DeviceAllocator::DeviceAllocator(int device, int64_t budget_bytes, cudaStream_t stream)
    : device_(device), budget_(budget_bytes), stream_(stream) {}

DeviceAllocator::~DeviceAllocator() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    for (auto& [size, p] : free_) cudaFree(p);
}

void DeviceAllocator::trim_locked() {
    if (free_.empty()) return;
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& [size, p] : free_) {
        MEGACTX_CUDA_CHECK(cudaFree(p));
        reserved_ -= static_cast<int64_t>(size);
    }
    free_.clear();
}

void* DeviceAllocator::allocate(size_t bytes, size_t* capacity) {
    const size_t size = round_size(std::max<size_t>(bytes, 1));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && (it->first == size || (size > kSmallMax && it->first <= 2 * size))) {
        void* p = it->second;
        *capacity = it->first;
        free_.erase(it);
        in_use_ += static_cast<int64_t>(*capacity);
        if (recording_) recorded_[p] = *capacity;
        return p;
    }
    if (budget_ > 0 && reserved_ + static_cast<int64_t>(size) > budget_) trim_locked();
    MEGACTX_CHECK(budget_ <= 0 || reserved_ + static_cast<int64_t>(size) <= budget_,
                  "CUDA memory budget exceeded: allocating {} bytes with {} bytes in use ({} of them weights) and "
                  "a budget of {} bytes (raise --gpu-memory-utilization or lower --kv-cache-memory)",
                  size, in_use_, weight_bytes_, budget_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        trim_locked();
        e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        MEGACTX_FAIL("cudaMalloc of {} bytes failed ({}) with {} bytes reserved by megactx", size,
                     cudaGetErrorString(e), reserved_);
    }
    ++n_malloc_;
    reserved_ += static_cast<int64_t>(size);
    in_use_ += static_cast<int64_t>(size);
    *capacity = size;
    if (recording_) recorded_[p] = size;
    return p;
}

void DeviceAllocator::release(void* p, size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= static_cast<int64_t>(capacity);
    if (graph_owned_.count(p) == 0)
        free_.emplace(capacity, p);
    else
        parked_.insert(p);
}

void DeviceAllocator::begin_record() {
    std::lock_guard<std::mutex> lock(mu_);
    recording_ = true;
    recorded_.clear();
}

std::vector<std::pair<void*, size_t>> DeviceAllocator::end_record() {
    std::lock_guard<std::mutex> lock(mu_);
    recording_ = false;
    std::vector<std::pair<void*, size_t>> blocks(recorded_.begin(), recorded_.end());
    recorded_.clear();
    for (const auto& [p, cap] : blocks) {
        graph_owned_[p] = cap;
        // released during the recording: it sat in free_, and now waits for unown
        for (auto it = free_.lower_bound(cap); it != free_.end() && it->first == cap; ++it) {
            if (it->second == p) {
                free_.erase(it);
                parked_.insert(p);
                break;
            }
        }
    }
    return blocks;
}

void DeviceAllocator::unown(const std::vector<std::pair<void*, size_t>>& blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [p, cap] : blocks) {
        graph_owned_.erase(p);
        if (parked_.erase(p) != 0) free_.emplace(cap, p);  // else its holder's release returns it
    }
}

CudaMemoryStats DeviceAllocator::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    CudaMemoryStats s;
    s.reserved_bytes = reserved_;
    s.in_use_bytes = in_use_;
    s.weight_bytes = weight_bytes_;
    s.budget_bytes = budget_;
    s.n_cuda_malloc = n_malloc_;
    return s;
}

CudaOps::CudaOps(const CudaOptions& options) : options_(options) {
    int n = 0;
    MEGACTX_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n > 0, "--device cuda: no CUDA device is available");
    MEGACTX_CHECK(options.device >= 0 && options.device < n, "CUDA device {} does not exist ({} present)",
                  options.device, n);
    MEGACTX_CUDA_CHECK(cudaSetDevice(options.device));
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MEGACTX_CUBLAS_CHECK(cublasLtCreate(&lt_));
    int optin = 0;
    MEGACTX_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, options.device));
    smem_optin_ = optin;
    MEGACTX_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm_, cudaDevAttrMultiProcessorCount, options.device));
    const char* ref = std::getenv("MEGACTX_CUDA_REFERENCE");
    fast_ = ref == nullptr || std::strcmp(ref, "0") == 0;
    const char* overlap = std::getenv("MEGACTX_TIER_OVERLAP");
    tier_overlap_ = overlap == nullptr || std::strcmp(overlap, "0") != 0;
    if (const char* b = std::getenv("MEGACTX_TIER_FETCH_BLOCKS")) tier_fetch_blocks_ = std::atoi(b);
    const char* stall = std::getenv("MEGACTX_TIER_STALL");
    tier_stall_ = stall == nullptr || std::strcmp(stall, "0") != 0;
    alloc_ = std::make_shared<DeviceAllocator>(options.device, options.memory_budget_bytes, stream_);
    workspace_ = alloc(DType::F32, {kWorkspaceBytes / 4});
    const char* fp8_gemm = std::getenv("MEGACTX_FP8_GEMM");
    if (fp8_gemm != nullptr && std::strcmp(fp8_gemm, "0") == 0) options_.fp8_gemm = false;
    if (const char* rows = std::getenv("MEGACTX_FP8_GEMV_MAX_ROWS")) options_.fp8_gemv_max_rows = std::atoi(rows);
    MEGACTX_CHECK(options_.fp8_gemv_max_rows >= 0 && options_.fp8_gemv_max_rows <= kFp8GemvMaxRows,
                  "fp8_gemv_max_rows must be 0..{} (got {})", kFp8GemvMaxRows, options_.fp8_gemv_max_rows);
    if (const char* tokens = std::getenv("MEGACTX_MOE_FP8_MIN_TOKENS")) options_.moe_fp8_min_tokens = std::atoi(tokens);
    MEGACTX_CHECK(options_.moe_fp8_min_tokens >= 0, "moe_fp8_min_tokens must be >= 0 (0: automatic; got {})",
                  options_.moe_fp8_min_tokens);
    if (const char* rows = std::getenv("MEGACTX_FP8_GEMM_SMALL_MAX_ROWS"))
        options_.fp8_gemm_small_max_rows = std::atoi(rows);
    MEGACTX_CHECK(options_.fp8_gemm_small_max_rows >= 0 && options_.fp8_gemm_small_max_rows <= kFp8GemmSmallMaxRows,
                  "fp8_gemm_small_max_rows must be 0..{} (got {})", kFp8GemmSmallMaxRows,
                  options_.fp8_gemm_small_max_rows);
    if (const char* t = std::getenv("MEGACTX_MLA_HEADS_MAX_TOKENS")) options_.mla_heads_max_tokens = std::atoi(t);
    MEGACTX_CHECK(options_.mla_heads_max_tokens >= 0 && options_.mla_heads_max_tokens <= kMlaHeadsMaxTokens,
                  "mla_heads_max_tokens must be 0..{} (got {})", kMlaHeadsMaxTokens, options_.mla_heads_max_tokens);
    const char* invariant = std::getenv("MEGACTX_BATCH_INVARIANT");
    if (invariant != nullptr && *invariant != '\0') options_.batch_invariant = std::strcmp(invariant, "0") != 0;
    const char* sync = std::getenv("MEGACTX_CUDA_SYNC");
    sync_each_op_ = sync != nullptr && std::strcmp(sync, "0") != 0;
}

CudaOps::~CudaOps() {
    cudaStreamSynchronize(stream_);
    for (auto& [key, p] : plans_) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.op);
    }
    weights_.clear();
    vectors_.clear();
    workspace_ = Tensor();
    cublasLtDestroy(lt_);
    if (branch_stream_ != nullptr) cudaStreamDestroy(branch_stream_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (fork_ != nullptr) cudaEventDestroy(fork_);
    for (cudaEvent_t e : fetched_) cudaEventDestroy(e);
    for (CopyListSlot& slot : copy_lists_) {
        if (slot.uploaded != nullptr) cudaEventDestroy(slot.uploaded);
        if (slot.list != nullptr) cudaFreeHost(slot.list);
    }
    if (stall_clock_ != nullptr) cudaFree(stall_clock_);
    if (stall_host_ != nullptr) cudaFreeHost(stall_host_);
    cudaStreamDestroy(stream_);
}

// With MEGACTX_CUDA_SYNC=1 every op waits for its kernels, so an asynchronous fault names the op that caused it.
void CudaOps::after_op(const char* name) {
    if (!sync_each_op_) return;
    const cudaError_t e = cudaStreamSynchronize(stream_);
    MEGACTX_CHECK(e == cudaSuccess, "CUDA op {} failed: {} ({})", name, cudaGetErrorName(e), cudaGetErrorString(e));
}

// The current device is per host thread (serve runs the model on the engine's thread; tensor-parallel ranks
// each on their own thread): every forward starts with uploads and allocations, which bind the calling thread
// to this backend's device. It asks the runtime rather than caching: creating another device's CudaOps (or
// device_info) on this thread changes the current device behind any cache.
void CudaOps::bind_thread() {
    int current = -1;
    MEGACTX_CUDA_CHECK(cudaGetDevice(&current));
    if (current != options_.device) MEGACTX_CUDA_CHECK(cudaSetDevice(options_.device));
}

namespace {

// A tensor of `dtype` and `shape` with no storage yet, and the bytes it needs (at least one element's).
Tensor unbacked(DType dtype, std::vector<int64_t> shape, size_t* bytes) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    *bytes = static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * dtype_size(dtype);
    return t;
}

}  // namespace

Tensor CudaOps::alloc(DType dtype, std::vector<int64_t> shape) {
    bind_thread();
    size_t bytes = 0;
    Tensor t = unbacked(dtype, std::move(shape), &bytes);
    size_t cap = 0;
    void* p = alloc_->allocate(bytes, &cap);
    std::shared_ptr<DeviceAllocator> a = alloc_;
    t.storage = std::shared_ptr<void>(p, [a, cap](void* q) { a->release(q, cap); });
    t.data = p;
    return t;
}

// A recorded graph: the executable, the pinned host buffers its uploads copy from, and the device blocks its
// tensors live in (held until the graph goes).
struct CudaOps::Graph final : OpsGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<std::pair<int32_t*, size_t>> pinned;  // per recorded upload: buffer, element count
    std::vector<std::pair<void*, size_t>> blocks;
    std::shared_ptr<DeviceAllocator> alloc;

    ~Graph() override {
        if (exec) cudaGraphExecDestroy(exec);
        for (auto& [p, n] : pinned) cudaFreeHost(p);
        if (alloc) alloc->unown(blocks);
    }
};

std::unique_ptr<OpsGraph> CudaOps::record(const std::function<void()>& body) {
    bind_thread();
    MEGACTX_CHECK(recording_ == nullptr, "CudaOps::record: already recording");
    auto g = std::make_unique<Graph>();
    g->alloc = alloc_;
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    alloc_->begin_record();
    recording_ = g.get();
    cudaGraph_t graph = nullptr;
    const cudaError_t begin = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
    try {
        MEGACTX_CHECK(begin == cudaSuccess, "CudaOps::record: cannot capture ({})", cudaGetErrorString(begin));
        body();
    } catch (...) {
        if (begin == cudaSuccess) cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        recording_ = nullptr;
        g->blocks = alloc_->end_record();
        throw;  // g's destructor gives the blocks back
    }
    recording_ = nullptr;
    g->blocks = alloc_->end_record();
    for (const auto& blk : g->blocks) g->bytes += static_cast<int64_t>(blk.second);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    MEGACTX_CHECK(end == cudaSuccess && graph != nullptr, "CudaOps::record: capture failed ({})",
                  cudaGetErrorString(end));
    const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    MEGACTX_CHECK(inst == cudaSuccess, "CudaOps::record: cannot instantiate the graph ({})", cudaGetErrorString(inst));
    return g;
}

void CudaOps::replay(OpsGraph& og) {
    bind_thread();
    auto* g = dynamic_cast<Graph*>(&og);
    MEGACTX_CHECK(g != nullptr && g->exec != nullptr, "CudaOps::replay: not a graph recorded by this backend");
    MEGACTX_CHECK(g->inputs.size() == g->pinned.size(), "CudaOps::replay: {} inputs for {} recorded uploads",
                  g->inputs.size(), g->pinned.size());
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the previous replay may still read the buffers
    for (size_t i = 0; i < g->pinned.size(); ++i) {
        MEGACTX_CHECK(g->inputs[i].size() == g->pinned[i].second,
                      "CudaOps::replay: input {} has {} values, recorded with {}", i, g->inputs[i].size(),
                      g->pinned[i].second);
        std::copy(g->inputs[i].begin(), g->inputs[i].end(), g->pinned[i].first);
    }
    MEGACTX_CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
}

Tensor CudaOps::upload_i32(const std::vector<int32_t>& v) {
    bind_thread();
    Tensor t = alloc(DType::I32, {static_cast<int64_t>(v.size())});
    if (recording_ != nullptr) {  // copied from a pinned buffer at each replay
        int32_t* pin = nullptr;
        MEGACTX_CUDA_CHECK(cudaMallocHost(&pin, std::max<size_t>(v.size(), 1) * 4));
        recording_->pinned.emplace_back(pin, v.size());
        recording_->inputs.push_back(v);
        std::copy(v.begin(), v.end(), pin);
        if (!v.empty()) MEGACTX_CUDA_CHECK(cudaMemcpyAsync(t.data, pin, v.size() * 4, cudaMemcpyHostToDevice, stream_));
        return t;
    }
    if (!v.empty()) {
        MEGACTX_CUDA_CHECK(cudaMemcpyAsync(t.data, v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream_));
        MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    return t;
}

void CudaOps::download(const Tensor& t, void* host) {
    bind_thread();
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
    if (bytes > 0) MEGACTX_CUDA_CHECK(cudaMemcpyAsync(host, t.data, bytes, cudaMemcpyDefault, stream_));
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::zero(Tensor& t) {
    bind_thread();
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
    if (bytes > 0) MEGACTX_CUDA_CHECK(cudaMemsetAsync(t.data, 0, bytes, stream_));
}

void CudaOps::upload(const void* host, Tensor& t) {
    bind_thread();
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
    if (bytes > 0) MEGACTX_CUDA_CHECK(cudaMemcpyAsync(t.data, host, bytes, cudaMemcpyDefault, stream_));
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaOps::DeviceWeight& CudaOps::weight(const Weight& w) {
    MEGACTX_CHECK(!w.empty(), "weight {} is empty", w.name);
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return it->second;
    DeviceWeight dw;
    dw.rows = w.rows;
    dw.cols = w.cols;
    dw.block = w.block;
    const int64_t n = w.rows * w.cols;
    auto upload = [&](DType t, const void* src, int64_t count) {
        Tensor d = alloc(t, {count});
        const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
        MEGACTX_CUDA_CHECK(cudaMemcpyAsync(d.data, src, bytes, cudaMemcpyHostToDevice, stream_));
        MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
        alloc_->add_weight_bytes(static_cast<int64_t>(bytes));
        return d;
    };
    switch (w.dtype) {
        case DType::F32:
        case DType::BF16:
            dw.dtype = w.dtype;
            dw.data = upload(w.dtype, w.data, n);
            break;
        case DType::F8_E4M3:
            dw.dtype = w.dtype;
            dw.data = upload(DType::F8_E4M3, w.data, n);
            dw.scales = upload(DType::F32, w.scale_inv.data(), static_cast<int64_t>(w.scale_inv.size()));
            break;
        default: {  // F16: widened to fp32 on the host once
            std::vector<float> f(static_cast<size_t>(n));
            w.rows_f32(0, w.rows, f.data());
            dw.dtype = DType::F32;
            dw.data = upload(DType::F32, f.data(), n);
        }
    }
    return weights_.emplace(w.data, std::move(dw)).first->second;
}

const Tensor& CudaOps::f32_operand(DeviceWeight& dw) {
    if (dw.dtype == DType::F32) return dw.data;
    if (dw.f32.data == nullptr) {
        dw.f32 = alloc(DType::F32, {dw.rows * dw.cols});
        MEGACTX_CUDA_CHECK(launch_weight_to_f32(dw.f32.f32(), dw.data.data, dw.dtype == DType::BF16 ? 1 : 2,
                                                dw.dtype == DType::BF16 ? nullptr : dw.scales.f32(), dw.rows, dw.cols,
                                                dw.block, stream_));
        alloc_->add_weight_bytes(dw.rows * dw.cols * 4);
    }
    return dw.f32;
}

const Tensor& CudaOps::gemm_operand(DeviceWeight& dw) {
    if (options_.gemm_f32) return f32_operand(dw);
    if (dw.dtype != DType::F8_E4M3) return dw.data;
    if (dw.bf16.data == nullptr) {
        // FP8 weights run as bf16 GEMMs: the weight is dequantised once (W8 · scale_inv, rounded to bf16).
        dw.bf16 = alloc(DType::BF16, {dw.rows * dw.cols});
        MEGACTX_CUDA_CHECK(launch_fp8_weight_to_bf16(static_cast<uint16_t*>(dw.bf16.data),
                                                     static_cast<const uint8_t*>(dw.data.data), dw.scales.f32(),
                                                     dw.rows, dw.cols, dw.block, stream_));
        alloc_->add_weight_bytes(dw.rows * dw.cols * 2);
    }
    return dw.bf16;
}

// y [n, out] = x [n, in] · Wᵀ (W [out, in] row-major) in cuBLASLt's column-major terms: C [out, n] = Aᵀ · B with
// A = W as [in, out] and B = x as [in, n]; the caller sets the operands and their type.
CudaOps::Gemm CudaOps::linear_gemm(int64_t out, int64_t n, int64_t in) {
    Gemm g;
    g.trans_a = true;
    g.m = out;
    g.n = n;
    g.k = in;
    g.lda = in;
    g.ldb = in;
    g.ldc = out;
    return g;
}

void CudaOps::invariant_linear(const Tensor& x, DeviceWeight& dw, Tensor& y) {
    InvariantGemmParams p = invariant_weight(dw, rows_of(x), 1);
    p.x = x.f32();
    p.ldx = dw.cols;
    p.o_rows = true;
    p.y = y.f32();
    p.ldy = dw.rows;
    p.out = dw.rows;
    p.in = dw.cols;
    MEGACTX_CUDA_CHECK(launch_invariant_gemm(p, stream_));
}

void CudaOps::linear_f32(const Tensor& x, const Weight& w, Tensor& y) {
    if (options_.batch_invariant) {
        invariant_linear(x, weight(w), y);
        return;
    }
    const Tensor* wt = &f32_operand(weight(w));
    Gemm g = linear_gemm(w.rows, rows_of(x), w.cols);
    g.a = wt->data;
    g.b = x.data;
    g.c = y.f32();
    gemm(g);
}

const float* CudaOps::vec(const std::vector<float>& v) {
    auto it = vectors_.find(v.data());
    if (it != vectors_.end() && it->second.first == v.size()) return it->second.second.f32();
    Tensor d = alloc(DType::F32, {static_cast<int64_t>(v.size())});
    if (!v.empty()) {
        MEGACTX_CUDA_CHECK(cudaMemcpyAsync(d.data, v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream_));
        MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    alloc_->add_weight_bytes(static_cast<int64_t>(v.size()) * 4);
    vectors_[v.data()] = {v.size(), d};
    return d.f32();
}

const float* CudaOps::inv_freq(const Rope& rope) {
    auto it = inv_freq_.find(rope.inv_freq);
    if (it != inv_freq_.end()) return it->second.f32();
    std::vector<float> f = rope.inv_freq;
    if (f.empty()) f.push_back(0.0f);
    Tensor d = alloc(DType::F32, {static_cast<int64_t>(f.size())});
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(d.data, f.data(), f.size() * 4, cudaMemcpyHostToDevice, stream_));
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return inv_freq_.emplace(rope.inv_freq, d).first->second.f32();
}

Tensor CudaOps::to_bf16(const Tensor& x) {
    Tensor b = alloc(DType::BF16, x.shape);
    MEGACTX_CUDA_CHECK(launch_f32_to_bf16(static_cast<uint16_t*>(b.data), x.f32(), x.numel(), stream_));
    return b;
}

const CudaOps::GemmPlan& CudaOps::gemm_plan(const Gemm& g) {
    MEGACTX_CHECK(!g.fp8 || (g.trans_a && g.batch == 1 && g.a_scale && g.b_scale),
                  "gemm: FP8 needs Aᵀ, scales, batch 1");
    // cuBLASLt picks kernels by operand alignment; with batches every batch's start counts, not only the first.
    const int64_t esize = g.fp8 ? 1 : g.bf16 ? 2 : 4;
    auto align_of = [&](const void* p, int64_t stride_bytes) {
        const uint32_t a = ptr_alignment(p);
        return g.batch > 1 ? std::min(a, ptr_alignment(reinterpret_cast<const void*>(stride_bytes))) : a;
    };
    const uint32_t al_a = align_of(g.a, g.stride_a * esize), al_b = align_of(g.b, g.stride_b * esize),
                   al_c = align_of(g.c, g.stride_c * 4);
    const int type = g.fp8 ? 2 : g.bf16 ? 1 : 0;
    char key[320];
    std::snprintf(key, sizeof key, "%d/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%d/%u/%u/%u",
                  g.trans_a ? 1 : 0, static_cast<long long>(g.m), static_cast<long long>(g.n),
                  static_cast<long long>(g.k), static_cast<long long>(g.lda), static_cast<long long>(g.ldb),
                  static_cast<long long>(g.ldc), static_cast<long long>(g.stride_a), static_cast<long long>(g.stride_b),
                  static_cast<long long>(g.stride_c), static_cast<long long>(g.batch), type, al_a, al_b, al_c);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
        GemmPlan p;
        const cudaDataType ab = g.fp8 ? CUDA_R_8F_E4M3 : g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
        MEGACTX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
        MEGACTX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        MEGACTX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (g.fp8) {
            const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                          b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            MEGACTX_CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
            MEGACTX_CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
            // The heuristic refuses block-scaled GEMMs without scale pointers; these are replaced at each run.
            MEGACTX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale,
                                                                sizeof g.a_scale));
            MEGACTX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale,
                                                                sizeof g.b_scale));
        }
        const auto rows_a = static_cast<uint64_t>(g.trans_a ? g.k : g.m),
                   cols_a = static_cast<uint64_t>(g.trans_a ? g.m : g.k);
        MEGACTX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, rows_a, cols_a, g.lda));
        MEGACTX_CUBLAS_CHECK(
            cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(g.k), static_cast<uint64_t>(g.n), g.ldb));
        MEGACTX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, static_cast<uint64_t>(g.m),
                                                        static_cast<uint64_t>(g.n), g.ldc));
        if (g.batch > 1) {
            const auto batch = static_cast<int32_t>(g.batch);
            const cublasLtMatrixLayout_t layouts[3] = {p.a, p.b, p.c};
            const int64_t strides[3] = {g.stride_a, g.stride_b, g.stride_c};
            for (int i = 0; i < 3; ++i) {
                MEGACTX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                                      &batch, sizeof batch));
                MEGACTX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
                    layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]));
            }
        }
        cublasLtMatmulPreference_t pref = nullptr;
        MEGACTX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws = kWorkspaceBytes;
        MEGACTX_CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        const uint32_t al[4] = {al_a, al_b, al_c, al_c};
        const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; ++i) {
            MEGACTX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]));
        }
        cublasLtMatmulHeuristicResult_t res{};
        int n_res = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &n_res);
        cublasLtMatmulPreferenceDestroy(pref);
        if (g.fp8 && (st != CUBLAS_STATUS_SUCCESS || n_res == 0)) {
            p.ok = false;  // the caller takes another path; the plan (descriptors) is kept for the destructor
            std::fprintf(stderr,
                         "megactx: cuBLASLt has no W8A8 FP8 algorithm for %lld x %lld x %lld (status %d); this shape "
                         "runs through a bf16 copy of its weights\n",
                         static_cast<long long>(g.m), static_cast<long long>(g.n), static_cast<long long>(g.k),
                         static_cast<int>(st));
        } else {
            MEGACTX_CHECK(st == CUBLAS_STATUS_SUCCESS && n_res > 0,
                          "cuBLASLt has no algorithm for GEMM {} (status {}, {} results)", key, static_cast<int>(st),
                          n_res);
            p.algo = res.algo;
        }
        it = plans_.emplace(key, p).first;
    }
    return it->second;
}

bool CudaOps::gemm(const Gemm& g) {
    if (g.m == 0 || g.n == 0 || g.batch == 0) return true;
    const GemmPlan& p = gemm_plan(g);
    if (!p.ok) return false;
    if (g.fp8) {  // the scales are per call (per weight and per activation buffer); the descriptor is shared
        MEGACTX_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof g.a_scale));
        MEGACTX_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof g.b_scale));
    }
    const float alpha = 1.0f, beta = 0.0f;
    MEGACTX_CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &alpha, g.a, p.a, g.b, p.b, &beta, g.c, p.c, g.c, p.c, &p.algo,
                                        workspace_.data, kWorkspaceBytes, stream_));
    return true;
}

// W8A8: the activations are quantised per 1 × 128 group (act_quant.h), the weight's e4m3 codes and 128 × 128
// block scales are read as they are (no bf16 copy). cuBLASLt (CUDA 13, sm_90) wants, as measured on the H200:
// the token count a multiple of 4 (so it is padded, with the output staged when it is), k a multiple of 16, and
// the weight scales' rows padded to a multiple of 4 floats; other shapes it refuses, and the caller falls back.
bool CudaOps::linear_fp8(const Tensor& x, DeviceWeight& dw, Tensor& y) {
    const int64_t n = rows_of(x), in = dw.cols, out = dw.rows;
    if (n <= options_.fp8_gemm_small_max_rows && fp8_gemm_small_supported(n, out, in, dw.block)) {
        // A few rows (batched decode): the tensor-core kernel reads the weight straight from HBM (fp8_gemm_small.h).
        Fp8GemmSmallParams p;
        p.n = n;
        p.n_pad = fp8_gemm_small_pad(n);
        p.out = out;
        p.in = in;
        Tensor q = alloc(DType::F8_E4M3, {p.n_pad, in});
        Tensor qs = alloc(DType::F32, {in / 128, p.n_pad});
        p.xq = static_cast<const uint8_t*>(q.data);
        p.xs = qs.f32();
        p.w = static_cast<const uint8_t*>(dw.data.data);
        p.scales = dw.scales.f32();
        p.y = y.f32();
        MEGACTX_CUDA_CHECK(
            launch_act_quant_fp8(x.f32(), n, in, p.n_pad, static_cast<uint8_t*>(q.data), qs.f32(), stream_));
        MEGACTX_CUDA_CHECK(launch_fp8_gemm_small(p, n_sm_, stream_));
        return true;
    }
    const int64_t n_pad = (n + 3) / 4 * 4, kb = (in + 127) / 128, kb4 = (kb + 3) / 4 * 4, mb = (out + 127) / 128;
    if (in % 16 != 0 || dw.block != 128 || n == 0) return false;
    const float* w_scales = dw.scales.f32();
    if (kb4 != kb) {
        if (dw.lt_scales.data == nullptr) {
            dw.lt_scales = alloc(DType::F32, {mb * kb4});
            MEGACTX_CUDA_CHECK(cudaMemsetAsync(dw.lt_scales.data, 0, static_cast<size_t>(mb * kb4) * 4, stream_));
            MEGACTX_CUDA_CHECK(launch_copy_2d(dw.lt_scales.f32(), kb4, dw.scales.f32(), kb, mb, kb, stream_));
            alloc_->add_weight_bytes(mb * kb4 * 4);
        }
        w_scales = dw.lt_scales.f32();
    }
    Tensor q = alloc(DType::F8_E4M3, {n_pad, in});
    Tensor qs = alloc(DType::F32, {kb, n_pad});
    Tensor staged;
    if (n_pad != n) staged = alloc(DType::F32, {n_pad, out});
    Gemm g = linear_gemm(out, n_pad, in);
    g.fp8 = true;
    g.a = dw.data.data;
    g.b = q.data;
    g.c = n_pad != n ? staged.f32() : y.f32();
    g.a_scale = w_scales;
    g.b_scale = qs.f32();
    if (!gemm_plan(g).ok) return false;
    MEGACTX_CUDA_CHECK(launch_act_quant_fp8(x.f32(), n, in, n_pad, static_cast<uint8_t*>(q.data), qs.f32(), stream_));
    gemm(g);
    if (n_pad != n)
        MEGACTX_CUDA_CHECK(
            cudaMemcpyAsync(y.data, staged.data, static_cast<size_t>(n * out) * 4, cudaMemcpyDeviceToDevice, stream_));
    return true;
}

void CudaOps::embedding(const Tensor& tokens, const Weight& table, Tensor& out) {
    DeviceWeight& dw = weight(table);
    const int elem = dw.dtype == DType::F32 ? 0 : dw.dtype == DType::BF16 ? 1 : 2;
    MEGACTX_CUDA_CHECK(launch_embedding(out.f32(), tokens.i32(), dw.data.data, elem,
                                        elem == 2 ? dw.scales.f32() : nullptr, dw.block, dw.cols, tokens.numel(),
                                        stream_));
    after_op("embedding");
}

void CudaOps::rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor& y) {
    MEGACTX_CUDA_CHECK(launch_rms_norm(x.f32(), vec(w), eps, rows_of(x), x.shape.back(), y.f32(), stream_));
    after_op("rms_norm");
}

void CudaOps::add_rms_norm(Tensor& x, const Tensor& delta, const std::vector<float>& w, float eps, Tensor& y) {
    MEGACTX_CHECK(delta.numel() == x.numel(), "add_rms_norm: delta has {} values, x {}", delta.numel(), x.numel());
    MEGACTX_CUDA_CHECK(
        launch_add_rms_norm(x.f32(), delta.f32(), vec(w), eps, rows_of(x), x.shape.back(), y.f32(), stream_));
    after_op("add_rms_norm");
}

void CudaOps::layer_norm(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, float eps,
                         Tensor& y) {
    const float* pw = vec(w);
    const float* pb = vec(b);
    MEGACTX_CUDA_CHECK(launch_layer_norm(x.f32(), pw, pb, eps, rows_of(x), x.shape.back(), y.f32(), stream_));
    after_op("layer_norm");
}

void CudaOps::linear(const Tensor& x, const Weight& w, Tensor& y) {
    const int64_t n = rows_of(x), in = w.cols, out = w.rows;
    MEGACTX_CHECK(x.shape.back() == in, "linear {}: input has {} columns, weight expects {}", w.name, x.shape.back(),
                  in);
    DeviceWeight& dw = weight(w);
    if (options_.batch_invariant) {
        invariant_linear(x, dw, y);
        after_op("linear");
        return;
    }
    // A few rows against FP8 weights (decode): read the FP8 weights as they are, half the bytes of the bf16 copy.
    if (dw.dtype == DType::F8_E4M3 && !options_.gemm_f32 && n <= options_.fp8_gemv_max_rows &&
        fp8_gemv_supported(n, in, dw.block) && (reinterpret_cast<uintptr_t>(x.data) & 15) == 0) {
        Fp8GemvParams p;
        p.x = x.f32();
        p.w = static_cast<const uint8_t*>(dw.data.data);
        p.scales = dw.scales.f32();
        p.y = y.f32();
        p.n = n;
        p.out = out;
        p.in = in;
        p.block = dw.block;
        MEGACTX_CUDA_CHECK(launch_fp8_gemv(p, stream_));
        after_op("linear");
        return;
    }
    if (dw.dtype == DType::F8_E4M3 && !options_.gemm_f32 && options_.fp8_gemm && linear_fp8(x, dw, y)) {
        after_op("linear");
        return;
    }
    const Tensor& wt = gemm_operand(dw);
    Gemm g = linear_gemm(out, n, in);
    g.a = wt.data;
    g.c = y.f32();
    Tensor xb;
    if (wt.dtype == DType::BF16) {
        xb = to_bf16(x);
        g.bf16 = true;
        g.b = xb.data;
    } else {
        g.b = x.data;
    }
    gemm(g);
    after_op("linear");
}

void CudaOps::rope(Tensor& x, int64_t offset, const Tensor& pos, const Rope& rope) {
    const int64_t n = x.dim(0), n_head = x.shape.size() == 3 ? x.dim(1) : 1, d_head = x.shape.back();
    MEGACTX_CHECK(offset + rope.dim() <= d_head, "rope: dims [{}, {}) outside a head of {}", offset,
                  offset + rope.dim(), d_head);
    MEGACTX_CUDA_CHECK(launch_rope(x.f32(), n, n_head, d_head, offset, rope.dim(), pos.i32(), inv_freq(rope),
                                   rope.scale, rope.interleaved, stream_));
    after_op("rope");
}

void CudaOps::cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) {
    const int elem = kv_elem(cache, "cache_write");
    MEGACTX_CHECK(elem != 2, "cache_write: FP8 pools are written by latent_cache_write / indexer_cache_write");
    MEGACTX_CHECK(rows.shape.back() == cache.shape.back(), "cache_write: rows of {} values, cache rows of {}",
                  rows.shape.back(), cache.shape.back());
    MEGACTX_CUDA_CHECK(
        launch_cache_copy(cache.data, elem, rows.f32(), slots.i32(), rows_of(rows), rows.shape.back(), stream_));
    after_op("cache_write");
}

void CudaOps::latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                                 const Rope& rope, const Tensor& slots, Tensor& cache) {
    LatentWriteParams p;
    p.elem = kv_elem(cache, "latent_cache_write");
    p.n = kv_a.dim(0);
    p.rank = static_cast<int64_t>(norm_w.size());
    p.rope = kv_a.shape.back() - p.rank;
    MEGACTX_CHECK(rope.dim() == p.rope && rope.interleaved,
                  "latent_cache_write: k_pe of {} dims takes interleaved RoPE over all of them (got {} dims{})", p.rope,
                  rope.dim(), rope.interleaved ? "" : ", half-split");
    const int64_t want = p.elem == 2 ? fp8_latent_row_bytes(p.rank, p.rope) : p.rank + p.rope;
    MEGACTX_CHECK(p.elem != 2 || (p.rank % 4 == 0 && p.rope % 2 == 0),
                  "latent_cache_write: FP8 rows need kv_lora_rank % 4 == 0 and an even RoPE dim (got {}, {})", p.rank,
                  p.rope);
    MEGACTX_CHECK(cache.shape.size() == 2 && cache.dim(1) == want,
                  "latent_cache_write: cache rows hold {} elements, the {} format needs {}", cache.shape.back(),
                  dtype_name(cache.dtype), want);
    if (fast_ && p.elem != 0 && p.rank == 512 && p.rope == 64) {  // GLM-5.2 geometry: latent_cache.cu
        LatentCacheWriteParams f;
        f.kv_raw = kv_a.f32();
        f.norm_w = vec(norm_w);
        f.pos = pos.i32();
        f.slots = slots.i32();
        f.cache = cache.data;
        f.format = p.elem == 2 ? LatentCacheFormat::FP8 : LatentCacheFormat::BF16;
        f.n = p.n;
        f.eps = eps;
        f.inv_freq = rope.inv_freq.data();
        f.rope_scale = rope.scale;
        if (latent_cache_write_supported(f)) {
            MEGACTX_CUDA_CHECK(launch_latent_cache_write(f, stream_));
            after_op("latent_cache_write");
            return;
        }
    }
    p.kv_a = kv_a.f32();
    p.norm_w = vec(norm_w);
    p.pos = pos.i32();
    p.slots = slots.i32();
    p.cache = cache.data;
    p.eps = eps;
    p.inv_freq = inv_freq(rope);
    p.rope_scale = rope.scale;
    MEGACTX_CUDA_CHECK(launch_latent_write(p, stream_));
    after_op("latent_cache_write");
}

void CudaOps::indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w, const std::vector<float>& ln_b,
                                  float eps, const Tensor& pos, const Rope& rope, const Tensor& slots, Tensor& cache,
                                  bool hadamard) {
    const int64_t d_rope = rope.dim();
    IndexerWriteParams p;
    p.elem = kv_elem(cache, "indexer_cache_write");
    p.n = k_raw.dim(0);
    p.dim = k_raw.shape.back();
    p.hadamard_scale = hadamard && p.elem == 2 ? hadamard_scale(p.dim) : 0.0f;
    const int64_t want = p.elem == 2 ? fp8_indexer_block_bytes(p.dim) : p.dim;
    MEGACTX_CHECK(cache.shape.size() == 2 && cache.dim(1) == want,
                  "indexer_cache_write: cache rows hold {} elements, the {} format needs {}", cache.shape.back(),
                  dtype_name(cache.dtype), want);
    if (fast_ && p.elem == 2 && indexer_cache_write_supported(p.dim, d_rope)) {  // indexer_cache_write.cu
        IndexerCacheWriteParams f;
        f.k_raw = k_raw.f32();
        f.ln_w = vec(ln_w);
        f.ln_b = vec(ln_b);
        f.eps = eps;
        f.pos = pos.i32();
        f.slots = slots.i32();
        f.n = p.n;
        f.d_rope = d_rope;
        f.inv_freq = rope.inv_freq.data();
        f.rope_scale = rope.scale;
        f.interleaved = rope.interleaved;
        f.pool = static_cast<uint8_t*>(cache.data);
        f.hadamard_scale = p.hadamard_scale;
        launch_indexer_cache_write(f, stream_);
        MEGACTX_CUDA_CHECK(cudaGetLastError());
        after_op("indexer_cache_write");
        return;
    }
    p.k = k_raw.f32();
    p.ln_w = vec(ln_w);
    p.ln_b = vec(ln_b);
    p.pos = pos.i32();
    p.slots = slots.i32();
    p.cache = cache.data;
    p.d_rope = d_rope;
    p.eps = eps;
    p.inv_freq = inv_freq(rope);
    p.rope_scale = rope.scale;
    p.interleaved = rope.interleaved;
    MEGACTX_CUDA_CHECK(launch_indexer_write(p, stream_));
    after_op("indexer_cache_write");
}

void CudaOps::indexer_topk(const IndexerTopkParams& p) {
    const int64_t n = p.q->dim(0), n_head = p.q->dim(1), d = p.q->dim(2);
    if (n == 0) return;
    const int elem = kv_elem(*p.keys, "indexer_topk");
    MEGACTX_CHECK(p.map.max_context > 0 && p.map.n_seq > 0,
                  "indexer_topk: the CacheMap has no host-side n_seq / max_context (BatchPlan fills them)");
    constexpr int64_t kIndexerHeads = 32;
    if (fast_ && elem == 2 && n_head < kIndexerHeads && kIndexerHeads % n_head == 0 &&
        indexer_topk_supported(kIndexerHeads, d, p.map.block_size, p.topk, p.map.max_context)) {
        // A head-split indexer (tensor parallel): the 32-head kernel with zero queries and zero gates in the
        // other heads, which add exactly 0 to every score (decode reads the same keys either way).
        Tensor qp = alloc(DType::F32, {n, kIndexerHeads, d});
        Tensor wp = alloc(DType::F32, {n, kIndexerHeads});
        MEGACTX_CUDA_CHECK(cudaMemsetAsync(qp.data, 0, static_cast<size_t>(qp.numel()) * 4, stream_));
        MEGACTX_CUDA_CHECK(cudaMemsetAsync(wp.data, 0, static_cast<size_t>(wp.numel()) * 4, stream_));
        MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(qp.data, static_cast<size_t>(kIndexerHeads * d) * 4, p.q->data,
                                             static_cast<size_t>(n_head * d) * 4, static_cast<size_t>(n_head * d) * 4,
                                             static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
        MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(wp.data, static_cast<size_t>(kIndexerHeads) * 4, p.weights->data,
                                             static_cast<size_t>(n_head) * 4, static_cast<size_t>(n_head) * 4,
                                             static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
        IndexerTopkParams padded = p;
        padded.q = &qp;
        padded.weights = &wp;
        indexer_topk(padded);
        return;
    }
    if (fast_ && elem == 2 && indexer_topk_supported(n_head, d, p.map.block_size, p.topk, p.map.max_context)) {
        // indexer_topk.cu: FP8 MMA scores + exact top-k, row groups under the fixed scratch budget.
        const int64_t ctx = p.map.max_context;
        // The most rows that fit (at 1M: 59, four groups for the logits, where halving from the estimate gave 31).
        int64_t rows = std::clamp<int64_t>(kIndexerScratchBytes / (ctx * 4 + 64 * 1024), 1, n);
        while (rows > 1 && indexer_topk_scratch_bytes(rows, ctx, p.topk) > static_cast<size_t>(kIndexerScratchBytes))
            --rows;
        const size_t bytes = indexer_topk_scratch_bytes(rows, ctx, p.topk);
        Tensor scratch = alloc(DType::F8_E4M3, {static_cast<int64_t>(bytes)});
        IndexerTopkCudaParams f;
        f.q = p.q->f32();
        f.gates = p.weights->f32();
        f.n_head = n_head;
        f.pool = static_cast<const uint8_t*>(p.keys->data);
        f.pool_blocks = p.keys->dim(0);  // [n_blocks, 8448] bytes
        f.pos = p.map.pos;
        f.seq = p.map.seq;
        f.table_offset = p.map.table_offset;
        f.tables = p.map.tables;
        f.n = n;
        f.n_seq = p.map.n_seq;
        f.max_seq_rows = p.map.max_seq_rows;
        f.max_context = ctx;
        f.softmax_scale = p.softmax_scale;
        f.head_scale = p.head_scale;
        f.topk = p.topk;
        f.max_rows_per_group = rows;
        f.out_slots = p.out_slots->i32();
        f.scratch = scratch.data;
        f.scratch_bytes = bytes;
        if (p.hadamard) f.hadamard_scale = hadamard_scale(d);
        if (options_.batch_invariant) f.logits_kernel = n_head == 64 ? 2 : 3;  // one scoring kernel for every shape
        if (p.reduce_scores) {
            f.reduce_ctx = const_cast<std::function<void(float*, int64_t)>*>(&p.reduce_scores);
            f.reduce_scores = [](void* ctx, float* scores, int64_t count) {
                (*static_cast<std::function<void(float*, int64_t)>*>(ctx))(scores, count);
            };
        }
        MEGACTX_CHECK(launch_indexer_topk(f, stream_), "indexer_topk: the FP8 kernel refused {} rows × {} keys{}", n,
                      ctx, options_.batch_invariant ? " (--batch-invariant: scoring kernel 3 could not run here)" : "");
        MEGACTX_CUDA_CHECK(cudaGetLastError());
        after_op("indexer_topk");
        return;
    }
    const int64_t smem = indexer_scores_smem_bytes(n_head, d);
    MEGACTX_CHECK(smem <= smem_optin_, "indexer_topk: {} heads × {} dims need {} B of shared memory (device: {})",
                  n_head, d, smem, smem_optin_);
    // The score rows are sized by the longest context in the batch (the plan's host-side max_context), rounded up
    // to 64 so that every row starts 16-B aligned for the top-k's vector loads (the padding scores -inf).
    const int64_t n_cand_max = (p.map.max_context + 63) / 64 * 64;
    // grid.y of the scores kernel is the chunk's token count: at most 65535
    const int64_t chunk = std::clamp<int64_t>(kIndexerScratchBytes / (n_cand_max * 4), 1, std::min<int64_t>(n, 65535));
    Tensor scores = alloc(DType::F32, {chunk, n_cand_max});
    // The selection runs topk.cu's exact top-k (the same slots as topk_rows_kernel, ties to the lowest position):
    // the reference kernel's 33 passes over every row made a 1M-token prefill of a model outside the FP8 kernels'
    // geometry take hours. The reference stays for the shapes topk.cu does not take.
    const bool fast_select = fast_ && topk_supported(p.topk, n_cand_max);
    const bool tiled_scores = fast_ && indexer_scores_tiled_supported(n_head, d);
    Tensor lengths, plan, select_scratch;
    size_t select_bytes = 0;
    if (fast_select) {
        lengths = alloc(DType::I32, {chunk});
        plan = alloc(DType::I32, {indexer_plan_ints(chunk)});
        select_bytes = topk_scratch_bytes(chunk, n_cand_max, p.topk);
        if (select_bytes > 0) select_scratch = alloc(DType::F8_E4M3, {static_cast<int64_t>(select_bytes)});
    }
    // Keys stored rotated (FP8 with the Hadamard): the queries are scored rotated too.
    const float* q = p.q->f32();
    Tensor q_rotated;
    if (elem == 2 && p.hadamard) {
        q_rotated = alloc(DType::F32, {n, n_head, d});  // [n, n_head, d] H · q per head
        MEGACTX_CUDA_CHECK(launch_hadamard_rows(q, q_rotated.f32(), n * n_head, d, hadamard_scale(d), stream_));
        q = q_rotated.f32();
    }
    IndexerMapView m;
    m.pos = p.map.pos;
    m.seq = p.map.seq;
    m.table_offset = p.map.table_offset;
    m.tables = p.map.tables;
    m.block_size = p.map.block_size;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        IndexerScoresParams sp;
        sp.q = q;
        sp.w = p.weights->f32();
        sp.keys = p.keys->data;
        sp.elem = elem;
        sp.map = m;
        sp.n_head = n_head;
        sp.dim = d;
        sp.i0 = i0;
        sp.i1 = std::min(n, i0 + chunk);
        sp.n_cand_max = n_cand_max;
        sp.softmax_scale = p.softmax_scale;
        sp.head_scale = p.head_scale;
        sp.scores = scores.f32();
        MEGACTX_CUDA_CHECK(tiled_scores ? launch_indexer_scores_tiled(sp, stream_)
                                        : launch_indexer_scores(sp, stream_));
        if (p.reduce_scores) p.reduce_scores(scores.f32(), (sp.i1 - sp.i0) * n_cand_max);
        if (fast_select) {
            IndexerPlanParams pp;  // only for the row lengths, pos + 1
            pp.pos = p.map.pos;
            pp.seq = p.map.seq;
            pp.row_begin = sp.i0;
            pp.row_end = sp.i1;
            pp.plan = plan.i32();
            pp.lengths = lengths.i32();
            launch_indexer_plan(pp, stream_);
            TopkParams tp;
            tp.values = scores.f32();
            tp.lengths = lengths.i32();
            tp.n_rows = sp.i1 - sp.i0;
            tp.row_stride = n_cand_max;
            tp.k = p.topk;
            tp.out_idx = p.out_slots->i32() + sp.i0 * p.topk;
            tp.slots.seq = p.map.seq;
            tp.slots.table_offset = p.map.table_offset;
            tp.slots.tables = p.map.tables;
            tp.slots.row_begin = sp.i0;
            tp.slots.block = static_cast<int32_t>(p.map.block_size);
            tp.scratch = select_scratch.data;
            tp.scratch_bytes = select_bytes;
            launch_topk(tp, stream_);
            MEGACTX_CUDA_CHECK(cudaGetLastError());
            continue;
        }
        TopkRowsParams tp;
        tp.scores = scores.f32();
        tp.map = m;
        tp.i0 = sp.i0;
        tp.i1 = sp.i1;
        tp.n_cand_max = n_cand_max;
        tp.topk = p.topk;
        tp.out = p.out_slots->i32();
        MEGACTX_CUDA_CHECK(launch_topk_rows(tp, stream_));
    }
    after_op("indexer_topk");
}

// The batch-invariant mode's GEMM over a weight as stored, split into `batch` equal groups of rows (MLA's heads of
// kv_b [n_head · (d_nope + d_v), r]; 1 for a linear): the caller sets x, y, the orientation and the first row.
InvariantGemmParams CudaOps::invariant_weight(const DeviceWeight& dw, int64_t n, int64_t batch) const {
    MEGACTX_CHECK(dw.rows % batch == 0, "invariant GEMM: {} weight rows in {} groups", dw.rows, batch);
    InvariantGemmParams g;
    g.w = dw.data.data;
    g.wtype = dw.dtype == DType::F32 ? 0 : dw.dtype == DType::BF16 ? 1 : 2;
    if (g.wtype == 2) {
        g.scales = dw.scales.f32();
        g.block = dw.block;
        g.scale_ld = (dw.cols + dw.block - 1) / dw.block;
    }
    g.w_ld = dw.cols;
    g.w_batch_rows = dw.rows / batch;
    g.n = n;
    g.batch = batch;
    return g;
}

// Decode (a few tokens): kv_b read as stored, FP8 or BF16 (mla_heads.h); else cuBLAS's batched GEMM over its bf16
// (or fp32) copy.
bool CudaOps::mla_heads(const Tensor& x, DeviceWeight& dw, int64_t d_nope, int64_t d_v, Tensor& y, bool absorb) {
    if (!fast_ || x.dim(0) > options_.mla_heads_max_tokens || dw.block != 128 ||
        (dw.dtype != DType::F8_E4M3 && dw.dtype != DType::BF16))
        return false;
    MlaHeadsParams m;
    m.x = x.f32();
    m.w = dw.data.data;
    m.fp8 = dw.dtype == DType::F8_E4M3;
    m.scales = m.fp8 ? dw.scales.f32() : nullptr;
    m.y = y.f32();
    m.n = x.dim(0);
    m.n_head = x.dim(1);
    m.d_nope = d_nope;
    m.d_v = d_v;
    m.r = dw.cols;
    m.d_qk = absorb ? x.dim(2) : d_nope;
    if (!mla_heads_supported(m) || dw.rows != m.n_head * (d_nope + d_v)) return false;
    MEGACTX_CUDA_CHECK(absorb ? launch_mla_absorb(m, stream_) : launch_mla_expand(m, stream_));
    return true;
}

void CudaOps::mla_absorb_q(const Tensor& q, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& q_out) {
    const int64_t n = q.dim(0), n_head = q.dim(1), d_qk = q.dim(2), r = kv_b.cols, d_out = q_out.dim(2);
    DeviceWeight& dw = weight(kv_b);
    if (options_.batch_invariant) {
        // Per head h: q_out[:, h, :r] = q[:, h, :d_nope] · W_UK_h, W_UK_h the rows h · (d_nope + d_v) + i of kv_b.
        MEGACTX_CHECK(d_out == r + d_qk - d_nope, "mla_absorb_q: output rows of {}, expected {}", d_out,
                      r + d_qk - d_nope);
        InvariantGemmParams g = invariant_weight(dw, n, n_head);
        g.x = q.f32();
        g.ldx = n_head * d_qk;
        g.x_bstride = d_qk;
        g.o_rows = false;
        g.w_row0 = 0;
        g.y = q_out.f32();
        g.ldy = n_head * d_out;
        g.y_bstride = d_out;
        g.out = r;
        g.in = d_nope;
        MEGACTX_CUDA_CHECK(launch_invariant_gemm(g, stream_));
        MEGACTX_CUDA_CHECK(
            launch_copy_2d(q_out.f32() + r, d_out, q.f32() + d_nope, d_qk, n * n_head, d_qk - d_nope, stream_));
        after_op("mla_absorb_q");
        return;
    }
    if (d_out == r + d_qk - d_nope && mla_heads(q, dw, d_nope, d_v, q_out, true)) {
        after_op("mla_absorb_q");
        return;
    }
    const Tensor& wt = gemm_operand(dw);
    const bool bf16 = wt.dtype == DType::BF16;
    Tensor qb;
    if (bf16) qb = to_bf16(q);
    const char* qsrc = static_cast<const char*>(bf16 ? qb.data : q.data);
    // Per head: q_abs[:, h] (r × n, column-major) = W_UK_h (r × d_nope) · q_nope[:, h] (d_nope × n).
    Gemm g;
    g.trans_a = false;
    g.m = r;
    g.n = n;
    g.k = d_nope;
    g.lda = r;
    g.stride_a = (d_nope + d_v) * r;
    g.ldb = n_head * d_qk;
    g.stride_b = d_qk;
    g.ldc = n_head * d_out;
    g.stride_c = d_out;
    g.batch = n_head;
    g.bf16 = bf16;
    g.a = wt.data;
    g.b = qsrc;
    g.c = q_out.f32();
    gemm(g);
    // q_out[:, h, r:] = q_pe[:, h]
    MEGACTX_CUDA_CHECK(
        launch_copy_2d(q_out.f32() + r, d_out, q.f32() + d_nope, d_qk, n * n_head, d_qk - d_nope, stream_));
    after_op("mla_absorb_q");
}

void CudaOps::sparse_mla(const SparseMlaParams& p) {
    const int elem = kv_elem(*p.cache, "sparse_mla");
    const int64_t n = p.q->dim(0), n_head = p.q->dim(1), topk = p.slots->dim(1);
    constexpr int64_t kPadHeads = 64;
    if (fast_ && elem != 0 && n > 0 && n_head < kPadHeads && kPadHeads % n_head == 0 && p.q->dim(2) == 576 &&
        p.d_v == 512 && sparse_mla_supported(static_cast<int>(kPadHeads), static_cast<int>(topk))) {
        // Tensor-parallel head counts (64 / TP): the kernel's 64-head tile with zero query heads, whose outputs
        // are dropped. Decode reads the same rows either way, so it costs what 64 heads cost (FlashMLA pads too).
        const int64_t d = p.q->dim(2), d_v = p.d_v;
        Tensor qp = alloc(DType::F32, {n, kPadHeads, d});
        Tensor op = alloc(DType::F32, {n, kPadHeads, d_v});
        MEGACTX_CUDA_CHECK(cudaMemsetAsync(qp.data, 0, static_cast<size_t>(n * kPadHeads * d) * 4, stream_));
        MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(qp.data, static_cast<size_t>(kPadHeads * d) * 4, p.q->data,
                                             static_cast<size_t>(n_head * d) * 4, static_cast<size_t>(n_head * d) * 4,
                                             static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
        SparseMlaParams padded = p;
        padded.q = &qp;
        padded.out = &op;
        sparse_mla(padded);
        MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(
            p.out->data, static_cast<size_t>(n_head * d_v) * 4, op.data, static_cast<size_t>(kPadHeads * d_v) * 4,
            static_cast<size_t>(n_head * d_v) * 4, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
        return;
    }
    if (fast_ && elem != 0 && p.q->dim(2) == 576 && p.d_v == 512 &&
        sparse_mla_supported(static_cast<int>(n_head), static_cast<int>(topk))) {
        // sparse_mla.cu: wgmma over the selected rows, split-KV planned here.
        if (n == 0) return;
        SparseMlaRunParams f;
        f.q = p.q->f32();
        f.cache = p.cache->data;
        f.slots = p.slots->i32();
        f.out = p.out->f32();
        f.format = elem == 2 ? MlaCacheFormat::FP8 : MlaCacheFormat::BF16;
        f.n = n;
        f.n_head = static_cast<int>(n_head);
        f.topk = static_cast<int>(topk);
        f.scale = p.scale;
        if (options_.batch_invariant) {
            // Batch-invariant: every token's selection in kInvariantSplits splits merged in split order, no cluster
            // or value split (whose use depends on the grid), whatever the row count: a decode row spreads over
            // that many CTAs instead of one. The splits' partials are bounded by passes of kInvariantPassRows rows
            // (the pass changes no token's arithmetic).
            f.plan = SparseMlaPlan{};
            f.plan.n_split = static_cast<int>(std::min<int64_t>(kInvariantSplits, topk / 64));
            const size_t bytes = sparse_mla_scratch_bytes(std::min(n, kInvariantPassRows), f.n_head, f.plan);
            Tensor scratch;  // (none for a single split: a top-k of 64)
            if (bytes > 0) scratch = alloc(DType::F8_E4M3, {static_cast<int64_t>(bytes)});
            for (int64_t r0 = 0; r0 < n; r0 += kInvariantPassRows) {
                SparseMlaRunParams pass = f;
                pass.n = std::min(kInvariantPassRows, n - r0);
                pass.q = f.q + r0 * n_head * 576;
                pass.slots = f.slots + r0 * topk;
                pass.out = f.out + r0 * n_head * 512;
                pass.scratch = scratch.data;
                MEGACTX_CUDA_CHECK(launch_sparse_mla(pass, stream_));
            }
            after_op("sparse_mla");
            return;
        }
        f.plan = sparse_mla_plan(p.plan_rows > 0 ? p.plan_rows : n, f.n_head, f.topk, n_sm_);
        Tensor scratch;
        const size_t bytes = sparse_mla_scratch_bytes(n, f.n_head, f.plan);
        if (bytes > 0) {
            scratch = alloc(DType::F8_E4M3, {static_cast<int64_t>(bytes)});
            f.scratch = scratch.data;
        }
        MEGACTX_CUDA_CHECK(launch_sparse_mla(f, stream_));
        after_op("sparse_mla");
        return;
    }
    SparseMlaRefParams s;
    s.elem = elem;
    s.n = p.q->dim(0);
    s.n_head = p.q->dim(1);
    s.d = p.q->dim(2);
    s.d_v = p.d_v;
    s.topk = p.slots->dim(1);
    const int64_t smem = sparse_mla_ref_smem_bytes(s.d, s.topk);
    MEGACTX_CHECK(smem <= smem_optin_, "sparse_mla: top-k {} with rows of {} needs {} B of shared memory", s.topk, s.d,
                  smem);
    s.q = p.q->f32();
    s.cache = p.cache->data;
    s.slots = p.slots->i32();
    s.scale = p.scale;
    s.out = p.out->f32();
    MEGACTX_CUDA_CHECK(launch_sparse_mla_ref(s, stream_));
    after_op("sparse_mla");
}

void CudaOps::mla_expand_v(const Tensor& lat, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& out) {
    const int64_t n = lat.dim(0), n_head = lat.dim(1), r = lat.dim(2);
    DeviceWeight& dw = weight(kv_b);
    if (options_.batch_invariant) {
        // Per head h: out[:, h] = lat[:, h] · W_UV_hᵀ, W_UV_h the rows h · (d_nope + d_v) + d_nope + j of kv_b.
        MEGACTX_CHECK(r == kv_b.cols, "mla_expand_v: latent rows of {}, kv_b has {} columns", r, kv_b.cols);
        InvariantGemmParams g = invariant_weight(dw, n, n_head);
        g.x = lat.f32();
        g.ldx = n_head * r;
        g.x_bstride = r;
        g.o_rows = true;
        g.w_row0 = d_nope;
        g.y = out.f32();
        g.ldy = n_head * d_v;
        g.y_bstride = d_v;
        g.out = d_v;
        g.in = r;
        MEGACTX_CUDA_CHECK(launch_invariant_gemm(g, stream_));
        after_op("mla_expand_v");
        return;
    }
    if (r == kv_b.cols && mla_heads(lat, dw, d_nope, d_v, out, false)) {
        after_op("mla_expand_v");
        return;
    }
    const Tensor& wt = gemm_operand(dw);
    const bool bf16 = wt.dtype == DType::BF16;
    Tensor lb;
    if (bf16) lb = to_bf16(lat);
    // Per head: out[:, h] (d_v × n, column-major) = op(W_UV_h) · lat[:, h] (r × n), where W_UV_h [d_v, r]
    // row-major is (r × d_v) column-major and op transposes it.
    Gemm g;
    g.trans_a = true;
    g.m = d_v;
    g.n = n;
    g.k = r;
    g.lda = r;
    g.stride_a = (d_nope + d_v) * r;
    g.ldb = n_head * r;
    g.stride_b = r;
    g.ldc = n_head * d_v;
    g.stride_c = d_v;
    g.batch = n_head;
    g.bf16 = bf16;
    g.a = static_cast<const char*>(wt.data) + d_nope * r * static_cast<int64_t>(bf16 ? 2 : 4);
    g.b = bf16 ? lb.data : lat.data;
    g.c = out.f32();
    gemm(g);
    after_op("mla_expand_v");
}

void CudaOps::swiglu_mlp(const Tensor& x, const MlpWeights& w, Tensor& y) {
    const int64_t n = rows_of(x), d_ff = w.gate.rows;
    Tensor g = alloc(DType::F32, {n, d_ff});  // [n, d_ff]
    Tensor u = alloc(DType::F32, {n, d_ff});  // [n, d_ff]
    linear(x, w.gate, g);
    linear(x, w.up, u);
    MEGACTX_CUDA_CHECK(launch_silu_mul(g.f32(), u.f32(), n * d_ff, stream_));
    linear(g, w.down, y);
}

void CudaOps::moe_route(const Tensor& x, const Weight& gate, const std::vector<float>& bias, const MoeRouteParams& p,
                        Tensor& ids, Tensor& weights) {
    const int64_t n = rows_of(x), n_exp = gate.rows;
    Tensor logits = alloc(DType::F32, {n, n_exp});  // [n, n_exp]
    linear_f32(x, gate, logits);
    MoeRouteKernelParams k;
    k.logits = logits.f32();
    k.bias = vec(bias);
    k.ids = ids.i32();
    k.weights = weights.f32();
    k.n = n;
    k.n_exp = n_exp;
    k.n_group = p.n_group;
    k.topk_group = p.topk_group;
    k.top_k = p.top_k;
    k.norm_topk_prob = p.norm_topk_prob;
    k.routed_scaling_factor = p.routed_scaling_factor;
    MEGACTX_CUDA_CHECK(launch_moe_route(k, stream_));
    after_op("moe_route");
}

// Tokens are grouped per expert on the host (one sync to read the ids), gathered into one sorted buffer, each
// expert runs its SwiGLU on its contiguous rows, and a combine kernel sums the k outputs per token in k order.
const CudaOps::ExpertTable& CudaOps::expert_table(const std::vector<MlpWeights>& experts) {
    const int64_t n_exp = static_cast<int64_t>(experts.size());
    std::vector<const void*> host(static_cast<size_t>(3 * n_exp));  // identifies the weights behind the table
    for (int64_t e = 0; e < n_exp; ++e) {
        const MlpWeights& m = experts[static_cast<size_t>(e)];
        host[static_cast<size_t>(3 * e)] = m.gate.data;
        host[static_cast<size_t>(3 * e + 1)] = m.up.data;
        host[static_cast<size_t>(3 * e + 2)] = m.down.data;
    }
    auto it = expert_tables_.find(experts.data());
    if (it != expert_tables_.end() && it->second.host == host) return it->second;
    ExpertTable t;
    t.host = std::move(host);
    std::vector<const void*> ptrs(static_cast<size_t>(6 * n_exp), nullptr);
    // FP8 experts are read as e4m3 + block scales (unless fp32 GEMMs are forced); others through their GEMM
    // operand (fp32 or the bf16 copy).
    bool all_fp8 = !options_.gemm_f32;
    for (const MlpWeights& m : experts)
        if (!m.gate.empty())
            all_fp8 = all_fp8 && m.gate.dtype == DType::F8_E4M3 && m.up.dtype == DType::F8_E4M3 &&
                      m.down.dtype == DType::F8_E4M3 && m.gate.block == 128 && m.down.block == 128;
    int kinds = 0;  // bit 0: an fp32 operand, bit 1: bf16, bit 2: e4m3
    for (int64_t e = 0; e < n_exp; ++e) {
        const MlpWeights& m = experts[static_cast<size_t>(e)];
        if (m.gate.empty()) continue;
        const Weight* w3[3] = {&m.gate, &m.up, &m.down};
        for (int i = 0; i < 3; ++i) {
            DeviceWeight& dw = weight(*w3[i]);
            if (all_fp8) {
                kinds |= 4;
                ptrs[static_cast<size_t>(6 * e + i)] = dw.data.data;
                ptrs[static_cast<size_t>(6 * e + 3 + i)] = dw.scales.data;
            } else {
                const Tensor& op = gemm_operand(dw);
                kinds |= op.dtype == DType::BF16 ? 2 : 1;
                ptrs[static_cast<size_t>(6 * e + i)] = op.data;
            }
        }
        t.ff = m.gate.rows;
        t.d = m.gate.cols;
    }
    t.usable = (kinds == 1 || kinds == 2 || kinds == 4) && t.ff > 0;
    t.wtype = kinds == 4 ? 2 : kinds == 2 ? 1 : 0;
    t.ptrs = alloc(DType::I32, {2 * 6 * n_exp});  // [n_exp][6] device pointers
    MEGACTX_CUDA_CHECK(
        cudaMemcpyAsync(t.ptrs.data, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, stream_));
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ExpertTable& slot = expert_tables_[experts.data()];
    slot = std::move(t);
    return slot;
}

// Per choice or grouped, picked on the device (moe_plan.h) while a CUDA graph is captured: the grouped path's plan
// kernel counts the step's distinct experts and sets an IF/ELSE conditional node whose branches are the two paths, so
// the skipped path launches nothing. (Launching both and letting the skipped kernels return cost 13-35 µs per layer
// in empty CTAs; the node costs ~6-12 µs, bench/results/cuda-h200-2026-12-01-d35a79c-moe-device-choice-graph-node.txt.)
void CudaOps::moe_device_choice(const MoeFp8Params& gp, const MoeSmallParams& sp) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    MEGACTX_CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &st, nullptr, &graph));
    MEGACTX_CHECK(st == cudaStreamCaptureStatusActive && graph != nullptr, "moe_device_choice: not capturing");
    cudaGraphConditionalHandle cond = 0;
    MEGACTX_CUDA_CHECK(cudaGraphConditionalHandleCreate(&cond, graph, 0, 0));
    MEGACTX_CUDA_CHECK(launch_moe_fp8_plan(gp, stream_, true, cond));
    const cudaGraphNode_t* deps = nullptr;
    const cudaGraphEdgeData* edges = nullptr;
    size_t n_deps = 0;
    MEGACTX_CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &st, nullptr, &graph, &deps, &edges, &n_deps));
    cudaGraphNodeParams cp{};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = cond;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 2;  // [0] when the condition is 1 (per choice), [1] when 0 (grouped)
    cudaGraphNode_t node = nullptr;
    MEGACTX_CUDA_CHECK(cudaGraphAddNode(&node, graph, deps, edges, n_deps, &cp));
    MEGACTX_CUDA_CHECK(
        cudaStreamUpdateCaptureDependencies(stream_, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
    if (branch_stream_ == nullptr)
        MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&branch_stream_, cudaStreamNonBlocking));
    auto branch = [&](cudaGraph_t body, bool per_choice) {
        MEGACTX_CUDA_CHECK(
            cudaStreamBeginCaptureToGraph(branch_stream_, body, nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed));
        const cudaError_t e =
            per_choice ? launch_moe_small(sp, branch_stream_) : launch_moe_fp8_experts(gp, n_sm_, branch_stream_);
        cudaGraph_t captured = nullptr;
        const cudaError_t end = cudaStreamEndCapture(branch_stream_, &captured);
        MEGACTX_CUDA_CHECK(e);
        MEGACTX_CUDA_CHECK(end);
    };
    branch(cp.conditional.phGraph_out[0], true);
    branch(cp.conditional.phGraph_out[1], false);
}

void CudaOps::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                          const std::vector<MlpWeights>& experts, Tensor& y) {
    const int64_t n = rows_of(x), d = x.shape.back(), k = ids.dim(1);
    if (options_.batch_invariant) {
        // Per (token, choice) whatever the tokens, in passes of at most kMoeSmallMaxTokens: nothing a token computes
        // depends on which other tokens chose its experts. Experts too wide for it take the sorted path below, whose
        // linears are invariant in this mode.
        const ExpertTable& t = expert_table(experts);
        if (t.usable && t.d == d && d <= kMoeSmallMaxRow && t.ff <= kMoeSmallMaxRow) {
            const int64_t pass = std::min(n, kMoeSmallMaxTokens);
            Tensor h = alloc(DType::F32, {pass, k, t.ff});
            Tensor yk = alloc(DType::F32, {pass, k, d});
            for (int64_t t0 = 0; t0 < n; t0 += pass) {
                MoeSmallParams sp;
                sp.x = x.f32() + t0 * d;
                sp.ids = ids.i32() + t0 * k;
                sp.w = weights.f32() + t0 * k;
                sp.experts = static_cast<const void* const*>(t.ptrs.data);
                sp.h = h.f32();
                sp.yk = yk.f32();
                sp.y = y.f32() + t0 * d;
                sp.n = std::min(pass, n - t0);
                sp.k = k;
                sp.d = d;
                sp.ff = t.ff;
                sp.n_exp = static_cast<int64_t>(experts.size());
                sp.wtype = t.wtype;
                MEGACTX_CUDA_CHECK(launch_moe_small(sp, stream_));
            }
            after_op("moe_experts");
            return;
        }
    }
    // Few tokens (decode): the experts run from device-side ids, no host round trip (capturable). Up to
    // kMoeGraphMaxTokens (a batch of verification rows) the same paths run in passes of kMoeSmallMaxTokens, so such
    // steps stay free of host syncs and replay as CUDA graphs too. few(t0, m, run): whether the few-token paths take
    // the m tokens from t0 on, and with run, launches them.
    const ExpertTable* table = n <= kMoeGraphMaxTokens ? &expert_table(experts) : nullptr;
    auto few = [&](int64_t t0, int64_t m, bool run) {
        const ExpertTable& t = *table;
        const int64_t n_exp = static_cast<int64_t>(experts.size());
        using moe_plan::MoePath;
        const MoePath path = t.usable && t.wtype == 2 && t.d == d && moe_fp8_supported(m, k, d, t.ff, n_exp)
                                 ? moe_plan::moe_path(m, k, n_exp, options_.moe_fp8_min_tokens)
                                 : MoePath::kPerChoice;
        const bool small_ok = t.usable && t.d == d && d <= kMoeSmallMaxRow && t.ff <= kMoeSmallMaxRow;
        const bool grouped_ok = path == MoePath::kGrouped || path == MoePath::kOnDevice;
        if (!run || !(grouped_ok || small_ok)) return grouped_ok || small_ok;
        // The device choice (moe_device_choice) only inside a CUDA graph, and with a driver that has IF/ELSE
        // conditional nodes (CUDA 12.8); otherwise grouped.
        static const bool if_else_nodes = [] {
            int v = 0;
            return cudaDriverGetVersion(&v) == cudaSuccess && v >= 12080;
        }();
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        if (path == MoePath::kOnDevice && if_else_nodes) MEGACTX_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
        const bool on_device = path == MoePath::kOnDevice && small_ok && capture == cudaStreamCaptureStatusActive;
        const bool grouped = grouped_ok;
        Tensor scratch, h, yk;
        auto common = [&](auto& p) {  // the fields both paths' parameters share
            p.x = x.f32() + t0 * d;
            p.ids = ids.i32() + t0 * k;
            p.w = weights.f32() + t0 * k;
            p.experts = static_cast<const void* const*>(t.ptrs.data);
            p.y = y.f32() + t0 * d;
            p.n = m;
            p.k = k;
            p.d = d;
            p.ff = t.ff;
            p.n_exp = n_exp;
        };
        MoeFp8Params gp;  // grouped by expert, each chosen expert read once (moe_fp8.h)
        if (grouped) {
            const size_t bytes = moe_fp8_scratch_bytes(m, k, d, t.ff, n_exp);
            scratch = alloc(DType::F8_E4M3, {static_cast<int64_t>(bytes)});
            common(gp);
            gp.scratch = scratch.data;
            gp.scratch_bytes = bytes;
            if (on_device) gp.grouped_max_active = moe_plan::grouped_max_active(m, k);
        }
        MoeSmallParams sp;  // per (token, choice) (moe.h)
        if (!grouped || on_device) {
            h = alloc(DType::F32, {m, k, t.ff});
            yk = alloc(DType::F32, {m, k, d});
            common(sp);
            sp.h = h.f32();
            sp.yk = yk.f32();
            sp.wtype = t.wtype;
        }
        if (!on_device) {
            MEGACTX_CUDA_CHECK(grouped ? launch_moe_fp8(gp, n_sm_, stream_) : launch_moe_small(sp, stream_));
        } else {
            moe_device_choice(gp, sp);
        }
        return true;
    };
    if (table != nullptr && n > 0) {
        const int64_t pass = std::min(n, kMoeSmallMaxTokens), last = n - (n - 1) / pass * pass;
        if (few(0, pass, false) && few(0, last, false)) {
            for (int64_t t0 = 0; t0 < n; t0 += pass) few(t0, std::min(pass, n - t0), true);
            after_op("moe_experts");
            return;
        }
    }
    std::vector<int32_t> hid(static_cast<size_t>(n * k));
    download(ids, hid.data());
    std::vector<int64_t> count(experts.size() + 1, 0);
    for (int32_t e : hid) {
        MEGACTX_CHECK(e >= 0 && static_cast<size_t>(e) < experts.size(), "moe_experts: expert id {} out of range", e);
        ++count[static_cast<size_t>(e) + 1];
    }
    for (size_t e = 0; e < experts.size(); ++e) count[e + 1] += count[e];  // offsets
    std::vector<int32_t> sorted_rows(hid.size()), inv(hid.size());
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < n * k; ++i) {
        const int64_t at = fill[static_cast<size_t>(hid[i])]++;
        sorted_rows[static_cast<size_t>(at)] = static_cast<int32_t>(i / k);
        inv[static_cast<size_t>(i)] = static_cast<int32_t>(at);
    }
    Tensor rows_dev = upload_i32(sorted_rows);
    Tensor inv_dev = upload_i32(inv);
    Tensor xs = alloc(DType::F32, {n * k, d});  // [n · k, d] token rows grouped by expert
    Tensor ys = alloc(DType::F32, {n * k, d});  // [n · k, d] expert outputs, same order
    MEGACTX_CUDA_CHECK(launch_gather_rows(xs.f32(), x.f32(), rows_dev.i32(), n * k, d, stream_));
    // Experts with empty weights are held by another rank (expert parallel): their rows contribute 0.
    const bool partial =
        std::any_of(experts.begin(), experts.end(), [](const MlpWeights& m) { return m.gate.empty(); });
    if (partial) MEGACTX_CUDA_CHECK(cudaMemsetAsync(ys.data, 0, static_cast<size_t>(n * k * d) * 4, stream_));
    for (size_t e = 0; e < experts.size(); ++e) {
        const int64_t r0 = count[e], m = count[e + 1] - count[e];
        if (m == 0 || experts[e].gate.empty()) continue;
        Tensor xe = xs, ye = ys;
        xe.data = xs.f32() + r0 * d;
        xe.shape = {m, d};
        ye.data = ys.f32() + r0 * d;
        ye.shape = {m, d};
        swiglu_mlp(xe, experts[e], ye);
    }
    MEGACTX_CUDA_CHECK(launch_moe_combine(y.f32(), ys.f32(), inv_dev.i32(), weights.f32(), n, k, d, stream_));
    after_op("moe_experts");
}

void CudaOps::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
    MEGACTX_CHECK((x.dtype == DType::F32 || x.dtype == DType::I32) && out.dtype == x.dtype,
                  "gather_rows: F32 or I32 rows, the same for both, got {} and {}", dtype_name(x.dtype),
                  dtype_name(out.dtype));
    // The kernel moves 4-byte values: I32 rows travel as their bits.
    MEGACTX_CUDA_CHECK(launch_gather_rows(static_cast<float*>(out.data), static_cast<const float*>(x.data), rows.i32(),
                                          rows.numel(), x.shape.back(), stream_));
    after_op("gather_rows");
}

namespace {

int64_t row_bytes(const Tensor& t) {
    const int64_t rows = t.shape.empty() ? 1 : t.dim(0);
    return rows == 0 ? 0 : t.numel() / rows * static_cast<int64_t>(dtype_size(t.dtype));
}

// The bytes of one row the gather moves, after checking that src's rows are dst's and that dst holds them all.
int64_t fetch_row_bytes(const Tensor& src, const Tensor& rows, const Tensor& dst) {
    const int64_t rb = row_bytes(dst), m = rows.numel();
    MEGACTX_CHECK(row_bytes(src) == rb && dst.dim(0) >= m, "kv_fetch_rows: {} rows of {} B into {} rows of {} B", m,
                  row_bytes(src), dst.dim(0), rb);
    return rb;
}

}  // namespace

void CudaOps::kv_resolve(const KvResolveParams& p) {
    const int64_t n = p.slots->dim(0), k = p.slots->dim(1), n_blocks = p.loc->numel();
    MEGACTX_CHECK(p.rows_per_pass >= 1 && p.device_slots->numel() == n * k && p.fetch->numel() == n * k &&
                      p.block_hits->numel() == n_blocks,
                  "kv_resolve: shapes do not match [{}, {}] slots over {} blocks", n, k, n_blocks);
    KvResolveArgs a;
    a.slots = p.slots->i32();
    a.loc = p.loc->i32();
    a.n = n;
    a.k = k;
    a.n_blocks = n_blocks;
    a.staging_base = p.staging_base;
    a.rows_per_pass = p.rows_per_pass;
    a.weight = p.weight;
    a.device_slots = p.device_slots->i32();
    a.fetch = p.fetch->i32();
    a.hits = p.block_hits->i32();
    MEGACTX_CUDA_CHECK(launch_kv_resolve(a, stream_));
    after_op("kv_resolve");
}

void CudaOps::kv_split_slots(const Tensor& slots, const Tensor& loc, Tensor& device, Tensor& host) {
    const int64_t n = slots.numel();
    MEGACTX_CHECK(device.numel() == n && host.numel() == n, "kv_split_slots: {} slots into {} and {} values", n,
                  device.numel(), host.numel());
    MEGACTX_CUDA_CHECK(
        launch_kv_split_slots(slots.i32(), loc.i32(), n, loc.numel(), device.i32(), host.i32(), stream_));
    after_op("kv_split_slots");
}

void CudaOps::stall_stamp(bool begin) {
    if (stall_clock_ == nullptr) return;  // no host tier
    MEGACTX_CUDA_CHECK(begin ? launch_stall_begin(stall_clock_, stream_)
                             : launch_stall_end(stall_clock_, stall_host_, stream_));
}

int64_t CudaOps::kv_fetch_stall_ns() {
    if (stall_host_ == nullptr) return 0;
    return static_cast<int64_t>(*static_cast<volatile uint64_t*>(stall_host_));
}

void CudaOps::kv_fetch_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
    const int64_t rb = fetch_row_bytes(src, rows, dst), m = rows.numel();
    stall_stamp(true);  // on the compute stream: all of it is stall
    MEGACTX_CUDA_CHECK(launch_kv_fetch_rows(dst.data, src.data, rows.i32(), m, src.dim(0), rb, stream_));
    stall_stamp(false);
    after_op("kv_fetch_rows");
}

int64_t CudaOps::kv_fetch_rows_async(const Tensor& src, const Tensor& rows, Tensor& dst) {
    const int64_t rb = fetch_row_bytes(src, rows, dst), m = rows.numel();
    constexpr size_t kRing = 512;
    if (copy_stream_ == nullptr) {
        MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
        MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        fetched_.resize(kRing);
        for (cudaEvent_t& e : fetched_) MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    const int64_t ticket = n_fetches_++;
    cudaEvent_t done = fetched_[static_cast<size_t>(ticket) % kRing];
    // MEGACTX_TIER_OVERLAP=0 gathers on the main stream instead, to measure what the overlap hides.
    cudaStream_t s = tier_overlap_ ? copy_stream_ : stream_;
    if (tier_overlap_) {
        MEGACTX_CUDA_CHECK(cudaEventRecord(fork_, stream_));
        MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, fork_, 0));
    }
    if (!tier_overlap_) stall_stamp(true);
    MEGACTX_CUDA_CHECK(launch_kv_fetch_rows(dst.data, src.data, rows.i32(), m, src.dim(0), rb, s,
                                            tier_overlap_ ? tier_fetch_blocks_ : 0));
    if (!tier_overlap_) stall_stamp(false);
    MEGACTX_CUDA_CHECK(cudaEventRecord(done, s));
    return ticket;
}

void CudaOps::kv_fetch_wait(int64_t ticket) {
    MEGACTX_CHECK(ticket >= 0 && ticket < n_fetches_ && n_fetches_ - ticket <= static_cast<int64_t>(fetched_.size()),
                  "kv_fetch_wait: ticket {} is not a recent kv_fetch_rows_async", ticket);
    stall_stamp(true);
    MEGACTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, fetched_[static_cast<size_t>(ticket) % fetched_.size()], 0));
    stall_stamp(false);
    after_op("kv_fetch_rows_async");
}

void CudaOps::copy_blocks(const std::vector<BlockCopy>& copies) {
    if (copies.empty()) return;
    bind_thread();
    MEGACTX_CHECK(recording_ == nullptr, "copy_blocks: KV blocks move between steps, not inside a recorded graph");
    // The copy list goes up from a pinned ring slot, so the upload is asynchronous and the host does not wait for
    // the device: a slot is written again only after the event of its last upload (a step or more ago) has fired.
    CopyListSlot& slot = copy_lists_[n_copy_lists_++ % copy_lists_.size()];
    if (slot.uploaded == nullptr)
        MEGACTX_CUDA_CHECK(cudaEventCreateWithFlags(&slot.uploaded, cudaEventDisableTiming));
    else
        MEGACTX_CUDA_CHECK(cudaEventSynchronize(slot.uploaded));
    if (slot.capacity < copies.size()) {
        if (slot.list != nullptr) MEGACTX_CUDA_CHECK(cudaFreeHost(slot.list));
        slot.capacity = std::max<size_t>(copies.size(), 2 * slot.capacity);
        void* p = nullptr;
        MEGACTX_CUDA_CHECK(cudaHostAlloc(&p, slot.capacity * sizeof(DeviceBlockCopy), cudaHostAllocDefault));
        slot.list = static_cast<DeviceBlockCopy*>(p);
    }
    int64_t max_bytes = 0;
    bool vec16 = true;
    for (size_t i = 0; i < copies.size(); ++i) {
        const BlockCopy& c = copies[i];
        slot.list[i] = {c.src, c.dst, c.bytes};
        max_bytes = std::max(max_bytes, c.bytes);
        vec16 = vec16 && reinterpret_cast<uintptr_t>(c.src) % 16 == 0 && reinterpret_cast<uintptr_t>(c.dst) % 16 == 0 &&
                c.bytes % 16 == 0;
    }
    const size_t bytes = copies.size() * sizeof(DeviceBlockCopy);
    // The device table is released in stream order: whatever reuses it runs on stream_ after the copy kernel.
    Tensor table = alloc(DType::F8_E4M3, {static_cast<int64_t>(bytes)});
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(table.data, slot.list, bytes, cudaMemcpyHostToDevice, stream_));
    MEGACTX_CUDA_CHECK(cudaEventRecord(slot.uploaded, stream_));
    MEGACTX_CUDA_CHECK(launch_copy_blocks(static_cast<const DeviceBlockCopy*>(table.data),
                                          static_cast<int64_t>(copies.size()), max_bytes, vec16, stream_));
    after_op("copy_blocks");
}

Tensor CudaOps::alloc_host(DType dtype, std::vector<int64_t> shape) {
    bind_thread();
    size_t bytes = 0;
    Tensor t = unbacked(dtype, std::move(shape), &bytes);
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    MEGACTX_CHECK(e == cudaSuccess, "host KV tier: cannot pin {:.2f} GiB of host memory ({})",
                  static_cast<double>(bytes) / (1 << 30), cudaGetErrorString(e));
    void* dev = nullptr;
    MEGACTX_CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
    MEGACTX_CHECK(dev == p, "host KV tier: the device sees pinned memory at another address (no unified addressing)");
    if (stall_clock_ == nullptr && tier_stall_) {
        MEGACTX_CUDA_CHECK(cudaMalloc(&stall_clock_, 2 * sizeof(uint64_t)));
        MEGACTX_CUDA_CHECK(cudaMemsetAsync(stall_clock_, 0, 2 * sizeof(uint64_t), stream_));
        MEGACTX_CUDA_CHECK(cudaHostAlloc(&stall_host_, sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable));
        *stall_host_ = 0;
    }
    t.storage = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    t.data = p;
    return t;
}

void CudaOps::argmax_rows(const Tensor& x, Tensor& out) {
    MEGACTX_CHECK(out.numel() == rows_of(x), "argmax_rows: {} rows into {} values", rows_of(x), out.numel());
    MEGACTX_CUDA_CHECK(launch_argmax_rows(out.i32(), x.f32(), rows_of(x), x.shape.back(), stream_));
    after_op("argmax_rows");
}

void CudaOps::mask_rows(Tensor& x, const Tensor& rows, const Tensor& bits) {
    const int64_t m = rows.numel();
    MEGACTX_CHECK(bits.shape.size() == 2 && bits.dim(0) == m, "mask_rows: {} rows and {} masks", m,
                  bits.shape.empty() ? 0 : bits.dim(0));
    MEGACTX_CUDA_CHECK(launch_mask_rows(x.f32(), rows_of(x), x.shape.back(), rows.i32(),
                                        reinterpret_cast<const uint32_t*>(bits.i32()), m, bits.dim(1), stream_));
    after_op("mask_rows");
}

void CudaOps::add(Tensor& y, const Tensor& x) {
    MEGACTX_CUDA_CHECK(launch_add(y.f32(), x.f32(), y.numel(), stream_));
    after_op("add");
}

void CudaOps::slice_cols(const Tensor& x, int64_t c0, Tensor& out) {
    const int64_t d = x.shape.back(), d_out = out.shape.back();
    MEGACTX_CUDA_CHECK(launch_copy_2d(out.f32(), d_out, x.f32() + c0, d, rows_of(x), d_out, stream_));
    after_op("slice_cols");
}

void CudaOps::concat_cols(const Tensor& a, const Tensor& b, Tensor& out) {
    const int64_t n = rows_of(a), da = a.shape.back(), db = b.shape.back();
    MEGACTX_CUDA_CHECK(launch_copy_2d(out.f32(), da + db, a.f32(), da, n, da, stream_));
    MEGACTX_CUDA_CHECK(launch_copy_2d(out.f32() + da, da + db, b.f32(), db, n, db, stream_));
    after_op("concat_cols");
}

}  // namespace cuda

std::unique_ptr<Ops> make_cuda_ops(const CudaOptions& options) { return std::make_unique<cuda::CudaOps>(options); }

CudaMemoryStats cuda_memory_stats(const Ops& ops) {
    const auto* c = dynamic_cast<const cuda::CudaOps*>(&ops);
    MEGACTX_CHECK(c != nullptr, "cuda_memory_stats: not a CUDA backend");
    return c->memory_stats();
}

void cuda_sync_each_op(Ops& ops, bool on) {
    auto* c = dynamic_cast<cuda::CudaOps*>(&ops);
    MEGACTX_CHECK(c != nullptr, "cuda_sync_each_op: not a CUDA backend");
    c->set_sync_each_op(on);
}

}  // namespace megactx
