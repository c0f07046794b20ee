// Prometheus metrics (text exposition format 0.0.4) for /metrics: counters, gauges read at scrape time, and
// histograms with fixed buckets. Thread-safe; updates are a mutex-protected add.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace megactx {

class Metrics {
public:
    // name{labels} += v. `labels` is the rendered label set, e.g. `status="200"` (may be empty).
    void inc(const std::string& name, double v = 1.0, const std::string& labels = "");
    void observe(const std::string& name, double v);  // into a histogram declared with histogram()
    void histogram(const std::string& name, const std::string& help, std::vector<double> buckets);
    void counter(const std::string& name, const std::string& help);
    // A counter kept elsewhere (monotonic), read at scrape time.
    void counter(const std::string& name, const std::string& help, std::function<double()> read);
    void gauge(const std::string& name, const std::string& help, std::function<double()> read);
    std::string render() const;

private:
    struct Hist {
        std::string help;
        std::vector<double> buckets;
        std::vector<uint64_t> counts;  // per bucket (non-cumulative), plus +Inf at the end
        double sum = 0;
        uint64_t n = 0;
    };
    struct Counter {
        std::string help;
        std::map<std::string, double> values;  // by label set
        std::function<double()> read;          // set: the one value, read at scrape time
    };
    struct Gauge {
        std::string help;
        std::function<double()> read;
    };
    mutable std::mutex mu_;
    std::map<std::string, Counter> counters_;
    std::map<std::string, Hist> hists_;
    std::map<std::string, Gauge> gauges_;
};

}  // namespace megactx
