// The plain half of `llmesh bench serve`: what one streamed request looked like to the client
// (request_record, filled from the SSE body by sse_recorder) and the serving metrics computed
// from many of them, with vLLM `bench serve`'s definitions (vllm/benchmarks/serve.py,
// calculate_metrics) so numbers compare across the two tools:
//   - TTFT: send → first chunk that carries `choices` (its text may be empty);
//   - E2E latency: send → last chunk that carries `choices` (the usage chunk and [DONE] after it
//     are not counted, as in vLLM);
//   - ITL: every gap between consecutive `choices` chunks, pooled over all requests;
//   - TPOT: (e2e - ttft) / (output tokens - 1), per request with more than one output token;
//   - throughputs: completed requests, their output tokens, their input + output tokens, each
//     divided by the run's wall time.
// Mean, median, standard deviation (population) and p99 are numpy's (linear interpolation).
// No I/O here; the HTTP client is serve_bench.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace llmesh::bench {

/// One request as the client saw it. Times are seconds since the request was sent.
struct request_record {
  bool ok = false;
  double ttft = 0;
  double e2e = 0;
  std::vector<double> itl;         ///< gaps between consecutive `choices` chunks
  size_t n_tokens_prompt = 0;
  size_t n_tokens_output = 0;      ///< usage.completion_tokens (chunk count if the server sent no usage)
  std::string error;               ///< why it failed (when !ok)
};

/// Turns one response's SSE body ("data: {json}\n\n" ... "data: [DONE]\n\n"), fed as it
/// arrives, into a request_record. Not thread-safe; one per request.
class sse_recorder {
 public:
  /// Feeds body bytes that arrived `t` seconds after the request was sent. Events complete
  /// in this piece are stamped with `t`; a partial event waits for the rest.
  void feed(std::string_view bytes, double t);

  /// True once "data: [DONE]" was seen.
  bool done() const { return done_; }

  /// The record. ok when a `choices` chunk came, [DONE] came, and no error event did (vLLM
  /// only asks for the first; a stream cut short is a failure here).
  request_record finish(size_t n_tokens_prompt) const;

 private:
  void on_event(std::string_view event, double t);

  std::string pending_;       ///< bytes of an unfinished event
  bool done_ = false;
  bool first_ = false;        ///< a `choices` chunk came
  double last_ = 0;           ///< when the latest `choices` chunk came
  size_t n_chunks_ = 0;
  long long usage_tokens_ = -1;
  request_record rec_;
};

/// Mean, median, population standard deviation and p99 of a sample, in milliseconds.
struct latency_summary {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  double p99_ms = 0;
};

/// The run's results, vLLM's BenchmarkMetrics without goodput.
struct serve_metrics {
  size_t completed = 0;
  size_t failed = 0;
  size_t total_input_tokens = 0;   ///< of completed requests
  size_t total_output_tokens = 0;  ///< of completed requests
  double duration_s = 0;
  double request_throughput = 0;      ///< completed / duration
  double output_throughput = 0;       ///< output tokens / duration
  double total_token_throughput = 0;  ///< (input + output tokens) / duration
  latency_summary ttft, tpot, itl, e2el;
};

/// numpy.percentile(values, p) with its default linear interpolation: rank p/100 * (n-1)
/// between the sorted neighbours. 0 for an empty sample (as vLLM's `values or 0`).
/// REQUIRES: 0 <= p <= 100.
double percentile(std::vector<double> values, double p);

/// The summary of a sample given in seconds. All zeros for an empty sample.
latency_summary summarize_seconds(const std::vector<double>& seconds);

/// Metrics of a run that took `duration_s` of wall time. REQUIRES: duration_s > 0.
serve_metrics compute_serve_metrics(const std::vector<request_record>& records, double duration_s);

/// What was asked for, printed beside the results.
struct serve_run_info {
  std::string model;
  size_t num_prompts = 0;
  size_t input_len = 0;
  size_t output_len = 0;
  double request_rate = 0;     ///< requests/s; infinity: all at once
  size_t max_concurrency = 0;  ///< 0: unlimited
  size_t random_prefix_len = 0;  ///< ids every prompt shared before its input_len
  size_t num_prefixes = 0;       ///< how many such prefixes, taken in turn
};

/// The human table, laid out like vLLM's "Serving Benchmark Result".
std::string format_serve_table(const serve_metrics& m, const serve_run_info& info);

/// One line of JSON (no newline) with every number, keys named as in vLLM's result file
/// (`mean_ttft_ms`, `p99_itl_ms`, `output_throughput`, ...). An infinite request rate and
/// an unlimited concurrency are null.
std::string format_serve_json(const serve_metrics& m, const serve_run_info& info);

}  // namespace llmesh::bench
