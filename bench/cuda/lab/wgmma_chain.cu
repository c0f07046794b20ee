// Lab (not built by CMake): how fast chains of wgmma run on one SM, to choose a sparse MLA structure. Session 17's
// register-operand kernel averaged ~103 cycles per m64n64k16 across the SM with two consumer warpgroups, and the
// staged kernel's Q·Kᵀ runs its 36 chained m64n64k16 at ~52 cycles each: is that the accumulator chain's latency (then
// a second warpgroup's chain would fill the gaps) or the tensor pipe's rate (then smaller N only costs more)?
// Each case: one CTA per SM, W warpgroups (1 or 2) each running a chain of dependent wgmma (one accumulator) or the
// same count over 4 independent accumulators in turn, m64nNk16 f16 with A and B from shared memory (SS, 128-B swizzle,
// K-major, as sparse_mla's descriptors) or A from registers (RS, n64); clock64 around 50 rounds of the chain.
// Prints cycles per wgmma per warpgroup and for the SM (both warpgroups' wgmma together), and the ideal (N/2 cycles:
// 64·N·16 FMA at 2,048 FMA per cycle per SM). Build: bench/cuda/lab/wgmma_chain.sh; run on the GPU machine.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "../cuda_bench.cuh"

#define CK(x) MEGACTX_BENCH_CK(x)

__device__ __forceinline__ uint64_t desc(uint32_t addr) {  // K-major, 128-B swizzle, LBO 16, SBO 1024
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int R>
__device__ __forceinline__ void touch(float (&r)[R]) {
#pragma unroll
    for (int k = 0; k < R; ++k) asm volatile("" : "+f"(r[k])::"memory");
}

__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

constexpr int kRounds = 50;
constexpr int kSmem = 64 * 128 + 256 * 128 + 1024;  // A [64 × 64] f16, B [256 × 64] f16, alignment

template <int N>
__device__ __forceinline__ void mma(float (&d)[N / 2], uint64_t da, uint64_t db, const uint32_t (&afrag)[4], bool rs) {
    if constexpr (N == 32) wgmma_n32(d, da, db);
    if constexpr (N == 64) {
        if (rs)
            wgmma_rs_n64(d, afrag, db);
        else
            wgmma_n64(d, da, db);
    }
    if constexpr (N == 128) wgmma_n128(d, da, db);
    if constexpr (N == 256) wgmma_n256(d, da, db);
}

// ACC accumulators used in turn over a fully unrolled chain of CHAIN wgmma (the compiler must see every register:
// a runtime loop or index makes ptxas serialise the wgmma or inject waits, which is not what is measured).
template <int N, int CHAIN, int ACC, bool RS>
__global__ void __launch_bounds__(256, 1) chain_kernel(int n_wg, unsigned long long* cycles, float* sink) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
    for (int i = threadIdx.x; i < (64 + 256) * 64 / 2; i += blockDim.x)
        reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x03ff03ffu);  // f16 near 1
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int wgi = threadIdx.x / 128;
    if (wgi >= n_wg) return;
    const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(smem)), sbb = sa + 64 * 128;
    float acc[ACC][N / 2];
#pragma unroll
    for (int a = 0; a < ACC; ++a)
#pragma unroll
        for (int k = 0; k < N / 2; ++k) acc[a][k] = 0.f;
    const uint32_t afrag[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
    asm volatile("bar.sync %0, %1;\n" ::"r"(1), "r"(n_wg * 128) : "memory");  // the warpgroups start together
    const unsigned long long t0 = clock64();
#pragma unroll 1
    for (int r = 0; r < kRounds; ++r) {
#pragma unroll
        for (int a = 0; a < ACC; ++a) touch(acc[a]);
        wg_fence();
#pragma unroll
        for (int k = 0; k < CHAIN; ++k)
            mma<N>(acc[k % ACC], desc(sa + (k & 3) * 32), desc(sbb + (k & 3) * 32), afrag, RS);
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int a = 0; a < ACC; ++a) touch(acc[a]);
    }
    const unsigned long long t1 = clock64();
    if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wgi] = t1 - t0;
    float s = 0.f;
#pragma unroll
    for (int a = 0; a < ACC; ++a)
#pragma unroll
        for (int k = 0; k < N / 2; ++k) s += acc[a][k];
    if (s == 12345.f) sink[threadIdx.x] = s;  // keeps the products
}

template <int N, int CHAIN, int ACC, bool RS>
void run(int n_sm, unsigned long long* d_cycles, float* d_sink) {
    auto kern = chain_kernel<N, CHAIN, ACC, RS>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    for (int n_wg = 1; n_wg <= 2; ++n_wg) {
        kern<<<n_sm, 256, kSmem>>>(n_wg, d_cycles, d_sink);  // warm-up
        kern<<<n_sm, 256, kSmem>>>(n_wg, d_cycles, d_sink);
        CK(cudaDeviceSynchronize());
        static unsigned long long h[2 * 1024];
        CK(cudaMemcpy(h, d_cycles, sizeof(unsigned long long) * 2 * n_sm, cudaMemcpyDeviceToHost));
        double mean = 0;
        for (int b = 0; b < n_sm; ++b)
            for (int w = 0; w < n_wg; ++w) mean += static_cast<double>(h[2 * b + w]);
        mean /= n_sm * n_wg;
        const double per = mean / (kRounds * CHAIN);  // cycles per wgmma of one warpgroup
        std::printf("m64n%-3dk16 %s %d acc  WGs %d chain %2d: %7.1f cycles/wgmma per WG, %7.1f per SM (ideal %d)\n", N,
                    RS ? "RS" : "SS", ACC, n_wg, CHAIN, per, per / n_wg, N / 2);
    }
}

int main() {
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    unsigned long long* d_cycles;
    float* d_sink;
    CK(cudaMalloc(&d_cycles, sizeof(unsigned long long) * 2 * n_sm));
    CK(cudaMalloc(&d_sink, sizeof(float) * 256));
    run<32, 36, 1, false>(n_sm, d_cycles, d_sink);
    run<32, 36, 4, false>(n_sm, d_cycles, d_sink);
    run<32, 72, 1, false>(n_sm, d_cycles, d_sink);
    run<64, 4, 1, false>(n_sm, d_cycles, d_sink);
    run<64, 36, 1, false>(n_sm, d_cycles, d_sink);
    run<64, 36, 4, false>(n_sm, d_cycles, d_sink);
    run<64, 36, 1, true>(n_sm, d_cycles, d_sink);
    run<64, 16, 4, true>(n_sm, d_cycles, d_sink);
    run<128, 36, 1, false>(n_sm, d_cycles, d_sink);
    run<256, 4, 1, false>(n_sm, d_cycles, d_sink);
    run<256, 36, 1, false>(n_sm, d_cycles, d_sink);
    return 0;
}
