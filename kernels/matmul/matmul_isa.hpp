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

/// Rows of x processed together while a weight tile stays in cache. Why 64: 64 rows of a
/// 2048-wide activation are 512 KiB, which stays in a 1 MiB L2 next to the weight tile.
constexpr size_t m_block = 64;

}  // namespace llmesh::kernels::detail
