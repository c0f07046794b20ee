#include "backend/cpu/cpu_ops.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

namespace megactx {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

int64_t rows_of(const Tensor& t) { return t.numel() / t.shape.back(); }

// Below this many multiply-adds a parallel region costs more than it saves (and with more threads than
// free cores, far more): small ops run on the calling thread. Results are identical either way.
constexpr int64_t kParallelMinWork = 1 << 16;

void check_f32_cache(const Tensor& cache, const char* op) {
    MEGACTX_CHECK(cache.dtype == DType::F32,
                  "{}: the CPU backend supports only F32 KV caches (this one holds {}); use --kv-cache-dtype f32", op,
                  dtype_name(cache.dtype));
}

}  // namespace

Tensor CpuOps::alloc(DType dtype, std::vector<int64_t> shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(t.numel(), 1)) * dtype_size(dtype);
    // Large buffers (the KV pools) are 2 MiB aligned and asked to live on huge pages: sparse attention reads
    // rows scattered over the whole pool, and with 4 KiB pages nearly every row is also a TLB miss.
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t align = bytes >= kHuge ? kHuge : 64;
    const size_t aligned = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, aligned);
    MEGACTX_CHECK(p != nullptr, "out of host memory allocating {} bytes", aligned);
    if (align == kHuge) madvise(p, aligned, MADV_HUGEPAGE);  // advisory: ignored where unsupported
    t.storage = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    t.data = p;
    return t;
}

Tensor CpuOps::upload_i32(const std::vector<int32_t>& v) {
    Tensor t = alloc(DType::I32, {static_cast<int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.data, v.data(), v.size() * 4);
    return t;
}

void CpuOps::download(const Tensor& t, void* host) {
    std::memcpy(host, t.data, static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
}

void CpuOps::upload(const void* host, Tensor& t) {
    std::memcpy(t.data, host, static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
}

void CpuOps::zero(Tensor& t) { std::memset(t.data, 0, static_cast<size_t>(t.numel()) * dtype_size(t.dtype)); }

void CpuOps::embedding(const Tensor& tokens, const Weight& table, Tensor& out) {
    const int64_t n = tokens.numel();
    const int32_t* ids = tokens.i32();
    float* y = out.f32();
    for (int64_t i = 0; i < n; ++i) {
        MEGACTX_CHECK(ids[i] >= 0 && ids[i] < table.rows, "token id {} is out of range (vocabulary size {})", ids[i],
                      table.rows);
        table.row_f32(ids[i], y + i * table.cols);
    }
}

void CpuOps::rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor& y) {
    const int64_t d = x.shape.back(), n = rows_of(x);
    const float* px = x.f32();
    float* py = y.f32();
#pragma omp parallel for schedule(static) if (n * d >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const float* xi = px + i * d;
        float* yi = py + i * d;
        const float ms = dot(xi, xi, d) / static_cast<float>(d);
        const float r = 1.0f / std::sqrt(ms + eps);
        for (int64_t j = 0; j < d; ++j) yi[j] = w[j] * (xi[j] * r);
    }
}

void CpuOps::add_rms_norm(Tensor& x, const Tensor& delta, const std::vector<float>& w, float eps, Tensor& y) {
    add(x, delta);
    rms_norm(x, w, eps, y);
}

void CpuOps::layer_norm(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, float eps,
                        Tensor& y) {
    const int64_t d = x.shape.back(), n = rows_of(x);
    const float* px = x.f32();
    float* py = y.f32();
#pragma omp parallel for schedule(static) if (n * d >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const float* xi = px + i * d;
        float* yi = py + i * d;
        float mean = 0.0f;
        for (int64_t j = 0; j < d; ++j) mean += xi[j];
        mean /= static_cast<float>(d);
        float var = 0.0f;
        for (int64_t j = 0; j < d; ++j) var += (xi[j] - mean) * (xi[j] - mean);
        var /= static_cast<float>(d);
        const float r = 1.0f / std::sqrt(var + eps);
        for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] - mean) * r * w[j] + b[j];
    }
}

