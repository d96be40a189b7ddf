// `llmesh bench tokenizer`: encode and decode throughput of a model's tokenizer.json.
#pragma once

#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct tokenizer_bench_options {
  std::string model_dir;
  std::string file;        ///< text to encode; empty: ~1 MB of built-in mixed English prose
  int reps = 3;
};

/// Prints load time, encode MB/s and tokens/s, decode tokens/s (best of reps).
[[nodiscard]] status run_tokenizer_bench(const tokenizer_bench_options& opt);

}  // namespace llmesh::bench
