// Private: the per-instruction-set entry points behind matmul() and dot().
#pragma once

#include "llmesh/kernels/cpu_features.hpp"
#include "llmesh/kernels/matmul.hpp"

namespace llmesh::kernels::detail {

/// Computes rows [m0, m1) × columns [n0, n1) of one matmul job on the calling thread.
using gemm_block_fn = void (*)(const matmul_args& a, size_t m0, size_t m1, size_t n0, size_t n1);
using dot_fn = float (*)(const float* a, const float* b, size_t n);

struct isa_kernels {
  gemm_block_fn gemm_block;
  dot_fn dot;
  size_t n_tile;  ///< output columns per micro-tile; thread splits are rounded to it
};

isa_kernels portable_kernels();
isa_kernels avx2_kernels();
isa_kernels avx512_kernels();

/// Weight rows processed as one block: as many as fit in ~192 KiB, so the block stays in L2
/// (512 KiB per core on the smallest CPUs we run on) while every x tile passes over it, and
/// each weight byte is read from memory once per matmul. Rounded to the tile width.
inline size_t n_block_rows(size_t k, dtype w_type, size_t n_tile) {
  constexpr size_t budget = 192 * 1024;
  size_t rows = budget / (k * dtype_size(w_type));
  rows = rows < n_tile ? n_tile : rows - rows % n_tile;
  return rows;
}

}  // namespace llmesh::kernels::detail
