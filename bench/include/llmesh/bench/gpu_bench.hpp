// `llmesh bench engine --device cuda`: the CUDA executor's prefill and decode speed against
// ceilings measured in the same run on the same GPU: a device-to-device copy (bytes read plus
// written per second: the decode roofline) and a cuBLASLt BF16 GEMM of the model's largest
// prefill shape (the prefill ceiling). Batch 1, 8 and 64 by default; deterministic (batch-
// invariant) and fast modes side by side, so the cost of invariance is a number.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct gpu_bench_options {
  std::string model_dir;  ///< a model directory, or
  std::string shape;      ///< "1b" or "8b": random BF16 weights made on the device (Llama 3 shapes)
  std::vector<size_t> batches = {1, 8, 64};
  size_t prompt_tokens = 512;  ///< prefill test
  size_t context = 128;        ///< each decode sequence's prompt
  size_t gen_tokens = 64;      ///< decode steps timed
  int reps = 3;
  bool profile = false;  ///< also print per-op device time for one prefill and a few decode steps
};

/// Runs the benchmark, prints a table and one JSON line to stdout.
[[nodiscard]] status run_gpu_bench(const gpu_bench_options& opt);

}  // namespace llmesh::bench
