// Serving-benchmark records and metrics (serve_stats.hpp).
#include "llmesh/bench/serve_stats.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

namespace llmesh::bench {

void sse_recorder::feed(std::string_view bytes, double t) {
  // SSE allows CRLF line ends; JSON payloads never hold a raw CR, so dropping them is safe.
  for (char c : bytes) {
    if (c != '\r') pending_.push_back(c);
  }
  size_t start = 0;
  for (size_t end; (end = pending_.find("\n\n", start)) != std::string::npos; start = end + 2) {
    on_event(std::string_view(pending_).substr(start, end - start), t);
  }
  pending_.erase(0, start);
}

void sse_recorder::on_event(std::string_view event, double t) {
  std::string data;
  bool has_data = false;
  while (!event.empty()) {
    const size_t eol = std::min(event.find('\n'), event.size());
    std::string_view line = event.substr(0, eol);
    event.remove_prefix(std::min(eol + 1, event.size()));
    if (!line.starts_with("data:")) continue;  // comments (":ping"), event:, id:, retry:
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    if (has_data) data += '\n';
    data += line;
    has_data = true;
  }
  if (!has_data || done_) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const auto j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (rec_.error.empty()) rec_.error = "malformed SSE chunk: " + data.substr(0, 80);
    return;
  }
  if (auto e = j.find("error"); e != j.end()) {
    std::string msg = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                          ? (*e)["message"].get<std::string>()
                          : e->dump();
    if (rec_.error.empty()) rec_.error = "server error mid-stream: " + msg;
    return;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    if (!first_) {
      first_ = true;
      rec_.ttft = t;
    } else {
      rec_.itl.push_back(t - last_);
    }
    last_ = t;
    ++n_chunks_;
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto n = u->find("completion_tokens"); n != u->end() && n->is_number_integer()) {
      usage_tokens_ = n->get<long long>();
    }
  }
}

request_record sse_recorder::finish(size_t n_tokens_prompt) const {
  request_record r = rec_;
  r.n_tokens_prompt = n_tokens_prompt;
  r.e2e = last_;
  r.n_tokens_output = usage_tokens_ >= 0 ? static_cast<size_t>(usage_tokens_) : n_chunks_;
  if (r.error.empty() && !first_) r.error = "the stream ended without a chunk carrying choices";
  if (r.error.empty() && !done_) r.error = "the stream ended before [DONE]";
  r.ok = r.error.empty();
  return r;
}

double percentile(std::vector<double> values, double p) {
  assert(p >= 0 && p <= 100);
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + frac * (values[hi] - values[lo]);
}

latency_summary summarize_seconds(const std::vector<double>& seconds) {
  latency_summary s;
  if (seconds.empty()) return s;
  const double n = static_cast<double>(seconds.size());
  const double mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / n;
  double var = 0;
  for (double v : seconds) var += (v - mean) * (v - mean);
  s.mean_ms = mean * 1e3;
  s.std_ms = std::sqrt(var / n) * 1e3;
  s.median_ms = percentile(seconds, 50) * 1e3;
  s.p99_ms = percentile(seconds, 99) * 1e3;
  return s;
}

serve_metrics compute_serve_metrics(const std::vector<request_record>& records, double duration_s) {
  assert(duration_s > 0);
  serve_metrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const auto& r : records) {
    if (!r.ok) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.n_tokens_prompt;
    m.total_output_tokens += r.n_tokens_output;
    ttfts.push_back(r.ttft);
    e2els.push_back(r.e2e);
    if (r.n_tokens_output > 1) tpots.push_back((r.e2e - r.ttft) / static_cast<double>(r.n_tokens_output - 1));
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
  }
  m.duration_s = duration_s;
  m.request_throughput = static_cast<double>(m.completed) / duration_s;
  m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
  m.ttft = summarize_seconds(ttfts);
  m.tpot = summarize_seconds(tpots);
  m.itl = summarize_seconds(itls);
  m.e2el = summarize_seconds(e2els);
  return m;
}

