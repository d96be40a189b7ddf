// `llmesh bench speculate`: what speculative decoding by prompt lookup buys on a model and a
// workload, against its peer measured in the same run — the same replica, the same requests,
// decoding one token per step. Both runs go through actors::replica_core (the replica's own
// loop, no actors), so the ratio is the serving path's. The outputs must be identical (the
// speculative draws are those of a plain decode); the bench fails if they are not.
#pragma once

#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct speculation_bench_options {
  std::string model_dir;
  std::string prompt_file;   ///< one prompt a line (text: needs the model's tokenizer); empty: built in
  size_t tokens = 4;         ///< drafts per step (--speculative-tokens)
  size_t max_n = 4, min_n = 2;  ///< prompt-lookup n-gram lengths
  size_t disable_by_batch_size = 0;  ///< no drafts while more requests run (0: no limit)
  size_t max_tokens = 128;   ///< per request
  size_t concurrency = 1;    ///< requests in flight at once
  float temperature = 0.0f;  ///< 0: greedy; else sampled with a seed per request
  int threads = 0;
  std::string quantization = "none";  ///< --quantization: none or int8
  /// A draft model's directory (--draft-model): drafts are its greedy continuation instead of
  /// a prompt lookup's (it must share the model's tokenizer).
  std::string draft_model;
};

/// Prints, for the plain and the speculative run: tokens, steps, tokens/s, drafts kept, tokens
/// per sequence step, and the speedup. Fails if the two runs' tokens differ.
[[nodiscard]] status run_speculation_bench(const speculation_bench_options& opt);

}  // namespace llmesh::bench