void CpuOps::linear(const Tensor& x, const Weight& w, Tensor& y) {
    const int64_t n = rows_of(x), in = w.cols, out = w.rows;
    MEGACTX_CHECK(x.shape.back() == in, "linear {}: input has {} columns, weight expects {}", w.name, x.shape.back(),
                  in);
    const float* px = x.f32();
    float* py = y.f32();
    // Rows of W are dequantized once per call in tiles of kTile and reused across all tokens.
    constexpr int64_t kTile = 16;
    const int64_t n_tiles = (out + kTile - 1) / kTile;
#pragma omp parallel if (n * in * out >= kParallelMinWork)
    {
        std::vector<float> tile(static_cast<size_t>(kTile * in));
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tiles; ++t) {
            const int64_t r0 = t * kTile, nr = std::min(kTile, out - r0);
            w.rows_f32(r0, nr, tile.data());
            for (int64_t i = 0; i < n; ++i) {
                const float* xi = px + i * in;
                float* yi = py + i * out + r0;
                for (int64_t r = 0; r < nr; ++r) yi[r] = dot(xi, tile.data() + r * in, in);
            }
        }
    }
}

void CpuOps::rope(Tensor& x, int64_t offset, const Tensor& pos, const Rope& rope) {
    const int64_t n = x.dim(0), n_head = x.shape.size() == 3 ? x.dim(1) : 1, d_head = x.shape.back();
    const int64_t dim = rope.dim(), half = dim / 2;
    MEGACTX_CHECK(offset + dim <= d_head, "rope: dims [{}, {}) outside a head of {}", offset, offset + dim, d_head);
    const int32_t* p = pos.i32();
    float* px = x.f32();
    // Pair i: dims (2i, 2i+1) interleaved, (i, i + dim/2) half-split. cos and sin of the fp32 angle, then times
    // the scale, as transformers builds its cos/sin tables.
    const int64_t stride = rope.interleaved ? 2 : 1, partner = rope.interleaved ? 1 : half;
#pragma omp parallel for schedule(static) if (n * n_head * dim >= kParallelMinWork)
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < half; ++i) {
            const float angle = static_cast<float>(p[t]) * rope.inv_freq[static_cast<size_t>(i)];
            const float c = std::cos(angle) * rope.scale, s = std::sin(angle) * rope.scale;
            for (int64_t h = 0; h < n_head; ++h) {
                float* v = px + (t * n_head + h) * d_head + offset + stride * i;
                const float x0 = v[0], x1 = v[partner];
                v[0] = x0 * c - x1 * s;
                v[partner] = x1 * c + x0 * s;
            }
        }
    }
}

void CpuOps::cache_write(const Tensor& rows, const Tensor& slots, Tensor& cache) {
    check_f32_cache(cache, "cache_write");
    const int64_t d = rows.shape.back(), n = rows_of(rows), n_slots = cache.dim(0);
    const int32_t* s = slots.i32();
    for (int64_t i = 0; i < n; ++i) {
        if (s[i] == -1) continue;
        MEGACTX_CHECK(s[i] >= 0 && s[i] < n_slots, "cache_write: slot {} outside the cache ({} slots)", s[i], n_slots);
        std::memcpy(cache.f32() + s[i] * d, rows.f32() + i * d, static_cast<size_t>(d) * 4);
    }
}

// Composed from the unfused ops so the CPU results stay bit-identical to the unfused sequence.
void CpuOps::latent_cache_write(const Tensor& kv_a, const std::vector<float>& norm_w, float eps, const Tensor& pos,
                                const Rope& rope_p, const Tensor& slots, Tensor& cache) {
    check_f32_cache(cache, "latent_cache_write");
    const int64_t n = kv_a.dim(0), r = static_cast<int64_t>(norm_w.size()), d_rope = kv_a.shape.back() - r;
    Tensor c_raw = alloc(DType::F32, {n, r});  // [n, r]
    slice_cols(kv_a, 0, c_raw);
    Tensor c_kv = alloc(DType::F32, {n, r});  // [n, r]
    rms_norm(c_raw, norm_w, eps, c_kv);
    Tensor k_pe = alloc(DType::F32, {n, 1, d_rope});  // [n, 1, d_rope]
    slice_cols(kv_a, r, k_pe);
    MEGACTX_CHECK(rope_p.dim() == d_rope, "latent_cache_write: RoPE over {} dims for a {}-dim k_pe", rope_p.dim(),
                  d_rope);
    rope(k_pe, 0, pos, rope_p);
    Tensor row = alloc(DType::F32, {n, r + d_rope});  // [n, r + d_rope]
    concat_cols(c_kv, k_pe, row);
    cache_write(row, slots, cache);
}

