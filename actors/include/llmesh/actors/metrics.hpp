// Prometheus metrics: counters, gauges and histograms in labelled families, rendered in the
// text exposition format (version 0.0.4) for GET /metrics. A plain, thread-safe class: the
// replica, router and gateway record into one registry per process; the gateway renders it.
// Names carry the `llmesh_` prefix (DESIGN.md §Metrics); label values are escaped.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace llmesh::actors {

/// Label values in the order of the family's label names.
using label_values = std::vector<std::string>;

/// Thread affinity: any thread; recording is lock-free after a series' first use.
class metrics_registry {
 public:
  class counter {
   public:
    void add(double v = 1.0);
    /// For collectors mirroring a monotonic total kept elsewhere (a transport's counts).
    void set_total(double v) { value_.store(v); }
    double value() const { return value_.load(); }

   private:
    std::atomic<double> value_{0.0};
  };
  class gauge {
   public:
    void set(double v) { value_.store(v); }
    void add(double v);
    double value() const { return value_.load(); }

   private:
    std::atomic<double> value_{0.0};
  };
  class histogram {
   public:
    explicit histogram(const std::vector<double>* bounds) : bounds_(bounds), buckets_(bounds->size() + 1) {}
    void observe(double v);
    /// Cumulative counts per bound (then +Inf), the sum and the count, read consistently.
    void snapshot(std::vector<uint64_t>& cumulative, double& sum, uint64_t& count) const;

   private:
    const std::vector<double>* bounds_;
    mutable std::mutex mu_;
    std::vector<uint64_t> buckets_;
    double sum_ = 0;
    uint64_t count_ = 0;
  };

  /// Declares a family (idempotent for the same name and kind). REQUIRES: a valid metric name.
  void declare_counter(const std::string& name, const std::string& help, std::vector<std::string> labels = {});
  void declare_gauge(const std::string& name, const std::string& help, std::vector<std::string> labels = {});
  void declare_histogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                         std::vector<std::string> labels = {});

  /// The series of a declared family with these label values (created on first use).
  /// Returns nullptr for an undeclared name, another kind, or the wrong number of values.
  counter* get_counter(const std::string& name, const label_values& values = {});
  gauge* get_gauge(const std::string& name, const label_values& values = {});
  histogram* get_histogram(const std::string& name, const label_values& values = {});

  /// Adds a function render() calls first, to copy values kept elsewhere into series (it must
  /// not call render() or add_collector()). It may run on any thread rendering.
  void add_collector(std::function<void()> fn);

  /// The whole registry in the Prometheus text format, families in name order.
  std::string render() const;

  /// Latency buckets in seconds, 1 ms to 60 s (TTFT, inter-token and end-to-end latency).
  static std::vector<double> latency_buckets();

 private:
  enum class kind { counter, gauge, histogram };
  struct family {
    kind k;
    std::string help;
    std::vector<std::string> labels;
    std::vector<double> bounds;
    std::map<label_values, std::unique_ptr<counter>> counters;
    std::map<label_values, std::unique_ptr<gauge>> gauges;
    std::map<label_values, std::unique_ptr<histogram>> histograms;
  };
  family* find(const std::string& name, kind k, const label_values& values);
  /// The series of family `name` in `member`, created on first use (histograms get the
  /// family's bounds from `bounds_of`).
  template <class Series>
  Series* series(const std::string& name, kind k, const label_values& values,
                 std::map<label_values, std::unique_ptr<Series>> family::*member,
                 const std::vector<double>* (*bounds_of)(const family&));
  void declare(const std::string& name, kind k, const std::string& help, std::vector<std::string> labels,
               std::vector<double> bounds);

  mutable std::mutex mu_;
  std::map<std::string, family> families_;
  mutable std::mutex collectors_mu_;  ///< held while collectors run: one render collects at a time
  std::vector<std::function<void()>> collectors_;
};

}  // namespace llmesh::actors
