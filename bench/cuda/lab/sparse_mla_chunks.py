# Adds per-chunk clock64 stamps to a copy of src/backend/cuda/sparse_mla.cu, for bench/cuda/lab/sparse_mla_chunks.cu
# (usage: bench/cuda/lab/sparse_mla_chunks.sh). Stamps go to g_st[(cta · 32 + chunk) · 48 + slot]:
#   producer warp w (lane 0), slot 8w + k: 0 before the wait for rows 0..31, 1 after it, 2 rows 32..63 landed,
#     3 first halves dequantised (producer barrier), 4 tile published, 5 previous tile freed, 6 next chunk issued;
#   WG0 (thread 0), slot 32 + k: 0 before the wait for the tile, 1 tile ready, 2 Q·Kᵀ done, 3 P buffer free
#     (softmax done), 4 P·V done;  WG1 (thread 128), slot 40 + k: 0 P ready, 1 P·V done.
# An anchor that no longer matches the source stops the script with MISSING.
import sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
def rep(a, b):
    global s
    if a not in s:
        print('MISSING:', a[:100]); sys.exit(1)
    s = s.replace(a, b, 1)
pre = '''
__device__ long long* g_st;  // [cta][32 chunks][48]
#define ST(slot) do { if (g_st && it < 32) g_st[(static_cast<long long>(blockIdx.x) * 32 + it) * 48 + (slot)] = clock64(); } while (0)
'''
rep('namespace {\n', 'namespace {\n' + pre)
P = 'if (lane == 0) ST(8 * pw + %d);'
rep('                uint8_t* tile = smem + kK0 + buf * kTile;\n                mbar_wait(bar_staged + 8 * buf, (it >> 1) & 1);',
    '                uint8_t* tile = smem + kK0 + buf * kTile;\n' + P % 0 + 'mbar_wait(bar_staged + 8 * buf, (it >> 1) & 1);' + P % 1)
rep('mbar_wait(bar_staged + 16 + 8 * buf, (it >> 1) & 1);  // rows 32..63 and k_pe\n',
    'mbar_wait(bar_staged + 16 + 8 * buf, (it >> 1) & 1);\n' + P % 2 + '\n')
rep('                producer_sync();\n#pragma unroll\n                for (int j = 4; j < 8; ++j) {\n                    put(ra',
    '                producer_sync();\n' + P % 3 + '\n#pragma unroll\n                for (int j = 4; j < 8; ++j) {\n                    put(ra')
rep('                mbar_arrive(bar_ready + 8 * buf);\n', '                mbar_arrive(bar_ready + 8 * buf);\n' + P % 4 + '\n')
rep('                    if (it >= 1) mbar_wait(bar_free + 8 * (buf ^ 1), ((it - 1) >> 1) & 1);\n',
    '                    if (it >= 1) mbar_wait(bar_free + 8 * (buf ^ 1), ((it - 1) >> 1) & 1);\n' + P % 5 + '\n')
open(dst, 'w').write(s)
print('patched')
