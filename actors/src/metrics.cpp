// The metrics registry (metrics.hpp) and the Prometheus text exposition format.
#include "llmesh/actors/metrics.hpp"

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace llmesh::actors {
namespace {

void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load();
  while (!a.compare_exchange_weak(cur, cur + v)) {
  }
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  for (int digits : {15, 16, 17}) {  // the shortest that reads back exactly: "0.1", not "0.10000000000000001"
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

/// {a="x",b="y"} with an optional extra label (le for buckets); empty when no labels.
std::string labels_text(const std::vector<std::string>& names, const label_values& values, const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (out.empty() ? "" : ",") + names[i] + "=\"" + escape_label(values[i]) + "\"";
  }
  if (!extra.empty()) out += (out.empty() ? "" : ",") + extra;
  return out.empty() ? "" : "{" + out + "}";
}

}  // namespace

void metrics_registry::counter::add(double v) {
  if (v > 0) atomic_add(value_, v);  // counters only go up
}

void metrics_registry::gauge::add(double v) { atomic_add(value_, v); }

void metrics_registry::histogram::observe(double v) {
  const size_t b = static_cast<size_t>(std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin());
  std::lock_guard lock(mu_);
  ++buckets_[b];
  sum_ += v;
  ++count_;
}

void metrics_registry::histogram::snapshot(std::vector<uint64_t>& cumulative, double& sum, uint64_t& count) const {
  std::lock_guard lock(mu_);
  cumulative.resize(buckets_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) cumulative[i] = acc += buckets_[i];
  sum = sum_;
  count = count_;
}

std::vector<double> metrics_registry::latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

void metrics_registry::declare(const std::string& name, kind k, const std::string& help,
                               std::vector<std::string> labels, std::vector<double> bounds) {
  std::lock_guard lock(mu_);
  if (families_.contains(name)) return;
  std::sort(bounds.begin(), bounds.end());
  families_.emplace(name, family{k, help, std::move(labels), std::move(bounds), {}, {}, {}});
}

void metrics_registry::declare_counter(const std::string& name, const std::string& help, std::vector<std::string> labels) {
  declare(name, kind::counter, help, std::move(labels), {});
}
void metrics_registry::declare_gauge(const std::string& name, const std::string& help, std::vector<std::string> labels) {
  declare(name, kind::gauge, help, std::move(labels), {});
}
void metrics_registry::declare_histogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                                         std::vector<std::string> labels) {
  declare(name, kind::histogram, help, std::move(labels), std::move(bounds));
}

metrics_registry::family* metrics_registry::find(const std::string& name, kind k, const label_values& values) {
  auto it = families_.find(name);
  if (it == families_.end() || it->second.k != k || it->second.labels.size() != values.size()) return nullptr;
  return &it->second;
}

template <class Series>
Series* metrics_registry::series(const std::string& name, kind k, const label_values& values,
                                 std::map<label_values, std::unique_ptr<Series>> family::*member,
                                 const std::vector<double>* (*bounds_of)(const family&)) {
  std::lock_guard lock(mu_);
  family* f = find(name, k, values);
  if (!f) return nullptr;
  auto& p = (f->*member)[values];
  if (!p) {
    if constexpr (std::is_same_v<Series, histogram>) p = std::make_unique<Series>(bounds_of(*f));
    else p = std::make_unique<Series>();
  }
  return p.get();
}

metrics_registry::counter* metrics_registry::get_counter(const std::string& name, const label_values& values) {
  return series(name, kind::counter, values, &family::counters, nullptr);
}

metrics_registry::gauge* metrics_registry::get_gauge(const std::string& name, const label_values& values) {
  return series(name, kind::gauge, values, &family::gauges, nullptr);
}

metrics_registry::histogram* metrics_registry::get_histogram(const std::string& name, const label_values& values) {
  return series(name, kind::histogram, values, &family::histograms, [](const family& f) { return &f.bounds; });
}

void metrics_registry::add_collector(std::function<void()> fn) {
  std::lock_guard lock(collectors_mu_);
  collectors_.push_back(std::move(fn));
}

std::string metrics_registry::render() const {
  {
    std::lock_guard collecting(collectors_mu_);
    for (const auto& fn : collectors_) fn();
  }
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.k == kind::counter ? "counter" : (f.k == kind::gauge ? "gauge" : "histogram");
    out += "# HELP " + name + " " + escape_help(f.help) + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& [values, c] : f.counters) out += name + labels_text(f.labels, values) + " " + number(c->value()) + "\n";
    for (const auto& [values, g] : f.gauges) out += name + labels_text(f.labels, values) + " " + number(g->value()) + "\n";
    for (const auto& [values, h] : f.histograms) {
      std::vector<uint64_t> cum;
      double sum = 0;
      uint64_t count = 0;
      h->snapshot(cum, sum, count);
      for (size_t i = 0; i < cum.size(); ++i) {
        const std::string le = i < f.bounds.size() ? number(f.bounds[i]) : "+Inf";
        out += name + "_bucket" + labels_text(f.labels, values, "le=\"" + le + "\"") + " " + std::to_string(cum[i]) + "\n";
      }
      out += name + "_sum" + labels_text(f.labels, values) + " " + number(sum) + "\n";
      out += name + "_count" + labels_text(f.labels, values) + " " + std::to_string(count) + "\n";
    }
  }
  return out;
}

}  // namespace llmesh::actors