void CpuOps::indexer_cache_write(const Tensor& k_raw, const std::vector<float>& ln_w, const std::vector<float>& ln_b,
                                 float eps, const Tensor& pos, const Rope& rope_p, const Tensor& slots, Tensor& cache,
                                 bool /*hadamard: an F32 cache stores the key unrotated*/) {
    check_f32_cache(cache, "indexer_cache_write");
    const int64_t n = k_raw.dim(0), d = k_raw.shape.back();
    Tensor k = alloc(DType::F32, {n, 1, d});  // [n, 1, d_indexer]
    layer_norm(k_raw, ln_w, ln_b, eps, k);
    rope(k, 0, pos, rope_p);
    cache_write(k, slots, cache);
}

void topk_indices(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& out) {
    out.resize(static_cast<size_t>(n));
    std::iota(out.begin(), out.end(), 0);
    if (k < n) {
        std::nth_element(out.begin(), out.begin() + k, out.end(), [&](int32_t a, int32_t b) {
            return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
        });
        out.resize(static_cast<size_t>(k));
    }
    std::sort(out.begin(), out.end());
}

void CpuOps::indexer_topk(const IndexerTopkParams& p) {
    check_f32_cache(*p.keys, "indexer_topk");
    const int64_t n = p.q->dim(0), n_head = p.q->dim(1), d = p.q->dim(2), topk = p.topk;
    const float* q = p.q->f32();
    const float* w = p.weights->f32();
    const float* keys = p.keys->f32();
    int32_t* out = p.out_slots->i32();
    const CacheMap& m = p.map;
    auto slot_of = [&](int32_t seq, int64_t t) {
        const int32_t* table = m.tables + m.table_offset[seq];
        return static_cast<int64_t>(table[t / m.block_size]) * m.block_size + t % m.block_size;
    };
    // Queries are processed in tiles of consecutive tokens of one sequence, so each cached key is read once
    // per tile instead of once per query. Scratch is tile × context scores per thread, never n × context.
    constexpr int64_t kQueryTile = 16;
    std::vector<std::pair<int64_t, int64_t>> tiles;  // [begin, end) token ranges
    for (int64_t i = 0; i < n;) {
        int64_t j = i + 1;
        while (j < n && j - i < kQueryTile && m.seq[j] == m.seq[i]) ++j;
        tiles.push_back({i, j});
        i = j;
    }
    // score(i, t) = Σ_h (w_h · head_scale) · ReLU((Σ_c q_h[c] · k_t[c]) · softmax_scale): the inner sum runs
    // over c in order for every (query, head) lane, vectorised across the lanes of a tile (queries × heads,
    // transposed to [d][lanes]), so a score does not depend on the tile it was computed in.
    auto run_tile = [&](int64_t i0, int64_t i1, std::vector<float>& scores, std::vector<int32_t>& chosen,
                        bool parallel_inner) {
        const int32_t seq = m.seq[i0];
        const int64_t n_lane = (i1 - i0) * n_head;
        int64_t n_cand = 0;
        for (int64_t i = i0; i < i1; ++i) n_cand = std::max<int64_t>(n_cand, m.pos[i] + 1);
        scores.resize(static_cast<size_t>((i1 - i0) * n_cand));
        std::vector<float> qt(static_cast<size_t>(d * n_lane)), gate(static_cast<size_t>(n_lane));
        for (int64_t l = 0; l < n_lane; ++l) {
            const float* ql = q + (i0 * n_head + l) * d;
            for (int64_t c = 0; c < d; ++c) qt[c * n_lane + l] = ql[c];
            gate[l] = w[i0 * n_head + l] * p.head_scale;
        }
        // Blocks of the sequence in order; within a block the slots (and keys) are contiguous.
        const int32_t* table = m.tables + m.table_offset[seq];
        const int64_t n_blk = (n_cand + m.block_size - 1) / m.block_size;
#pragma omp parallel for schedule(static) if (parallel_inner && n_cand * n_lane * d >= kParallelMinWork)
        for (int64_t b = 0; b < n_blk; ++b) {
            std::vector<float> acc(static_cast<size_t>(n_lane));
            const float* kb = keys + static_cast<int64_t>(table[b]) * m.block_size * d;
            const int64_t t0 = b * m.block_size, t1 = std::min(n_cand, t0 + m.block_size);
            for (int64_t t = t0; t < t1; ++t) {
                const float* k = kb + (t - t0) * d;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int64_t c = 0; c < d; ++c) {
                    const float kc = k[c];
                    const float* qc = qt.data() + c * n_lane;
#pragma omp simd
                    for (int64_t l = 0; l < n_lane; ++l) acc[l] += qc[l] * kc;
                }
                for (int64_t i = i0; i < i1; ++i) {
                    if (t > m.pos[i]) continue;
                    float sc = 0.0f;
                    for (int64_t h = 0; h < n_head; ++h) {
                        const int64_t l = (i - i0) * n_head + h;
                        sc += gate[l] * std::max(acc[l] * p.softmax_scale, 0.0f);
                    }
                    scores[static_cast<size_t>((i - i0) * n_cand + t)] = sc;
                }
            }
        }
        if (p.reduce_scores) p.reduce_scores(scores.data(), static_cast<int64_t>(scores.size()));
        for (int64_t i = i0; i < i1; ++i) {
            topk_indices(scores.data() + (i - i0) * n_cand, static_cast<int64_t>(m.pos[i]) + 1, topk, chosen);
            int32_t* oi = out + i * topk;
            for (int64_t j = 0; j < topk; ++j) {
                oi[j] = j < static_cast<int64_t>(chosen.size()) ? static_cast<int32_t>(slot_of(seq, chosen[j])) : -1;
            }
        }
    };
    const auto n_tiles = static_cast<int64_t>(tiles.size());
    // With reduce_scores the tiles run in order (every rank makes the same collective calls in the same order).
    if (n_tiles >= omp_get_max_threads() && !p.reduce_scores) {
#pragma omp parallel if (n * (m.pos[n - 1] + 1) * n_head * d >= kParallelMinWork)
        {
            std::vector<float> scores;
            std::vector<int32_t> chosen;
#pragma omp for schedule(dynamic, 1)
            for (int64_t k = 0; k < n_tiles; ++k) run_tile(tiles[k].first, tiles[k].second, scores, chosen, false);
        }
    } else {
        std::vector<float> scores;
        std::vector<int32_t> chosen;
        for (const auto& [i0, i1] : tiles) run_tile(i0, i1, scores, chosen, true);
    }
}

