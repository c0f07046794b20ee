#include "engine/speculative.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace megactx {

namespace {

int32_t most_likely(const std::vector<float>& p) {
    return static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
}

}  // namespace

Verified verify_drafts(Sampler& sampler, const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
                       const std::vector<std::vector<float>>& p) {
    MEGACTX_CHECK(p.size() == drafts.size() + 1 && q.size() == drafts.size(),
                  "verify_drafts: {} drafts need {} target and {} draft distributions, got {} and {}", drafts.size(),
                  drafts.size() + 1, drafts.size(), p.size(), q.size());
    Verified v;
    for (size_t i = 0; i < drafts.size(); ++i) {
        const int32_t x = drafts[i];
        const std::vector<float>& pi = p[i];
        if (sampler.greedy()) {
            const int32_t best = most_likely(pi);
            v.tokens.push_back(best);
            if (best != x) return v;
        } else {
            const double px = pi[static_cast<size_t>(x)], qx = q[i][static_cast<size_t>(x)];
            // qx > 0: the draft was drawn from q. Accept with probability min(1, px / qx).
            if (qx > 0.0 && sampler.uniform() * qx < px) {
                v.tokens.push_back(x);
            } else {
                std::vector<float> rest(pi.size());
                double sum = 0.0;
                for (size_t t = 0; t < pi.size(); ++t) {
                    rest[t] = std::max(0.0f, pi[t] - q[i][t]);
                    sum += rest[t];
                }
                if (sum <= 0.0) {
                    rest = pi;  // p <= q everywhere means p == q: the draft would have been accepted; never here
                } else {
                    for (float& r : rest) r = static_cast<float>(r / sum);
                }
                v.tokens.push_back(sampler.draw(rest));
                return v;
            }
        }
        ++v.n_accepted;
    }
    const std::vector<float>& last = p.back();
    v.tokens.push_back(sampler.greedy() ? most_likely(last) : sampler.draw(last));
    return v;
}

Verified verify_greedy(const std::vector<int32_t>& drafts, const int32_t* best) {
    Verified v;
    for (size_t i = 0; i < drafts.size(); ++i) {
        v.tokens.push_back(best[i]);
        if (best[i] != drafts[i]) return v;
        ++v.n_accepted;
    }
    v.tokens.push_back(best[drafts.size()]);
    return v;
}

double acceptance_length(double alpha, int64_t k) {
    double sum = 0.0, term = 1.0;
    for (int64_t i = 0; i <= k; ++i, term *= alpha) sum += term;
    return sum;
}

ForcedAcceptance::ForcedAcceptance(double length, int64_t k, uint64_t seed) : state_(seed) {
    MEGACTX_CHECK(k >= 1, "a forced acceptance length needs speculative tokens (K >= 1), got K = {}", k);
    MEGACTX_CHECK(length >= 1.0 && length <= static_cast<double>(k + 1),
                  "forced acceptance length must be in [1, K + 1] = [1, {}] tokens per step, got {}", k + 1, length);
    // acceptance_length grows with alpha on [0, 1]: bisection to double precision.
    double lo = 0.0, hi = 1.0;
    for (int i = 0; i < 100; ++i) {
        const double mid = 0.5 * (lo + hi);
        (acceptance_length(mid, k) < length ? lo : hi) = mid;
    }
    alpha_ = 0.5 * (lo + hi);
}

int64_t ForcedAcceptance::draw(int64_t n_drafts) {
    int64_t n = 0;
    while (n < n_drafts) {
        // splitmix64, top 53 bits as a uniform in [0, 1)
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        if (static_cast<double>(z >> 11) * 0x1.0p-53 >= alpha_) break;
        ++n;
    }
    return n;
}

}  // namespace megactx

namespace megactx {

void SpecStats::record(int64_t n_drafts, int64_t n_accepted) {
    ++verifications;
    drafted += n_drafts;
    accepted += n_accepted;
    const auto grow = [](std::vector<int64_t>& v, int64_t n) {
        if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n), 0);
    };
    grow(drafted_at, n_drafts);
    grow(accepted_at, n_drafts);
    grow(accept_length, n_accepted + 1);
    for (int64_t i = 0; i < n_drafts; ++i) ++drafted_at[static_cast<size_t>(i)];
    for (int64_t i = 0; i < n_accepted; ++i) ++accepted_at[static_cast<size_t>(i)];
    ++accept_length[static_cast<size_t>(n_accepted)];
}

std::string SpecStats::summary() const {
    std::string at;
    for (size_t i = 0; i < drafted_at.size(); ++i)
        at += fmt::format(" {:.0f}%", 100.0 * static_cast<double>(accepted_at[i]) /
                                          static_cast<double>(std::max<int64_t>(drafted_at[i], 1)));
    return fmt::format("MTP drafts accepted {} of {}, mean acceptance length {:.2f} tokens per step, by draft position{}",
                       accepted, drafted, mean_acceptance_length(), at);
}

void SpecStats::add(const SpecStats& o) {
    verifications += o.verifications;
    drafted += o.drafted;
    accepted += o.accepted;
    const auto sum = [](std::vector<int64_t>& a, const std::vector<int64_t>& b) {
        if (a.size() < b.size()) a.resize(b.size(), 0);
        for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
    };
    sum(drafted_at, o.drafted_at);
    sum(accepted_at, o.accepted_at);
    sum(accept_length, o.accept_length);
}

}  // namespace megactx
