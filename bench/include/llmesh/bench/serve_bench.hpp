// `llmesh bench serve`: a serving benchmark client with vLLM `bench serve` semantics, against
// any OpenAI-compatible server (llmesh serve, vLLM, llama.cpp's server). It sends
// `num_prompts` streamed POST /v1/completions requests, each a prompt of exactly `input_len`
// random token ids (uniform over [0, vocab), seeded; after `random_prefix_len` ids that every
// prompt shares, vLLM's --random-prefix-len) with max_tokens `output_len`,
// ignore_eos and temperature 0, arriving as a Poisson process of `request_rate` requests/s
// (infinity: all at once), at most `max_concurrency` in flight; then prints vLLM's table and
// one JSON line (serve_stats.hpp has the metric definitions).
//
// Threads: run_serve_bench runs one io_context on the calling thread; every request is a
// coroutine on it with its own HTTP/1.1 connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct serve_bench_options {
  std::string url;            ///< server base, http[s]://HOST[:PORT][/PREFIX]; PREFIX/v1/... is called
  std::string cacert;         ///< https: PEM CAs the server's certificate is checked against ("": the system's)
  bool insecure = false;      ///< https: the server's certificate is not checked
  std::string model;          ///< empty: the first id GET /v1/models lists
  std::string api_key;        ///< sent as "Authorization: Bearer KEY" when set
  std::string tokenizer_dir;  ///< a model directory: its config.json's vocab_size bounds the ids
  size_t num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();  ///< requests/s (vLLM's default: inf)
  size_t max_concurrency = 0;                                     ///< 0: unlimited
  size_t input_len = 1024;
  size_t random_prefix_len = 0;  ///< vLLM's: ids every prompt starts with (a shared system prompt, a conversation's history)
  /// That many different prefixes, taken in turn (vLLM's prefix-repetition dataset, unshuffled).
  size_t num_prefixes = 1;
  size_t output_len = 128;
  /// Prompt ids are drawn from [0, vocab). 0: tokenizer_dir's vocab_size, else 256 (every
  /// model has at least 256 ids: byte-level BPE starts from the bytes).
  size_t vocab = 0;
  uint64_t seed = 0;
  double timeout_s = 600;     ///< a request with no byte from the server for this long fails
};

/// Runs the benchmark; prints the table and the JSON line to stdout. Errors: bad options,
/// an unparsable URL, an unreachable server or a failed GET /v1/models (before any request
/// is sent), and a run in which every request failed (after the report is printed).
[[nodiscard]] status run_serve_bench(const serve_bench_options& opt);

/// Where a base URL points.
struct base_url {
  std::string host;    ///< without brackets for IPv6
  std::string port;    ///< "80" ("443" for https) when the URL names none
  bool tls = false;    ///< https
  std::string prefix;  ///< path before /v1, no trailing '/'; usually empty
};

/// Parses "http[s]://HOST[:PORT][/PREFIX]" (HOST may be "[v6]").
[[nodiscard]] result<base_url> parse_base_url(const std::string& url);

/// Send times in seconds from the start: 0 for the first request, then exponential gaps of
/// mean 1/rate drawn from `seed` (vLLM's Poisson arrivals, burstiness 1). All 0 when rate
/// is infinite. REQUIRES: rate > 0.
std::vector<double> poisson_arrivals(size_t n, double rate, uint64_t seed);

/// `n` prompts of `prefix_len` + `len` ids each, uniform over [0, vocab), from `seed`: the first
/// `prefix_len` are one of `num_prefixes` (0 counts as 1) random prefixes, prompt i's the
/// (i mod num_prefixes)-th. REQUIRES: vocab > 0.
std::vector<std::vector<int32_t>> random_prompts(size_t n, size_t len, size_t vocab, uint64_t seed, size_t prefix_len = 0,
                                                 size_t num_prefixes = 1);

}  // namespace llmesh::bench