void CpuOps::mla_absorb_q(const Tensor& q, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& q_out) {
    const int64_t n = q.dim(0), n_head = q.dim(1), d_qk = q.dim(2), r = kv_b.cols, d_out = q_out.dim(2);
    const float* pq = q.f32();
    float* po = q_out.f32();
#pragma omp parallel if (n * n_head * d_nope * r >= kParallelMinWork)
    {
        std::vector<float> w_uk(static_cast<size_t>(d_nope * r));
#pragma omp for schedule(static)
        for (int64_t h = 0; h < n_head; ++h) {
            kv_b.rows_f32(h * (d_nope + d_v), d_nope, w_uk.data());  // W_UK_h [d_nope, r]
            for (int64_t i = 0; i < n; ++i) {
                const float* qn = pq + (i * n_head + h) * d_qk;
                float* o = po + (i * n_head + h) * d_out;
                std::fill(o, o + r, 0.0f);
                for (int64_t k = 0; k < d_nope; ++k) {
                    const float qk = qn[k];
                    const float* wk = w_uk.data() + k * r;
#pragma omp simd
                    for (int64_t c = 0; c < r; ++c) o[c] += qk * wk[c];
                }
                // The RoPE part of the query is carried over unchanged: q_out = [q_abs | q_pe].
                std::memcpy(o + r, qn + d_nope, static_cast<size_t>(d_qk - d_nope) * 4);
            }
        }
    }
}

