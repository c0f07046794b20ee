# Adds globaltimer stamps to a copy of src/backend/cuda/sparse_mla.cu, for bench/cuda/lab/sparse_mla_phases.cu
# (usage: bench/cuda/lab/sparse_mla_phases.sh). Thread 0 of each CTA writes the time of each phase to g_prof[cta][k]:
# 0 entry, 1 prepared Q landed, 2 the CTA barrier after Q, 3 first rows 0..31 landed, 4 first tile dequantised, 5
# first Q·Kᵀ done, 6 last P·V done, 7 partial staged, 8 stored; the combine kernel's CTAs write [1000 + cta][0..2]
# (entry, released by griddepcontrol.wait, done), the Q preparation's [3000 + cta][0..1] (entry, done). Anchors that no longer match are reported
# ("MISSING") or, for the optional ones, skipped: the source changes, so check the "patched N" count.
import sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
n0 = 0
def rep(a, b, required=True):
    global s, n0
    if a not in s:
        if required: print('MISSING:', a[:80]); sys.exit(1)
        return
    s = s.replace(a, b, 1); n0 += 1
pre = '''
__device__ unsigned long long* g_prof;  // [cta][16]
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define PROF(k) do { if (g_prof) g_prof[blockIdx.x * 16 + (k)] = gtime(); } while (0)
'''
rep('namespace {\n', 'namespace {\n' + pre)
rep('    const int32_t* tok_slots = p.slots + i * p.topk;\n', '    const int32_t* tok_slots = p.slots + i * p.topk;\n    if (threadIdx.x == 0) PROF(0);\n')
rep("    __syncthreads();                   // Q tile and barrier initialisation visible to all\n", "    __syncthreads();                   // Q tile and barrier initialisation visible to all\n    if (t == 0) PROF(2);\n")
rep('        mbar_wait(bar_q, 0);\n', '        mbar_wait(bar_q, 0);\n        if (t == 0) PROF(1);\n')
rep('                mbar_wait(bar_staged + 8 * buf, (it >> 1) & 1);  // rows 0..31 (rows 32..63 still land meanwhile)\n',
    '                mbar_wait(bar_staged + 8 * buf, (it >> 1) & 1);  // rows 0..31 (rows 32..63 still land meanwhile)\n                if (pt == 0 && it == 0) PROF(3);\n')
rep('                publish();\n                proxy_fence();\n                mbar_arrive(bar_ready + 8 * buf);\n', '                publish();\n                proxy_fence();\n                mbar_arrive(bar_ready + 8 * buf);\n                if (pt == 0 && it == 0) PROF(4);\n')
rep('                    wg_commit();\n                    wg_wait<0>();\n                    reg_fence(s);\n', '                    wg_commit();\n                    wg_wait<0>();\n                    reg_fence(s);\n                    if (t == 0 && it == 0) PROF(5);\n')
rep('                wg_commit();\n                wg_wait<0>();\n                reg_fence(o);\n            }\n', '                wg_commit();\n                wg_wait<0>();\n                reg_fence(o);\n                if (t == 0) PROF(6);\n            }\n')
rep('    named_sync(kBarEpilogue);\n    if (t < kHeads) {', '    named_sync(kBarEpilogue);\n    if (t == 0) PROF(7);\n    if (t < kHeads) {')
rep('                       smem_u32(reinterpret_cast<float*>(smem) + t * kOutStride), kW * 4);\n    }\n}', '                       smem_u32(reinterpret_cast<float*>(smem) + t * kOutStride), kW * 4);\n        if (t == 0) PROF(8);\n    }\n}')
rep('    asm volatile("griddepcontrol.wait;\\n" ::: "memory");               // launched early (PDL): wait for the partials',
    '    if (threadIdx.x == 0 && g_prof) g_prof[(1000 + blockIdx.x) * 16 + 0] = gtime();\n    asm volatile("griddepcontrol.wait;\\n" ::: "memory");\n    if (threadIdx.x == 0 && g_prof) g_prof[(1000 + blockIdx.x) * 16 + 1] = gtime();')
rep('    reinterpret_cast<float4*>(p.out + ih * kDv)[t] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);\n}',
    '    reinterpret_cast<float4*>(p.out + ih * kDv)[t] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);\n    if (threadIdx.x == 0 && g_prof) g_prof[(1000 + blockIdx.x) * 16 + 2] = gtime();\n}')
rep('    asm volatile("griddepcontrol.launch_dependents;\\n" ::: "memory");\n    const int lane = threadIdx.x & 31;\n',
    '    asm volatile("griddepcontrol.launch_dependents;\\n" ::: "memory");\n    if (threadIdx.x == 0 && g_prof) g_prof[(3000 + blockIdx.x) * 16 + 0] = gtime();\n    const int lane = threadIdx.x & 31;\n')
rep('    if (lane == 0) q_inv[row] = inv;\n}', '    if (lane == 0) q_inv[row] = inv;\n    if (threadIdx.x == 0 && g_prof) g_prof[(3000 + blockIdx.x) * 16 + 1] = gtime();\n}')
open(dst, 'w').write(s)
print('patched', n0)
