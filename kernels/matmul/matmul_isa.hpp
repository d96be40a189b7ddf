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
  size_t n_tile;  ///< output columns per micro-tile; work units are rounded to it
  size_t m_tile;  ///< rows of x per micro-tile
  /// When set, bf16 jobs take x packed by this function (a permuted layout within each
  /// 16-chunk, rows zero-padded to a multiple of 16 = ld_out) instead of x itself.
  void (*pack_x_bf16)(const float* x, size_t ldx, size_t m, size_t k, float* out, size_t ld_out);
};

isa_kernels portable_kernels();
/// load_as_f32 compiled without instruction-set flags (matmul_portable.cpp), for the ISA units'
/// rare tails: an inline function of dtype.hpp that one of those units emitted out of line
/// would be ODR-merged with the others' copies, and the AVX-512 one could run on an AVX2 CPU.
float weight_as_f32(const void* data, dtype t, size_t i);
/// The kernels matmul() and dot() use on this CPU (for other kernels' inner products: any
/// gemm_block result is bit-identical to dot() of the same operands).
const isa_kernels& cpu_kernels();
isa_kernels avx2_kernels();
isa_kernels avx512_kernels();

/// Weight rows processed as one block: as many as fit in ~192 KiB, so the block stays in L2
/// (512 KiB per core on the smallest CPUs we run on) while every x tile passes over it, and
/// each weight byte is read from memory once per matmul. Rounded to the tile width.
inline size_t n_block_rows(size_t k_block, dtype w_type, size_t n_tile) {
  const size_t k = k_block;
  constexpr size_t budget = 192 * 1024;
  size_t rows = budget / dtype_bytes(w_type, k);
  rows = rows < n_tile ? n_tile : rows - rows % n_tile;
  return rows;
}

/// Length of the k blocks a matmul with m rows is split into: the x tile (m_tile rows) stays
/// within ~24 KiB of L1. Rows not much longer than that, and decode (a single x tile), are not
/// split. A multiple of 16, so every block starts a new 16-lane step.
inline size_t k_block_len(size_t k, size_t m, size_t m_tile) {
  size_t kb = (24 * 1024 / (sizeof(float) * m_tile)) / 16 * 16;
  return (m <= m_tile || k <= kb + kb / 2) ? k : kb;
}

}  // namespace llmesh::kernels::detail