void CpuOps::sparse_mla(const SparseMlaParams& p) {
    check_f32_cache(*p.cache, "sparse_mla");
    const int64_t n = p.q->dim(0), n_head = p.q->dim(1), d = p.q->dim(2), topk = p.slots->dim(1), d_v = p.d_v;
    const float* q = p.q->f32();
    const float* cache = p.cache->f32();
    const int32_t* slots = p.slots->i32();
    float* out = p.out->f32();
#pragma omp parallel if (n * n_head * topk * d >= kParallelMinWork)
    {
        std::vector<float> prob(static_cast<size_t>(topk));
#pragma omp for collapse(2) schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t h = 0; h < n_head; ++h) {
                const float* qh = q + (i * n_head + h) * d;
                const int32_t* si = slots + i * topk;
                float mx = -std::numeric_limits<float>::infinity();
                // The selected rows are scattered over the whole cache, so at long context every one is a
                // cache miss: prefetch a few rows ahead to overlap the misses instead of paying them in turn.
                constexpr int64_t kAhead = 8;
                auto prefetch_row = [&](int64_t j) {
                    if (j >= topk || si[j] < 0) return;
                    const char* row = reinterpret_cast<const char*>(cache + static_cast<int64_t>(si[j]) * d);
                    for (int64_t b = 0; b < d * 4; b += 64) __builtin_prefetch(row + b);
                };
                for (int64_t j = 0; j < kAhead; ++j) prefetch_row(j);
                for (int64_t j = 0; j < topk; ++j) {
                    prefetch_row(j + kAhead);
                    if (si[j] < 0) continue;
                    prob[j] = dot(qh, cache + static_cast<int64_t>(si[j]) * d, d) * p.scale;
                    mx = std::max(mx, prob[j]);
                }
                float sum = 0.0f;
                for (int64_t j = 0; j < topk; ++j) {
                    if (si[j] < 0) continue;
                    prob[j] = std::exp(prob[j] - mx);
                    sum += prob[j];
                }
                float* o = out + (i * n_head + h) * d_v;
                std::fill(o, o + d_v, 0.0f);
                for (int64_t j = 0; j < topk; ++j) {
                    if (si[j] < 0) continue;
                    const float pj = prob[j] / sum;
                    const float* v = cache + static_cast<int64_t>(si[j]) * d;
#pragma omp simd
                    for (int64_t c = 0; c < d_v; ++c) o[c] += pj * v[c];
                }
            }
        }
    }
}

void CpuOps::mla_expand_v(const Tensor& lat, const Weight& kv_b, int64_t d_nope, int64_t d_v, Tensor& out) {
    const int64_t n = lat.dim(0), n_head = lat.dim(1), r = lat.dim(2);
    const float* pl = lat.f32();
    float* po = out.f32();
#pragma omp parallel if (n * n_head * d_v * r >= kParallelMinWork)
    {
        std::vector<float> w_uv(static_cast<size_t>(d_v * r));
#pragma omp for schedule(static)
        for (int64_t h = 0; h < n_head; ++h) {
            kv_b.rows_f32(h * (d_nope + d_v) + d_nope, d_v, w_uv.data());  // W_UV_h [d_v, r]
            for (int64_t i = 0; i < n; ++i) {
                const float* l = pl + (i * n_head + h) * r;
                float* o = po + i * n_head * d_v + h * d_v;
                for (int64_t j = 0; j < d_v; ++j) o[j] = dot(l, w_uv.data() + j * r, r);
            }
        }
    }
}

