#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace megactx {

void Metrics::counter(const std::string& name, const std::string& help) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_[name].help = help;
}

void Metrics::counter(const std::string& name, const std::string& help, std::function<double()> read) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_[name] = Counter{help, {}, std::move(read)};
}

void Metrics::inc(const std::string& name, double v, const std::string& labels) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_[name].values[labels] += v;
}

void Metrics::histogram(const std::string& name, const std::string& help, std::vector<double> buckets) {
    std::lock_guard<std::mutex> lock(mu_);
    Hist& h = hists_[name];
    h.help = help;
    std::sort(buckets.begin(), buckets.end());
    h.buckets = std::move(buckets);
    h.counts.assign(h.buckets.size() + 1, 0);
}

void Metrics::observe(const std::string& name, double v) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = hists_.find(name);
    if (it == hists_.end()) return;
    Hist& h = it->second;
    const size_t i = static_cast<size_t>(std::lower_bound(h.buckets.begin(), h.buckets.end(), v) - h.buckets.begin());
    ++h.counts[i];
    h.sum += v;
    ++h.n;
}

void Metrics::gauge(const std::string& name, const std::string& help, std::function<double()> read) {
    std::lock_guard<std::mutex> lock(mu_);
    gauges_[name] = Gauge{help, std::move(read)};
}

std::string Metrics::render() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& [name, c] : counters_) {
        out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, c.help, name);
        if (c.read) {
            out += fmt::format("{} {}\n", name, c.read());
            continue;
        }
        if (c.values.empty()) out += fmt::format("{} 0\n", name);
        for (const auto& [labels, v] : c.values) {
            out += labels.empty() ? fmt::format("{} {}\n", name, v) : fmt::format("{}{{{}}} {}\n", name, labels, v);
        }
    }
    for (const auto& [name, g] : gauges_) {
        out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, g.help, name, name, g.read());
    }
    for (const auto& [name, h] : hists_) {
        out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, h.help, name);
        uint64_t cum = 0;
        for (size_t i = 0; i < h.buckets.size(); ++i) {
            cum += h.counts[i];
            out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.buckets[i], cum);
        }
        cum += h.counts.back();
        out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, h.sum, name, h.n);
    }
    return out;
}

}  // namespace megactx
