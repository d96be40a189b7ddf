// `llmesh bench engine`: prompt-processing (pp) and decode (tg) tokens/s, llama-bench style,
// reported against limits measured in the same run: the machine's read bandwidth (decode
// roofline = bandwidth / bytes read per token) and OpenBLAS sgemm GFLOP/s (prefill GEMM).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct engine_bench_options {
  std::string model_dir;
  int tp = 1;
  bool expert_parallel = false;  ///< --enable-expert-parallel: an MoE model's ranks run whole experts
  int threads = 0;
  size_t prompt_tokens = 512;
  size_t gen_tokens = 64;
  size_t context = 1;  ///< the tg run decodes after a context of this many tokens (its KV is read every step)
  std::string lora;    ///< a LoRA adapter's directory: also time pp and tg with it, as ratios to the base model's
  int reps = 3;
  std::string quantization = "none";  ///< --quantization: none or int8
  std::string kv_cache_dtype = "auto";  ///< --kv-cache-dtype: auto/float32, bfloat16, fp8 (fp8_e4m3), fp8_e5m2
  std::string dtype = "auto";           ///< --dtype: the weight matrices' type (auto: as stored)
  std::vector<size_t> batches;  ///< also decode this many sequences at once (aggregate tok/s vs batch 1)
};

/// Runs the benchmark and prints a table to stdout.
[[nodiscard]] status run_engine_bench(const engine_bench_options& opt);

/// Read bandwidth in bytes/s: `threads` threads sum a `bytes`-sized buffer (best of reps).
double measure_read_bandwidth(int threads, size_t bytes, int reps);

}  // namespace llmesh::bench