void CpuOps::swiglu_mlp(const Tensor& x, const MlpWeights& w, Tensor& y) {
    const int64_t n = rows_of(x), d_ff = w.gate.rows;
    Tensor g = alloc(DType::F32, {n, d_ff});
    Tensor u = alloc(DType::F32, {n, d_ff});
    linear(x, w.gate, g);
    linear(x, w.up, u);
    float* pg = g.f32();
    const float* pu = u.f32();
    for (int64_t i = 0; i < n * d_ff; ++i) pg[i] = silu(pg[i]) * pu[i];
    linear(g, w.down, y);
}

void CpuOps::moe_route(const Tensor& x, const Weight& gate, const std::vector<float>& bias, const MoeRouteParams& p,
                       Tensor& ids, Tensor& weights) {
    const int64_t n = rows_of(x), n_exp = gate.rows, k = p.top_k;
    Tensor logits = alloc(DType::F32, {n, n_exp});
    linear(x, gate, logits);  // router GEMM in fp32
    const float* pl = logits.f32();
    int32_t* pid = ids.i32();
    float* pw = weights.f32();
    const int64_t per_group = n_exp / p.n_group;
    for (int64_t i = 0; i < n; ++i) {
        std::vector<float> s(static_cast<size_t>(n_exp)), choice(static_cast<size_t>(n_exp));
        for (int64_t e = 0; e < n_exp; ++e) {
            s[e] = sigmoid(pl[i * n_exp + e]);
            choice[e] = s[e] + bias[e];
        }
        if (p.n_group > 1) {
            // Group score = sum of the group's two best choice scores; keep topk_group groups.
            std::vector<float> group_score(static_cast<size_t>(p.n_group));
            for (int64_t g = 0; g < p.n_group; ++g) {
                std::vector<float> v(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
                std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
                group_score[g] = v[0] + v[1];
            }
            std::vector<int32_t> keep;
            topk_indices(group_score.data(), p.n_group, p.topk_group, keep);
            std::vector<bool> kept(static_cast<size_t>(p.n_group), false);
            for (int32_t g : keep) kept[g] = true;
            for (int64_t e = 0; e < n_exp; ++e) {
                if (!kept[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
            }
        }
        // Top-k by choice score (descending, ties to the lower expert id), in that order.
        std::vector<int32_t> order(static_cast<size_t>(n_exp));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
            return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
        });
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += s[order[j]];
        for (int64_t j = 0; j < k; ++j) {
            float wj = s[order[j]];
            if (p.norm_topk_prob) wj /= (sum + 1e-20f);
            pid[i * k + j] = order[j];
            pw[i * k + j] = wj * p.routed_scaling_factor;
        }
    }
}

void CpuOps::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                         const std::vector<MlpWeights>& experts, Tensor& y) {
    const int64_t n = rows_of(x), d = x.shape.back(), k = ids.dim(1);
    const int32_t* pid = ids.i32();
    const float* pw = weights.f32();
    // Per-(token, k) outputs, summed per token in k order afterwards: the result for a token does not
    // depend on which other tokens share the batch.
    std::vector<float> partial(static_cast<size_t>(n * k * d), 0.0f);
    std::vector<std::vector<int64_t>> assigned(experts.size());  // entries i * k + j
    for (int64_t i = 0; i < n * k; ++i) assigned[static_cast<size_t>(pid[i])].push_back(i);
    for (size_t e = 0; e < experts.size(); ++e) {
        const auto& rows = assigned[e];
        if (rows.empty() || experts[e].gate.empty()) continue;  // empty: held by another rank (contributes 0)
        const int64_t m = static_cast<int64_t>(rows.size());
        Tensor xe = alloc(DType::F32, {m, d});
        Tensor ye = alloc(DType::F32, {m, d});
        for (int64_t r = 0; r < m; ++r) {
            std::memcpy(xe.f32() + r * d, x.f32() + (rows[r] / k) * d, static_cast<size_t>(d) * 4);
        }
        swiglu_mlp(xe, experts[e], ye);
        for (int64_t r = 0; r < m; ++r) {
            std::memcpy(partial.data() + rows[r] * d, ye.f32() + r * d, static_cast<size_t>(d) * 4);
        }
    }
    float* py = y.f32();
#pragma omp parallel for schedule(static) if (n * k * d >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        float* yi = py + i * d;
        std::fill(yi, yi + d, 0.0f);
        for (int64_t j = 0; j < k; ++j) {
            const float wj = pw[i * k + j];
            const float* src = partial.data() + (i * k + j) * d;
            for (int64_t c = 0; c < d; ++c) yi[c] += wj * src[c];
        }
    }
}

