// `llmesh bench matmul`: the decode kernel of every weight type on one matrix shape — weights
// per second and bytes per second at m activation rows (and m times the weights in
// multiply-adds), against the read bandwidth measured
// with the same threads in the same run (the limit a decode matmul streams against) and
// against int8. Random weights (every block type's quants and scales random, its float16
// factors finite); 32768 × 4096 by default, 44-268 MB a type (f32: 537 MB), past most
// last-level caches (a Q2_K matrix alone can fit a large one: pass more --rows there).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::bench {

struct matmul_bench_options {
  size_t rows = 32768;            ///< n: output rows (weight rows)
  size_t cols = 4096;             ///< k: a multiple of 256 (the K-quant super-block)
  std::vector<size_t> m = {1};    ///< activation rows per call (1: decode)
  std::vector<std::string> types; ///< dtype names (bf16, int8, q4_k, ...); empty: all but f32/f16
  int threads = 1;
  int reps = 20;                  ///< calls per type per m, interleaved across types; the best is reported
};

/// Runs the benchmark and prints a table to stdout.
[[nodiscard]] status run_matmul_bench(const matmul_bench_options& opt);

}  // namespace llmesh::bench