namespace {

void line(std::string& out, const char* name, const std::string& value) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", name, value.c_str());
  out += buf;
}

std::string num(double v, int decimals = 2) {
  if (std::isinf(v)) return "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

/// "----Title----" centred in 50 columns, as vLLM's `"{s:{c}^{n}}".format(...)`.
void rule(std::string& out, const std::string& title, char fill) {
  const size_t width = 50;
  const size_t left = title.size() >= width ? 0 : (width - title.size()) / 2;
  const size_t right = title.size() >= width ? 0 : width - title.size() - left;
  out += std::string(left, fill) + title + std::string(right, fill) + "\n";
}

void latency_block(std::string& out, const std::string& title, const std::string& abbr, const latency_summary& s) {
  rule(out, title, '-');
  line(out, ("Mean " + abbr + " (ms):").c_str(), num(s.mean_ms));
  line(out, ("Median " + abbr + " (ms):").c_str(), num(s.median_ms));
  line(out, ("P99 " + abbr + " (ms):").c_str(), num(s.p99_ms));
}

}  // namespace

std::string format_serve_table(const serve_metrics& m, const serve_run_info& info) {
  std::string out;
  rule(out, " Serving Benchmark Result ", '=');
  line(out, "Model:", info.model);
  line(out, "Successful requests:", std::to_string(m.completed));
  line(out, "Failed requests:", std::to_string(m.failed));
  line(out, "Request rate (req/s):", num(info.request_rate));
  line(out, "Maximum request concurrency:", info.max_concurrency ? std::to_string(info.max_concurrency) : "none");
  line(out, "Benchmark duration (s):", num(m.duration_s));
  line(out, "Total input tokens:", std::to_string(m.total_input_tokens));
  line(out, "Total generated tokens:", std::to_string(m.total_output_tokens));
  line(out, "Request throughput (req/s):", num(m.request_throughput));
  line(out, "Output token throughput (tok/s):", num(m.output_throughput));
  line(out, "Total Token throughput (tok/s):", num(m.total_token_throughput));
  latency_block(out, "Time to First Token", "TTFT", m.ttft);
  latency_block(out, "Time per Output Token (excl. 1st token)", "TPOT", m.tpot);
  latency_block(out, "Inter-token Latency", "ITL", m.itl);
  latency_block(out, "End-to-end Latency", "E2EL", m.e2el);
  rule(out, "", '=');
  return out;
}

std::string format_serve_json(const serve_metrics& m, const serve_run_info& info) {
  nlohmann::ordered_json j;
  j["model"] = info.model;
  j["num_prompts"] = info.num_prompts;
  j["input_len"] = info.input_len;
  if (info.random_prefix_len) j["random_prefix_len"] = info.random_prefix_len;
  if (info.num_prefixes > 1) j["num_prefixes"] = info.num_prefixes;
  j["output_len"] = info.output_len;
  j["request_rate"] = std::isinf(info.request_rate) ? nlohmann::ordered_json() : nlohmann::ordered_json(info.request_rate);
  j["max_concurrency"] = info.max_concurrency ? nlohmann::ordered_json(info.max_concurrency) : nlohmann::ordered_json();
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  const std::pair<const char*, const latency_summary*> blocks[] = {
      {"ttft", &m.ttft}, {"tpot", &m.tpot}, {"itl", &m.itl}, {"e2el", &m.e2el}};
  for (const auto& [name, s] : blocks) {
    const std::string n = name;
    j["mean_" + n + "_ms"] = s->mean_ms;
    j["median_" + n + "_ms"] = s->median_ms;
    j["std_" + n + "_ms"] = s->std_ms;
    j["p99_" + n + "_ms"] = s->p99_ms;
  }
  return j.dump();
}

}  // namespace llmesh::bench