void CpuOps::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
    const int64_t d = x.shape.back(), m = rows.numel(), n = rows_of(x);
    MEGACTX_CHECK((x.dtype == DType::F32 || x.dtype == DType::I32) && out.dtype == x.dtype,
                  "gather_rows: F32 or I32 rows, the same for both, got {} and {}", dtype_name(x.dtype),
                  dtype_name(out.dtype));
    const auto* src = static_cast<const uint8_t*>(x.data);
    auto* dst = static_cast<uint8_t*>(out.data);
    for (int64_t j = 0; j < m; ++j) {
        const int32_t r = rows.i32()[j];
        MEGACTX_CHECK(r >= 0 && r < n, "gather_rows: row {} outside [0, {})", r, n);
        std::memcpy(dst + j * d * 4, src + r * d * 4, static_cast<size_t>(d) * 4);
    }
}

namespace {

int64_t row_bytes(const Tensor& t) {
    return t.shape.size() < 2 ? static_cast<int64_t>(dtype_size(t.dtype))
                              : t.numel() / t.dim(0) * static_cast<int64_t>(dtype_size(t.dtype));
}

// Host frame of a tier location (< 0), or -1 for a device block.
int32_t host_block(int32_t loc) { return loc < 0 ? -(loc + 1) : -1; }

}  // namespace

void CpuOps::kv_resolve(const KvResolveParams& p) {
    const int64_t n = p.slots->dim(0), k = p.slots->dim(1), n_blocks = p.loc->numel(), R = p.rows_per_pass;
    MEGACTX_CHECK(
        R >= 1 && p.device_slots->numel() == n * k && p.fetch->numel() == n * k && p.block_hits->numel() == n_blocks,
        "kv_resolve: shapes do not match [{}, {}] slots over {} blocks", n, k, n_blocks);
    const int32_t* slots = p.slots->i32();
    const int32_t* loc = p.loc->i32();
    int32_t* dev = p.device_slots->i32();
    int32_t* fetch = p.fetch->i32();
    int32_t* hits = p.block_hits->i32();
    const auto bs = static_cast<int32_t>(kBlockSize);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < k; ++j) {
            const int64_t t = i * k + j;
            const int32_t s = slots[t];
            fetch[t] = -1;
            if (s < 0) {
                dev[t] = -1;
                continue;
            }
            const int32_t b = s / bs;
            MEGACTX_CHECK(b < n_blocks, "kv_resolve: slot {} outside the {} blocks", s, n_blocks);
            hits[b] += p.weight;
            const int32_t h = host_block(loc[b]);
            if (h < 0) {
                dev[t] = loc[b] * bs + s % bs;
            } else {
                fetch[t] = h * bs + s % bs;
                dev[t] = static_cast<int32_t>(p.staging_base + (i % R) * k + j);
            }
        }
    }
}

void CpuOps::kv_split_slots(const Tensor& slots, const Tensor& loc, Tensor& device, Tensor& host) {
    const int64_t n = slots.numel(), n_blocks = loc.numel();
    const auto bs = static_cast<int32_t>(kBlockSize);
    for (int64_t i = 0; i < n; ++i) {
        const int32_t s = slots.i32()[i];
        device.i32()[i] = host.i32()[i] = -1;
        if (s < 0) continue;
        const int32_t b = s / bs;
        MEGACTX_CHECK(b < n_blocks, "kv_split_slots: slot {} outside the {} blocks", s, n_blocks);
        const int32_t l = loc.i32()[b], h = host_block(l);
        (h < 0 ? device.i32()[i] : host.i32()[i]) = (h < 0 ? l : h) * bs + s % bs;
    }
}

void CpuOps::kv_fetch_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
    const int64_t rb = row_bytes(dst), m = rows.numel(), n_src = src.dim(0);
    MEGACTX_CHECK(row_bytes(src) == rb && dst.dim(0) >= m, "kv_fetch_rows: {} rows of {} B into {} rows of {} B", m,
                  row_bytes(src), dst.dim(0), rb);
    const auto start = std::chrono::steady_clock::now();
    const auto* from = static_cast<const uint8_t*>(src.data);
    auto* to = static_cast<uint8_t*>(dst.data);
    for (int64_t t = 0; t < m; ++t) {
        const int32_t r = rows.i32()[t];
        if (r < 0) continue;
        MEGACTX_CHECK(r < n_src, "kv_fetch_rows: row {} outside [0, {})", r, n_src);
        std::memcpy(to + t * rb, from + r * rb, static_cast<size_t>(rb));
    }
    fetch_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

void CpuOps::copy_blocks(const std::vector<BlockCopy>& copies) {
    for (const BlockCopy& c : copies) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
}

void CpuOps::argmax_rows(const Tensor& x, Tensor& out) {
    const int64_t d = x.shape.back(), n = rows_of(x);
    MEGACTX_CHECK(out.numel() == n, "argmax_rows: {} rows into {} values", n, out.numel());
    const float* px = x.f32();
    for (int64_t i = 0; i < n; ++i) {
        const float* row = px + i * d;
        int64_t best = 0;
        for (int64_t c = 1; c < d; ++c)
            if (row[c] > row[best]) best = c;
        out.i32()[i] = static_cast<int32_t>(best);
    }
}

void CpuOps::mask_rows(Tensor& x, const Tensor& rows, const Tensor& bits) {
    const int64_t d = x.shape.back(), n = rows_of(x), m = rows.numel();
    MEGACTX_CHECK(bits.shape.size() == 2 && bits.dim(0) == m, "mask_rows: {} rows and {} masks", m,
                  bits.shape.empty() ? 0 : bits.dim(0));
    const int64_t w = bits.dim(1);
    for (int64_t j = 0; j < m; ++j) {
        const int32_t r = rows.i32()[j];
        MEGACTX_CHECK(r >= 0 && r < n, "mask_rows: row {} of {}", r, n);
        float* row = x.f32() + r * d;
        const auto* words = reinterpret_cast<const uint32_t*>(bits.i32() + j * w);
        for (int64_t c = 0; c < d; ++c)
            if (c >= 32 * w || ((words[c / 32] >> (c % 32)) & 1u) == 0)
                row[c] = -std::numeric_limits<float>::infinity();
    }
}

void CpuOps::add(Tensor& y, const Tensor& x) {
    float* py = y.f32();
    const float* px = x.f32();
    const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) py[i] += px[i];
}

void CpuOps::slice_cols(const Tensor& x, int64_t c0, Tensor& out) {
    const int64_t n = rows_of(x), d = x.shape.back(), d_out = out.shape.back();
    for (int64_t i = 0; i < n; ++i) {
        std::memcpy(out.f32() + i * d_out, x.f32() + i * d + c0, static_cast<size_t>(d_out) * 4);
    }
}

void CpuOps::concat_cols(const Tensor& a, const Tensor& b, Tensor& out) {
    const int64_t n = rows_of(a), da = a.shape.back(), db = b.shape.back();
    for (int64_t i = 0; i < n; ++i) {
        std::memcpy(out.f32() + i * (da + db), a.f32() + i * da, static_cast<size_t>(da) * 4);
        std::memcpy(out.f32() + i * (da + db) + da, b.f32() + i * db, static_cast<size_t>(db) * 4);
    }
}

}  // namespace megactx
